package disker

import (
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// SendOption sets how Send, SendBatch, SendEach or Request sends a message.
// Every option composes with every other: a message can be deferred,
// urgent, deduplicated, idempotent and timed at once, and the broker
// decides all of it in one atomic step.
type SendOption func(*sendOptions)

// sendOptions are the settings of one send, set by SendOptions and checked
// in one place (check). A new option is a function that sets a field here,
// a case in check, and its field in params (send.go).
type sendOptions struct {
	timeout time.Duration // WithTimeout

	dedup        bool // WithDedupKey, WithDedupUntilSettled
	dedupKey     string
	dedupTTL     time.Duration
	dedupSettled bool // WithDedupUntilSettled

	debounce                  bool // WithDebounce
	debounceKey               string
	debounceWait, debounceMax time.Duration

	idempotent bool // WithIdempotencyKey
	idemKey    string
	idemTTL    time.Duration // WithIdempotencyTTL
	idemTTLSet bool

	priority        Priority      // WithPriority
	delay           time.Duration // WithDelay
	at              time.Time     // WithDeliverAt
	delaySet, atSet bool

	onSent func(id string) // WithOnSent

	group    string // WithGroup
	groupSet bool

	expiry                 time.Duration // WithExpiry
	expireAt               time.Time     // WithExpireAt
	expirySet, expireAtSet bool

	retention    time.Duration // WithRetention
	retentionSet bool

	batch    string // WithBatch
	batchSet bool

	then *thenStep // WithThen
}

// MaxDelay is the longest delay WithDelay accepts (100 years); WithDeliverAt
// accepts times up to the year 9999.
const MaxDelay = broker.MaxDelay

// MaxKeyLen is the longest key, in bytes, of WithDedupKey,
// WithIdempotencyKey, WithDebounce and WithGroup.
const MaxKeyLen = broker.MaxKeyLen

// later reports whether the message is sent for later.
func (o *sendOptions) later() bool { return o.delay > 0 || !o.at.IsZero() }

// sendOptionsOf applies opts after base (the options of a whole batch, or
// none). The options are applied to a value of their own, which escapes to
// the heap (an option is an opaque function): a call without options
// allocates nothing.
func sendOptionsOf(base *sendOptions, opts []SendOption) sendOptions {
	if len(opts) == 0 {
		if base == nil {
			return sendOptions{}
		}
		return *base
	}
	o := new(sendOptions)
	if base != nil {
		*o = *base
	}
	for _, opt := range opts {
		opt(o)
	}
	return *o
}

// check validates the options for a message that has a reply address (a
// Sender, or Request's inbox; false for fire-and-forget). The
// *ValidationError it returns names the option.
func (o *sendOptions) check(hasSender bool) error {
	if err := o.checkChild(); err != nil {
		return err
	}
	switch {
	case o.timeout < 0:
		return invalid("WithTimeout", "must be >= 0, got %v", o.timeout)
	case o.timeout > 0 && o.timeout < time.Millisecond:
		return invalid("WithTimeout", "must be at least 1ms, got %v", o.timeout)
	case o.timeout > 0 && !hasSender:
		return invalid("WithTimeout", "a message without a Sender is fire-and-forget: nobody would receive its timeout notice")
	case o.dedup && o.dedupKey == "":
		return invalid(o.dedupOption(), "key must not be empty")
	case o.dedup && len(o.dedupKey) > MaxKeyLen:
		return invalid(o.dedupOption(), "key is %d bytes, over the limit of %d", len(o.dedupKey), MaxKeyLen)
	case o.dedup && o.dedupTTL < time.Millisecond:
		return invalid(o.dedupOption(), "ttl must be at least 1ms, got %v", o.dedupTTL)
	case o.debounce && o.debounceKey == "":
		return invalid("WithDebounce", "key must not be empty")
	case o.debounce && len(o.debounceKey) > MaxKeyLen:
		return invalid("WithDebounce", "key is %d bytes, over the limit of %d", len(o.debounceKey), MaxKeyLen)
	case o.debounce && o.debounceWait < time.Millisecond:
		return invalid("WithDebounce", "wait must be at least 1ms, got %v", o.debounceWait)
	case o.debounce && (o.debounceMax < o.debounceWait || o.debounceMax > MaxDelay):
		return invalid("WithDebounce", "maxWait must be from wait (%v) to MaxDelay, got %v", o.debounceWait, o.debounceMax)
	case o.debounce && (o.delaySet || o.atSet):
		return invalid("WithDebounce", "it gives the message its due time, as WithDelay and WithDeliverAt do: give one")
	case o.debounce && o.timeout > 0:
		return invalid("WithDebounce", "a later send may replace the message, which then has no reply or timeout of its own: it goes with Send of a message without WithTimeout")
	case o.debounce && (o.idempotent || o.dedupSettled):
		return invalid("WithDebounce", "a message that a later send replaces is never settled: it cannot hold a key of WithIdempotencyKey or WithDedupUntilSettled")
	case o.idempotent && o.idemKey == "":
		return invalid("WithIdempotencyKey", "key must not be empty")
	case o.idempotent && len(o.idemKey) > MaxKeyLen:
		return invalid("WithIdempotencyKey", "key is %d bytes, over the limit of %d", len(o.idemKey), MaxKeyLen)
	case o.idemTTLSet && o.idemTTL < time.Millisecond:
		return invalid("WithIdempotencyTTL", "must be at least 1ms, got %v (leave it out for DefaultIdempotencyTTL)", o.idemTTL)
	case o.idemTTLSet && !o.idempotent:
		return invalid("WithIdempotencyTTL", "sets the window of WithIdempotencyKey, which is missing")
	case o.groupSet && o.group == "":
		return invalid("WithGroup", "key must not be empty")
	case o.groupSet && len(o.group) > MaxKeyLen:
		return invalid("WithGroup", "key is %d bytes, over the limit of %d", len(o.group), MaxKeyLen)
	case o.priority < PriorityLow || o.priority > PriorityHigh:
		return invalid("WithPriority", "must be in %d..%d (PriorityLow..PriorityHigh), got %d", PriorityLow, PriorityHigh, o.priority)
	case o.delaySet && o.atSet:
		return invalid("WithDelay", "WithDelay and WithDeliverAt both give the message a due time: give one")
	case o.delay < 0:
		return invalid("WithDelay", "must be >= 0, got %v", o.delay)
	case o.delay > 0 && o.delay < time.Millisecond:
		return invalid("WithDelay", "must be at least 1ms, got %v", o.delay)
	case o.delay > MaxDelay:
		return invalid("WithDelay", "%v is over the limit of %v (MaxDelay)", o.delay, MaxDelay)
	case o.atSet && o.at.IsZero():
		return invalid("WithDeliverAt", "the zero time is not a delivery time")
	case o.atSet && (o.at.Year() < 1970 || o.at.Year() > 9999):
		return invalid("WithDeliverAt", "%v is out of range (years 1970 to 9999)", o.at)
	case o.retentionSet && (o.retention < time.Millisecond || o.retention > MaxRetention):
		return invalid("WithRetention", "must be from 1ms to %v (MaxRetention), got %v", MaxRetention, o.retention)
	case o.retentionSet && o.debounce:
		return invalid("WithRetention", "does not go with WithDebounce: a debounced message that a later send replaces is never settled, so it would have no final outcome to keep")
	case o.expirySet && o.expireAtSet:
		return invalid("WithExpiry", "WithExpiry and WithExpireAt both give the message an expiry: give one")
	case o.expirySet && o.expiry < time.Millisecond:
		return invalid("WithExpiry", "must be at least 1ms, got %v", o.expiry)
	case o.expirySet && o.expiry > MaxDelay:
		return invalid("WithExpiry", "%v is over the limit of %v (MaxDelay)", o.expiry, MaxDelay)
	case o.expireAtSet && (o.expireAt.Year() < 1970 || o.expireAt.Year() > 9999):
		return invalid("WithExpireAt", "%v is out of range (years 1970 to 9999)", o.expireAt)
	case o.expireAtSet && o.atSet && !o.expireAt.After(o.at):
		return invalid("WithExpireAt", "%v is not after the due time %v (WithDeliverAt): the message would never start", o.expireAt, o.at)
	case o.expireAtSet && o.delay > 0 && !o.expireAt.After(time.Now().Add(o.delay)):
		return invalid("WithExpireAt", "%v is not after the due time, %v from now (WithDelay): the message would never start", o.expireAt, o.delay)
	}
	return nil
}

// dedupOption names the option that set the dedup key.
func (o *sendOptions) dedupOption() string {
	if o.dedupSettled {
		return "WithDedupUntilSettled"
	}
	return "WithDedupKey"
}

// idemTTLOrDefault is the window of the idempotency key.
func (o *sendOptions) idemTTLOrDefault() time.Duration {
	if o.idemTTLSet {
		return o.idemTTL
	}
	return DefaultIdempotencyTTL
}

// WithDedupKey makes the send queue the message only if no message was
// sent with the same key to the same receiver less than ttl ago: a second
// Send with the key within ttl of the first queues nothing, and returns
// the first message's id with a *DuplicateError, which matches ErrDuplicate
// (errors.Is). The check and the send are one atomic step in the broker
// (in Redis, one script in the receiver's slot), so any number of
// concurrent Sends with one key, from any number of processes, queue one
// message.
//
// The window is the first message's: it starts at its Send (broker time)
// and lasts ttl, whether the message was handled meanwhile or not, and a
// duplicate does not extend it; a message sent for later (WithDelay) holds
// its key from its send. After the window the key can be used again. key
// must not be empty (at most MaxKeyLen bytes), ttl must be at least 1ms.
//
// It goes with every other option. A duplicate has no timeout of its own:
// a sender that gets a *DuplicateError gets no reply or timeout notice for
// it. A Request that is a duplicate returns the *DuplicateError at once,
// with no reply; SendBatch and SendEach report one in the message's place
// of a *BatchError.
func WithDedupKey(key string, ttl time.Duration) SendOption {
	return func(o *sendOptions) { o.dedup, o.dedupKey, o.dedupTTL, o.dedupSettled = true, key, ttl, false }
}

// WithDedupUntilSettled makes the send queue the message only if no
// message sent with the same key to the same receiver is still unsettled:
// the key is held from the send until the message's final outcome is
// settled (handled and acknowledged, dead-lettered, dropped as expired, or
// cancelled), "one per key until it has run", and ttl at most: a bound for
// a message that never settles where this instance can see it (deleted by
// hand, or dead-lettered by a fetch after its workers died). A send while
// the key is held queues nothing and returns the holder's id with a
// *DuplicateError, as WithDedupKey.
//
// The key frees a round trip after the message's acknowledgement (the
// worker then acknowledges it alone, not in a batch): a send in between
// is still a duplicate. It goes with every other option but WithDebounce;
// it replaces WithDedupKey (the last of the two given counts). key must not
// be empty (at most MaxKeyLen bytes), ttl at least 1ms.
func WithDedupUntilSettled(key string, ttl time.Duration) SendOption {
	return func(o *sendOptions) { o.dedup, o.dedupKey, o.dedupTTL, o.dedupSettled = true, key, ttl, true }
}

// WithDebounce debounces the message by key: "the latest send wins". It is
// deferred by wait; a later send with the same key to the same receiver,
// while this message is still deferred, replaces it (this one is dropped,
// never delivered, and its id no longer found) and is deferred by wait
// again, but never past maxWait after the first send of the run, so a
// steady stream of sends still runs at least every maxWait. Once the run's
// message comes due (it is queued, or running), the next send with the key
// starts a new run. Decided in one Redis step on Redis time.
//
// A message that a later send may replace has no reply or timeout of its
// own: WithDebounce goes with a fire-and-forget Send or one from a Sender
// without WithTimeout, not with Request, WithTimeout, WithDelay or
// WithDeliverAt (it sets the due time), WithIdempotencyKey or
// WithDedupUntilSettled (a replaced message never settles). It goes with
// WithPriority, WithDedupKey (checked first: a duplicate replaces nothing)
// and WithExpiry (counted from the due time). key must not be empty (at
// most MaxKeyLen bytes); wait at least 1ms; maxWait from wait to MaxDelay.
func WithDebounce(key string, wait, maxWait time.Duration) SendOption {
	return func(o *sendOptions) {
		o.debounce, o.debounceKey, o.debounceWait, o.debounceMax = true, key, wait, maxWait
	}
}

// Priority is a message's level in its receiver's queue: a worker takes
// every waiting message of a higher level before any of a lower one.
type Priority int

// The priority levels. PriorityNormal is the default.
const (
	PriorityLow    Priority = -1
	PriorityNormal Priority = 0
	PriorityHigh   Priority = 1
)

// String returns "low", "normal" or "high" (or the number, out of range).
func (p Priority) String() string {
	switch p {
	case PriorityLow:
		return "low"
	case PriorityNormal:
		return "normal"
	case PriorityHigh:
		return "high"
	}
	return fmt.Sprintf("Priority(%d)", int(p))
}

// WithPriority sends the message at level p, one of PriorityLow,
// PriorityNormal (the default) and PriorityHigh. Priority is strict: a
// worker of the receiver takes every waiting message of a higher level
// before any of a lower one, including messages whose retry delay or
// lease has run out, so a steady flow of high messages starves the lower
// levels, and messages an instance already fetched ahead of its free
// handlers (WithPrefetch) still run first. The level stays with the
// message while it is deferred (WithDelay), through retries, lease
// reclaims and dead letters (a dead letter retried goes back to its
// level), and is set on the delivered Message.Priority.
//
// A receiver that has only ever had normal messages costs nothing more
// than before: on Redis each level is a stream of its own beside the
// receiver's queue, and workers look at the others only while they hold
// messages. So the first message at another level sent to a receiver
// whose other levels are empty is noticed by a busy worker within 100ms
// (until then it may take normal messages first), and by an idle one,
// waiting in a blocking read, when the first such read that ends after
// its instance's next heartbeat ends: within Config.HeartbeatInterval and
// Config.ReceiverBlockTimeout. From then on the order is strict.
func WithPriority(p Priority) SendOption {
	return func(o *sendOptions) { o.priority = p }
}

// WithDelay defers the message: it is queued d after the broker accepted
// it, by the broker's clock (Redis time), never before, and until then it
// counts as Deferred in Stats, is delivered to no worker, and can be
// cancelled (Cancel). 0 sends it now. A timed message's deadline is its
// due time plus its timeout: WithTimeout counts from the delivery. d must
// be at least 1ms and at most MaxDelay. It goes with every other option:
// the message keeps its priority, holds its dedup key from its send, and
// an idempotency key's window counts from its due time.
func WithDelay(d time.Duration) SendOption {
	return func(o *sendOptions) { o.delay, o.delaySet = d, true }
}

// WithDeliverAt defers the message until t, compared with the broker's
// clock (Redis time), not the sender's: as WithDelay otherwise. A time
// that has passed (by the broker's clock) delivers the message now, with
// its timeout, if any, counted from now.
func WithDeliverAt(t time.Time) SendOption {
	return func(o *sendOptions) { o.at, o.atSet = t, true }
}

// WithTimeout gives the message a deadline of d after it is due (sent, or
// WithDelay's due time): its sender then receives exactly one of the reply
// or a timeout notice (see OnTimeout), and a worker never starts it after
// the deadline. 0 means no timeout. It needs a Message.Sender (with Send,
// SendBatch and SendEach); Request times out at the earlier of d and ctx's
// deadline.
func WithTimeout(d time.Duration) SendOption {
	return func(o *sendOptions) { o.timeout = d }
}

// DefaultIdempotencyTTL is how long the key of a send made
// WithIdempotencyKey, and its reply, live when WithIdempotencyTTL does not
// say.
const DefaultIdempotencyTTL = 24 * time.Hour

// WithIdempotencyKey makes sends with the same key to one receiver, within
// the key's ttl (WithIdempotencyTTL, from the due time of the first of
// them; DefaultIdempotencyTTL by default), one send: one message, one run
// of the handler and one reply. The first send with the key queues its
// message; a later one queues nothing:
//
//   - Request waits for the reply of the first (or gets it at once, if it
//     came already), each caller until its own deadline. Every caller gets
//     the same reply: the first one a worker stored for the key, so even a
//     handler that runs twice (its worker died before the acknowledgement,
//     and the message was redelivered) answers every caller with one reply.
//     A Request retried by its client after a timeout or a crash therefore
//     runs the handler once: effectively-once RPC.
//   - Send returns the id of the key's message, with no error: the call is
//     the same send as the first, whose reply (to the first's Sender) and
//     timeout stand for it.
//
// A dead-lettered message's error reply is the key's reply too: until the
// ttl ends, Requests with the key get that *RemoteError. The message
// carries the key's window as its deadline: a worker starts it as long as
// the reply can still be used, whatever the deadline of the first Request.
// Only the key's message stores the key's reply: a run that ends after the
// window, once a later send took the key for a new message, answers its
// own sender alone, and the new message's callers get the new message's
// reply.
// key must not be empty (at most MaxKeyLen bytes). It goes with every other
// option; with WithDedupKey, a repeat of the idempotency key is not a
// duplicate (it is the same send), and only a send that queued its message
// takes the idempotency key.
func WithIdempotencyKey(key string) SendOption {
	return func(o *sendOptions) { o.idempotent, o.idemKey = true, key }
}

// WithIdempotencyTTL sets how long the key of WithIdempotencyKey, and its
// reply, live after the due time of the first send with it: at least 1ms.
// The first send's ttl is the key's. Without it the ttl is
// DefaultIdempotencyTTL.
func WithIdempotencyTTL(ttl time.Duration) SendOption {
	return func(o *sendOptions) { o.idemTTL, o.idemTTLSet = ttl, true }
}

// WithExpiry expires the message d after it is due (sent, or WithDelay's
// due time): a message that no worker has started by then is never
// started. It is dropped instead, counted (ReceiverStats.Expired, the
// messages_expired_total metric, EventExpired), and its sender, if it has
// one (a Sender, or a Request), gets a RemoteError with CodeExpired, which
// matches ErrExpired, in place of a reply: exactly one outcome, as for a
// timeout. The expiry is Redis time, set when the broker accepts the
// message; a worker compares it with its estimate of Redis's clock before
// it starts the message (within half a round trip to Redis).
//
// It needs no Sender: a fire-and-forget message expires too ("if nobody
// started this within 30s, drop it"). With WithTimeout, the message is
// never started after the earlier of its deadline and its expiry. d must
// be at least 1ms and at most MaxDelay. It goes with every other option
// (a dedup key stays taken for its window, expired or not).
func WithExpiry(d time.Duration) SendOption {
	return func(o *sendOptions) { o.expiry, o.expirySet = d, true }
}

// WithExpireAt expires the message at t, compared with the broker's clock
// (Redis time): as WithExpiry otherwise. t must be after the message's due
// time (WithDelay, WithDeliverAt), or it would never start.
func WithExpireAt(t time.Time) SendOption {
	return func(o *sendOptions) { o.expireAt, o.expireAtSet = t, true }
}

// WithOnSent calls f with the message's id once the broker has accepted
// it: for Request, before it waits for the reply, so that the caller can
// Cancel the message from elsewhere, or log its id, while it waits. f runs
// on the calling goroutine and must not block. For SendBatch and SendEach
// it is called for each message accepted, in order.
func WithOnSent(f func(id string)) SendOption {
	return func(o *sendOptions) { o.onSent = f }
}

// checkChild checks the options of a batch's child or a chain's step
// (WithBatch, WithThen).
func (o *sendOptions) checkChild() error {
	switch {
	case o.batchSet && checkBatchID("WithBatch", o.batch) != nil:
		return checkBatchID("WithBatch", o.batch)
	case o.batchSet && o.debounce:
		return invalid("WithBatch", "does not go with WithDebounce: a debounced message that a later send replaces is never settled, so the batch would wait for it for ever")
	case o.then != nil && o.debounce:
		return invalid("WithThen", "does not go with WithDebounce: a debounced message that a later send replaces is never settled, so the chain would stop there without a word")
	}
	return nil
}
