// Package broker defines the storage engine behind package disker: the
// operations a broker must provide atomically, and the types they exchange.
//
// Two brokers implement it: internal/redisbroker (Redis Streams and Lua
// scripts, the distributed engine) and internal/membroker (in one process,
// the embedded default). Both pass the conformance suite in
// internal/broker/brokertest.
//
// Time that decides outcomes (deadlines, leases) is the broker's clock: Redis
// server time for Redis. All times exchanged here are broker times.
package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors a broker returns. Callers check them with errors.Is.
var (
	// ErrLate is returned by Reply when the request has already been settled
	// (timed out, or replied to), and by ReplyInbox when the request's
	// deadline passed or the inbox is gone: the reply was dropped.
	ErrLate = errors.New("disker: reply is late: the request already timed out or was answered")
	// ErrLeaseLost is returned when the caller no longer holds the lease of a
	// delivery (it expired and another consumer may have it).
	ErrLeaseLost = errors.New("disker: lease lost")
	// ErrUnavailable wraps errors from a broker that cannot be reached.
	ErrUnavailable = errors.New("disker: broker unavailable")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("disker: broker closed")
)

// InboxPrefix starts the names of private reply addresses, inboxes:
// senders that only the process sending from them reads (disker's Request
// uses "_inbox." and the instance id), whose state the process bounds with
// ExpireSender.
//
// A timed request from an inbox has no pending timeout in the broker. Its
// outcome is decided by the order of the inbox's reply stream, whose
// entries carry the broker time at which they were appended (Reply.At):
// ReplyInbox appends a reply and accepts it only if its time is before the
// deadline, and the requester, when it gives up, appends a marker
// (GiveUp). Every accepted reply is in the stream before any marker at or
// after the deadline, so the one reader, reading in order, sees the first
// accepted reply before such a marker, or the marker alone: exactly one
// outcome, decided by broker time.
const InboxPrefix = "_inbox."

// Envelope is a message as a broker stores and moves it.
type Envelope struct {
	// ID is the message id, unique across all messages; set by the client.
	ID string
	// Sender is the sender's name, its reply address. May be empty for a
	// fire-and-forget message.
	Sender string
	// Receiver is the name of the receiver the message is sent to.
	Receiver string
	// Content is the payload.
	Content []byte
	// Headers are optional key/value metadata.
	Headers map[string]string
	// FireAndForget means no reply is expected: Reply to it is an error.
	FireAndForget bool
	// Timeout, when > 0, gives the message a deadline of broker-now+Timeout
	// at Send; the sender then receives exactly one of a reply or a timeout
	// notice.
	Timeout time.Duration
	// InReplyTo is set on replies: the id of the request answered.
	InReplyTo string
	// ErrorCode and ErrorText carry a remote error in a reply envelope
	// (for instance, a request that was dead-lettered). Empty on success.
	ErrorCode string
	ErrorText string
}

// Delivery is one leased delivery of a message to a consumer.
type Delivery struct {
	// Env is the decoded message.
	Env Envelope
	// Ref is the broker's handle of this queue entry (a Redis stream id):
	// pass it to Ack, Extend, Retry and DeadLetter.
	Ref string
	// Deadline is the message's deadline in broker time; zero means none.
	Deadline time.Time
	// Attempt is 1 on the first delivery and grows with each redelivery
	// (after a Retry, or after a lease expired).
	Attempt int
}

// ReplyKind tells a reply from a timeout notice.
type ReplyKind int

// The kinds of entry in a sender's reply stream.
const (
	// KindReply is a reply from a worker; Env is the reply envelope.
	KindReply ReplyKind = 1
	// KindTimeout is a timeout notice; Env is the original message.
	KindTimeout ReplyKind = 2
)

// ReplyMode tells Reply how to decide whether a reply is accepted.
type ReplyMode int

// The modes of Reply.
const (
	// ReplyUntimed is for a request without a timeout from a durable sender
	// (one whose state ExpireSender does not manage): the reply is always
	// appended, creating the sender's reply stream if need be, and waits
	// there for the sender's next reader.
	ReplyUntimed ReplyMode = iota
	// ReplyTimed is for a request with a timeout from a sender that is not
	// an inbox (replies to an inbox use ReplyInbox): one atomic step accepts
	// the reply only if the request is still pending and its deadline has
	// not passed (broker time), settling it; otherwise ErrLate.
	ReplyTimed
)

