package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Route is where the reply to a message goes: the one thing a worker needs
// to know to answer it. It travels with the message (the wire encoding's
// flags) and is set on deliveries.
type Route uint8

// The routes of a message.
const (
	// RouteNone is a fire-and-forget message: nobody receives a reply.
	RouteNone Route = iota
	// RouteSender is a message from a named sender (Envelope.Sender):
	// replies go to the sender's reply stream (Replies.Reply), and a
	// timed message has a pending timeout under the sender, so that the
	// sender receives exactly one of a reply or a timeout notice.
	RouteSender
	// RouteInbox is a requester's message (disker's Request) from its
	// private address, the inbox Envelope.Sender: replies go through
	// Inbox.ReplyInbox, and the outcome of a timed one is decided in the
	// inbox, with no pending timeout (see Inbox).
	RouteInbox
)

// String returns "none", "sender" or "inbox".
func (r Route) String() string {
	switch r {
	case RouteNone:
		return "none"
	case RouteSender:
		return "sender"
	case RouteInbox:
		return "inbox"
	}
	return fmt.Sprintf("Route(%d)", r)
}

// SendParams are one message of Queue.Send: the message as it travels
// (Env), and the instructions that decide its journey, each a plain field
// that composes with every other. The broker carries out all of them in
// one atomic step per message: a message is never stored without its
// dedup or idempotency key, its pending timeout or its due time, nor a key
// or a pending timeout recorded for a message that was not stored.
//
// A new send option is one field here (and its check in Validate), its
// part of that step in each broker, and a case of brokertest's product of
// the options.
type SendParams struct {
	// Env is the message. Env.Route, Env.Timeout, Env.Priority and
	// Env.IdempotencyKey are part of the journey too, and travel with the
	// message: the worker reads them.
	Env Envelope

	// Delay, when > 0, sends the message for later: it is deferred, and
	// queued when Delay has passed in broker time (never before). Until
	// then it counts as deferred (ReceiverStats.Deferred) and can be
	// cancelled. A timed message's deadline is its due time plus
	// Env.Timeout.
	Delay time.Duration
	// TimeoutFrom, when not zero, is the local time (with its monotonic
	// reading) at which Env.Timeout was measured: a Request's is the time
	// left to its context's deadline, taken before the inbox was made ready
	// and the send reached the broker. A broker that sets an inbox
	// message's deadline (RouteInbox) counts Env.Timeout from then, not
	// from the send (TimeoutLeft), so that a send held up on its way (a
	// host stall, a slow inbox, a queued send) does not move the deadline
	// past the sender's.
	TimeoutFrom time.Time

	// DeliverAt, when not zero, defers the message until that broker time
	// (at most one of Delay and DeliverAt is set). A time that has passed
	// queues it at once, with its deadline counted from now.
	DeliverAt time.Time

	// DedupKey, when not empty, sends the message only if no message was
	// sent to Env.Receiver with the same key less than DedupTTL ago (broker
	// time); otherwise nothing is stored and the result is Duplicate, with
	// the id of the message that holds the key. A deferred message holds
	// its key from its send.
	DedupKey string
	// DedupTTL is the window of DedupKey, from the send that took it; > 0
	// when DedupKey is set.
	DedupTTL time.Duration
	// DedupUntilSettled holds DedupKey from the send until the message is
	// settled for good (acknowledged, dead-lettered, dropped, cancelled:
	// the consumer calls Queue.ReleaseDedup), DedupTTL at most. The broker sets
	// Env.DedupKey, so that the key travels with the message.
	DedupUntilSettled bool

	// DebounceKey, when not empty, debounces the message: it is deferred
	// by DebounceWait, and a later send with the same key to Env.Receiver,
	// while this message is still deferred, replaces it (this message is
	// dropped, never delivered) and is deferred by DebounceWait again, but
	// never past DebounceMax after the first send of the run. The run ends
	// when its message comes due; the next send starts another. It sets the
	// message's due time, so it goes without Delay and DeliverAt; and a
	// message it may replace has no outcome for a sender to wait for, and
	// never settles, so it goes without a Timeout, RouteInbox, an
	// idempotency key and DedupUntilSettled.
	DebounceKey  string
	DebounceWait time.Duration
	DebounceMax  time.Duration

	// Env.IdempotencyKey, when not empty, makes sends with the same key to
	// Env.Receiver one send for IdemTTL after the message's due time: the
	// first stores its message and takes the key; a later one stores
	// nothing and its result is Joined, with the key's message id and, once
	// a worker stored it (Idempotency.SettleIdempotent), the key's reply. A
	// later send from an inbox (RouteInbox) becomes a waiter of the key:
	// the key's reply is sent to it too. The key's message carries the end
	// of the key's window as its deadline, so that a worker starts it while
	// its reply can still be used.
	//
	// IdemTTL is how long the key lives after the message's due time; > 0
	// when Env.IdempotencyKey is set.
	IdemTTL time.Duration

	// GroupKey, when not empty, puts the message in its receiver's group of
	// that key: it runs after the messages of the key accepted before it,
	// as the receiver's GroupConfig says (see Groups).
	GroupKey string

	// Expiry, when > 0, expires the message Expiry after its due time
	// (broker time): one not started by then is never started (see
	// Delivery.Expiry and Queue.Drop). ExpireAt, when not zero, expires it
	// at that broker time instead (at most one of the two is set).
	Expiry   time.Duration
	ExpireAt time.Time

	// Retention, when > 0, keeps the message's fate for that long after
	// its final outcome (see Results): the send records it (state queued
	// or deferred) in the same step that stores the message, and the
	// broker sets Env.Retention, so that the retention travels with the
	// message. At most MaxRetention. A send that stores nothing
	// (Duplicate, Joined) records nothing.
	Retention time.Duration

	// Batch, when not empty, makes the message a child of that batch (see
	// Batches): its final outcome is recorded for the batch by the step
	// that settles it, which needs its retained result: Retention > 0.
	// The child must have been registered (Batches.AddBatchChildren).
	Batch string
	// BatchReply, with Batch, sends the child's reply (content and
	// headers, as its retained result keeps it) to the batch with its
	// outcome, in the same step, for a completion that takes it
	// (CreateBatchParams.ReplyAsContent: a chain's next step).
	BatchReply bool

	// Result is set by Send.
	Result SendResult
}

