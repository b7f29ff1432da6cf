package disker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Message is a message between a sender and a receiver.
//
// Set the fields Receiver, Content, and optionally Sender and Headers, to
// send one: what a message is lives in these fields, and how it is sent
// (its timeout) in SendOptions. A message without a Sender is
// fire-and-forget: nobody receives a reply. Disker sets the rest on the
// messages it delivers.
type Message struct {
	// ID is the message's id, set by Send.
	ID string
	// Sender is the sender's name: its reply address. Empty for a
	// fire-and-forget message, and for Request (which replies to the
	// instance's private address).
	Sender string
	// Receiver is the name of the receiver the message goes to.
	Receiver string
	// Content is the payload, up to Config.MaxMessageSize bytes.
	Content []byte
	// Headers are optional key/value metadata, delivered with the message.
	Headers map[string]string

	// Deadline is set on delivered messages sent with a timeout: the
	// deadline in the local clock (the broker decides by its own clock;
	// Disker corrects for the difference). Zero if none.
	Deadline time.Time
	// Attempt is set on delivered messages: 1 on the first delivery, and one
	// more on each redelivery.
	Attempt int
	// InReplyTo is set on replies: the id of the request answered.
	InReplyTo string
	// Error is set on replies that carry an error instead of a response,
	// such as a request that was dead-lettered (Code CodeDeadLetter).
	Error *RemoteError
	// Priority is set on delivered messages: the level it was sent with
	// (WithPriority).
	Priority Priority

	// timeout is the timeout the message was sent with (WithTimeout), set
	// on delivered messages; 0 if none.
	timeout time.Duration
	// noReply is set on delivered messages sent fire-and-forget.
	noReply bool
	// brokerDeadline is Deadline in the broker's clock, as delivered: a
	// reply to a Request is judged against it (see Disker.reply).
	brokerDeadline time.Time
	// fromInbox says the message is a Request's, sent from its requester's
	// inbox: the reply goes there (see Disker.reply).
	fromInbox bool
	// replyHeaders are the headers of the reply (SetReplyHeader).
	replyHeaders map[string]string
	// idemKey is the idempotency key of a delivered message from an
	// idempotent Request: its reply is stored under the key and sent to
	// the key's waiters (see Disker.replyIdempotent).
	idemKey string
	// settle is the state of the delivery being handled (taskRunning,
	// taskSettled, taskCancelled), set on delivered messages: a reply is
	// sent only while it is not cancelled, and a cancellation only takes
	// one not settled.
	settle *atomic.Int32
}

// SetReplyHeader sets header key to value on the reply to msg, a message
// this instance received: the reply a handler returns, or the one sent by
// Reply, carries it in its Headers. Call it from the handler, before it
// returns or calls Reply.
func (msg *Message) SetReplyHeader(key, value string) {
	if msg.replyHeaders == nil {
		msg.replyHeaders = make(map[string]string, 1)
	}
	msg.replyHeaders[key] = value
}

// ExpectsReply reports whether a reply to msg, a message this instance
// received, reaches anyone: false for a fire-and-forget message (sent
// without a Sender), whose handler's response is discarded and for which
// Reply returns ErrFireAndForget.
func (msg *Message) ExpectsReply() bool {
	return msg.Sender != "" && !msg.noReply
}

// SendOption sets how Send, SendBatch or Request sends a message.
type SendOption func(*sendOptions)

// sendOptions are the settings of one send, set by SendOptions and checked
// in one place (check). A new option is a function that sets a field here,
// and a case in check.
type sendOptions struct {
	timeout time.Duration // WithTimeout

	dedup    bool // WithDedupKey
	dedupKey string
	dedupTTL time.Duration

	idempotent      bool // WithIdempotencyKey
	idemKey         string
	idemTTL         time.Duration // WithIdempotencyTTL; 0 means DefaultIdempotencyTTL
	priority        Priority      // WithPriority
	delay           time.Duration // WithDelay
	at              time.Time     // WithDeliverAt
	delaySet, atSet bool
}

