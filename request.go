package disker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// cancelGrace bounds how long a Request whose ctx ended tries to append
// its marker to the inbox, and then waits for the inbox's reader to reach
// it.
const cancelGrace = 30 * time.Second

// Request sends content to receiver and waits for the reply, which it
// returns. The message is sent from this instance's private reply address
// with ctx's deadline as its timeout (WithTimeout may shorten it), so the
// reply and the timeout are decided by the broker's clock at one point:
// the reply counts if the broker appended it to the inbox before the
// deadline, and the replier of any other is told ErrLate. Request sees
// exactly one of them.
//
// It returns an error matching ErrTimeout (and context.DeadlineExceeded)
// when no reply came in time, a *RemoteError when the reply carries an error
// (for instance, the message was dead-lettered after its last attempt), and
// ctx's error when ctx was cancelled before a deadline; a reply that was
// already in the inbox then is returned instead. When the broker cannot be
// reached, Request returns an error matching ErrUnavailable at once, unless
// the connection broke after the message was written: then the message may
// have been queued all the same, so Request waits for its deadline and
// settles the request as it would have, returning the reply or an error
// that matches ErrTimeout and says that the send failed. Without a deadline in ctx
// the message has no timeout: Request waits until ctx is cancelled.
//
// The private reply address, the inbox, is "_inbox." followed by the
// instance's id. Its state in the broker (a reply stream) lives as long as
// the instance: it carries an expiry that the heartbeat renews
// (Config.HeartbeatInterval; it always covers the deadlines of the
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
		switch {
		case errors.Is(err, ErrClosed):
		case ctx.Err() != nil:
			return nil, d.requestEnded(id, ctx.Err())
		case errors.Is(err, context.DeadlineExceeded):
			// The broker saw the deadline pass a moment before ctx did.
			return nil, d.requestEnded(id, context.DeadlineExceeded)
		}
		return nil, err
	}
	defer d.requests.Done()
	msg.Sender = d.inbox

	w := &waiter{ready: make(chan struct{}, 1)}
	d.waitMu.Lock()
	d.waiters[id] = w
	d.waitMu.Unlock()
	defer func() {
		d.waitMu.Lock()
		delete(d.waiters, id)
		d.waitMu.Unlock()
	}()

	// The send runs to its end even if ctx ends meanwhile (the broker bounds
	// its I/O): an interrupted send would leave it unknown whether the
	// message was queued, and so whether a reply may still be accepted.
	deadline, err := d.send(context.WithoutCancel(ctx), &msg, id)
	var sendErr error
	if err != nil {
		if !errors.Is(err, ErrUnavailable) || deadline.IsZero() {
			return nil, err
		}
		// The broker could not be reached, and the message may have been
		// queued all the same (the write made, its answer lost): settle the
		// request as below, so that a reply is either returned or refused.
		sendErr = err
	}
	// The outcome is the first reply appended before the deadline. Once ctx
	// ends, Request settles the request in the inbox with a marker: one at
	// or after the deadline leaves no room for a reply after it; one before
	// the deadline (ctx was cancelled) leaves the replies after it unread.
	// From then on the outcome is that first reply if it precedes the
	// marker, else the marker.
	var marker broker.Reply
	ended := ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-w.ready:
			r, ok := w.decide(deadline, marker.Ref)
			switch {
			case !ok:
				continue
			case r.Kind == broker.KindReply:
				return d.outcome(id, &r)
			}
			if ctx.Err() == context.DeadlineExceeded {
				d.timedOut.Add(1)
				if d.onEvent != nil {
					d.emit(Event{Kind: EventTimedOut, Receiver: receiver, Sender: d.inbox, MessageID: id})
				}
			}
			if sendErr != nil {
				return nil, fmt.Errorf("%w (its send failed, and it may not have been queued: %v)", d.requestEnded(id, ctx.Err()), sendErr)
			}
			return nil, d.requestEnded(id, ctx.Err())
		case <-d.closing:
			return nil, ErrClosed
		case <-ended:
			if msg.Timeout == 0 {
				return nil, d.requestEnded(id, ctx.Err())
			}
			ended = nil
			if marker, err = d.giveUp(id, deadline, ctx.Err() == context.DeadlineExceeded); err != nil {
				return nil, fmt.Errorf("%w (and the request could not be settled: %v)", d.requestEnded(id, ctx.Err()), err)
			}
			t := time.NewTimer(cancelGrace)
			defer t.Stop()
			grace = t.C
		case <-grace:
			return nil, d.requestEnded(id, ctx.Err())
		}
	}
}