// Reply is an entry of a sender's reply stream.
type Reply struct {
	// Ref is the broker's handle of the entry, for AckReplies.
	Ref string
	// Kind says whether this is a reply or a timeout notice.
	Kind ReplyKind
	// RequestID is the id of the message this answers.
	RequestID string
	// Env is the reply envelope (KindReply) or the original message
	// (KindTimeout; for an inbox's marker, only its ID and Sender).
	Env Envelope
	// At is the broker time at which the entry was appended, to the
	// broker's precision (milliseconds for Redis). Within a reply stream it
	// never decreases from one entry to the next.
	At time.Time
}

// DeadLetter is an entry of a receiver's dead-letter stream.
type DeadLetter struct {
	// Ref is the broker's handle of the dead-letter entry.
	Ref string
	// Env is the message. For an entry that could not be decoded, Env.ID is
	// empty and Raw holds the bytes as found.
	Env Envelope
	// Raw is the undecodable payload, if any.
	Raw []byte
	// Reason says why the message was dead-lettered.
	Reason string
	// Attempts is how many deliveries were made.
	Attempts int
	// At is when it was dead-lettered (broker time).
	At time.Time
}

// WorkerInfo describes a live instance for the registry of workers.
type WorkerInfo struct {
	ID          string         `json:"id"`
	Host        string         `json:"host"`
	PID         int            `json:"pid"`
	Receivers   []string       `json:"receivers"`
	Concurrency map[string]int `json:"concurrency"`
	InFlight    int64          `json:"in_flight"`
	Processed   int64          `json:"processed"`
	Failed      int64          `json:"failed"`
	StartedAt   time.Time      `json:"started_at"`
	// LastSeen is set by the broker on Heartbeat (broker time).
	LastSeen time.Time `json:"last_seen"`
}

// ReceiverStats is a snapshot of one receiver's queue.
type ReceiverStats struct {
	Receiver    string
	Queued      int64 // entries in the queue not yet delivered
	Pending     int64 // delivered, not yet acknowledged (in flight or awaiting redelivery)
	DeadLetters int64
	Length      int64 // all entries in the queue stream (queued + pending)
}

// Broker is the storage engine: the composition of one small interface
// per concern. Every method is safe for concurrent use. Each state change
// that must be atomic is one atomic step in the broker.
//
// A new operation (a delayed send, a priority, a dedup key, a pause) is one
// method on the interface of its concern (or a new interface embedded
// here), one params type with a Validate in params.go when it takes more
// than three arguments, and one case in brokertest that every broker runs.
type Broker interface {
	Clock
	Queue
	Replies
	DeadLetters
	Locks
	Registry
	Admin

	// Close releases the broker's resources. Calls after Close return
	// ErrClosed.
	Close() error
}

// Clock is the broker's time, which decides deadlines and leases.
type Clock interface {
	// Now returns the broker's clock.
	Now(ctx context.Context) (time.Time, error)
}

// Queue is a receiver's queue: sending, leased delivery, and the end of a
// delivery (ack, retry, dead letter).
type Queue interface {
	// Send queues env for env.Receiver in one atomic step. If env.Timeout > 0
	// it also records, in the same step, a pending timeout under env.Sender
	// with deadline broker-now+Timeout, and returns that deadline; otherwise
	// the zero time. From an inbox (InboxPrefix) it records no pending
	// timeout (see InboxPrefix), and broker-now may be the broker's clock as
	// this client estimates it (within a round trip); then, when an error
	// wrapping ErrUnavailable leaves it unknown whether env was queued (the
	// connection broke after the write, and the answer was lost), Send
	// still returns the deadline env would carry, for the requester to
	// settle the request; with an error that leaves env surely not queued
	// (no connection could be made), the zero time.
	Send(ctx context.Context, env *Envelope) (deadline time.Time, err error)

	// SendBatch sends each of envs as Send would, each in its own atomic
	// step, in as few round trips as the broker can; the batch as a whole
	// is not atomic. It returns the deadline of each (zero for untimed
	// ones). When some could not be sent it returns a *BatchError whose
	// Errs[i] is envs[i]'s error (nil for those sent). An envelope that
	// fails the checks of Send fails the whole call before anything is
	// sent, with a plain error naming its index.
	SendBatch(ctx context.Context, envs []*Envelope) (deadlines []time.Time, err error)

	// Fetch leases up to max messages of receiver to consumer for lease: first
	// messages whose lease expired (or whose retry delay passed), then new
	// ones. It blocks up to block when there is nothing; block 0 does not
	// block. A message delivered more than maxAttempts times, or one that
	// does not decode, is moved to the dead-letter stream instead of being
	// returned. It returns an empty slice, not an error, when nothing came.
	Fetch(ctx context.Context, p *FetchParams) ([]Delivery, error)

	// Extend renews the leases of refs held by consumer. It returns the refs
	// whose lease was lost (the consumer no longer holds them).
	Extend(ctx context.Context, p *ExtendParams) (lost []string, err error)

	// Ack removes delivered messages for good.
	Ack(ctx context.Context, receiver string, refs ...string) error

	// Retry gives up consumer's lease on ref so that the message is delivered
	// again after delay. ErrLeaseLost if consumer does not hold it.
	Retry(ctx context.Context, p *RetryParams) error

	// DeadLetter atomically removes ref from the queue and appends the
	// message to the receiver's dead-letter stream with reason.
	DeadLetter(ctx context.Context, receiver string, d Delivery, reason string) error
}

