// Package membroker is the embedded broker: a [broker.Broker] held entirely
// in the memory of one process, with the same semantics as the Redis broker
// (it passes the same conformance suite, internal/broker/brokertest).
//
// It is the default engine of a single process and of `disker demo`. A
// broker made by [New] is private to its user; [Shared] gives several users
// in one process (for instance several disker instances) one broker by name.
//
// All state sits behind one mutex, so every operation is one atomic step.
// Blocking reads wait on channels and on a timer for the earliest moment a
// lease or a retry delay comes due; an idle receiver costs no goroutine and
// no polling. Messages are stored encoded, so callers never share memory with
// the broker.
package membroker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// DefaultMaxMessageSize is the default limit on a message's content: 1 MiB.
const DefaultMaxMessageSize = 1 << 20

// Options configures a Broker.
type Options struct {
	// MaxMessageSize is the largest content, in bytes, that a message or a
	// reply may carry; Send and Reply reject larger ones. 0 (or less) means
	// DefaultMaxMessageSize. For a shared broker it is the limit of the
	// handle that Shared returns: handles of one broker may differ.
	MaxMessageSize int
	// Now is the broker's clock: every deadline, lease and expiry is decided
	// by it. nil means time.Now. Blocked calls wait in real time for
	// durations computed from it, and Local converts by it at each call
	// (a clock that moves only when told, as the test kit's, stays
	// exact). A shared broker always runs on time.Now: Shared panics when
	// Now is set.
	Now func() time.Time
	// MaxResultBytes caps the bytes of the final results retained per
	// receiver (broker.Results), as the Redis broker's: 0 (or less) means
	// broker.DefaultMaxResultBytes. A shared broker's is the first
	// handle's.
	MaxResultBytes int64
}

// Broker is an in-memory [broker.Broker]. It is safe for concurrent use.
// A Broker from [New] owns its state; one from [Shared] is a handle on state
// shared by name, and its Close only closes the handle.
type Broker struct {
	c         *core
	maxSize   int // the limit on content of this handle's Send and Reply
	closed    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
	// offset is the broker's clock minus the local one, from the readings
	// of Now (see broker.Offset): the clock of Local.
	offset broker.Offset
	// parked are the waits of this handle's fetches with Wake (park),
	// woken by Close; guarded by c.mu.
	parked map[*parkedWait]struct{}
}

var _ broker.Broker = (*Broker)(nil)

// New returns a private in-memory broker: its state is reachable through it
// alone, and goes when it does.
func New(opts Options) *Broker {
	return newHandle(newCore(opts), opts)
}

var shared = struct {
	mu    sync.Mutex
	cores map[string]*core
}{cores: make(map[string]*core)}

// Shared returns a handle on the process-wide broker called name, creating
// it on first use. Every handle of one name sees the same queues, replies
// and registry, as clients of one Redis server do. opts.MaxMessageSize is
// the limit of this handle's Send and Reply, as each Redis client has its
// own; opts.Now must be nil (a shared broker runs on time.Now), else Shared
// panics.
//
// A shared broker lives as long as the process (it is never discarded, so a
// stopped instance's messages wait for the next one, as they would in
// Redis). Close on a handle only closes that handle: calls through it return
// broker.ErrClosed and its blocked calls wake, while other handles carry on.
func Shared(name string, opts Options) *Broker {
	if opts.Now != nil {
		panic("membroker: Shared: Options.Now must be nil: a shared broker runs on time.Now")
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	c, ok := shared.cores[name]
	if !ok {
		c = newCore(Options{MaxResultBytes: opts.MaxResultBytes})
		shared.cores[name] = c
	}
	return newHandle(c, opts)
}

func newHandle(c *core, opts Options) *Broker {
	b := &Broker{c: c, maxSize: opts.MaxMessageSize, done: make(chan struct{})}
	if b.maxSize <= 0 {
		b.maxSize = DefaultMaxMessageSize
	}
	return b
}

// Close closes b: blocked calls return broker.ErrClosed, and so do later
// calls. For a shared broker, only this handle is closed. Close is
// idempotent and always returns nil.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		close(b.done)
		b.c.mu.Lock()
		for w := range b.parked {
			w.wakeAlone()
		}
		b.c.mu.Unlock()
	})
	return nil
}

