package disker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/pool"
)

// consumer serves one receiver: a fetch loop, the handler tasks on an
// executor, a lease keeper, and an acker. A batch handler's consumer
// (HandleBatch) gathers its deliveries into batches (batches) and runs a
// task per batch instead of one per delivery.
type consumer struct {
	d    *Disker
	name string
	h    Handler
	o    handleOptions
	// exec runs the handler tasks; made at the first (executor).
	exec     *pool.Executor
	execOnce sync.Once
	batches  *batcher // nil for a Handler

	fetchCtx   context.Context // ends when fetching stops (interrupts a blocking Fetch)
	stopFetch  context.CancelFunc
	hardCtx    context.Context // parent of the handlers' contexts: ends on forced stop
	hardCancel context.CancelCauseFunc
	loopDone   sync.WaitGroup // the fetch loop, till it stops
	keeperStop chan struct{}  // made at the keeper's first run; closed by stop
	// keeper guards keeperOn (the lease keeper runs) and keeperOff (it
	// is not to run again: stopping, or run by hand); keepers counts its
	// runs, for stop to wait.
	keeper      sync.Mutex
	keeperOn    bool
	keeperOff   bool
	keepers     sync.WaitGroup
	acks        *acker
	freed       chan struct{} // a slot was freed (capacity 1); made at the first wait, under mu (freedSignal)
	stopOnce    sync.Once
	stopErr     error
	tasks       sync.WaitGroup
	n           atomic.Int64 // in flight
	mu          sync.Mutex
	inflight    map[string]*task // by ref; made at the first
	lockHeld    atomic.Bool      // exclusive mode: this instance holds the lock
	lockTTL     time.Duration
	lockRenewAt time.Time
	lim         *limiter // nil unless gated (limits.go)

	// paused is set while the receiver is paused (see pause.go); resumed
	// is closed when it is resumed. Guarded by pauseMu, paused read alone
	// where it is only looked at.
	paused  atomic.Bool
	pauseMu sync.Mutex
	resumed chan struct{}

	// The fetch loop's state, its own but across its runs (see park):
	// fp, its params, bo, its pacer of failures, grouped, its receiver's
	// group settings are made, and idle, its last fetch found nothing.
	fp      broker.FetchParams
	bo      pacer
	grouped bool
	idle    bool
	// begun: its first fetch ended (or it parked or stopped before one),
	// which lets another loop begin (loopStarts).
	begun bool
	// loop is loopRunning, loopWoken or loopParked; wakeLoop is wake, as
	// a func made once.
	loop     atomic.Int32
	wakeLoop func()

	processed, failed, retried, deadLettered, expired, givenBack atomic.Int64
	// droppedReplies counts the replies the handler returned to
	// fire-and-forget messages; droppedLogged is set once one was logged.
	droppedReplies atomic.Int64
	droppedLogged  atomic.Bool
}

// task is one delivery being handled.
type task struct {
	dl broker.Delivery
	// hc is the handler's context of a task run alone (begin).
	hc handlerCtx
	// cancel, set for a task of a batch (batch.join), is what end calls
	// instead of ending hc.
	cancel context.CancelCauseFunc
	// msg is the Message handed to the handler, held here so that a
	// delivery costs one allocation less; the handler may keep it after
	// it returned (ErrReplyLater), which keeps the task with it.
	msg Message
	// settle is taskRunning until the delivery is settled (replied to,
	// acknowledged, retried: taskSettled) or cancelled (Cancel:
	// taskCancelled), whichever comes first.
	settle atomic.Int32
}

// The states of task.settle.
const (
	taskRunning int32 = iota
	taskSettled
	taskCancelled
)

// keeperIdleFor is how long a receiver's lease keeper runs on with nothing
// in flight before it ends.
const keeperIdleFor = time.Second

// cancelPoll is how often a consumer with deliveries in flight reads the
// broker's marks of cancelled messages (broker.Cancels.CancelMarks).
const cancelPoll = 250 * time.Millisecond

// errStopped is the cause of a handler's context ending because its
// instance stopped serving the receiver and the grace period ran out.
var errStopped = errors.New("disker: stopped: the message will be delivered again")

func (d *Disker) newConsumer(receiver string, h Handler, o handleOptions) (*consumer, error) {
	c := &consumer{
		d: d, name: receiver, h: h, o: o,
		lockTTL: max(3*d.cfg.HeartbeatInterval, 6*d.cfg.ReceiverBlockTimeout),
	}
	// The executor is made at the first delivery (executor): made here, it
	// is only checked.
	if _, err := c.newExecutor(); err != nil {
		return nil, fmt.Errorf("disker: receiver %s: %w", receiver, err)
	}
	c.acks = newAcker(d, "receiver", receiver, func(ctx context.Context, refs ...string) error {
		return d.b.Ack(ctx, receiver, refs...)
	})
	if c.gated() {
		c.lim = newLimiter(c)
	}
	if o.batch != nil {
		c.batches = newBatcher(c)
	}
	c.fp = broker.FetchParams{Receiver: receiver, Consumer: d.id, Block: d.cfg.ReceiverBlockTimeout, Lease: o.lease, MaxAttempts: o.maxAttempts}
	c.idle = true // its first fetch too: many receivers started at once park
	c.wakeLoop = c.wake
	c.fetchCtx, c.stopFetch = context.WithCancel(d.bgCtx)
	c.hardCtx, c.hardCancel = context.WithCancelCause(context.Background())
	return c, nil
}