// Replies is a named sender's reply stream: replies, timeout notices, and
// the pending timeouts that produce them.
type Replies interface {
	// Reply delivers reply (reply.Receiver is the original sender,
	// reply.InReplyTo the request id) to the sender's reply stream, if mode
	// accepts it (see ReplyMode); otherwise it writes nothing and returns
	// ErrLate.
	Reply(ctx context.Context, reply *Envelope, mode ReplyMode) error

	// ExpireTimeouts settles up to max pending timeouts of sender whose
	// deadline has passed, appending a timeout notice for each to the
	// sender's reply stream. It returns how many it settled.
	ExpireTimeouts(ctx context.Context, sender string, max int) (int, error)

	// ReplyInbox appends reply (reply.Receiver is an inbox, see
	// InboxPrefix; reply.InReplyTo the request id) to the inbox's reply
	// stream while the inbox is open (see ExpireSender). It returns ErrLate
	// when the inbox is not open, and writes nothing then; and when
	// deadline is not zero and the entry's time (Reply.At) is not before
	// it: the entry stays in the stream, where the requester ignores it.
	// A reply accepted before the deadline is not exclusive: a second
	// reply to the same request is accepted too, and the requester takes
	// the first.
	ReplyInbox(ctx context.Context, reply *Envelope, deadline time.Time) error

	// GiveUp appends to the reply stream of inbox, while it is open, a
	// marker for request id (Kind KindTimeout, Env holding the id), and
	// returns the entry as ReadReplies will return it. A requester that
	// stops waiting calls it: its outcome is the first reply before its
	// deadline that precedes the marker in the stream, if any, else the
	// marker. A marker at or after the deadline therefore settles the
	// request for good. It returns ErrLate when the inbox is not open.
	GiveUp(ctx context.Context, inbox, id string) (Reply, error)

	// ExpireSender bounds the life of sender's state: its reply stream
	// (with the entries not yet acknowledged) and its pending timeouts
	// (with their messages) are deleted ttl from now, broker time, unless
	// ExpireSender is called again before; a later call replaces the
	// expiry. State that sender's timed Sends add meanwhile expires with
	// the rest. With ttl > 0 it also opens sender's reply address: the
	// reply stream exists from then on (so that ReplyInbox and GiveUp
	// accept entries) until it expires. ttl 0 deletes the state now and
	// closes the address.
	//
	// It is for private reply addresses that live as long as their owner,
	// which calls it again while alive (disker's inbox: at each
	// heartbeat, and with 0 on Close). Once the state is gone, ReplyInbox,
	// GiveUp and a ReplyTimed reply to sender return ErrLate and write
	// nothing, ExpireTimeouts finds nothing pending, and ReadReplies finds
	// nothing; a ReplyUntimed reply would re-create the reply stream for
	// good, so replies to such a sender must not use it.
	// Dead letters of sender (reply-stream entries that were not replies,
	// written by a foreign writer) are not part of it.
	ExpireSender(ctx context.Context, sender string, ttl time.Duration) error

	// ReadReplies reads up to max entries of sender's reply stream for
	// consumer (instances of one sender share the stream as competing
	// consumers), blocking up to block. Entries must be acknowledged with
	// AckReplies; unacknowledged ones are redelivered after lease. The reply
	// stream of an inbox (InboxPrefix) has one reader: a broker delivers
	// each of its entries once, in the order they were appended, and its
	// AckReplies may remove every entry up to the newest ref given.
	ReadReplies(ctx context.Context, p *ReadRepliesParams) ([]Reply, error)

	// AckReplies removes entries of sender's reply stream.
	AckReplies(ctx context.Context, sender string, refs ...string) error
}

