package disker

import (
	"context"
	"errors"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// CancelResult says what Cancel found.
type CancelResult int

// The results of Cancel.
const (
	// CancelNotFound: the message is not deferred, queued or being
	// handled: it was handled already, dead-lettered, cancelled before,
	// or never sent to that receiver. Nothing changed.
	CancelNotFound CancelResult = iota
	// CancelDeferred: the message was deferred (WithDelay,
	// WithDeliverAt), not due yet; it will never be delivered.
	CancelDeferred
	// CancelQueued: the message was queued; it will never be delivered.
	CancelQueued
	// CancelInFlight: a worker is handling the message. It will not be
	// delivered again, and its handler's context is cancelled with the
	// cause ErrCancelled at the worker's next poll of the cancellations
	// (every quarter of a second). Unless the handler replied before that
	// poll, its reply is dropped (the replier gets ErrLate) and the sender
	// gets a RemoteError with CodeCancelled instead (see Reply).
	CancelInFlight
)

// CancelScheduled is CancelDeferred, under its former name.
//
// Deprecated: use CancelDeferred. "Schedule" names the periodic schedules
// (Schedule) alone.
const CancelScheduled = CancelDeferred

// String returns "not found", "deferred", "queued" or "in flight".
func (r CancelResult) String() string {
	switch r {
	case CancelNotFound:
		return "not found"
	case CancelDeferred:
		return "deferred"
	case CancelQueued:
		return "queued"
	case CancelInFlight:
		return "in flight"
	}
	return "unknown"
}

// cancelScan is the most queue entries Cancel reads to find a message.
const cancelScan = 100_000

// cancelSince is how long before its id's time Cancel starts reading the
// queue for a message: the margin for the sender's clock.
const cancelSince = 10 * time.Minute

// Cancel cancels message id (as Send, SendBatch or a handler's
// Message.ID gave it) sent to receiver, in one atomic step in the broker.
// A scheduled or queued message is never delivered; one being handled is
// not delivered again, and its handler's context ends with the cause
// ErrCancelled (see CancelInFlight). The sender of a message that expects
// a reply gets exactly one outcome: the reply if the handler replied
// first, else a RemoteError with CodeCancelled (which matches
// ErrCancelled), sent by Cancel for a scheduled or queued message and by
// the worker for one in flight. A message whose worker dies after the
// cancellation is not delivered again; its sender gets a timeout notice
// if it has a timeout.
//
// Cancelling an id that is not scheduled, queued or in flight (handled,
// dead-lettered, unknown) changes nothing and returns CancelNotFound. A
// malformed id is a *ValidationError. Cancel reads up to 100,000 queue
// entries to find a queued message.
func (d *Disker) Cancel(ctx context.Context, receiver, id string) (CancelResult, error) {
	return d.cancel(ctx, receiver, id, true)
}

// cancel cancels message id of receiver; notify sends the cancelled
// notice to the sender of a scheduled or queued message that expects a
// reply.
func (d *Disker) cancel(ctx context.Context, receiver, id string, notify bool) (CancelResult, error) {
	if err := checkName("receiver", receiver); err != nil {
		return CancelNotFound, err
	}
	at, ok := idTime(id)
	if !ok {
		return CancelNotFound, invalid("id", "%q is not a message id (26 characters of Crockford base32, as Send returns)", id)
	}
	since := at.Add(-cancelSince) // a bound, not a decision: the sender's clock is close enough
	c, err := call(d, "cancel", func() (broker.Cancelled, error) {
		return d.b.Cancel(ctx, &broker.CancelParams{Receiver: receiver, ID: id, Since: since, MaxScan: cancelScan})
	})
	if err != nil {
		return CancelNotFound, err
	}
	res := CancelResult(c.State)
	if res != CancelNotFound {
		d.releaseDedup(receiver, &c.Env)
	}
	if notify && (res == CancelDeferred || res == CancelQueued) && c.Env.Sender != "" && c.Env.Route != broker.RouteNone {
		msg := d.messageOf(&c.Env, c.Deadline, 0)
		err := d.reply(context.WithoutCancel(ctx), msg, nil, CodeCancelled, ErrCancelled.Error())
		if err != nil && !errors.Is(err, ErrLate) {
			d.log.Warn("disker: cannot tell the sender that its message was cancelled", "receiver", receiver, "id", id, "error", err)
		}
		d.recordReply(context.WithoutCancel(ctx), msg)
	}
	return res, nil
}