// newExecutor returns a new executor of the consumer's handler tasks.
func (c *consumer) newExecutor() (*pool.Executor, error) {
	return pool.NewExecutor(pool.ExecutorConfig{
		Name:        "disker:" + c.name,
		MaxWorkers:  c.o.concurrency,
		QueueSize:   c.o.capacity(), // a task holds at least one delivery
		IdleTimeout: 30 * time.Second,
		// Handler panics are recovered in call; this catches Disker's own.
		PanicHandler: func(p *pool.PanicError) {
			c.d.log.Error("disker: panic while settling a delivery", "receiver", c.name, "error", p)
		},
	})
}

// executor returns the executor of the handler tasks, made at the first
// call (newConsumer checked that it can be): a receiver that never had a
// delivery holds none.
func (c *consumer) executor() *pool.Executor {
	c.execOnce.Do(func() {
		exec, err := c.newExecutor()
		if err != nil {
			panic(err) // newConsumer made one with the same config
		}
		c.exec = exec
	})
	return c.exec
}

func (c *consumer) start() {
	c.loopDone.Add(1)
	c.d.starts.start(c)
	if c.lim != nil {
		c.wakeKeeper() // it renews the flow limits' slots between fetches too
	}
}

// stop stops fetching, waits for the in-flight handlers until ctx ends, then
// cancels them and waits for them to return; what they did not finish stays
// in the broker for redelivery.
func (c *consumer) stop(ctx context.Context) error {
	c.stopOnce.Do(func() {
		c.stopFetch()
		c.wake() // a parked loop, to stop
		c.loopDone.Wait()
		if c.batches != nil {
			c.batches.close() // the batch being gathered starts now
		}
		idle := make(chan struct{})
		go func() { c.tasks.Wait(); close(idle) }()
		select {
		case <-idle:
		case <-ctx.Done():
			c.stopErr = fmt.Errorf("disker: receiver %s: %d handlers did not finish in time: %w", c.name, c.n.Load(), ctx.Err())
			c.hardCancel(errStopped)
			<-idle
		}
		c.hardCancel(errStopped)
		c.keeper.Lock()
		c.keeperOff = true
		if c.keeperStop != nil {
			close(c.keeperStop)
		}
		c.keeper.Unlock()
		c.keepers.Wait()
		c.acks.close(ctx)
		if c.lim != nil {
			rctx, cancel := context.WithTimeout(c.d.opCtx, 5*time.Second)
			c.lim.releaseAll(rctx)
			cancel()
		}
		if c.lockHeld.Load() {
			rctx, cancel := context.WithTimeout(c.d.opCtx, 5*time.Second)
			if err := c.d.b.Release(rctx, c.name, c.d.id); err != nil {
				c.d.log.Warn("disker: cannot release the exclusive lock; it expires by itself", "receiver", c.name, "error", err)
			}
			cancel()
		}
		c.execOnce.Do(func() {}) // none is made after this
		if c.exec != nil {
			cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = c.exec.Close(cctx) // idle by now
			cancel()
		}
	})
	return c.stopErr
}

// The states of consumer.loop.
const (
	loopRunning int32 = iota // the fetch loop runs
	loopWoken                // it runs, and was woken meanwhile: it must not park
	loopParked               // it parked: wake runs it again
)

// fetchLoop runs the fetch loop (fetching) until it stops or parks.
func (c *consumer) fetchLoop() {
	if c.fetching() {
		return // parked: wake runs it again
	}
	c.begin1()
	if c.fp.Wait != nil {
		c.fp.Wait.Cancel()
		c.fp.Wait = nil
	}
	c.loopDone.Done()
}

// park ends the fetch loop's goroutine, which wake starts again, and
// reports true, unless the loop was woken since it last tried; an idle
// receiver then holds no goroutine. It parks while its fetch waits in the
// broker (broker.FetchParams.Wake), or while it is paused (setPaused
// wakes it).
func (c *consumer) park() bool {
	c.begin1() // before: once parked, the loop's state is the next run's
	if c.loop.CompareAndSwap(loopRunning, loopParked) {
		return true
	}
	c.loop.Store(loopRunning)
	return false
}

// wake runs the fetch loop again if it parked, or keeps it from parking
// once if it runs.
func (c *consumer) wake() {
	for {
		switch c.loop.Load() {
		case loopParked:
			if c.loop.CompareAndSwap(loopParked, loopRunning) {
				go c.fetchLoop()
				return
			}
		case loopRunning:
			if c.loop.CompareAndSwap(loopRunning, loopWoken) {
				return
			}
		default:
			return
		}
	}
}

// fetching fetches deliveries while there are free slots, until stopped
// (false) or parked (true). A fetch that follows one that found nothing
// lets the broker wait for entries without a goroutine (Wake), unless the
// receiver has flow limits or is exclusive (its lock is renewed between
// fetches): a busy loop fetches as before.
func (c *consumer) fetching() bool {
	d := c.d
	fp, bo := &c.fp, &c.bo
	for c.fetchCtx.Err() == nil {
		free, step := c.beforeFetch()
		switch step {
		case stepStop:
			return false
		case stepPark:
			return true
		case stepAgain:
			continue
		}
		fp.Max = free
		if fp.Wake == nil {
			c.begin1() // it may hold its goroutine: no use holding back others
		}
		ds, err := d.b.Fetch(c.fetchCtx, fp)
		c.begin1()
		if c.lim != nil {
			c.lim.ungate(d.opCtx, free, len(ds))
		}
		if err != nil {
			if c.fetchCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return false
			}
			d.health.fail("fetch", err)
			bo.wait(c.fetchCtx.Done())
			continue
		}
		bo.reset()
		d.health.ok()
		c.idle = len(ds) == 0
		if fp.Wait != nil {
			if c.park() {
				return true
			}
			continue // woken meanwhile: the next fetch takes the wait up
		}
		if len(ds) > 0 {
			c.dispatch(ds)
			yieldToWoken()
		} else if c.lim != nil && fp.Block <= 0 {
			// A fetch that may not block in the broker (WithRateLimit)
			// found nothing: look again after a while.
			c.sleep(c.lim.idleWait(), false)
		}
	}
	return false
}