// SendOutcome is what Send did with a message.
type SendOutcome uint8

// The outcomes of a send.
const (
	// SendFailed: the message was not sent (Result.Err says why), or it is
	// unknown whether it was (an error wrapping ErrUnavailable; see Send).
	SendFailed SendOutcome = iota
	// Queued: the message is in its receiver's queue.
	Queued
	// Deferred: the message is stored for later, and is queued at its due
	// time.
	Deferred
	// Duplicate: SendParams.DedupKey was taken; nothing was stored, and
	// Result.ID is the id of the message sent with the key.
	Duplicate
	// Joined: Env.IdempotencyKey was in use; nothing was stored, and
	// Result.ID is the id of the key's message. Result.Reply is the key's
	// stored reply, if a worker stored one already.
	Joined
)

// String returns the outcome's name in lower case.
func (o SendOutcome) String() string {
	switch o {
	case SendFailed:
		return "failed"
	case Queued:
		return "queued"
	case Deferred:
		return "deferred"
	case Duplicate:
		return "duplicate"
	case Joined:
		return "joined"
	}
	return fmt.Sprintf("SendOutcome(%d)", o)
}

// SendResult is the result of one message of Queue.Send.
type SendResult struct {
	// Outcome says what was done with the message.
	Outcome SendOutcome
	// ID is the id of the message stored: Env.ID when it was Queued or
	// Deferred, the key's message's for Duplicate and Joined.
	ID string
	// Deadline is the message's deadline in broker time (its due time
	// plus Env.Timeout), zero when it has none. For a message from an
	// inbox it may be the broker's clock as the client estimates it
	// (within a round trip): it is set even with an error that leaves it
	// unknown whether the message was stored (see Send).
	Deadline time.Time
	// Reply is the stored reply of a Joined idempotency key, nil if none.
	Reply *Envelope
	// Err is the message's error when Outcome is SendFailed.
	Err error
}

