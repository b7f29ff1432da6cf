package disker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// inbox is the state of the instance's private reply address, the sender
// of its Requests: "_inbox." followed by the instance's id.
//
// Its state in the broker, the reply stream, must not outlive the
// instance, so it carries an expiry
// (broker.ExpireSender): the first Request opens the address with one, each
// heartbeat renews it, and Close deletes the state once the Requests have
// returned. An instance that crashes leaves it to expire. The expiry covers
// three heartbeat intervals past the later of now and the latest deadline
// of a Request (plus inboxMargin), so a Request never loses its state while
// the instance lives, even if a few heartbeats fail.
//
// Replies to it use broker.ReplyInbox: once the inbox has gone, a reply is
// dropped (the replier gets ErrLate) instead of re-creating a reply stream
// that nobody reads.
type inbox struct {
	mu     sync.Mutex
	open   bool      // the broker has it open (ExpireSender succeeded once)
	until  time.Time // local time until which the broker keeps it, at least
	latest time.Time // the latest deadline of a Request sent from it
}

// inboxMargin is how long after a Request's deadline the inbox must still
// hold its state: the Request appends its marker at the deadline (again
// if the broker's clock was behind), and the reader needs a block time to
// read it.
func (d *Disker) inboxMargin() time.Duration {
	return d.cfg.ReceiverBlockTimeout + 5*time.Second
}

// inboxTTL is the expiry of the inbox's state from now. Call with
// d.ib.mu held.
func (d *Disker) inboxTTL(now time.Time) time.Duration {
	ttl := 3 * d.cfg.HeartbeatInterval
	if wait := d.ib.latest.Add(d.inboxMargin()).Sub(now); wait > 0 {
		ttl += wait
	}
	return ttl
}

// renewInbox opens the inbox in the broker, or renews its expiry. Call
// with d.ib.mu held.
func (d *Disker) renewInbox(ctx context.Context) error {
	now := time.Now()
	ttl := d.inboxTTL(now)
	if err := d.b.ExpireSender(ctx, d.inbox, ttl); err != nil {
		return err
	}
	d.ib.open, d.ib.until = true, now.Add(ttl)
	return nil
}

// ensureInbox makes the inbox ready for a Request with deadline (zero for
// none): it starts reading it, counts the Request in for Close to wait on,
// and makes sure the broker keeps the inbox past the deadline. On success
// the caller must call d.requests.Done when the Request returns.
func (d *Disker) ensureInbox(ctx context.Context, deadline time.Time) error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return ErrClosed
	}
	d.requests.Add(1)
	if d.inboxReader == nil {
		d.inboxReader = d.startReader(d.inbox)
	}
	d.mu.Unlock()

	d.ib.mu.Lock()
	defer d.ib.mu.Unlock()
	if deadline.After(d.ib.latest) {
		d.ib.latest = deadline
	}
	if d.ib.open && (deadline.IsZero() || !deadline.Add(d.inboxMargin()).After(d.ib.until)) {
		return nil
	}
	if err := d.renewInbox(ctx); err != nil {
		d.requests.Done()
		if ctx.Err() == nil {
			d.health.fail("expire sender", err)
		}
		return wrapBroker("request", err)
	}
	return nil
}

// heartbeatInbox renews the inbox's expiry, if it is open.
func (d *Disker) heartbeatInbox(ctx context.Context) {
	d.ib.mu.Lock()
	defer d.ib.mu.Unlock()
	if !d.ib.open {
		return
	}
	if err := d.renewInbox(ctx); err != nil && ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
		d.health.fail("expire sender", err)
	}
}

// deleteInbox deletes the inbox's state in the broker, if it was opened.
// Close calls it once the Requests have returned and the reader stopped.
func (d *Disker) deleteInbox(ctx context.Context) {
	d.ib.mu.Lock()
	defer d.ib.mu.Unlock()
	if !d.ib.open {
		return
	}
	if err := d.b.ExpireSender(ctx, d.inbox, 0); err != nil {
		d.log.Warn("disker: cannot delete the inbox; it expires by itself", "inbox", d.inbox, "error", err)
		return
	}
	d.ib.open = false
}