// loopStep is what the fetch loop does next (beforeFetch).
type loopStep int

const (
	stepFetch loopStep = iota // fetch
	stepAgain                 // look again
	stepPark                  // park: the loop's goroutine ends
	stepStop                  // stop: fetching ended
)

// beforeFetch readies the fetch loop's next fetch, and returns the
// deliveries it may fetch (with stepFetch): first the receiver's group
// settings, then a pause, the exclusive lock, free slots and flow limits
// each may hold it (waiting, or parked while paused), and it sets
// whether the fetch may wait without a goroutine (see fetching).
func (c *consumer) beforeFetch() (int, loopStep) {
	d, fp, bo := c.d, &c.fp, &c.bo
	if !c.grouped {
		// The receiver's group settings, before its first fetch.
		if err := c.configureGroups(c.fetchCtx); err != nil {
			if c.fetchCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return 0, stepStop
			}
			d.health.fail("configure groups", err)
			bo.wait(c.fetchCtx.Done())
			return 0, stepAgain
		}
		c.grouped = true
	}
	if c.paused.Load() {
		return 0, c.whilePaused()
	}
	if c.o.exclusive && !c.holdLock(bo) {
		return 0, stepAgain
	}
	free := c.o.capacity() - int(c.n.Load())
	if free <= 0 {
		freed := c.freedSignal()
		if c.o.capacity()-int(c.n.Load()) > 0 {
			return 0, stepAgain // freed before the signal was made
		}
		select {
		case <-freed:
		case <-c.fetchCtx.Done():
		}
		return 0, stepAgain
	}
	fp.Wake = nil
	if c.lim == nil {
		if c.idle && !c.o.exclusive {
			fp.Wake = c.wakeLoop
		}
		return free, stepFetch
	}
	var wait time.Duration
	var onFree bool
	var err error
	free, fp.Block, wait, onFree, err = c.lim.gate(c.fetchCtx, free)
	if err != nil {
		if c.fetchCtx.Err() != nil || errors.Is(err, broker.ErrClosed) {
			return 0, stepStop
		}
		d.health.fail("flow limits", err)
		bo.wait(c.fetchCtx.Done())
		return 0, stepAgain
	}
	if free <= 0 {
		c.sleep(wait, onFree)
		return 0, stepAgain
	}
	return free, stepFetch
}

// whilePaused holds the fetch loop of a paused receiver: it ends its
// fetch's wait in the broker, if any, and parks (setPaused wakes it), or
// waits to be resumed when it has flow limits (their slots are renewed
// between fetches).
func (c *consumer) whilePaused() loopStep {
	if c.fp.Wait != nil {
		c.fp.Wait.Cancel()
		c.fp.Wait = nil
	}
	if c.lim == nil && c.park() {
		return stepPark
	}
	c.waitResumed(c.fetchCtx.Done(), nil)
	return stepAgain
}

// begin1 lets another fetch loop begin (loopStarts), once: at the end of
// this one's first fetch (at its start when it may not park), or when it
// parks or stops before one.
func (c *consumer) begin1() {
	if !c.begun {
		c.begun = true
		c.d.starts.begun()
	}
}

// loopStarts bounds the fetch loops that make their first fetch at once:
// each holds a goroutine until it parks, and the runtime keeps the
// goroutines it made for reuse, so that ten thousand receivers started
// at once would leave ten thousand behind. The others wait in line, and
// start as those begun end their first fetch.
type loopStarts struct {
	mu      sync.Mutex
	running int
	queue   []*consumer
}

// loopsAtOnce is how many fetch loops may make their first fetch at once.
const loopsAtOnce = 1024

// start runs c's fetch loop, at once or in its turn.
func (s *loopStarts) start(c *consumer) {
	s.mu.Lock()
	if s.running >= loopsAtOnce {
		s.queue = append(s.queue, c)
		s.mu.Unlock()
		return
	}
	s.running++
	s.mu.Unlock()
	go c.firstRun()
}

// begun starts the next loop in line, if any.
func (s *loopStarts) begun() {
	s.mu.Lock()
	if len(s.queue) == 0 {
		s.running--
		s.queue = nil
		s.mu.Unlock()
		return
	}
	c := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	s.mu.Unlock()
	go c.firstRun()
}

// firstRun is the first run of the fetch loop: it reads whether the
// receiver is paused first.
func (c *consumer) firstRun() {
	c.readPaused()
	c.fetchLoop()
}

// yieldToWoken lets the goroutines that a reading loop has just woken
// (handlers, waiting Requests) run before the loop issues its next read:
// without it a lone round trip takes longer on a machine with more than
// one CPU (compare `bench -suite disker -workloads rr1` with and without
// it). The likely cause: the next read's command readies the client's
// writer goroutine, which takes the woken goroutine's place as the
// next to run on this P, so the woken one waits for another P to be woken
// to steal it, a wake-up across CPUs.
func yieldToWoken() {
	runtime.Gosched()
}

