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
	// ErrPartialCap is returned by Streams.Partial when the attempt has
	// appended PartialParams.Max partials already: nothing is written.
	ErrPartialCap = errors.New("disker: too many partial replies")
)

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
	// Route is where a reply to the message goes (none: fire-and-forget;
	// a named sender; a requester's inbox). It travels with the message.
	Route Route
	// Timeout, when > 0, gives the message a deadline of its due time +
	// Timeout (broker time); the sender then receives exactly one of a
	// reply or a timeout notice. It travels with the message.
	Timeout time.Duration
	// InReplyTo is set on replies: the id of the request answered.
	InReplyTo string
	// ErrorCode and ErrorText carry a remote error in a reply envelope
	// (for instance, a request that was dead-lettered). Empty on success.
	ErrorCode string
	ErrorText string
	// IdempotencyKey is the message's idempotency key (see
	// SendParams.IdemTTL): its reply is stored under the key and sent to
	// the key's waiters (Idempotency.SettleIdempotent). It travels with
	// the message.
	IdempotencyKey string
	// DedupKey is set on a message sent with a dedup key held until it is
	// settled (SendParams.DedupUntilSettled): the consumer that settles
	// the message for good frees the key (Queue.Release). It travels with
	// the message.
	DedupKey string
	// Retention, when > 0, keeps the message's fate for that long after
	// its final outcome (SendParams.Retention; see Results). It travels
	// with the message.
	Retention time.Duration
	// Priority is the message's level in its receiver's queue, from
	// PriorityLow to PriorityHigh; 0 (PriorityNormal) is the default. A
	// fetch takes every waiting message of a higher level before any of a
	// lower one. The broker keeps it with the message (it is not part of
	// the wire encoding) and sets it on deliveries and dead letters.
	Priority int
	// Stream is set on a message from an inbox (RouteInbox) whose
	// requester reads partial replies: its partials and its final reply
	// go through Streams, so that no partial follows the final outcome.
	// It travels with the message.
	Stream bool
}

// The priority levels of a message (Envelope.Priority).
const (
	PriorityLow    = -1
	PriorityNormal = 0
	PriorityHigh   = 1
)

// Delivery is one leased delivery of a message to a consumer.
type Delivery struct {
	// Env is the decoded message.
	Env Envelope
	// Ref is the broker's handle of this queue entry (a Redis stream id):
	// pass it to Ack, Extend, Retry and DeadLetter.
	Ref string
	// Deadline is the message's deadline in broker time; zero means none.
	Deadline time.Time
	// GroupKey is the message's group key (SendParams.GroupKey), or "".
	GroupKey string
	// Expiry is when the message expires (SendParams.Expiry, ExpireAt),
	// broker time; zero means never. A consumer does not start a message
	// whose expiry, or deadline, has passed: it drops it (Queue.Drop).
	Expiry time.Time
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
	// KindPartial is a partial reply to a streamed request (Streams.Partial)
	// in an inbox's reply stream; Env.Content is its data, Env.InReplyTo
	// the request id, and Reply.Attempt and Reply.Part say more.
	KindPartial ReplyKind = 3
)

// PartKind tells what a partial reply (KindPartial) carries, so that more
// than one kind of part can share a request's stream.
type PartKind int

// The kinds of partial reply.
const (
	// PartData is a piece of the reply, as the handler sends it.
	PartData PartKind = 1
	// PartProgress is the handler's progress (disker's Message.Progress),
	// not a piece of the reply.
	PartProgress PartKind = 2
)

// ReplyMode tells Reply how to decide whether a reply is accepted.
type ReplyMode int

