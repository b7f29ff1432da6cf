package disker

import (
	"context"
	"runtime"
	"time"

	"github.com/diskerhq/disker/internal/backoff"
	"github.com/diskerhq/disker/internal/broker"
)

// Handler handles the messages of a receiver.
//
// Handle returns the response, sent as the reply to the message's sender
// unless the response is nil or the message is fire-and-forget (a message
// sent by Request always gets a reply: a nil response is sent as an empty
// one). An error fails the delivery: the message is retried after a backoff,
// and dead-lettered after the last attempt or at once when the error is
// marked with NoRetry. A panic counts as an error (*PanicError).
//
// ctx ends at the message's deadline (when it has a Timeout), when the
// delivery's lease is lost, and on Close or Unhandle once their grace period
// is over. Handle must return soon after ctx ends: what it has not finished
// is delivered again.
//
// A handler either returns its response or calls Disker.Reply itself and
// returns nil, not both.
type Handler interface {
	Handle(ctx context.Context, msg *Message) ([]byte, error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, msg *Message) ([]byte, error)

// Handle calls f(ctx, msg).
func (f HandlerFunc) Handle(ctx context.Context, msg *Message) ([]byte, error) { return f(ctx, msg) }

// TimeoutHandler is told about the sender's messages that timed out: msg is
// the original message. It runs on whichever instance of the sender reads
// the notice, once per timed-out message.
type TimeoutHandler interface {
	HandleTimeout(ctx context.Context, msg *Message)
}

// TimeoutHandlerFunc adapts a function to a TimeoutHandler.
type TimeoutHandlerFunc func(ctx context.Context, msg *Message)

// HandleTimeout calls f(ctx, msg).
func (f TimeoutHandlerFunc) HandleTimeout(ctx context.Context, msg *Message) { f(ctx, msg) }

// ReplyHandler receives the replies to the sender's messages: reply.InReplyTo
// is the id of the message answered, and reply.Error is set when the receiver
// failed (the message was dead-lettered).
type ReplyHandler interface {
	HandleReply(ctx context.Context, reply *Message)
}

// ReplyHandlerFunc adapts a function to a ReplyHandler.
type ReplyHandlerFunc func(ctx context.Context, reply *Message)

// HandleReply calls f(ctx, reply).
func (f ReplyHandlerFunc) HandleReply(ctx context.Context, reply *Message) { f(ctx, reply) }

// Defaults of the HandleOptions.
const (
	// DefaultMaxAttempts is how many deliveries a message gets before it is
	// dead-lettered, unless WithMaxAttempts says otherwise.
	DefaultMaxAttempts = 5
	// DefaultLease is how long a delivery is leased to a worker, unless
	// WithLease says otherwise. A live worker extends it every third of it.
	DefaultLease = 30 * time.Second
	// MinLease is the shortest lease WithLease accepts.
	MinLease = 30 * time.Millisecond
)

// DefaultConcurrency returns the default number of messages of one receiver
// an instance handles at a time: 4 × GOMAXPROCS, at least 16.
func DefaultConcurrency() int { return max(16, 4*runtime.GOMAXPROCS(0)) }

// DefaultBackoff is the default delay before a failed delivery is tried
// again: 100ms doubled with each attempt, capped at 30s, with jitter (a
// random delay between half and all of it).
func DefaultBackoff(attempt int) time.Duration {
	return backoff.Delay(100*time.Millisecond, 30*time.Second, max(attempt-1, 0))
}

type handleOptions struct {
	concurrency int
	prefetch    int
	maxAttempts int
	backoff     func(attempt int) time.Duration
	lease       time.Duration
	exclusive   bool
	// Flow limits (limits.go): 0 (nil) when not used.
	globalConcurrency int
	rate              float64
	burst             int
	ready             func(inFlight int) int // HandleWithPool: workers ready
	// groups are the receiver's group settings (groups.go); its Receiver
	// is set by the consumer.
	groups broker.GroupConfig
	// Batches (batch.go): the handler, set by HandleBatch; the first
	// batch option given, by name, for Handle to refuse it.
	batch       BatchHandler
	batchSize   int
	batchWait   time.Duration
	batchOption string
	// retention is WithResultRetention's, 0 for none.
	retention time.Duration
	err       error
}

// HandleOption configures how a receiver is served (Handle).
type HandleOption func(*handleOptions)

// WithConcurrency sets how many messages of the receiver this instance
// handles at a time; default DefaultConcurrency(). With HandleBatch it
// counts batches, default 1. n must be >= 1.
func WithConcurrency(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 1 {
			o.setErr(invalid("WithConcurrency", "must be >= 1, got %d", n))
		}
		o.concurrency = n
	}
}