// holdLock takes or renews the exclusive lock when due. It returns false,
// after waiting, when this instance does not hold it.
func (c *consumer) holdLock(bo *pacer) bool {
	d := c.d
	if c.lockHeld.Load() && time.Now().Before(c.lockRenewAt) {
		return true
	}
	ok, err := d.b.Acquire(c.fetchCtx, c.name, d.id, c.lockTTL)
	if err != nil {
		if c.fetchCtx.Err() == nil {
			d.health.fail("acquire lock", err)
			bo.wait(c.fetchCtx.Done())
		}
		return false
	}
	d.health.ok()
	if ok != c.lockHeld.Load() {
		c.lockHeld.Store(ok)
		if ok {
			d.log.Info("disker: serving exclusive receiver", "receiver", c.name)
		} else {
			d.log.Info("disker: lost the exclusive lock; another instance serves the receiver", "receiver", c.name)
		}
	}
	if !ok {
		t := time.NewTimer(d.cfg.ReceiverBlockTimeout)
		select {
		case <-t.C:
		case <-c.fetchCtx.Done():
			t.Stop()
		}
		return false
	}
	c.lockRenewAt = time.Now().Add(c.lockTTL / 3)
	return true
}

// dispatch starts a task for each delivery, or gives them to the batches
// of a batch handler, and drops at once those whose deadline or expiry
// passed (see tooLate).
func (c *consumer) dispatch(ds []broker.Delivery) {
	if c.batches != nil {
		c.batches.add(ds)
		return
	}
	now := time.Now()
	for i := range ds {
		dl := ds[i]
		deadline := c.d.b.Local(dl.Deadline)
		if c.tooLate(&dl, now) {
			continue
		}
		t := c.begin(dl, deadline)
		if err := c.executor().Submit(context.Background(), func() { c.run(t) }); err != nil {
			// The executor is closed only after the loop stopped: this is a
			// bug, but the message is safe (unacknowledged).
			c.d.log.Error("disker: cannot run a handler", append(logAttrs(c.name, dl.Env.ID, dl.Attempt), "error", err)...)
			c.finish(t)
		}
	}
}

// begin counts dl in flight as a task, whose handler's context (t.hc)
// ends at deadline (zero: none), and returns it.
func (c *consumer) begin(dl broker.Delivery, deadline time.Time) *task {
	t := &task{dl: dl}
	t.hc.init(c.hardCtx, deadline)
	c.track(t)
	return t
}

// end ends t's handler's context with cause (nil: t finished; else why
// it was lost), or tells its batch.
func (t *task) end(cause error) {
	if t.cancel != nil {
		t.cancel(cause)
		return
	}
	t.hc.cancel(cause)
}

// track counts t in flight, where the lease keeper and the cancellations
// find it, until finish.
func (c *consumer) track(t *task) {
	c.mu.Lock()
	if c.inflight == nil {
		c.inflight = make(map[string]*task)
	}
	c.inflight[t.dl.Ref] = t
	c.mu.Unlock()
	c.n.Add(1)
	c.tasks.Add(1)
	c.wakeKeeper()
}

// wakeKeeper starts the lease keeper unless it runs: it runs while
// deliveries are in flight (or the receiver has flow limits), so an idle
// receiver holds no goroutine for it.
func (c *consumer) wakeKeeper() {
	c.keeper.Lock()
	defer c.keeper.Unlock()
	if c.keeperOn || c.keeperOff {
		return
	}
	c.keeperOn = true
	if c.keeperStop == nil {
		c.keeperStop = make(chan struct{})
	}
	c.keepers.Add(1)
	go c.keepLeases(c.keeperStop)
}

// keeperIdle ends the lease keeper's run when nothing is in flight (and
// the receiver has no flow limits), under the lock wakeKeeper takes, so
// that a task tracked meanwhile starts another.
func (c *consumer) keeperIdle() bool {
	if c.lim != nil {
		return false
	}
	c.keeper.Lock()
	defer c.keeper.Unlock()
	if c.n.Load() > 0 {
		return false
	}
	c.keeperOn = false
	return true
}

// tooLate reports whether dl must not start, at now, and then drops it:
// its deadline passed (its sender hears of the timeout from the broker),
// or its expiry did (its sender, if it waits for a reply, is told here
// with a CodeExpired error). Both are broker times, compared in the local
// clock corrected to the broker's.
func (c *consumer) tooLate(dl *broker.Delivery, now time.Time) bool {
	if deadline := c.d.b.Local(dl.Deadline); !deadline.IsZero() && !now.Before(deadline) {
		c.drop(dl, false)
		return true
	}
	if expiry := c.d.b.Local(dl.Expiry); !expiry.IsZero() && !now.Before(expiry) {
		c.drop(dl, true)
		return true
	}
	return false
}

