package disker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// ErrReplyLater defers the reply when a handler returns it: the message is
// handled (acknowledged, not retried) and no reply is sent for it, so that
// a Reply from elsewhere, before the message's deadline, is the one its
// sender (or its Request) gets. A handler that returns it must make sure
// that Reply is called: otherwise the sender gets a timeout at the
// deadline, or, without one, waits for good.
var ErrReplyLater = errors.New("disker: the reply will be sent later with Reply")

// answeredFor is how long an instance remembers, past a message's deadline
// (from now, without one), that it replied to it, to refuse a second reply.
const answeredFor = time.Minute

// Reply sends response as the reply to msg, a message this instance
// received. It returns ErrFireAndForget for a fire-and-forget message (one
// without a Sender) and
// ErrLate when msg has a timeout and was already settled (it timed out, or
// was answered), or when msg came from a Request whose instance has gone:
// the reply was dropped.
//
// For a Request the reply is judged against the deadline msg was delivered
// with. A second reply to a message from the instance that replied first
// returns an error matching ErrLate that says the message was already
// answered (the instance remembers it until a minute after the deadline);
// one from another instance is not refused, but only the first reaches
// the requester.
//
// A message cancelled while in flight (Cancel, or its Request's ctx)
// gives its sender exactly one outcome, decided on the worker that holds
// it: the worker learns of the cancellation at its next poll of the
// cancellation marks (every quarter of a second), and then sends the
// sender a RemoteError with CodeCancelled unless a reply was sent first.
// So a reply made before the worker learned of the cancellation wins, and
// reaches the sender; one made after it is refused with ErrLate.
//
// A handler usually returns its response instead; Reply is for replying
// from elsewhere, or before the handler returns (a handler that replies
// later returns ErrReplyLater).
func (d *Disker) Reply(ctx context.Context, msg *Message, response []byte) error {
	// Not through call: reply runs after Close too, for the handlers that
	// Close drains; it records the broker's health itself.
	if d.closed.Load() {
		return ErrClosed
	}
	switch {
	case msg == nil:
		return invalid("Message", "must not be nil")
	case !msg.ExpectsReply():
		return ErrFireAndForget
	case msg.ID == "":
		return invalid("Message.ID", "must be set: reply to a received message")
	case len(response) > d.cfg.MaxMessageSize:
		return invalid("response", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(response), d.cfg.MaxMessageSize)
	}
	if _, dup := d.answered.LoadOrStore(msg.ID, struct{}{}); dup {
		return fmt.Errorf("disker: reply: message %s was already answered: %w", msg.ID, ErrLate)
	}
	err := d.reply(ctx, msg, response, "", "")
	if err != nil && !errors.Is(err, ErrLate) {
		d.answered.Delete(msg.ID) // not answered: it may be tried again
		return err
	}
	forget := answeredFor
	if !msg.Deadline.IsZero() {
		forget += max(time.Until(msg.Deadline), 0)
	}
	time.AfterFunc(forget, func() { d.answered.Delete(msg.ID) })
	return err
}

// repliedBy tells whether Reply answered msg from this instance.
func (d *Disker) repliedBy(msg *Message) bool {
	_, ok := d.answered.Load(msg.ID)
	return ok
}

// reply sends a reply (or an error reply when code is set) to msg's sender.
func (d *Disker) reply(ctx context.Context, msg *Message, response []byte, code, text string) error {
	if msg.settle != nil && code != CodeCancelled {
		// The delivery is settled by its first reply, unless it was
		// cancelled first: then the reply is dropped.
		if !msg.settle.CompareAndSwap(taskRunning, taskSettled) && msg.settle.Load() == taskCancelled {
			return d.countLate(msg)
		}
	}
	env := broker.Envelope{
		ID:        newID(),
		Sender:    msg.Receiver,
		Receiver:  msg.Sender,
		Content:   response,
		Headers:   msg.replyHeaders,
		InReplyTo: msg.ID,
		ErrorCode: code,
		ErrorText: text,
		Retention: msg.retention, // the broker may record the reply where it accepts it
	}
	var err error
	if msg.idemKey != "" {
		err = d.replyIdempotent(ctx, msg, &env)
	} else {
		err = d.replyRoute(ctx, msg, &env)
	}
	// No call here: a handler that Close drains still replies.
	switch err := d.record("reply", err); {
	case err == nil:
		msg.sentReply = &env
		if msg.retention > 0 {
			d.rememberReply(msg)
		}
		d.replied.Add(1)
		if d.onEvent != nil {
			d.emit(Event{Kind: EventReplied, Receiver: msg.Receiver, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt})
		}
		return nil
	case errors.Is(err, ErrLate):
		return d.countLate(msg)
	default:
		return err
	}
}

