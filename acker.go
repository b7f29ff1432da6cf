package disker

import (
	"context"
	"errors"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// ackBatch is the most refs one acknowledgement call carries.
const ackBatch = 256

// ackDelay is how long the acker gathers refs after the first one before
// it sends them: a few round trips' worth, so that a lone requester's
// acknowledgements take a fraction of a call each instead of a call each
// (a delayed acknowledgement only delays the deletion of a settled entry).
const ackDelay = 2 * time.Millisecond

// acker acknowledges entries in batches on its own goroutine, so that the
// loops that settle entries never wait for the round trip: what queued up
// within ackDelay of the first ref, or while one call was on the wire, goes
// in one call.
type acker struct {
	d     *Disker
	kind  string // "receiver" or "sender", for logs
	name  string
	ack   func(ctx context.Context, refs ...string) error
	refs  chan ackRef
	abort chan struct{} // closed to give up retrying failed calls
	done  chan struct{}
	// direct acknowledges each ref at once, on the caller's goroutine,
	// with no goroutine of its own (newDirectAcker).
	direct bool
}

func newAcker(d *Disker, kind, name string, ack func(ctx context.Context, refs ...string) error) *acker {
	a := &acker{d: d, kind: kind, name: name, ack: ack, refs: make(chan ackRef, 4*ackBatch), abort: make(chan struct{}), done: make(chan struct{})}
	go a.run()
	return a
}

// ackRef is a ref to acknowledge; now sends it without gathering more
// (what is queued already goes with it).
type ackRef struct {
	ref string
	now bool
}

// add queues ref for acknowledgement. It waits when the queue is full.
func (a *acker) add(ref string) { a.queue(ackRef{ref: ref}) }

// addNow queues ref for an acknowledgement sent at once, with what is
// queued: the acknowledgement of a keyed message (WithGroup) is what lets
// its key's next message go, so it waits for no batch to fill.
func (a *acker) addNow(ref string) { a.queue(ackRef{ref: ref, now: true}) }

func (a *acker) queue(r ackRef) {
	if a.direct {
		a.ackNow(r.ref)
		return
	}
	a.refs <- r
}

// close acknowledges what is queued and stops. Call it once, after the last
// add. When ctx ends first, failed calls are no longer retried.
func (a *acker) close(ctx context.Context) {
	close(a.refs)
	select {
	case <-a.done:
	case <-ctx.Done():
		close(a.abort)
		<-a.done
	}
}

func (a *acker) run() {
	defer close(a.done)
	d := a.d
	batch := make([]string, 0, ackBatch)
	gather := time.NewTimer(ackDelay)
	gather.Stop()
	for first := range a.refs {
		batch = append(batch[:0], first.ref)
		now := first.now
		gather.Reset(ackDelay)
	more:
		for len(batch) < ackBatch {
			if now {
				// Send at once, with what is queued already.
				select {
				case r, ok := <-a.refs:
					if !ok {
						break more
					}
					batch = append(batch, r.ref)
					continue
				default:
					break more
				}
			}
			select {
			case r, ok := <-a.refs:
				if !ok {
					break more // closing: send what is here at once
				}
				batch, now = append(batch, r.ref), r.now
			case <-gather.C:
				break more
			}
		}
		gather.Stop()
		var bo pacer
		for {
			err := a.ack(d.opCtx, batch...)
			if err == nil {
				d.health.ok()
				break
			}
			if d.opCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				break // shutting down: the entries will be delivered again
			}
			d.health.fail("ack", err)
			// Unacknowledged entries are delivered again after their lease:
			// keep trying while that is still worth it.
			if bo.attempts >= 8 || !bo.wait(a.abort) {
				d.log.Warn("disker: cannot acknowledge; the entries will be delivered again", a.kind, a.name, "count", len(batch), "error", err)
				break
			}
		}
	}
}