// MaxDelay is the longest SendParams.Delay a broker accepts: 100 years.
const MaxDelay = 100 * 365 * 24 * time.Hour

// maxDeliverAt is the latest SendParams.DeliverAt accepted, in unix ms:
// the end of the year 9999.
const maxDeliverAt = 253402300799999

// MaxKeyLen is the longest dedup or idempotency key, in bytes.
const MaxKeyLen = 1024

// Validate returns an error naming the first field that is not valid.
// Content over the broker's size limit is checked by the broker
// (CheckSize).
func (p *SendParams) Validate() error {
	env := &p.Env
	switch {
	case env.Receiver == "":
		return empty("SendParams.Env.Receiver")
	case env.ID == "":
		return empty("SendParams.Env.ID")
	case env.Route > RouteInbox:
		return fmt.Errorf("broker: SendParams.Env.Route %v is not a route", env.Route)
	case env.Route != RouteNone && env.Sender == "":
		return fmt.Errorf("broker: SendParams.Env.Sender is empty, but route %v needs a reply address", env.Route)
	case env.Timeout < 0:
		return negative("SendParams.Env.Timeout", env.Timeout)
	case env.Timeout > 0 && env.Route == RouteNone:
		return errors.New("broker: SendParams.Env.Timeout is set on a message without a reply route: nobody would be told of its timeout")
	case env.Priority < PriorityLow || env.Priority > PriorityHigh:
		return fmt.Errorf("broker: SendParams.Env.Priority is %d, out of %d..%d", env.Priority, PriorityLow, PriorityHigh)
	case len(env.IdempotencyKey) > MaxKeyLen:
		return fmt.Errorf("broker: SendParams.Env.IdempotencyKey is %d bytes, over %d", len(env.IdempotencyKey), MaxKeyLen)
	case env.IdempotencyKey != "" && p.IdemTTL <= 0:
		return notPositive("SendParams.IdemTTL", p.IdemTTL)
	case p.Delay < 0:
		return negative("SendParams.Delay", p.Delay)
	case p.Delay > MaxDelay:
		return fmt.Errorf("broker: SendParams.Delay %v is over the limit of %v", p.Delay, MaxDelay)
	case p.Delay > 0 && !p.DeliverAt.IsZero():
		return errors.New("broker: SendParams.Delay and SendParams.DeliverAt are both set")
	case !p.DeliverAt.IsZero() && (p.DeliverAt.UnixMilli() <= 0 || p.DeliverAt.UnixMilli() > maxDeliverAt):
		return fmt.Errorf("broker: SendParams.DeliverAt %v is out of range", p.DeliverAt)
	case len(p.GroupKey) > MaxKeyLen:
		return fmt.Errorf("broker: SendParams.GroupKey is %d bytes, over %d", len(p.GroupKey), MaxKeyLen)
	case p.Expiry < 0:
		return negative("SendParams.Expiry", p.Expiry)
	case p.Expiry > 0 && !p.ExpireAt.IsZero():
		return errors.New("broker: SendParams.Expiry and SendParams.ExpireAt are both set")
	case !p.ExpireAt.IsZero() && (p.ExpireAt.UnixMilli() <= 0 || p.ExpireAt.UnixMilli() > maxDeliverAt):
		return fmt.Errorf("broker: SendParams.ExpireAt %v is out of range", p.ExpireAt)
	case p.DedupUntilSettled && p.DedupKey == "":
		return empty("SendParams.DedupKey (DedupUntilSettled)")
	case len(p.DebounceKey) > MaxKeyLen:
		return fmt.Errorf("broker: SendParams.DebounceKey is %d bytes, over %d", len(p.DebounceKey), MaxKeyLen)
	case p.DebounceKey != "" && p.DebounceWait <= 0:
		return notPositive("SendParams.DebounceWait", p.DebounceWait)
	case p.DebounceKey != "" && p.DebounceMax < p.DebounceWait:
		return fmt.Errorf("broker: SendParams.DebounceMax %v is less than DebounceWait %v", p.DebounceMax, p.DebounceWait)
	case p.DebounceKey != "" && p.Later():
		return errors.New("broker: SendParams.DebounceKey sets the due time: Delay and DeliverAt must not be set")
	case p.DebounceKey != "" && (env.Timeout > 0 || env.Route == RouteInbox):
		return errors.New("broker: SendParams.DebounceKey: a message that a later send may replace has no outcome to wait for: no Timeout, no RouteInbox")
	case p.DebounceKey != "" && (env.IdempotencyKey != "" || p.DedupUntilSettled):
		return errors.New("broker: SendParams.DebounceKey: a message that a later send may replace never settles, so it cannot hold an idempotency key or a dedup key until settled")
	case p.Retention < 0:
		return negative("SendParams.Retention", p.Retention)
	case p.Retention > 0 && p.Retention < time.Millisecond:
		return fmt.Errorf("broker: SendParams.Retention %v is under a millisecond", p.Retention)
	case p.Retention > MaxRetention:
		return fmt.Errorf("broker: SendParams.Retention %v is over the limit of %v", p.Retention, MaxRetention)
	case p.Retention > 0 && p.DebounceKey != "":
		return errors.New("broker: SendParams.Retention: a debounced message may be replaced and never settle: it keeps no result")
	case p.Batch != "" && CheckBatchID("SendParams.Batch", p.Batch) != nil:
		return CheckBatchID("SendParams.Batch", p.Batch)
	case p.Batch != "" && p.Retention <= 0:
		return errors.New("broker: SendParams.Batch: a child reports its outcome through its retained result: Retention must be > 0")
	case p.BatchReply && p.Batch == "":
		return errors.New("broker: SendParams.BatchReply is set without Batch")
	case len(p.DedupKey) > MaxKeyLen:
		return fmt.Errorf("broker: SendParams.DedupKey is %d bytes, over %d", len(p.DedupKey), MaxKeyLen)
	case p.DedupKey != "" && p.DedupTTL <= 0:
		return notPositive("SendParams.DedupTTL", p.DedupTTL)
	}
	return nil
}