// drop removes a delivery that will not run (broker.Queue.Drop, which
// counts it in ReceiverStats.Expired), after telling its sender that it
// expired when expired is set. Should the broker not answer, the delivery
// comes back after its lease, and is dropped then.
func (c *consumer) drop(dl *broker.Delivery, expired bool) {
	d := c.d
	c.expired.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventExpired, Receiver: c.name, Sender: dl.Env.Sender, MessageID: dl.Env.ID, Attempt: dl.Attempt})
	}
	attrs := logAttrs(c.name, dl.Env.ID, dl.Attempt)
	msg := d.messageOf(&dl.Env, dl.Deadline, dl.Attempt)
	msg.retention = c.retentionOf(&dl.Env)
	if msg.retention > 0 {
		d.priorReply(msg)
	}
	if expired && msg.wantsReply() {
		if err := d.reply(d.opCtx, msg, nil, CodeExpired, ErrExpired.Error()); err != nil && !errors.Is(err, ErrLate) {
			d.log.Warn("disker: cannot tell the sender that its message expired; it is dropped when it comes back", append(attrs, "error", err)...)
			return
		}
	}
	var err error
	if ret := msg.retention; ret > 0 {
		st, code, text := broker.ResultTimedOut, "", ""
		if expired {
			st, code, text = broker.ResultExpired, CodeExpired, ErrExpired.Error()
		}
		err = d.b.FinishResult(d.opCtx, &broker.FinishResultParams{Receiver: c.name, ID: dl.Env.ID, Ref: dl.Ref, State: st,
			Worker: d.id, Attempt: dl.Attempt, Reply: msg.sentReply, ErrorCode: code, ErrorText: text, Retention: ret, ReplyTo: msg.replyTo()})
	} else {
		err = d.b.Drop(d.opCtx, c.name, dl.Ref)
	}
	if err != nil {
		d.health.fail("drop", err)
		d.log.Warn("disker: cannot drop an expired message; it is dropped when it comes back", append(attrs, "error", err)...)
		return
	}
	d.forgetReply(msg)
	d.releaseDedup(c.name, &dl.Env)
}

// releaseDedup frees the dedup key that env held until it was settled
// (WithDedupUntilSettled), after its delivery was settled for good. Should
// that fail, the key frees at the end of its ttl.
func (d *Disker) releaseDedup(receiver string, env *broker.Envelope) {
	if env.DedupKey == "" {
		return
	}
	if err := d.b.ReleaseDedup(d.opCtx, receiver, env.DedupKey, env.ID); err != nil {
		d.health.fail("release dedup key", err)
		d.log.Warn("disker: cannot free the dedup key of a settled message; it frees at the end of its ttl",
			append(logAttrs(receiver, env.ID, 0), "key", env.DedupKey, "error", err)...)
	}
}

// finish ends a task's bookkeeping.
func (c *consumer) finish(t *task) {
	t.end(nil)
	c.mu.Lock()
	delete(c.inflight, t.dl.Ref)
	c.n.Add(-1)
	freed := c.freed
	c.mu.Unlock()
	signal(freed)
	c.tasks.Done()
}

// freedSignal returns the channel that a freed slot signals, made at the
// first call: a receiver that never filled its slots has none. A slot
// freed before the call is not signalled: the caller counts the free
// slots again after it.
func (c *consumer) freedSignal() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.freed == nil {
		c.freed = make(chan struct{}, 1)
	}
	return c.freed
}

// signal signals ch, a channel of capacity 1, if not nil, unless it is
// signalled already.
func signal(ch chan struct{}) {
	if ch == nil {
		return
	}
	select {
	case ch <- struct{}{}:
	default:
	}
}

// run handles one delivery, begun (begin), and settles it: reply and ack,
// retry, or dead letter.
func (c *consumer) run(t *task) {
	defer c.finish(t)
	d := c.d
	dl := &t.dl
	deadline := t.hc.deadline
	if c.tooLate(dl, time.Now()) {
		return
	}
	if c.paused.Load() && !c.waitResumed(t.hc.make().outer.Done(), c.fetchCtx.Done()) {
		return // stopped, or the lease was lost, while paused
	}
	if t.hc.causeOf() != nil || c.hardCtx.Err() != nil {
		// It waited in line (WithPrefetch) until the instance stopped or
		// the lease was lost: leave it for another delivery. hardCtx is
		// asked too: its children are cancelled one after another, so a
		// busy handler's slot may free before this task's ctx ends.
		return
	}
	msg := &t.msg
	d.setMessage(msg, &dl.Env, dl.Deadline, dl.Attempt)
	msg.Deadline = deadline // the handler's context's, in the same estimate of the clock offset
	msg.Group = dl.GroupKey
	msg.settle = &t.settle
	if t.settle.Load() == taskCancelled {
		c.cancelled(msg)
		return
	}
	if c.lim != nil {
		if !c.lim.start(d.opCtx, 1) {
			// Its global concurrency slot lapsed (or cannot be renewed)
			// while it waited: it goes to an instance that holds one.
			c.giveBack(t, msg, errSlotLapsed)
			return
		}
		defer c.lim.end(1)
	}
	if msg.retention == 0 {
		msg.retention = c.o.retention
	}
	if msg.retention > 0 {
		d.priorReply(msg)
		c.startResult(msg, dl)
		if c.tooLate(dl, time.Now()) {
			return // its deadline passed while its start was recorded
		}
	}
	if d.onEvent != nil {
		d.emit(Event{Kind: EventStarted, Receiver: c.name, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt})
	}
	began := time.Now()
	resp, err := c.call(&t.hc, msg)
	took := time.Since(began)

	if t.settle.Load() == taskCancelled {
		c.cancelled(msg)
		return
	}

	if cause := t.hc.causeOf(); cause != nil {
		if errors.Is(cause, broker.ErrLeaseLost) {
			// Another worker may have the message now: leave it to it.
			d.log.Warn("disker: lease lost while handling; the message goes to another worker", logAttrs(c.name, msg.ID, msg.Attempt)...)
			return
		}
		if err != nil {
			// Stopped before the handler finished: leave it for redelivery.
			return
		}
	}
	c.settle(t, msg, resp, err, took, deadline)
}