// WithPrefetch lets this instance fetch up to n of the receiver's messages
// beyond its free handler slots, to wait in line for the next free one;
// default 0. It keeps the handlers busy when messages come faster than a
// fetch's round trip to the broker (BENCHMARKS.md has the figures, with n
// equal to the concurrency, under a backlog).
// A message waiting in line is leased to this instance like one being
// handled (no other instance takes it), its lease is extended, and it is
// not started after its deadline or once the instance stops (it is then
// delivered again). Leave it at 0 for slow handlers, where messages are
// better left to other instances. n must be >= 0.
func WithPrefetch(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 0 {
			o.setErr(invalid("WithPrefetch", "must be >= 0, got %d", n))
		}
		o.prefetch = n
	}
}

// WithMaxAttempts sets how many deliveries a message gets before it moves to
// the dead-letter stream; default DefaultMaxAttempts. 1 means no retry.
func WithMaxAttempts(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 1 {
			o.setErr(invalid("WithMaxAttempts", "must be >= 1, got %d", n))
		}
		o.maxAttempts = n
	}
}

// WithBackoff sets the delay before attempt+1 after attempt failed; default
// DefaultBackoff. Negative delays count as 0.
func WithBackoff(f func(attempt int) time.Duration) HandleOption {
	return func(o *handleOptions) {
		if f == nil {
			o.setErr(invalid("WithBackoff", "must not be nil"))
		}
		o.backoff = f
	}
}

// WithLease sets how long a delivery is leased to this instance before
// another may take it; default DefaultLease. The lease is extended every
// third of it while the handler runs, so it bounds how long a crashed
// worker's message waits, not how long a handler may run.
func WithLease(d time.Duration) HandleOption {
	return func(o *handleOptions) {
		if d < MinLease {
			o.setErr(invalid("WithLease", "must be >= %v, got %v", MinLease, d))
		}
		o.lease = d
	}
}

// WithExclusive makes the receiver served by one instance at a time: the
// instances that register it take turns holding a lock in the broker, and
// the others wait to take over. When the holder stops, another takes over
// within Config.ReceiverBlockTimeout; when it dies, once its lock expires:
// after 3 × Config.HeartbeatInterval or 6 × Config.ReceiverBlockTimeout,
// whichever is longer. The holder renews the lock every third of that.
func WithExclusive() HandleOption {
	return func(o *handleOptions) { o.exclusive = true }
}

// capacity is the most deliveries an instance holds of the receiver: one
// per handler slot (a batch's worth for a batch handler) and its prefetch.
func (o *handleOptions) capacity() int {
	if o.batch != nil {
		return o.concurrency*o.batchSize + o.prefetch
	}
	return o.concurrency + o.prefetch
}

func (o *handleOptions) setErr(err error) {
	if o.err == nil {
		o.err = err
	}
}

// Handle starts serving receiver with h: this instance fetches the
// receiver's messages, as many at a time as its concurrency (plus
// WithPrefetch's), and runs h on each. Any number of instances may serve the same receiver; each message
// goes to one of them at a time.
//
// It returns a *ValidationError for a bad name, a nil handler or a bad
// option (WithBatchSize and WithBatchWait go with HandleBatch alone),
// ErrAlreadyRegistered when this instance already serves receiver, and
// ErrClosed after Close. With a group option (WithGroupConcurrency,
// WithGroupRate, WithGroupSkipRetries) it sets the receiver's groups in
// the broker before it returns, and returns the broker's error if it
// cannot; without one, the instance sets the defaults before its first
// fetch.
func (d *Disker) Handle(receiver string, h Handler, opts ...HandleOption) error {
	if err := checkName("receiver", receiver); err != nil {
		return err
	}
	if h == nil {
		return invalid("Handler", "must not be nil")
	}
	o, err := handleOptionsOf(DefaultConcurrency(), opts)
	if err != nil {
		return err
	}
	if o.batchOption != "" {
		return invalid(o.batchOption, "goes with HandleBatch alone: a Handler gets one message at a time")
	}
	return d.serve(receiver, h, o)
}

// handleOptionsOf applies opts to the defaults, with concurrency's.
func handleOptionsOf(concurrency int, opts []HandleOption) (handleOptions, error) {
	o := handleOptions{
		concurrency: concurrency,
		maxAttempts: DefaultMaxAttempts,
		backoff:     DefaultBackoff,
		lease:       DefaultLease,
	}
	for _, opt := range opts {
		opt(&o)
	}
	return o, o.err
}