// Later reports whether p sends its message for later (Delay or DeliverAt):
// the broker then decides, by its clock, whether it is due already.
func (p *SendParams) Later() bool { return p.Delay > 0 || !p.DeliverAt.IsZero() }

// Deferred reports whether p defers its message: Later, or debounced.
func (p *SendParams) Deferred() bool { return p.Later() || p.DebounceKey != "" }

// ValidateAll checks every message of a Send: the first that is not valid
// fails the call with an error naming its index (for a call of one
// message, Validate's error as it is), before anything is sent. Brokers
// call it first in Send, and return its error as it is.
func ValidateAll(ps []SendParams, maxSize int) error {
	for i := range ps {
		err := ps[i].Validate()
		if err == nil {
			if err = CheckSize(&ps[i].Env, maxSize); err != nil {
				err = fmt.Errorf("broker: %w", err)
			}
		}
		if err != nil {
			if len(ps) == 1 {
				return err
			}
			return fmt.Errorf("message %d: %w", i, err)
		}
	}
	return nil
}

// SendOne sends p alone (Queue.Send of one message) and returns its
// result, with the result's error as the error.
func SendOne(ctx context.Context, q Queue, p SendParams) (SendResult, error) {
	ps := []SendParams{p}
	if err := q.Send(ctx, ps); err != nil {
		return SendResult{}, err
	}
	return ps[0].Result, ps[0].Result.Err
}

// TimeoutLeft returns what is left of p.Env.Timeout now, counted from
// p.TimeoutFrom when it is set (at least a millisecond, so that the
// message keeps a deadline, one that has passed); Env.Timeout itself
// when it is not.
func (p *SendParams) TimeoutLeft() time.Duration {
	if p.TimeoutFrom.IsZero() || p.Env.Timeout <= 0 {
		return p.Env.Timeout
	}
	return max(p.Env.Timeout-time.Since(p.TimeoutFrom), time.Millisecond)
}