// settle settles a handled delivery by what its handler returned: reply
// and ack, give back, retry, or dead letter.
func (c *consumer) settle(t *task, msg *Message, resp []byte, err error, took time.Duration, deadline time.Time) {
	if err == nil || errors.Is(err, ErrReplyLater) {
		c.succeed(t, msg, resp, nil, took, err != nil)
		return
	}
	if isGivenBack(err) {
		c.giveBack(t, msg, err)
		return
	}
	c.fail(t, msg, err, took, deadline)
}

// call runs the handler, turning a panic into a *PanicError.
func (c *consumer) call(ctx context.Context, msg *Message) (resp []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			resp, err = nil, pool.NewPanicError(v)
		}
	}()
	return c.h.Handle(ctx, msg)
}

// cancelled ends the handling of msg, cancelled (Cancel) before it was
// settled: the broker no longer has it, and its sender was told when the
// cancellation took it (see pollCancels).
func (c *consumer) cancelled(msg *Message) {
	c.d.log.Debug("disker: message cancelled while being handled", logAttrs(c.name, msg.ID, msg.Attempt)...)
}

// notifyCancelled sends the sender of t's message, if it waits for a
// reply, the cancelled error in place of the reply: at the moment the
// cancellation took the delivery, so that the sender learns it then,
// whatever the handler does, and in the same order as a reply would be.
func (c *consumer) notifyCancelled(t *task) {
	d := c.d
	msg := d.messageOf(&t.dl.Env, t.dl.Deadline, t.dl.Attempt)
	if !msg.wantsReply() {
		return
	}
	msg.retention = c.retentionOf(&t.dl.Env)
	if err := d.reply(d.opCtx, msg, nil, CodeCancelled, ErrCancelled.Error()); err != nil && !errors.Is(err, ErrLate) {
		d.log.Warn("disker: cannot tell the sender that its message was cancelled", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
	}
	d.recordReply(d.opCtx, msg)
}

// dropReply counts the reply the handler returned to msg, a
// fire-and-forget message (sent without a Sender): nobody receives it. The
// first such reply of the receiver is logged, to point at a Sender the
// sender may have forgotten.
func (c *consumer) dropReply(msg *Message) {
	c.droppedReplies.Add(1)
	if c.droppedLogged.CompareAndSwap(false, true) {
		c.d.log.Warn("disker: the handler returned a reply to a message sent without a Sender; nobody receives it (logged once per receiver; counted in ReceiverLocalStats.DroppedReplies). Send with a Sender, or use Request, to receive replies",
			logAttrs(c.name, msg.ID, msg.Attempt)...)
	}
}

// succeed acknowledges a handled message, after sending resp, or rerr
// when set (a batch handler's Outcome.ReplyError), as its reply unless the
// handler replies later (ErrReplyLater).
func (c *consumer) succeed(t *task, msg *Message, resp []byte, rerr *RemoteError, took time.Duration, later bool) {
	d := c.d
	late := false // the reply was refused as late
	if !c.settling(t, msg) {
		return
	}
	if !later && !msg.wantsReply() && (resp != nil || rerr != nil) {
		if msg.retention > 0 {
			// Nobody receives it: it is kept as the message's result.
			msg.sentReply = &broker.Envelope{ID: msg.ID, Sender: c.name, InReplyTo: msg.ID, Content: resp, Headers: msg.replyHeaders}
			if rerr != nil {
				msg.sentReply.ErrorCode, msg.sentReply.ErrorText = rerr.Code, rerr.Text
			}
		} else {
			c.dropReply(msg)
		}
	}
	if !later && msg.wantsReply() && (resp != nil || rerr != nil || msg.route == broker.RouteInbox || msg.idemKey != "") && !d.repliedBy(msg) {
		if resp == nil {
			resp = []byte{}
		}
		var code, text string
		if rerr != nil {
			code, text = rerr.Code, rerr.Text
		}
		if size := len(resp) + len(text); size > d.cfg.MaxMessageSize {
			// No retry can make it fit: dead-letter it now, and tell the sender.
			c.fail(t, msg, NoRetry(fmt.Errorf("disker: the handler's reply is %d bytes, over the limit of %d (Config.MaxMessageSize)", size, d.cfg.MaxMessageSize)), took, time.Time{})
			return
		}
		err := d.reply(d.opCtx, msg, resp, code, text)
		late = errors.Is(err, ErrLate)
		if err != nil && !late {
			// The reply did not reach the broker: deliver the message again
			// so that its sender gets one (at least once).
			c.fail(t, msg, fmt.Errorf("disker: cannot send the reply: %w", err), took, time.Time{})
			return
		}
	}
	c.processed.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventHandled, Receiver: c.name, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt, Duration: took})
	}
	if msg.retention > 0 {
		c.finishResult(t, msg, rerr, late)
		return
	}
	if t.dl.Env.DedupKey == "" {
		c.acks.addDelivery(&t.dl, msg)
		return
	}
	// Its dedup key frees once the acknowledgement is made: acknowledged
	// here, not in a batch, and then freed.
	err := d.b.Ack(d.opCtx, c.name, t.dl.Ref)
	acked(c.name, []ackRef{{ref: t.dl.Ref, id: msg.ID, attempt: msg.Attempt}}, err)
	if err != nil {
		d.health.fail("ack", err)
		d.log.Warn("disker: cannot acknowledge a handled message; it will be delivered again", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
		return
	}
	d.forgetReply(msg)
	d.releaseDedup(c.name, &t.dl.Env)
}

