package disker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// cancelGrace bounds how long Request waits for an outcome that the broker
// says is already decided (a reply or timeout notice on its way) after ctx
// ended.
const cancelGrace = 30 * time.Second

// Request sends content to receiver and waits for the reply, which it
// returns. The message is sent from this instance's private reply address
// with ctx's deadline as its timeout (WithTimeout may shorten it), so the
// reply and the timeout are decided by the broker in one step: Request sees
// exactly one of them.
//
// It returns an error matching ErrTimeout (and context.DeadlineExceeded)
// when no reply came in time, a *RemoteError when the reply carries an error
// (for instance, the message was dead-lettered after its last attempt), and
// ctx's error when ctx was cancelled before a deadline. Without a deadline
// in ctx the message has no timeout: Request waits until ctx is cancelled.
//
// The private reply address, the inbox, is "_inbox." followed by the
// instance's id. Its state in the broker (reply stream, pending timeouts)
// lives as long as the instance: it carries an expiry that the heartbeat
// renews (Config.HeartbeatInterval; it always covers the deadlines of the
// Requests in flight), Close deletes it once the Requests have returned,
// and the broker deletes it by itself some heartbeat intervals after an
// instance crashed. A reply that comes after the inbox has gone is dropped
// (the replier gets ErrLate) and re-creates nothing.
func (d *Disker) Request(ctx context.Context, receiver string, content []byte, opts ...SendOption) (*Message, error) {
	msg := Message{Receiver: receiver, Content: content}
	for _, o := range opts {
		o(&msg)
	}
	if msg.FireAndForget {
		return nil, invalid("Message.FireAndForget", "a request waits for its reply: it cannot be fire-and-forget")
	}
	if err := checkName("Message.Receiver", receiver); err != nil {
		return nil, err
	}
	if len(content) > d.cfg.MaxMessageSize {
		return nil, invalid("Message.Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(content), d.cfg.MaxMessageSize)
	}
	if msg.Timeout < 0 {
		return nil, invalid("Message.Timeout", "must be >= 0, got %v", msg.Timeout)
	}
	if msg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, msg.Timeout)
		defer cancel()
	}
	id := newID()
	msg.Timeout = 0
	dl, hasDeadline := ctx.Deadline()
	if hasDeadline {
		msg.Timeout = max(time.Until(dl), time.Millisecond)
	}
	if err := ctx.Err(); err != nil {
		return nil, d.requestEnded(id, err)
	}
	if err := d.ensureInbox(ctx, dl); err != nil {
		if ctx.Err() != nil && !errors.Is(err, ErrClosed) {
			return nil, d.requestEnded(id, ctx.Err())
		}
		return nil, err
	}
	defer d.requests.Done()
	msg.Sender = d.inbox

	ch := make(chan broker.Reply, 1)
	d.waitMu.Lock()
	d.waiters[id] = ch
	d.waitMu.Unlock()
	defer func() {
		d.waitMu.Lock()
		delete(d.waiters, id)
		d.waitMu.Unlock()
	}()

	// The send runs to its end even if ctx ends meanwhile (the broker bounds
	// its I/O): an interrupted send would leave it unknown whether the
	// message was queued, and so whether a reply may still be accepted.
	if _, err := d.send(context.WithoutCancel(ctx), &msg, id); err != nil {
		return nil, err
	}
	select {
	case r := <-ch:
		return d.outcome(id, &r)
	case <-d.closing:
		return nil, ErrClosed
	case <-ctx.Done():
	}
	if msg.Timeout == 0 {
		return nil, d.requestEnded(id, ctx.Err())
	}
	// The deadline passed or ctx was cancelled: settle the request in the
	// broker. If it was already settled, its outcome is on its way.
	cctx, cancel := context.WithTimeout(d.opCtx, 5*time.Second)
	cancelled, err := d.b.Cancel(cctx, d.inbox, id)
	cancel()
	if err != nil {
		d.health.fail("cancel", err)
		return nil, fmt.Errorf("%w (and the broker could not settle it: %v)", d.requestEnded(id, ctx.Err()), err)
	}
	if cancelled {
		return nil, d.requestEnded(id, ctx.Err())
	}
	t := time.NewTimer(cancelGrace)
	defer t.Stop()
	select {
	case r := <-ch:
		return d.outcome(id, &r)
	case <-d.closing:
		return nil, ErrClosed
	case <-t.C:
		return nil, d.requestEnded(id, ctx.Err())
	}
}

// requestEnded is Request's error when ctx ended first.
func (d *Disker) requestEnded(id string, ctxErr error) error {
	if ctxErr == context.Canceled {
		return fmt.Errorf("disker: request %s: %w", id, ctxErr)
	}
	return timeoutErr(id, ctxErr)
}

// outcome turns the entry of the inbox for request id into Request's result.
func (d *Disker) outcome(id string, r *broker.Reply) (*Message, error) {
	if r.Kind == broker.KindTimeout {
		return nil, timeoutErr(id, nil)
	}
	m := d.messageOf(&r.Env, time.Time{}, 0)
	if m.Error != nil {
		return nil, m.Error
	}
	return m, nil
}

// deliverOutcome hands an inbox entry to the Request that waits for it, if
// any (a Request that gave up has gone).
func (d *Disker) deliverOutcome(r *broker.Reply) {
	d.waitMu.Lock()
	ch := d.waiters[r.RequestID]
	d.waitMu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- *r:
	default: // a duplicate (redelivered entry): the first one counts
	}
}