// MaxDelay is the longest delay WithDelay accepts (100 years); WithDeliverAt
// accepts times up to the year 9999.
const MaxDelay = broker.MaxDelay

// later reports whether the message is sent for later.
func (o *sendOptions) later() bool { return o.delay > 0 || !o.at.IsZero() }

// sendOptionsOf applies opts. The options are applied to a value of their
// own, which escapes to the heap (an option is an opaque function): a call
// without options allocates nothing.
func sendOptionsOf(opts []SendOption) sendOptions {
	if len(opts) == 0 {
		return sendOptions{}
	}
	o := new(sendOptions)
	for _, opt := range opts {
		opt(o)
	}
	return *o
}

// check validates the options for a message that has a sender (false for
// fire-and-forget). The *ValidationError it returns names the option.
func (o *sendOptions) check(hasSender bool) error {
	switch {
	case o.timeout < 0:
		return invalid("WithTimeout", "must be >= 0, got %v", o.timeout)
	case o.timeout > 0 && o.timeout < time.Millisecond:
		return invalid("WithTimeout", "must be at least 1ms, got %v", o.timeout)
	case o.timeout > 0 && !hasSender:
		return invalid("WithTimeout", "a message without a Sender is fire-and-forget: nobody would receive its timeout notice")
	case o.dedup && o.dedupKey == "":
		return invalid("WithDedupKey", "key must not be empty")
	case o.dedup && len(o.dedupKey) > MaxKeyLen:
		return invalid("WithDedupKey", "key is %d bytes, over the limit of %d", len(o.dedupKey), MaxKeyLen)
	case o.dedup && o.dedupTTL < time.Millisecond:
		return invalid("WithDedupKey", "ttl must be >= 1ms, got %v", o.dedupTTL)
	case o.dedup && o.timeout > 0:
		return invalid("WithDedupKey", "cannot be combined with WithTimeout (a Request can be made idempotent with WithIdempotencyKey)")
	case o.idempotent && o.idemKey == "":
		return invalid("WithIdempotencyKey", "key must not be empty")
	case o.idempotent && len(o.idemKey) > MaxKeyLen:
		return invalid("WithIdempotencyKey", "key is %d bytes, over the limit of %d", len(o.idemKey), MaxKeyLen)
	case o.idemTTL < 0 || (o.idemTTL > 0 && o.idemTTL < time.Millisecond):
		return invalid("WithIdempotencyTTL", "must be >= 1ms, got %v", o.idemTTL)
	case o.idemTTL > 0 && !o.idempotent:
		return invalid("WithIdempotencyTTL", "needs WithIdempotencyKey")
	case o.priority < PriorityLow || o.priority > PriorityHigh:
		return invalid("WithPriority", "must be in %d..%d (PriorityLow..PriorityHigh), got %d", PriorityLow, PriorityHigh, o.priority)
	case o.delaySet && o.atSet:
		return invalid("WithDelay", "WithDelay and WithDeliverAt cannot both be given")
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
	case o.later() && o.dedup:
		return invalid("WithDedupKey", "cannot be combined with WithDelay or WithDeliverAt")
	case o.later() && o.idempotent:
		return invalid("WithIdempotencyKey", "cannot be combined with WithDelay or WithDeliverAt")
	case o.later() && o.priority != PriorityNormal:
		return invalid("WithPriority", "cannot be combined with WithDelay or WithDeliverAt: a message sent for later is delivered at the normal level")
	}
	return nil
}