// Now returns the broker's clock.
func (b *Broker) Now(ctx context.Context) (time.Time, error) {
	if err := b.check(ctx); err != nil {
		return time.Time{}, err
	}
	sent := time.Now()
	now := b.c.now()
	b.offset.Measure(sent, now, time.Now())
	return now, nil
}

// Local turns the broker's time t into local time (see broker.Clock). On
// a clock of its own (Options.Now), t is as far from the local now as it
// is from the broker's, read at the call: exact however that clock moves.
func (b *Broker) Local(t time.Time) time.Time {
	if b.c.ownClock && !t.IsZero() {
		return time.Now().Add(t.Sub(b.c.now()))
	}
	return b.offset.Local(t)
}

// check returns the error a call must fail with before it starts, if any.
func (b *Broker) check(ctx context.Context) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("membroker: %w", err)
	}
	return nil
}

// lock takes the state's mutex for an operation, failing if b is closed or
// ctx is done, and drops the inboxes whose state expired. The caller must
// unlock when it gets nil.
func (b *Broker) lock(ctx context.Context) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	b.c.mu.Lock()
	if len(b.c.inboxes) > 0 {
		b.c.expireInboxes(b.c.now())
	}
	return nil
}

// core is the state of one broker, shared by its handles.
type core struct {
	now      func() time.Time
	ownClock bool // now is Options.Now, not time.Now

	mu  sync.Mutex
	seq uint64
	// lastReplyAt is the time of the latest reply-stream entry: entries
	// never get an earlier one (see appendReply).
	lastReplyAt time.Time
	queues      map[string]*stream     // receiver -> its queue
	replies     map[string]*stream     // sender -> its reply stream
	dead        map[string]*deadList   // receiver -> its dead letters
	timeouts    map[string]*timeoutSet // sender -> its pending timeouts
	locks       map[string]lockEntry   // receiver -> its exclusive lock
	workers     map[string]workerEntry // worker id -> its registration
	// vouched holds, by vouchKey, until when a worker's heartbeat vouches
	// for its deliveries of a receiver: past it, another consumer's Fetch
	// takes them whatever their lease.
	vouched map[string]time.Time
	// inboxes holds when the state of each open inbox (KeepInbox)
	// expires; nextExpiry is at or before the earliest of them (zero when
	// there is none). An expired inbox is dropped by the next lock.
	inboxes    map[string]time.Time
	nextExpiry time.Time
	// streams holds the state of the streamed requests of each inbox
	// (streams.go), by inbox and request id; made on first use.
	streams map[string]*inboxStreams
	// dedups holds the dedup keys by receiver and key (keyOf), paused the
	// paused receivers, idems the idempotency keys by receiver and key.
	// Expired keys are dropped when looked up, and all of them when the
	// map has doubled since the last sweep (sweepKeys).
	dedups    map[string]dedupEntry
	paused    map[string]bool
	idems     map[string]*idemEntry
	debounces map[string]debounceRun
	// pauseEpoch counts the calls of Pause and Resume (PauseEpoch).
	pauseEpoch uint64
	keysSwept  int
	// schedules holds the periodic schedules by name (schedules.go);
	// made on first use.
	schedules    map[string]*schedule
	schedVersion int64 // the last version given to a schedule
	// buckets and slots are the receivers' flow limits (limits.go).
	buckets map[string]*bucket
	slots   map[string]map[string]slotHold
	// marks holds, by receiver, the Cancels of messages in flight, oldest
	// first (broker.Cancels.CancelMarks).
	marks map[string][]mark
	// expired counts, by receiver, the messages dropped unstarted
	// (broker.Queue.Drop).
	expired map[string]int64
	// groupSets holds the keyed groups by receiver (groups.go).
	groupSets map[string]*groupSet
	// resultSets holds the retained results by receiver (results.go), and
	// maxResults the cap on each one's bytes.
	resultSets map[string]*resultSet
	maxResults int64
	// batches holds the batches by id (batches.go).
	batches map[string]*memBatch
	// batchIndex holds, by completion receiver, the latest batch ids
	// created, the oldest first, and batchSeq numbers their creations
	// (batchindex.go).
	batchIndex map[string][]indexedBatch
	batchSeq   uint64
}