// DeadLetters is a receiver's dead-letter stream.
type DeadLetters interface {
	// DeadLetters lists up to max dead letters of receiver, oldest first.
	DeadLetters(ctx context.Context, receiver string, max int) ([]DeadLetter, error)
	// RetryDeadLetters moves the given dead letters (all when refs is empty)
	// back to the receiver's queue, with attempts reset. It returns how many
	// moved. Undecodable entries stay.
	RetryDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error)
	// PurgeDeadLetters deletes the given dead letters (all when refs is
	// empty) and returns how many it deleted.
	PurgeDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error)
}

// Locks are the exclusive locks of receivers (a receiver served by one
// worker at a time).
type Locks interface {
	// Acquire takes or renews the exclusive lock of receiver for owner for
	// ttl. It returns false when another owner holds it.
	Acquire(ctx context.Context, receiver, owner string, ttl time.Duration) (bool, error)
	// Release gives up owner's lock of receiver, if held.
	Release(ctx context.Context, receiver, owner string) error
}

// Registry is the registry of live workers.
type Registry interface {
	// Heartbeat records info as live for ttl.
	Heartbeat(ctx context.Context, info WorkerInfo, ttl time.Duration) error
	// Deregister removes a worker from the registry.
	Deregister(ctx context.Context, id string) error
}

// Admin answers what an operator asks: the live workers, the receivers,
// and a receiver's queue.
type Admin interface {
	// Workers lists the live workers.
	Workers(ctx context.Context) ([]WorkerInfo, error)

	// Receivers lists the receivers known to the broker (registered by a
	// worker, or holding messages or dead letters).
	Receivers(ctx context.Context) ([]string, error)
	// Stats returns a snapshot of receiver's queue.
	Stats(ctx context.Context, receiver string) (ReceiverStats, error)
}

// BatchError is SendBatch's error when some envelopes were not sent.
type BatchError struct {
	// Errs[i] is the error of the batch's envelope i, nil if it was sent.
	Errs []error
}

// Error says how many failed, and the first failure.
func (e *BatchError) Error() string {
	n, first := 0, -1
	for i, err := range e.Errs {
		if err != nil {
			n++
			if first < 0 {
				first = i
			}
		}
	}
	if n == 0 {
		return "batch: nothing failed"
	}
	return fmt.Sprintf("%d of %d messages not sent; message %d: %v", n, len(e.Errs), first, e.Errs[first])
}

// Unwrap returns the errors of the envelopes that failed, so that
// errors.Is and errors.As look at each of them.
func (e *BatchError) Unwrap() []error {
	var errs []error
	for _, err := range e.Errs {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// CheckSend returns an error when env cannot be sent: nil, no receiver or
// id, a negative timeout, a timeout without a sender to notify, or content
// over maxSize bytes (the broker's MaxMessageSize). Brokers call it first
// in Send and SendBatch. The error names the field; callers add their
// package prefix.
func CheckSend(env *Envelope, maxSize int) error {
	switch {
	case env == nil:
		return errors.New("envelope is nil")
	case env.Receiver == "":
		return errors.New("Envelope.Receiver is empty")
	case env.ID == "":
		return errors.New("Envelope.ID is empty")
	case env.Timeout < 0:
		return fmt.Errorf("Envelope.Timeout is negative: %v", env.Timeout)
	case env.Timeout > 0 && env.Sender == "":
		return errors.New("Envelope.Sender is empty, but a message with a Timeout needs a reply address")
	}
	return CheckSize(env, maxSize)
}

// CheckSize returns an error when env's content is over max bytes (the
// broker's MaxMessageSize). Callers add their package prefix.
func CheckSize(env *Envelope, max int) error {
	if len(env.Content) > max {
		return fmt.Errorf("Envelope.Content is %d bytes, over the limit of %d (MaxMessageSize)", len(env.Content), max)
	}
	return nil
}