// The modes of Reply.
const (
	// ReplyUntimed is for a request without a timeout from a named sender
	// (not an inbox: replies to an inbox use ReplyInbox): the reply is always
	// appended, creating the sender's reply stream if need be, and waits
	// there for the sender's next reader.
	ReplyUntimed ReplyMode = iota
	// ReplyTimed is for a request with a timeout from a named sender (not
	// an inbox): one atomic step accepts
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
	// Attempt and Part are set on a partial reply (KindPartial): the
	// delivery attempt of the handler that sent it, and its kind.
	Attempt int
	Part    PartKind
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
	// The cluster-wide limits of the receivers that have them.
	GlobalConcurrency map[string]int     `json:"global_concurrency,omitempty"`
	RateLimit         map[string]float64 `json:"rate_limit,omitempty"`
	RateBurst         map[string]int     `json:"rate_burst,omitempty"`
	InFlight          int64              `json:"in_flight"`
	Processed         int64              `json:"processed"`
	Failed            int64              `json:"failed"`
	StartedAt         time.Time          `json:"started_at"`
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
	// Deferred counts the messages sent for later (SendParams.Delay,
	// DeliverAt) that are not due yet: they are in none of the above.
	Deferred int64
	// OldestQueued is when the oldest entry not yet delivered was queued
	// (broker time); zero when none waits.
	OldestQueued time.Time
	// Paused reports whether the receiver is paused (Pauses.Pause).
	Paused bool
	// QueuedHigh and QueuedLow are the entries of Queued at PriorityHigh
	// and PriorityLow (the rest are at PriorityNormal).
	QueuedHigh, QueuedLow int64
	// Expired counts the messages dropped unstarted because their expiry
	// or deadline had passed (Queue.Drop), by every consumer, ever.
	Expired int64
	// GroupWaiting counts the keyed messages waiting behind their key (see
	// Groups), in none of the counts above; GroupKeys counts the keys that
	// have some (Groups.BusiestGroups lists them).
	GroupWaiting, GroupKeys int64
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
	Inbox
	Streams
	DeadLetters
	Locks
	Registry
	Admin
	Inspect
	Pauses
	Idempotency
	Schedules
	Limits
	Cancels
	Groups
	Results
	Batches
	BatchIndex

	// Close releases the broker's resources. Calls after Close return
	// ErrClosed.
	Close() error
}

// Clock is the broker's time, which decides deadlines and leases.
type Clock interface {
	// Now returns the broker's clock, and measures the offset of the local
	// clock to it (see Offset).
	Now(ctx context.Context) (time.Time, error)
	// Local turns broker time t into local time by the offset estimated
	// from the readings of Now (see Offset); the zero time stays zero.
	Local(t time.Time) time.Time
}

// Queue is a receiver's queue: sending, leased delivery, and the end of a
// delivery (ack, retry, dead letter).
type Queue interface {
	// Send sends each message of ps in one atomic step of its own (see
	// SendParams), in as few round trips as the broker can, and sets each
	// one's Result; the call as a whole is not atomic, but messages to one
	// receiver are stored in the order of ps. It returns an error, and
	// sends nothing, when a message fails ValidateAll, or after Close;
	// otherwise each message's error is its Result.Err (SendFailed). For a
	// message from an inbox, an error wrapping ErrUnavailable that leaves
	// it unknown whether the message was stored (the connection broke
	// after the write, and the answer was lost) comes with its deadline
	// set, for the requester to settle the request; an error that leaves
	// it surely not stored (no connection could be made) with the zero
	// deadline.
	Send(ctx context.Context, ps []SendParams) error

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

	// Drop removes delivered messages for good, as Ack does, that were
	// not started because their expiry or deadline had passed, and counts
	// them in the receiver's ReceiverStats.Expired.
	Drop(ctx context.Context, receiver string, refs ...string) error

	// ReleaseDedup frees receiver's dedup key if message id holds it: the
	// message, sent with SendParams.DedupUntilSettled, was settled for
	// good. A key that another message took since (after its ttl) stays.
	ReleaseDedup(ctx context.Context, receiver, key, id string) error

	// Retry gives up consumer's lease on ref so that the message is delivered
	// again after delay. ErrLeaseLost if consumer does not hold it.
	Retry(ctx context.Context, p *RetryParams) error

	// DeadLetter atomically removes ref from the queue and appends the
	// message to the receiver's dead-letter stream with reason.
	DeadLetter(ctx context.Context, receiver string, d Delivery, reason string) error
}