// settling marks t settled, and reports whether it may be settled: false
// (after logging it) when it was cancelled first.
func (c *consumer) settling(t *task, msg *Message) bool {
	if !t.settle.CompareAndSwap(taskRunning, taskSettled) && t.settle.Load() == taskCancelled {
		c.cancelled(msg)
		return false
	}
	return true
}

func (c *consumer) fail(t *task, msg *Message, err error, took time.Duration, deadline time.Time) {
	d := c.d
	if !c.settling(t, msg) {
		return
	}
	c.failed.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventFailed, Receiver: c.name, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt, Duration: took, Err: err})
	}
	attrs := logAttrs(c.name, msg.ID, msg.Attempt)
	if !deadline.IsZero() && !time.Now().Before(deadline) {
		// Its sender has been told it timed out: nobody waits for it. An
		// expected outcome, counted (Expired, EventExpired), so Debug.
		d.log.Debug("disker: handler failed after the message's deadline; dropped", append(attrs, "error", err)...)
		c.drop(&t.dl, false)
		return
	}
	if isNoRetry(err) || msg.Attempt >= c.o.maxAttempts {
		reason := fmt.Sprintf("attempt %d of %d failed: %v", msg.Attempt, c.o.maxAttempts, err)
		if isNoRetry(err) {
			reason = fmt.Sprintf("attempt %d failed with an error marked NoRetry: %v", msg.Attempt, err)
		}
		d.log.Error("disker: handler failed; message dead-lettered", append(attrs, "error", err)...)
		dl := t.dl // a copy: the lease keeper reads t.dl
		dl.Env.Retention = msg.retention
		if err := d.b.DeadLetter(d.opCtx, c.name, dl, reason); err != nil {
			d.health.fail("dead letter", err)
			d.log.Error("disker: cannot dead-letter the message; it will be delivered again", append(attrs, "error", err)...)
			return
		}
		c.deadLettered.Add(1)
		if d.onEvent != nil {
			d.emit(Event{Kind: EventDeadLettered, Receiver: c.name, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt, Err: err})
		}
		d.releaseDedup(c.name, &t.dl.Env)
		if msg.wantsReply() {
			if rerr := d.reply(d.opCtx, msg, nil, CodeDeadLetter, errorText(err)); rerr != nil && !errors.Is(rerr, ErrLate) {
				d.log.Warn("disker: cannot send the dead-letter error reply", append(attrs, "error", rerr)...)
			}
			d.recordReply(d.opCtx, msg)
		}
		return
	}
	delay := max(c.o.backoff(msg.Attempt), 0)
	d.log.Warn("disker: handler failed; will retry", append(attrs, "error", err, "delay", delay)...)
	if err := d.b.Retry(d.opCtx, &broker.RetryParams{Receiver: c.name, Consumer: d.id, Ref: t.dl.Ref, Delay: delay, Lease: c.o.lease}); err != nil {
		if !errors.Is(err, broker.ErrLeaseLost) {
			d.health.fail("retry", err)
			d.log.Warn("disker: cannot schedule the retry; the message returns when its lease ends", append(attrs, "error", err)...)
		}
		return
	}
	c.retried.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventRetried, Receiver: c.name, Sender: msg.Sender, MessageID: msg.ID, Attempt: msg.Attempt, Err: err})
	}
}