// giveUp appends Request id's marker to the inbox. When the Request's
// deadline has passed (timedOut), it appends markers until one is at or
// after the deadline by the broker's clock, which may be a little behind
// the local one: that marker settles the request as timed out. While the
// broker cannot be reached, it tries again for up to cancelGrace: until a
// marker is in, a reply may still be accepted.
func (d *Disker) giveUp(id string, deadline time.Time, timedOut bool) (broker.Reply, error) {
	stop := time.Now().Add(cancelGrace)
	var bo backoff
	for {
		ctx, cancel := context.WithTimeout(d.opCtx, 5*time.Second)
		m, err := d.b.GiveUp(ctx, d.inbox, id)
		cancel()
		switch {
		case errors.Is(err, broker.ErrLate):
			return m, errors.New("the inbox has expired")
		case errors.Is(err, broker.ErrClosed):
			return m, err
		case err != nil:
			d.health.fail("give up", err)
			if time.Now().After(stop) || !bo.wait(d.closing) {
				return m, err
			}
			continue
		case !timedOut || !m.At.Before(deadline):
			d.health.ok()
			return m, nil
		}
		t := time.NewTimer(max(deadline.Sub(m.At), time.Millisecond))
		select {
		case <-t.C:
		case <-d.closing:
			t.Stop()
			return m, ErrClosed
		}
	}
}

// requestEnded is Request's error when ctx ended first.
func (d *Disker) requestEnded(id string, ctxErr error) error {
	if ctxErr == context.Canceled {
		return fmt.Errorf("disker: request %s: %w", id, ctxErr)
	}
	return timeoutErr(id, ctxErr)
}

// outcome turns the reply to request id into Request's result.
func (d *Disker) outcome(id string, r *broker.Reply) (*Message, error) {
	m := d.messageOf(&r.Env, time.Time{}, 0)
	if m.Error != nil {
		return nil, m.Error
	}
	return m, nil
}

// waiter is a Request waiting for its outcome: the inbox's entries for
// it, in the order the inbox's reader read them, which is the order they
// were appended.
type waiter struct {
	mu      sync.Mutex
	entries []broker.Reply
	next    int           // entries before it were looked at and decided nothing
	ready   chan struct{} // signalled when entries were added
}

func (w *waiter) add(r *broker.Reply) {
	w.mu.Lock()
	w.entries = append(w.entries, *r)
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// decide looks at the entries not looked at yet, in order, for the one
// that settles the Request: a reply appended before deadline (any reply
// when there is none), or the Request's marker (ref marker, once it gave
// up). Other entries are replies that came too late, and earlier markers.
func (w *waiter) decide(deadline time.Time, marker string) (broker.Reply, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ; w.next < len(w.entries); w.next++ {
		e := w.entries[w.next]
		switch {
		case e.Kind == broker.KindReply && (deadline.IsZero() || e.At.Before(deadline)):
			return e, true
		case e.Kind == broker.KindTimeout && marker != "" && e.Ref == marker:
			return e, true
		}
	}
	return broker.Reply{}, false
}

// deliverOutcome hands an inbox entry to the Request that waits for it, if
// any (a Request that returned has gone).
func (d *Disker) deliverOutcome(r *broker.Reply) {
	d.waitMu.Lock()
	w := d.waiters[r.RequestID]
	d.waitMu.Unlock()
	if w != nil {
		w.add(r)
	}
}