// checkCall validates the options that apply to some calls only: call is
// "Send", "SendBatch" or "Request".
func (o *sendOptions) checkCall(call string) error {
	switch {
	case o.dedup && call == "SendBatch":
		return invalid("WithDedupKey", "applies to one message: use Send")
	case o.dedup && call == "Request":
		return invalid("WithDedupKey", "applies to Send: make a Request idempotent with WithIdempotencyKey")
	case (o.idempotent || o.idemTTL > 0) && call != "Request":
		return invalid("WithIdempotencyKey", "applies to Request: deduplicate a Send with WithDedupKey")
	}
	return nil
}

// MaxKeyLen is the longest key, in bytes, of WithDedupKey and
// WithIdempotencyKey.
const MaxKeyLen = broker.MaxKeyLen

// WithDedupKey makes Send queue the message only if no message was sent
// with the same key to the same receiver less than ttl ago: a second Send
// with the key within ttl of the first queues nothing, and returns the
// first message's id with a *DuplicateError, which matches ErrDuplicate
// (errors.Is). The check and
// the send are one atomic step in the broker (in Redis, one script in the
// receiver's slot), so any number of concurrent Sends with one key, from
// any number of processes, queue one message.
//
// The window is the first message's: it starts at its Send (broker time)
// and lasts ttl, whether the message was handled meanwhile or not, and a
// duplicate does not extend it. After it the key can be used again. key
// must not be empty (at most MaxKeyLen bytes), ttl must be at least 1ms.
// It applies to Send only, and not together with WithTimeout.
func WithDedupKey(key string, ttl time.Duration) SendOption {
	return func(o *sendOptions) { o.dedup, o.dedupKey, o.dedupTTL = true, key, ttl }
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
// message through retries, lease
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

// WithDelay sends the message for later: it is queued d after the broker
// accepted it, by the broker's clock (Redis time), and until then it counts
// as Scheduled in Stats, is delivered to no worker, and can be cancelled
// (Cancel). 0 sends it now. A timed message's deadline is its due time
// plus its timeout: WithTimeout counts from the delivery. d must be at
// least 1ms and at most MaxDelay. A message sent for later is delivered at
// the normal priority and has no dedup or idempotency key: WithDelay and
// WithDeliverAt do not go with WithPriority (other than PriorityNormal),
// WithDedupKey or WithIdempotencyKey (a *ValidationError).
func WithDelay(d time.Duration) SendOption {
	return func(o *sendOptions) { o.delay, o.delaySet = d, true }
}

// WithDeliverAt sends the message for delivery at t, compared with the
// broker's clock (Redis time), not the sender's: as WithDelay otherwise. A
// time that has passed (by the broker's clock) delivers the message now,
// with its timeout, if any, counted from now.
func WithDeliverAt(t time.Time) SendOption {
	return func(o *sendOptions) { o.at, o.atSet = t, true }
}

// WithTimeout gives the message a deadline of d after it is sent: its
// sender then receives exactly one of the reply or a timeout notice (see
// OnTimeout), and a worker never starts it after the deadline. 0 means no
// timeout. It needs a Message.Sender (with Send and SendBatch); Request
// times out at the earlier of d and ctx's deadline.
func WithTimeout(d time.Duration) SendOption {
	return func(o *sendOptions) { o.timeout = d }
}

// Send queues msg for msg.Receiver and returns its id once the broker has
// accepted it. A message without a Sender is fire-and-forget. A message
// sent WithTimeout is queued together with its pending
// timeout in one atomic step; this instance then watches the sender's
// timeouts, so that a notice reaches the sender's TimeoutHandler (on
// whichever instance registered one) within Config.TimeoutMonitorFrequency of
// the deadline.
//
// With WithDedupKey, a Send within the key's window of an earlier one
// queues nothing and returns that message's id with a *DuplicateError.
//
// Send returns a *ValidationError for bad input, an error wrapping
// ErrUnavailable when the broker cannot be reached, and ErrClosed after
// Close. It blocks for one round trip to the broker, never past ctx's end
// (see "Which calls block" in the package documentation).
func (d *Disker) Send(ctx context.Context, msg Message, opts ...SendOption) (string, error) {
	o := sendOptionsOf(opts)
	if err := d.validateMessage(&msg, &o); err != nil {
		return "", err
	}
	if err := o.checkCall("Send"); err != nil {
		return "", err
	}
	id := newID()
	if o.dedup {
		return d.sendDedup(ctx, &msg, &o, id)
	}
	if _, err := d.send(ctx, &msg, &o, id); err != nil {
		return "", err
	}
	return id, nil
}

// SendBatch sends msgs, each as Send would (opts apply to every one), in as
// few round trips to the broker as it can, and returns their ids in order.
// On Redis a batch of untimed messages, or of timed ones, is one pipeline
// per 1,000 messages: the way to move many messages from one producer.
//
// Every message is checked first: a bad one fails the call with a
// *ValidationError whose Field names its index (such as
// "msgs[3].Receiver"), and nothing is sent. Each message is then sent in
// its own atomic step, but the batch is not atomic: when some could not be
// sent, SendBatch returns the ids with "" in their place and a *BatchError
// that says which failed and why. Messages to one receiver are queued in
// batch order. An empty batch sends nothing and returns no error.
func (d *Disker) SendBatch(ctx context.Context, msgs []Message, opts ...SendOption) ([]string, error) {
	if d.closed.Load() {
		return nil, ErrClosed
	}
	o := sendOptionsOf(opts)
	if err := o.checkCall("SendBatch"); err != nil {
		return nil, err
	}
	envs := make([]*broker.Envelope, len(msgs))
	for i := range msgs {
		m := &msgs[i]
		if err := d.validateMessage(m, &o); err != nil {
			var ve *ValidationError
			if errors.As(err, &ve) && strings.HasPrefix(ve.Field, "Message.") {
				return nil, invalid(fmt.Sprintf("msgs[%d].%s", i, strings.TrimPrefix(ve.Field, "Message.")), "%s", ve.Reason)
			}
			if errors.As(err, &ve) {
				return nil, invalid(ve.Field, "msgs[%d]: %s", i, ve.Reason)
			}
			return nil, err
		}
		envs[i] = envelope(m, &o, newID())
	}
	if len(envs) == 0 {
		return []string{}, nil
	}
	for _, env := range envs {
		if env.Timeout > 0 {
			d.monitor.watch(env.Sender, o.deadline(time.Now()))
		}
	}
	_, err := d.b.SendBatch(ctx, envs)
	var be *broker.BatchError
	if err != nil && !errors.As(err, &be) {
		d.health.fail("send", err)
		return nil, wrapBroker("send", err)
	}
	ids := make([]string, len(envs))
	var errs []error
	if be != nil {
		errs = make([]error, len(envs))
	}
	for i, env := range envs {
		if be != nil && be.Errs[i] != nil {
			errs[i] = wrapBroker("send", be.Errs[i])
			continue
		}
		ids[i] = env.ID
		d.sent.Add(1)
		if d.onEvent != nil {
			d.emit(Event{Kind: EventSent, Receiver: env.Receiver, Sender: env.Sender, MessageID: env.ID})
		}
	}
	if be != nil {
		d.health.fail("send", err)
		return ids, &BatchError{Errs: errs}
	}
	d.health.ok()
	return ids, nil
}

// sendDedup sends m, validated, under id with o's dedup key. A duplicate
// returns the first message's id with an error matching ErrDuplicate.
func (d *Disker) sendDedup(ctx context.Context, m *Message, o *sendOptions, id string) (string, error) {
	if d.closed.Load() {
		return "", ErrClosed
	}
	first, dup, err := d.b.SendDedup(ctx, &broker.SendDedupParams{Env: envelope(m, &sendOptions{priority: o.priority}, id), Key: o.dedupKey, TTL: o.dedupTTL})
	if err != nil {
		return "", d.afterSend(m, id, err)
	}
	if dup {
		d.health.ok()
		return first, &DuplicateError{ID: first, Receiver: m.Receiver, Key: o.dedupKey}
	}
	return id, d.afterSend(m, id, nil)
}

// validateMessage checks m, sent with o, as Send and SendBatch take it.
func (d *Disker) validateMessage(m *Message, o *sendOptions) error {
	if err := d.checkContent(m); err != nil {
		return err
	}
	if m.Sender != "" {
		if err := checkName("Message.Sender", m.Sender); err != nil {
			return err
		}
	}
	return o.check(m.Sender != "")
}

// checkContent checks m's Receiver and Content, which every send needs.
func (d *Disker) checkContent(m *Message) error {
	if err := checkName("Message.Receiver", m.Receiver); err != nil {
		return err
	}
	if len(m.Content) > d.cfg.MaxMessageSize {
		return invalid("Message.Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(m.Content), d.cfg.MaxMessageSize)
	}
	return nil
}

// deadline is the local estimate of the deadline of a message sent at now
// with o: its due time plus its timeout.
func (o *sendOptions) deadline(now time.Time) time.Time {
	due := now.Add(o.delay)
	if o.at.After(now) {
		due = o.at
	}
	return due.Add(o.timeout)
}

// send sends a validated message with o under id. It returns the
// deadline in the broker's clock (zero if none).
func (d *Disker) send(ctx context.Context, m *Message, o *sendOptions, id string) (time.Time, error) {
	if d.closed.Load() {
		return time.Time{}, ErrClosed
	}
	env := envelope(m, o, id)
	if o.timeout > 0 {
		// Watch before sending: the monitor must know the sender by the time
		// the deadline passes.
		d.monitor.watch(m.Sender, o.deadline(time.Now()))
	}
	bdl, err := d.b.Send(ctx, env)
	return bdl, d.afterSend(m, id, err)
}

// afterSend counts the send of m under id, which ended with err, and
// returns err as Send returns it.
func (d *Disker) afterSend(m *Message, id string, err error) error {
	if err != nil {
		d.health.fail("send", err)
		return wrapBroker("send", err)
	}
	d.health.ok()
	d.sent.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventSent, Receiver: m.Receiver, Sender: m.Sender, MessageID: id})
	}
	return nil
}