// giveBack returns a delivery at once without counting an attempt: it
// could not start here for a reason of this instance's (HandleWithPool).
func (c *consumer) giveBack(t *task, msg *Message, err error) {
	d := c.d
	d.log.Debug("disker: message given back without counting an attempt", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
	if err := d.b.Retry(d.opCtx, &broker.RetryParams{Receiver: c.name, Consumer: d.id, Ref: t.dl.Ref, Lease: c.o.lease, Uncounted: true}); err != nil && !errors.Is(err, broker.ErrLeaseLost) {
		d.health.fail("give back", err)
		d.log.Warn("disker: cannot give the message back; it returns when its lease ends", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
		return
	}
	c.givenBack.Add(1)
}

// errorText is the text of a handler error as it travels in an error reply:
// a panic's value without its stack.
func errorText(err error) string {
	var p *pool.PanicError
	if errors.As(err, &p) {
		return fmt.Sprintf("panic: %v", p.Value)
	}
	return err.Error()
}

// keepLeases extends the leases of the in-flight deliveries every third of
// the lease, in one call, and cancels the handlers of the ones lost. It
// ends once nothing has been in flight for keeperIdleFor (see wakeKeeper).
func (c *consumer) keepLeases(stop <-chan struct{}) {
	defer c.keepers.Done()
	d := c.d
	tick := time.NewTicker(c.o.lease / 3)
	defer tick.Stop()
	poll := time.NewTicker(cancelPoll)
	defer poll.Stop()
	var refs []string
	var since time.Time
	ep := broker.ExtendParams{Receiver: c.name, Consumer: d.id, Lease: c.o.lease}
	idleSince := time.Now()
	for {
		select {
		case <-stop:
			return
		case now := <-poll.C:
			c.pollCancels(&since)
			if c.n.Load() > 0 {
				idleSince = now
			} else if now.Sub(idleSince) >= keeperIdleFor && c.keeperIdle() {
				return
			}
			continue
		case <-tick.C:
		}
		refs = refs[:0]
		c.mu.Lock()
		for ref := range c.inflight {
			refs = append(refs, ref)
		}
		c.mu.Unlock()
		if c.lim != nil {
			c.lim.renew(d.opCtx)
		}
		if len(refs) == 0 {
			continue
		}
		ep.Refs = refs
		lost, err := d.b.Extend(d.opCtx, &ep)
		if err != nil {
			d.health.fail("extend leases", err)
			continue
		}
		d.health.ok()
		if len(lost) > 0 {
			// A cancelled message is lost to its holder too: learn why
			// first, so that its handler's cause is ErrCancelled.
			c.pollCancels(&since)
		}
		for _, ref := range lost {
			c.mu.Lock()
			t := c.inflight[ref]
			c.mu.Unlock()
			if t != nil {
				t.end(broker.ErrLeaseLost)
			}
		}
	}
}

// pollCancels reads the marks of messages cancelled in flight since
// *since, when this consumer handles any, and cancels the handlers of
// those it holds.
func (c *consumer) pollCancels(since *time.Time) {
	if c.n.Load() == 0 {
		return
	}
	d := c.d
	ids, latest, err := d.b.CancelMarks(d.opCtx, c.name, *since)
	if err != nil {
		d.health.fail("cancel marks", err)
		return
	}
	if !latest.IsZero() {
		*since = latest
	}
	if len(ids) == 0 {
		return
	}
	want := make(map[string]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.inflight {
		if want[t.dl.Env.ID] && t.settle.CompareAndSwap(taskRunning, taskCancelled) {
			t.end(ErrCancelled)
			// Off the lease keeper's loop, which a slow broker must not
			// hold up; stop waits for it (the task is still counted in
			// c.tasks, so the count is above zero here).
			c.tasks.Add(1)
			go func() {
				defer c.tasks.Done()
				c.notifyCancelled(t)
			}()
		}
	}
}

// stats is the consumer's LocalStats entry.
func (c *consumer) stats() ReceiverLocalStats {
	return ReceiverLocalStats{
		Concurrency:    c.o.concurrency,
		BatchSize:      c.o.batchSize,
		Exclusive:      c.o.exclusive,
		HoldsLock:      c.lockHeld.Load(),
		InFlight:       c.n.Load(),
		Processed:      c.processed.Load(),
		Failed:         c.failed.Load(),
		Retried:        c.retried.Load(),
		DeadLettered:   c.deadLettered.Load(),
		Expired:        c.expired.Load(),
		GivenBack:      c.givenBack.Load(),
		DroppedReplies: c.droppedReplies.Load(),

		GlobalConcurrency: c.o.globalConcurrency,
		HeldSlots:         c.heldSlots(),
		RateLimit:         c.o.rate,
		RateBurst:         c.o.burst,
	}
}

func (c *consumer) heldSlots() int {
	if c.lim == nil {
		return 0
	}
	return c.lim.heldSlots()
}

// logAttrs are the attributes of a delivery in logs.
func logAttrs(receiver, id string, attempt int) []any {
	return []any{slog.String("receiver", receiver), slog.String("id", id), slog.Int("attempt", attempt)}
}

// startResult records the start of msg's attempt on its retained result;
// should that fail, the result shows the attempt at the final outcome.
func (c *consumer) startResult(msg *Message, dl *broker.Delivery) {
	d := c.d
	p := &broker.StartResultParams{Receiver: c.name, ID: msg.ID, Worker: d.id, Attempt: msg.Attempt,
		Retention: msg.retention, Deadline: dl.Deadline, Route: msg.route}
	p.ReplyTo = msg.replyTo()
	err := d.b.StartResult(d.opCtx, p)
	if err != nil {
		d.health.fail("start result", err)
		d.log.Warn("disker: cannot record the start of a message on its result", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
	}
}

// finishResult acknowledges t's delivery of msg, handled, and records its
// final outcome on its retained result, in one step (broker.Results): the
// reply its sender received (msg.sentReply), or rerr, or a timeout when
// its reply was refused as late.
func (c *consumer) finishResult(t *task, msg *Message, rerr *RemoteError, late bool) {
	d := c.d
	p := &broker.FinishResultParams{Receiver: c.name, ID: msg.ID, Ref: t.dl.Ref, State: broker.ResultDone, Worker: d.id,
		Attempt: msg.Attempt, Reply: msg.sentReply, Retention: msg.retention, ReplyTo: msg.replyTo()}
	if late && !t.dl.Deadline.IsZero() {
		p.State = broker.ResultTimedOut
	}
	if rerr != nil {
		p.ErrorCode, p.ErrorText = rerr.Code, rerr.Text
	}
	err := d.b.FinishResult(d.opCtx, p)
	acked(c.name, []ackRef{{ref: t.dl.Ref, id: msg.ID, attempt: msg.Attempt}}, err)
	if err != nil {
		d.health.fail("ack", err)
		d.log.Warn("disker: cannot acknowledge a handled message; it will be delivered again", append(logAttrs(c.name, msg.ID, msg.Attempt), "error", err)...)
		return
	}
	d.forgetReply(msg)
	d.releaseDedup(c.name, &t.dl.Env)
}

// retentionOf is the retention of a delivered message: its own, else the
// receiver's (WithResultRetention).
func (c *consumer) retentionOf(env *broker.Envelope) time.Duration {
	if env.Retention > 0 {
		return env.Retention
	}
	return c.o.retention
}