// rememberReply keeps msg.sentReply, accepted for a retained message, for
// the later attempts of msg on this instance (priorReply) until its final
// outcome is recorded (forgetReply), and at most until answeredFor after
// its deadline (from now, without one).
func (d *Disker) rememberReply(msg *Message) {
	d.sentReplies.Store(msg.ID, msg.sentReply)
	forget := answeredFor
	if !msg.Deadline.IsZero() {
		forget += max(time.Until(msg.Deadline), 0)
	}
	env := msg.sentReply
	time.AfterFunc(forget, func() { d.sentReplies.CompareAndDelete(msg.ID, env) })
}

// priorReply sets msg.sentReply, when none is set, to the reply an earlier
// attempt of msg on this instance had accepted and whose final outcome
// was not recorded (its acknowledgement failed, or the handler failed
// after its Reply): its sender got that reply, and a later attempt finds
// the message answered (its Reply is refused with ErrLate, or it is
// dropped after its deadline), so the result records that reply, not a
// timeout.
func (d *Disker) priorReply(msg *Message) {
	if msg.sentReply != nil {
		return
	}
	if v, ok := d.sentReplies.Load(msg.ID); ok {
		msg.sentReply = v.(*broker.Envelope)
	}
}

// forgetReply drops the reply kept for msg once its final outcome is
// recorded.
func (d *Disker) forgetReply(msg *Message) {
	if msg.sentReply != nil {
		d.sentReplies.CompareAndDelete(msg.ID, msg.sentReply)
	}
}

// countLate counts the reply to msg that came too late, reports it, and
// returns ErrLate.
func (d *Disker) countLate(msg *Message) error {
	d.late.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventLate, Receiver: msg.Receiver, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt, Err: ErrLate})
	}
	return ErrLate
}

// replyRoute sends env, the reply to msg, by msg's route: to a Request's
// inbox, where it counts if it is appended before the deadline (see
// broker.Inbox) and never re-creates an inbox that has gone; or to its
// sender's reply stream, settling its pending timeout if it has one. A
// fire-and-forget message's reply goes nowhere: ErrLate.
func (d *Disker) replyRoute(ctx context.Context, msg *Message, env *broker.Envelope) error {
	switch {
	case msg.route == broker.RouteInbox && msg.stream:
		// Settles the stream: no partial follows the final reply.
		return d.b.ReplyStream(ctx, env, msg.brokerDeadline)
	case msg.route == broker.RouteInbox:
		return d.b.ReplyInbox(ctx, env, msg.brokerDeadline)
	case !msg.ExpectsReply():
		return broker.ErrLate
	case msg.timeout > 0:
		return d.b.Reply(ctx, env, broker.ReplyTimed)
	}
	return d.b.Reply(ctx, env, broker.ReplyUntimed)
}

// replyIdempotent stores env as the reply of msg's idempotency key, unless
// a reply is stored already, and sends the stored reply by msg's own route
// (a named sender's; a Request's inbox is among the waiters) and to every
// Request waiting for the key, each by its own request id and judged
// against its own deadline (see broker.Idempotency). When the key is gone
// (its window passed) or holds a later message (a send took it after the
// window), env goes by msg's route alone. It returns nil when
// at least one of them accepted it, ErrLate when none did (all had given
// up, or nobody waits), and the broker's error when one failed.
func (d *Disker) replyIdempotent(ctx context.Context, msg *Message, env *broker.Envelope) error {
	stored, waiters, found, err := d.b.SettleIdempotent(ctx, msg.Receiver, msg.idemKey, env)
	if err != nil {
		return err
	}
	if !found {
		if msg.route == broker.RouteInbox {
			return broker.ErrLate
		}
		return d.replyRoute(ctx, msg, env)
	}
	errs := make([]error, len(waiters)+1)
	if msg.route == broker.RouteSender {
		own := stored
		own.ID, own.Receiver, own.InReplyTo = newID(), msg.Sender, msg.ID
		errs[len(waiters)] = d.replyRoute(ctx, msg, &own)
	} else {
		errs[len(waiters)] = broker.ErrLate
	}
	var wg sync.WaitGroup
	for i, w := range waiters {
		e := stored
		e.ID, e.Receiver, e.InReplyTo = newID(), w.Inbox, w.RequestID
		e.Retention = 0 // a joined request has no record of its own
		if w.RequestID == msg.ID {
			e.Retention = msg.retention
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.b.ReplyInbox(ctx, &e, w.Deadline)
		}()
	}
	wg.Wait()
	err = broker.ErrLate
	for _, e := range errs {
		switch {
		case e == nil:
			if err == broker.ErrLate {
				err = nil
			}
		case !errors.Is(e, broker.ErrLate):
			return e
		}
	}
	return err
}
