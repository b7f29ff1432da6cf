package disker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/testhook"
)

// ackBatch is the most refs one acknowledgement call carries.
const ackBatch = 256

// ackDelay is how long the acker gathers refs after the first one before
// it sends them: a few round trips' worth, so that a lone requester's
// acknowledgements take a fraction of a call each instead of a call each
// (a delayed acknowledgement only delays the deletion of a settled entry).
const ackDelay = 2 * time.Millisecond

// ackQueue is how many refs wait for the acker before add waits: a batch
// gathers while a call is on the wire, so a short queue keeps the batches
// full and an idle receiver's acker small.
const ackQueue = 64

// ackIdle is how long the acker's goroutine waits for a ref before it
// ends: an idle receiver keeps none (the next add starts one).
const ackIdle = time.Second

// acker acknowledges entries in batches on a goroutine of its own, started
// by the first ref and ended after ackIdle without one, so that the loops
// that settle entries never wait for the round trip: what queued up within
// ackDelay of the first ref, or while one call was on the wire, goes in one
// call.
type acker struct {
	d     *Disker
	kind  string // "receiver" or "sender", for logs
	name  string
	ack   func(ctx context.Context, refs ...string) error
	refs  chan ackRef   // made at the first ref; guarded by mu until then
	abort chan struct{} // closed to give up retrying failed calls; made with refs
	// mu guards running and pending: pending counts the refs added and
	// not yet taken by the goroutine, so that it ends only when none is
	// on its way (see queue and idle).
	mu      sync.Mutex
	running bool
	pending int
	runs    sync.WaitGroup
	// direct acknowledges each ref at once, on the caller's goroutine,
	// with no goroutine of its own (newDirectAcker).
	direct bool
}

func newAcker(d *Disker, kind, name string, ack func(ctx context.Context, refs ...string) error) *acker {
	return &acker{d: d, kind: kind, name: name, ack: ack}
}

// ackRef is a ref to acknowledge; now sends it without gathering more
// (what is queued already goes with it). id and attempt name a handled
// delivery's message, for testhook.Acked; a reply entry's ref has none.
type ackRef struct {
	ref     string
	id      string
	attempt int
	now     bool
}

// add queues ref for acknowledgement. It waits when the queue is full.
func (a *acker) add(ref string) { a.queue(ackRef{ref: ref}) }

// addDelivery queues the ref of dl, a delivery of msg, for
// acknowledgement; a keyed message's (WithGroup) is sent at once, with
// what is queued: its acknowledgement is what lets its key's next message
// go, so it waits for no batch to fill.
func (a *acker) addDelivery(dl *broker.Delivery, msg *Message) {
	a.queue(ackRef{ref: dl.Ref, id: msg.ID, attempt: msg.Attempt, now: dl.GroupKey != ""})
}

// acked tells testhook.Acked, when set, that the acknowledgement of the
// deliveries among refs ended with err.
func acked(receiver string, refs []ackRef, err error) {
	h := testhook.Acked
	if h == nil {
		return
	}
	for _, r := range refs {
		if r.id != "" {
			h(receiver, r.id, r.attempt, err)
		}
	}
}

func (a *acker) queue(r ackRef) {
	if a.direct {
		a.ackNow(r)
		return
	}
	a.mu.Lock()
	a.pending++
	if !a.running {
		if a.refs == nil {
			// Kept: made at the first ref.
			a.refs, a.abort = make(chan ackRef, ackQueue), make(chan struct{})
		}
		a.running = true
		a.runs.Add(1)
		go a.run(a.refs, a.abort)
	}
	refs := a.refs
	a.mu.Unlock()
	refs <- r
}

// took counts a ref taken off the queue.
func (a *acker) took() {
	a.mu.Lock()
	a.pending--
	a.mu.Unlock()
}

// idle ends the goroutine unless a ref is on its way.
func (a *acker) idle() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pending > 0 {
		return false
	}
	a.running = false
	return true
}

// close acknowledges what is queued and stops. Call it once, after the last
// add. When ctx ends first, failed calls are no longer retried.
func (a *acker) close(ctx context.Context) {
	a.mu.Lock()
	if a.refs != nil {
		close(a.refs)
	}
	abort := a.abort
	a.mu.Unlock()
	if abort == nil {
		return // none ran
	}
	done := make(chan struct{})
	go func() { a.runs.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		close(abort)
		<-done
	}
}

// send acknowledges refs, trying again after a failure while that is
// worth it, and returns the last call's error.
func (a *acker) send(refs []string, abort <-chan struct{}) error {
	d := a.d
	var bo pacer
	for {
		err := a.ack(d.opCtx, refs...)
		if err == nil {
			d.health.ok()
			return nil
		}
		if d.opCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
			return err // shutting down: the entries will be delivered again
		}
		d.health.fail("ack", err)
		// Unacknowledged entries are delivered again after their lease:
		// keep trying while that is still worth it.
		if bo.attempts >= 8 || !bo.wait(abort) {
			d.log.Warn("disker: cannot acknowledge; the entries will be delivered again", a.kind, a.name, "count", len(refs), "error", err)
			return err
		}
	}
}

// run acknowledges the refs of refs (a.refs) until it is closed, or ends
// after ackIdle without one.
func (a *acker) run(refs <-chan ackRef, abort <-chan struct{}) {
	defer a.runs.Done()
	batch := make([]ackRef, 0, ackBatch)
	wire := make([]string, 0, ackBatch)
	gather := time.NewTimer(ackDelay)
	gather.Stop()
	wait := time.NewTimer(ackIdle)
	defer wait.Stop()
	for {
		var first ackRef
		select {
		case r, ok := <-refs:
			if !ok {
				return // closed, and all taken
			}
			first = r
		case <-wait.C:
			if a.idle() {
				return
			}
			wait.Reset(ackIdle)
			continue
		}
		a.took()
		batch = append(batch[:0], first)
		now := first.now
		gather.Reset(ackDelay)
	more:
		for len(batch) < ackBatch {
			if now {
				// Send at once, with what is queued already.
				select {
				case r, ok := <-refs:
					if !ok {
						break more
					}
					a.took()
					batch = append(batch, r)
					continue
				default:
					break more
				}
			}
			select {
			case r, ok := <-refs:
				if !ok {
					break more // closing: send what is here at once
				}
				a.took()
				batch, now = append(batch, r), r.now
			case <-gather.C:
				break more
			}
		}
		gather.Stop()
		wire = wire[:0]
		for _, r := range batch {
			wire = append(wire, r.ref)
		}
		acked(a.name, batch, a.send(wire, abort))
		wait.Reset(ackIdle)
	}
}