// Replies is a named sender's reply stream: replies, timeout notices, and
// the pending timeouts that produce them. (A requester's private address
// is an Inbox.)
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

	// ReadReplies reads up to max entries of sender's reply stream for
	// consumer (instances of one sender share the stream as competing
	// consumers), blocking up to block. Entries must be acknowledged with
	// AckReplies; unacknowledged ones are redelivered after lease.
	ReadReplies(ctx context.Context, p *ReadRepliesParams) ([]Reply, error)

	// AckReplies removes entries of sender's reply stream.
	AckReplies(ctx context.Context, sender string, refs ...string) error
}

// Inbox is the private reply address of a requester (disker's Request):
// an address that only the process that opened it reads, whose state lives
// as long as that process keeps it open.
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
type Inbox interface {
	// KeepInbox opens inbox, or renews it: its reply stream exists from
	// then on (so that ReplyInbox and GiveUp accept entries) and is deleted,
	// with the entries not yet acknowledged, ttl (> 0) from now, broker
	// time, unless KeepInbox is called again before; a later call replaces
	// the expiry. The owner calls it while alive (disker: at each
	// heartbeat), so the state of a crashed owner vanishes by itself.
	KeepInbox(ctx context.Context, inbox string, ttl time.Duration) error

	// CloseInbox deletes inbox's state now and closes it. Once the state
	// is gone (closed, or expired), ReplyInbox and GiveUp return ErrLate
	// and write nothing, and ReadInbox finds nothing.
	CloseInbox(ctx context.Context, inbox string) error

	// ReplyInbox appends reply (reply.Receiver is the inbox of the request
	// reply.InReplyTo, whose Envelope.FromInbox was set) to the inbox's
	// reply stream while the inbox is open (see KeepInbox). It returns ErrLate
	// when the inbox is not open, and writes nothing then; and when
	// deadline is not zero and the entry's time (Reply.At) is not before
	// it: the entry stays in the stream, where the requester ignores it.
	// A reply accepted before the deadline is not exclusive: a second
	// reply to the same request is accepted too, and the requester takes
	// the first. An accepted reply with a Retention (> 0) from a named
	// Sender (the request's receiver) is recorded on the request's record
	// (Results) as the reply its requester received, as FinishResult
	// records one, without a final state; a late one is not. The append
	// and the record are one atomic step when the broker can make them
	// one; otherwise the record follows the append.
	ReplyInbox(ctx context.Context, reply *Envelope, deadline time.Time) error

	// GiveUp appends to the reply stream of inbox, while it is open, a
	// marker for request id (Kind KindTimeout, Env holding the id), and
	// returns the entry as ReadInbox will return it. A requester that
	// stops waiting calls it: its outcome is the first reply before its
	// deadline that precedes the marker in the stream, if any, else the
	// marker. A marker at or after the deadline therefore settles the
	// request for good. It returns ErrLate when the inbox is not open.
	GiveUp(ctx context.Context, inbox, id string) (Reply, error)

	// ReadInbox reads up to max entries of inbox's reply stream, blocking
	// up to block. The inbox has one reader: a broker delivers each of its
	// entries once, in the order they were appended.
	ReadInbox(ctx context.Context, inbox string, max int, block time.Duration) ([]Reply, error)

	// AckInbox removes entries of inbox's reply stream that were read: it
	// may remove every entry up to the newest ref given.
	AckInbox(ctx context.Context, inbox string, refs ...string) error
}