// envelope returns the envelope of m, sent with o under id.
func envelope(m *Message, o *sendOptions, id string) *broker.Envelope {
	return &broker.Envelope{
		ID:            id,
		Sender:        m.Sender,
		Receiver:      m.Receiver,
		Content:       m.Content,
		Headers:       m.Headers,
		FireAndForget: m.Sender == "",
		Timeout:       o.timeout,
		Priority:      int(o.priority),
		Delay:         o.delay,
		DeliverAt:     o.at,
	}
}

// messageOf turns a delivered envelope into a Message.
func (d *Disker) messageOf(env *broker.Envelope, deadline time.Time, attempt int) *Message {
	m := new(Message)
	d.setMessage(m, env, deadline, attempt)
	return m
}

// setMessage sets *m to the Message of a delivered envelope, as messageOf
// makes it, for a caller that holds the Message in memory of its own.
func (d *Disker) setMessage(m *Message, env *broker.Envelope, deadline time.Time, attempt int) {
	*m = Message{
		ID:        env.ID,
		Sender:    env.Sender,
		Receiver:  env.Receiver,
		Content:   env.Content,
		Headers:   env.Headers,
		Deadline:  d.b.Local(deadline),
		Attempt:   attempt,
		InReplyTo: env.InReplyTo,
		Priority:  Priority(env.Priority),

		timeout:        env.Timeout,
		noReply:        env.FireAndForget,
		brokerDeadline: deadline,
		fromInbox:      env.FromInbox,
		idemKey:        env.IdempotencyKey,
	}
	if env.ErrorCode != "" {
		m.Error = &RemoteError{Code: env.ErrorCode, Text: env.ErrorText}
	}
}