func newCore(opts Options) *core {
	c := &core{
		now:       opts.Now,
		queues:    make(map[string]*stream),
		vouched:   make(map[string]time.Time),
		replies:   make(map[string]*stream),
		dead:      make(map[string]*deadList),
		timeouts:  make(map[string]*timeoutSet),
		locks:     make(map[string]lockEntry),
		workers:   make(map[string]workerEntry),
		inboxes:   make(map[string]time.Time),
		dedups:    make(map[string]dedupEntry),
		debounces: make(map[string]debounceRun),
		paused:    make(map[string]bool),
		idems:     make(map[string]*idemEntry),
		buckets:   make(map[string]*bucket),
		slots:     make(map[string]map[string]slotHold),
		marks:     make(map[string][]mark),
		expired:   make(map[string]int64),
		groupSets: make(map[string]*groupSet),

		resultSets: make(map[string]*resultSet),
		batches:    make(map[string]*memBatch),
		maxResults: opts.MaxResultBytes,
	}
	if c.maxResults <= 0 {
		c.maxResults = broker.DefaultMaxResultBytes
	}
	c.ownClock = c.now != nil
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

// nextRef returns a new entry handle: a decimal number that grows with each
// call. Callers hold mu.
func (c *core) nextRef() string {
	c.seq++
	return strconv.FormatUint(c.seq, 10)
}

// queue returns receiver's queue, creating it. Callers hold mu.
func (c *core) queue(receiver string) *stream {
	s := c.queues[receiver]
	if s == nil {
		s = newStream()
		c.queues[receiver] = s
	}
	return s
}

// replyStream returns sender's reply stream, creating it. Callers hold mu.
func (c *core) replyStream(sender string) *stream {
	s := c.replies[sender]
	if s == nil {
		s = newStream()
		c.replies[sender] = s
	}
	return s
}

// tidy drops the empty, unwatched state kept for name. Callers hold mu.
func (c *core) tidy(name string) {
	if s := c.queues[name]; s != nil && s.idle() {
		delete(c.queues, name)
	}
	if s := c.replies[name]; s != nil && s.idle() {
		delete(c.replies, name)
	}
	if d := c.dead[name]; d != nil && d.order.Len() == 0 {
		delete(c.dead, name)
	}
	if t := c.timeouts[name]; t != nil && len(t.byID) == 0 {
		delete(c.timeouts, name)
	}
}

// wait blocks until ch is closed, due comes (if not zero), the block timer
// fires, ctx is done or b is closed. It reports whether the caller should
// look again (false when the block time is over), or the error to return.
func (b *Broker) wait(ctx context.Context, ch <-chan struct{}, due time.Duration, hasDue bool, block *time.Timer) (bool, error) {
	var dueC <-chan time.Time
	if hasDue {
		t := time.NewTimer(max(due, 0))
		defer t.Stop()
		dueC = t.C
	}
	select {
	case <-ch:
		return true, nil
	case <-dueC:
		return true, nil
	case <-block.C:
		return false, nil
	case <-ctx.Done():
		return false, fmt.Errorf("membroker: %w", ctx.Err())
	case <-b.done:
		return false, broker.ErrClosed
	}
}