// Streams are the partial replies of a streamed request from an inbox (a
// message with Envelope.Stream set): entries of the inbox's reply stream
// before the request's final outcome, and never after it.
//
// A streamed request has a state of its own in the broker, in the inbox's
// slot: the highest attempt that sent partials, how many that attempt
// sent, and whether the request is settled. Partial appends a partial only
// while the request is not settled, its deadline has not passed (broker
// time) and no later attempt has sent partials; ReplyStream and
// GiveUpStream append the final entry and settle the request in the same
// atomic step. So every partial in the stream precedes the entry that
// decides the request. The state lives while the inbox does, and is
// renewed by each call.
type Streams interface {
	// Partial appends the partial p.Data of p.Kind from attempt p.Attempt
	// to the reply stream of p.Inbox for request p.RequestID (entry Kind
	// KindPartial). It returns ErrLate, and writes nothing, when the inbox
	// is not open, the request is settled, or p.Deadline is not zero and
	// the entry's time would not be before it; ErrLeaseLost when a later
	// attempt has sent partials; ErrPartialCap when attempt p.Attempt has
	// appended p.Max partials already.
	Partial(ctx context.Context, p *PartialParams) error

	// ReplyStream appends reply, the final reply to a streamed request, as
	// ReplyInbox does, and settles the request, in one atomic step. It
	// returns ErrLate, and writes nothing, when the inbox is not open, the
	// request is settled already, or deadline is not zero and the entry's
	// time would not be before it. An accepted reply with a Retention from
	// a named Sender is recorded on the request's record, as ReplyInbox
	// records one; a refused one is not.
	ReplyStream(ctx context.Context, reply *Envelope, deadline time.Time) error

	// GiveUpStream is GiveUp for a streamed request: it appends the
	// request's marker and settles the request, in one atomic step, so
	// that no partial or reply follows the marker.
	GiveUpStream(ctx context.Context, inbox, id string) (Reply, error)
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

// Limits are a receiver's cluster-wide flow limits, shared by every
// instance that serves it and decided on broker time: a token bucket of
// starts per second (a rate limit) and a set of concurrency slots held
// under leases (a global concurrency limit). The caller takes tokens and
// slots before it fetches, so that it never fetches a message it may not
// start.
type Limits interface {
	// TakeTokens takes up to p.Want tokens from p.Receiver's bucket, which
	// holds at most p.Burst and refills at p.Rate tokens per second of
	// broker time (a bucket never used is full). It returns how many it
	// took and, when it took none, how long until the next token is due.
	// A negative p.Want puts -p.Want tokens back (unused ones), up to
	// p.Burst, and returns 0.
	TakeTokens(ctx context.Context, p *TokensParams) (took int, wait time.Duration, err error)

	// Slots changes how many of p.Receiver's p.Limit concurrency slots
	// p.Holder holds, and returns how many it holds after: p.Delta > 0
	// takes up to p.Delta more while the holders together hold fewer than
	// p.Limit; p.Delta < 0 gives -p.Delta back (no more than it holds); 0
	// changes nothing. Each call renews the holder's lease to p.Lease from
	// now (broker time);
	// the slots of a holder whose lease ran out are free again. It also
	// returns how many the holder held as the call began: 0 when its lease
	// had run out (or it held none), so that a holder that lost its slots
	// that way learns it even from a call that takes them again.
	Slots(ctx context.Context, p *SlotsParams) (held, had int, err error)
}

// Registry is the registry of live workers.
type Registry interface {
	// Heartbeat records info as live for ttl, and measures the broker's
	// clock as Now does (see Offset).
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

// Pauses are the paused receivers: a paused receiver's messages still
// queue, and its consumers stop fetching and starting them until it is
// resumed. The broker only records the state; consumers read it
// (Paused) and act on it.
type Pauses interface {
	// Pause marks receiver paused. Pausing a paused receiver does nothing.
	Pause(ctx context.Context, receiver string) error
	// Resume marks receiver not paused. Resuming a receiver that is not
	// paused does nothing.
	Resume(ctx context.Context, receiver string) error
	// Paused reports, for each of receivers in order, whether it is
	// paused, in as few round trips as the broker can.
	Paused(ctx context.Context, receivers []string) ([]bool, error)
	// PauseEpoch reads the pause epoch of the namespace: a value that
	// every Pause and Resume changes, after it set or cleared its flag,
	// so that a reader that sees the same epoch twice knows that no flag
	// changed in between (but for a Pause or Resume that failed half-way,
	// or a broker that lost its data: readers also read the flags now and
	// then). It is "" while no Pause or Resume was recorded. One round
	// trip, whatever the number of receivers.
	PauseEpoch(ctx context.Context) (string, error)
}

// Idempotency makes requests with the same key, to the same receiver,
// share one run of the handler and one reply, for a window of time.
//
// The first send with a key (Queue.Send, Envelope.IdempotencyKey) stores
// its message and records the key, in one atomic step, with the requester
// (a send from an inbox) as the key's first waiter; each later send with
// the key, while the key lives, stores nothing (SendResult Joined): a
// send from an inbox is added as a waiter, or, once the reply is stored,
// gets that reply at once. The worker that answers the message stores
// its reply under the key (SettleIdempotent): the first stored reply is
// the key's reply for good, and the worker sends it to every waiter's
// inbox (Inbox.ReplyInbox, each by its own request id and deadline). Only
// the key's own message stores its reply: a run that outlives its
// message's window, after a later send took the key for a new message,
// finds the key gone.
type Idempotency interface {
	// SettleIdempotent stores reply (an envelope to be sent to each
	// waiter, who sets its Receiver: reply.Receiver may be empty) as the
	// reply of receiver's key unless one is stored already, and returns the stored reply and the waiters to send it
	// to. reply.InReplyTo is the id of the message answered. found is
	// false when the key is gone (its window passed) or holds another
	// message than reply.InReplyTo (a later send took it after the
	// window): nothing is stored then, in the same atomic step.
	SettleIdempotent(ctx context.Context, receiver, key string, reply *Envelope) (stored Envelope, waiters []IdempotentWaiter, found bool, err error)
}

// IdempotentWaiter is a request waiting for the reply of an idempotency
// key.
type IdempotentWaiter struct {
	// Inbox is the requester's inbox; RequestID its request's id.
	Inbox, RequestID string
	// Deadline is the request's deadline (broker time); zero for none.
	Deadline time.Time
}

// Cancels is the cancellation of sent messages: a deferred or queued
// message is removed before any delivery; one that a consumer holds is
// removed from the queue and marked, and its holder learns of the mark
// with CancelMarks.
type Cancels interface {
	// Cancel cancels message p.ID of p.Receiver in one atomic step: a
	// deferred one is dropped (CancelDeferred), a queued one removed
	// (CancelQueued); one delivered and not acknowledged is removed from
	// the queue, so that it is never delivered again, and marked for its
	// holder (CancelInFlight). Otherwise nothing changes and the state is
	// CancelNotFound (finished, dead-lettered, never sent, or not among
	// the p.MaxScan entries read since p.Since).
	Cancel(ctx context.Context, p *CancelParams) (Cancelled, error)
	// CancelMarks returns the ids of receiver's messages cancelled while
	// in flight (marked by Cancel) at or after since (broker time; the
	// zero time: every mark kept), and the time of the latest mark
	// returned, to pass as since next time (zero when none). Marks are
	// kept for MarkRetention.
	CancelMarks(ctx context.Context, receiver string, since time.Time) (ids []string, latest time.Time, err error)
}

// MarkRetention is how long a broker keeps a mark of Cancel.
const MarkRetention = 10 * time.Minute

// CancelState is what Cancel found.
type CancelState int

// The states Cancel reports.
const (
	// CancelNotFound: not deferred, queued or in flight; nothing changed.
	CancelNotFound CancelState = iota
	// CancelDeferred: it was deferred, and never will be delivered.
	CancelDeferred
	// CancelQueued: it was queued, and never will be delivered.
	CancelQueued
	// CancelInFlight: a consumer held it; it is no longer in the queue,
	// and is marked for its holder.
	CancelInFlight
)

// Cancelled is what Cancel did.
type Cancelled struct {
	State CancelState
	// Env is the message (not for CancelNotFound).
	Env Envelope
	// Deadline is the message's deadline (broker time), zero if none.
	Deadline time.Time
}

// BatchError is the error of disker's SendBatch when some messages were
// not sent.
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

// CheckSize returns an error when env's content is over max bytes (the
// broker's MaxMessageSize). Callers add their package prefix.
func CheckSize(env *Envelope, max int) error {
	if len(env.Content) > max {
		return fmt.Errorf("Envelope.Content is %d bytes, over the limit of %d (MaxMessageSize)", len(env.Content), max)
	}
	return nil
}