// serve registers the consumer of receiver, which runs h, or o.batch when
// h is nil, and starts it.
func (d *Disker) serve(receiver string, h Handler, o handleOptions) error {
	if o.groups != (broker.GroupConfig{}) {
		// Set before the first message is fetched, and before Handle
		// returns: a send after it finds them set.
		if err := d.configureGroups(receiver, o.groups); err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return ErrClosed
	}
	if _, ok := d.consumers[receiver]; ok {
		return ErrAlreadyRegistered
	}
	c, err := d.newConsumer(receiver, h, o)
	if err != nil {
		return err
	}
	d.consumers[receiver] = c
	if d.manual {
		c.startByHand()
	} else {
		c.start()
	}
	d.startTicker() // an instance that serves a receiver runs the schedules
	// A heartbeat at once shows the new receiver in the registry, and
	// vouches for its deliveries from the start. Receivers added together
	// share it (see runHeartbeat): a heartbeat writes an entry per
	// receiver, so one per receiver added would cost the square of their
	// number.
	select {
	case d.beatNow <- struct{}{}:
	default:
	}
	return nil
}

// Unhandle stops serving receiver: it stops fetching, waits for the
// in-flight handlers until ctx ends, then cancels their contexts and leaves
// what did not finish to be delivered again. It returns ctx's error when the
// handlers did not all finish in time, and ErrNotHandled when receiver is not
// served by this instance.
func (d *Disker) Unhandle(ctx context.Context, receiver string) error {
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return ErrClosed
	}
	c, ok := d.consumers[receiver]
	delete(d.consumers, receiver)
	if ok {
		d.unhandling.Add(1) // Close waits for it
	}
	d.mu.Unlock()
	if !ok {
		return ErrNotHandled
	}
	defer d.unhandling.Done()
	return c.stop(ctx)
}

// OnTimeout registers h to receive the timeout notices of sender's messages.
// It stays registered until RemoveTimeoutHandler. The instance then reads
// sender's reply stream (shared with the other instances that registered
// handlers for sender) and watches sender's timeouts.
//
// Until a ReplyHandler is registered for sender (OnReply), the replies to
// sender's messages go to a default one, which logs each at Info with the
// sender and the request's id and counts it (LocalStats.UnhandledReplies):
// register the sender's ReplyHandler as well to act on them. The handlers of one
// sender run one at a time, in the order of its stream, and each entry is
// acknowledged once its handler returned; ctx ends on Close, which waits
// for the handler running.
func (d *Disker) OnTimeout(sender string, h TimeoutHandler) error {
	if err := checkName("sender", sender); err != nil {
		return err
	}
	if h == nil {
		return invalid("TimeoutHandler", "must not be nil")
	}
	return d.addSenderHandler(sender, func(s *senderHandlers) bool {
		if s.timeout != nil {
			return false
		}
		s.timeout = h
		if s.reply == nil {
			s.reply, s.defaultReply = d.defaultReplyHandler(sender), true
		}
		return true
	})
}

// OnReply registers h to receive the replies to sender's messages, until
// RemoveReplyHandler; it replaces the default one of OnTimeout. See
// OnTimeout.
func (d *Disker) OnReply(sender string, h ReplyHandler) error {
	if err := checkName("sender", sender); err != nil {
		return err
	}
	if h == nil {
		return invalid("ReplyHandler", "must not be nil")
	}
	return d.addSenderHandler(sender, func(s *senderHandlers) bool {
		if s.reply != nil && !s.defaultReply {
			return false
		}
		s.reply, s.defaultReply = h, false
		return true
	})
}

// RemoveTimeoutHandler unregisters sender's TimeoutHandler, and the
// default ReplyHandler that OnTimeout registered, if any.
func (d *Disker) RemoveTimeoutHandler(sender string) error {
	return d.removeSenderHandler(sender, func(s *senderHandlers) bool {
		ok := s.timeout != nil
		s.timeout = nil
		if s.defaultReply {
			s.reply, s.defaultReply = nil, false
		}
		return ok
	})
}

// RemoveReplyHandler unregisters sender's ReplyHandler. While sender has a
// TimeoutHandler, its replies then go to the default ReplyHandler (see
// OnTimeout).
func (d *Disker) RemoveReplyHandler(sender string) error {
	return d.removeSenderHandler(sender, func(s *senderHandlers) bool {
		if s.reply == nil || s.defaultReply {
			return false
		}
		s.reply = nil
		if s.timeout != nil {
			s.reply, s.defaultReply = d.defaultReplyHandler(sender), true
		}
		return true
	})
}

// defaultReplyHandler is the ReplyHandler of a sender that has only a
// TimeoutHandler: it logs and counts each reply, so that none is lost
// without a trace.
func (d *Disker) defaultReplyHandler(sender string) ReplyHandler {
	return ReplyHandlerFunc(func(_ context.Context, msg *Message) {
		d.unhandledReplies.Add(1)
		d.log.Info("disker: a reply for a sender with no ReplyHandler (OnReply); logged and dropped",
			"sender", sender, "id", msg.InReplyTo, "from", msg.Sender)
	})
}
