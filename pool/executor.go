package pool

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultIdleTimeout is the [ExecutorConfig.IdleTimeout] of an [Executor]
// whose config leaves it 0.
const DefaultIdleTimeout = 10 * time.Second

// maxWorkersLimit and maxExecutorLimit bound MaxWorkers and
// MaxWorkers+QueueSize: the counts share one 64-bit word of state.
const (
	maxWorkersLimit  = 1<<19 - 1
	maxExecutorLimit = 1<<25 - 1
)

var (
	errNilTask = errors.New("pool: nil task")
	// errTaskGoexit is the error of a future or group task that called
	// runtime.Goexit instead of returning.
	errTaskGoexit = errors.New("pool: task called runtime.Goexit")
)

// ExecutorConfig configures an [Executor]. The zero value is a valid
// configuration: GOMAXPROCS workers, no queue, a 10s idle timeout.
type ExecutorConfig struct {
	// Name names the executor in the errors it returns (`pool: executor
	// "NAME": closed`). "" leaves them unnamed.
	Name string
	// MaxWorkers is the most tasks that run at the same time, each on a
	// worker goroutine of its own. 0 means runtime.GOMAXPROCS(0). At most
	// 524,287.
	MaxWorkers int
	// QueueSize is how many accepted tasks may wait for a free worker on top
	// of the MaxWorkers that run. 0 means no queue: a task is accepted only
	// when a worker is free for it. MaxWorkers+QueueSize is at most
	// 33,554,431; the queue's memory (16 bytes a place) is allocated by
	// NewExecutor.
	QueueSize int
	// IdleTimeout is how long worker goroutines may go without a task: every
	// IdleTimeout, the workers beyond the most tasks that ran at once during
	// it exit, so a worker left without a task exits after one to two
	// IdleTimeouts. The next task that needs a worker starts a new one. 0
	// means DefaultIdleTimeout (10s).
	IdleTimeout time.Duration
	// PanicHandler is called, on the worker goroutine, with every panic
	// recovered from a task given to Submit or TrySubmit. nil means such
	// panics are recovered and dropped (Stats counts them). Panics of tasks
	// started by Go or Group.Go are never passed to it: they are returned to
	// whoever waits for the task. PanicHandler itself must not panic.
	PanicHandler func(*PanicError)
}

// ExecutorStats is a snapshot of an [Executor]. The counts are read one by
// one without stopping the executor, so under load they are only mutually
// consistent once the executor is idle or closed.
type ExecutorStats struct {
	// Running is the number of accepted tasks that are not waiting in the
	// queue: running, or being handed to a worker.
	Running int
	// Queued is the number of accepted tasks waiting for a worker.
	Queued int
	// Workers is the number of worker goroutines alive, busy or idle.
	Workers int
	// Submitted is the number of tasks accepted since NewExecutor.
	Submitted uint64
	// Completed is the number of accepted tasks that have finished, by
	// returning or by panicking.
	Completed uint64
	// Panicked is the number of tasks that panicked.
	Panicked uint64
	// Rejected is the number of submissions refused with ErrFull or
	// ErrClosed. Submissions abandoned because their context ended are not
	// counted.
	Rejected uint64
}

// Executor runs functions (tasks) on a bounded set of reused worker
// goroutines.
//
// At most MaxWorkers tasks run at once, and at most QueueSize more wait for a
// worker. A worker goroutine is started when a task needs one and none is
// free; workers that had no task for an IdleTimeout exit (see
// [ExecutorConfig.IdleTimeout]). Workers take the tasks in the order they
// were accepted. An accepted task never waits behind another task while fewer
// than MaxWorkers run.
//
// A task that panics does not take the executor down: the panic is recovered,
// counted, and either passed to PanicHandler (tasks of Submit and TrySubmit)
// or returned as a [*PanicError] to whoever waits (tasks of [Go] and
// [Group.Go]).
//
// A task may submit more tasks, to its own executor or to another, and
// Submit waits for room like any caller's: no executor ever runs more than
// its MaxWorkers tasks, whoever submits them. As with errgroup.Group.Go under
// a limit, this means that tasks which submit to their own full executor can
// deadlock it: when every worker waits in Submit for room that only a worker
// can make, they wait until their contexts end. A task that must not wait
// uses [Executor.TrySubmit] and, on ErrFull, runs the work itself (see
// ExampleExecutor_TrySubmit_fromTask), or [Group.TryGo]; or give the
// executor a queue deep enough for the nested work, or give the nested work
// an executor of its own. Likewise, a task that waits for the result of
// another task of the same executor (a [Future] or a [Group]) can deadlock it
// if every worker waits so.
//
// An Executor's methods are safe for concurrent use. Close it to stop its
// workers.
type Executor struct {
	// Read-only after NewExecutor.
	maxWorkers   uint64
	limit        uint64 // MaxWorkers + QueueSize: the most accepted, unfinished tasks
	idle         time.Duration
	panicHandler func(*PanicError)
	// tasks holds the accepted tasks that no worker has taken yet, and a
	// nil for each worker told to exit. Idle workers wait in a plain
	// receive on it. It is never full, and closed once the executor is
	// closed and drained.
	tasks     chan runnable
	wake      chan struct{} // a permit for one waiting Submit to try again
	done      chan struct{} // closed when closed and every accepted task finished
	errClosed error
	errFull   error
	closeOnce sync.Once
	workers   sync.WaitGroup // worker goroutines and the reaper's timer

	// reapMu guards reaper and stopped, so that the reaper never sends on
	// tasks once it is closed.
	reapMu  sync.Mutex
	reaper  *time.Timer // runs reap every idle while workers exist
	stopped bool        // tasks is closed
	// exiting counts the nils in tasks: workers told to exit that have not
	// taken their notice yet.
	exiting atomic.Int64

	_ [64]byte
	// state packs the executor's counts, so that one atomic operation both
	// decides and records a change:
	//
	//	bits  0-24 inflight: accepted tasks that have not finished
	//	bits 25-43 workers:  worker goroutines alive, less those told to exit
	//	bits 44-62 peak:     the most of min(inflight, maxWorkers) since the
	//	                     reaper last looked
	//	bit     63 closed:   Close was called
	//
	// The invariant workers >= min(inflight, maxWorkers) means that every
	// accepted task has a worker that will take it: the workers that run no
	// task wait in a receive on tasks.
	state atomic.Uint64
	_     [56]byte
	// waiters counts the Submit calls waiting for room.
	waiters atomic.Int64
	_       [56]byte
	// submitted counts the accepted tasks; those finished are submitted
	// minus inflight, so that finishing a task writes one word less.
	submitted atomic.Uint64
	_         [56]byte
	panicked  atomic.Uint64
	rejected  atomic.Uint64
}

const (
	fieldMask  = 1<<19 - 1
	inflightMk = 1<<25 - 1
	workerOne  = 1 << 25
	peakShift  = 44
	closedBit  = 1 << 63
)

func inflightOf(s uint64) uint64 { return s & inflightMk }
func workersOf(s uint64) uint64  { return s >> 25 & fieldMask }
func peakOf(s uint64) uint64     { return s >> peakShift & fieldMask }

// withPeak returns s with its peak set to p.
func withPeak(s, p uint64) uint64 { return s&^(fieldMask<<peakShift) | p<<peakShift }

// minus returns the two's complement of d, to subtract d with Add.
func minus(d uint64) uint64 { return ^(d - 1) }

// runnable is a task as the executor holds it: a plain function, a future or
// a group task. Each kind is pointer-shaped, so holding it in the interface
// does not allocate.
type runnable interface {
	run(e *Executor)
}

// funcTask is a task passed to Submit or TrySubmit.
type funcTask func()

func (f funcTask) run(*Executor) { f() }

// NewExecutor returns an Executor configured by cfg. It starts no goroutine:
// workers start as tasks arrive.
func NewExecutor(cfg ExecutorConfig) (*Executor, error) {
	if cfg.MaxWorkers < 0 {
		return nil, fmt.Errorf("pool: ExecutorConfig.MaxWorkers is %d, must not be negative", cfg.MaxWorkers)
	}
	if cfg.QueueSize < 0 {
		return nil, fmt.Errorf("pool: ExecutorConfig.QueueSize is %d, must not be negative", cfg.QueueSize)
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("pool: ExecutorConfig.IdleTimeout is %v, must not be negative", cfg.IdleTimeout)
	}
	if cfg.MaxWorkers == 0 {
		cfg.MaxWorkers = runtime.GOMAXPROCS(0)
	}
	if cfg.IdleTimeout == 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.MaxWorkers > maxWorkersLimit {
		return nil, fmt.Errorf("pool: ExecutorConfig.MaxWorkers is %d, must be at most %d", cfg.MaxWorkers, maxWorkersLimit)
	}
	if cfg.QueueSize > maxExecutorLimit-cfg.MaxWorkers {
		return nil, fmt.Errorf("pool: ExecutorConfig.QueueSize is %d, MaxWorkers+QueueSize must be at most %d", cfg.QueueSize, maxExecutorLimit)
	}
	limit := cfg.MaxWorkers + cfg.QueueSize
	e := &Executor{
		maxWorkers:   uint64(cfg.MaxWorkers),
		limit:        uint64(limit),
		idle:         cfg.IdleTimeout,
		panicHandler: cfg.PanicHandler,
		tasks:        make(chan runnable, limit+cfg.MaxWorkers),
		wake:         make(chan struct{}, 1),
		done:         make(chan struct{}),
		errClosed:    ErrClosed,
		errFull:      ErrFull,
	}
	if cfg.Name != "" {
		e.errClosed = &executorError{name: cfg.Name, err: ErrClosed}
		e.errFull = &executorError{name: cfg.Name, err: ErrFull}
	}
	return e, nil
}

// executorError names the executor that returned err.
type executorError struct {
	name string
	err  error
}

func (e *executorError) Error() string {
	return "pool: executor " + strconv.Quote(e.name) + ": " + strings.TrimPrefix(e.err.Error(), "pool: ")
}

func (e *executorError) Unwrap() error { return e.err }

// Submit runs task on a worker. When MaxWorkers tasks run and the queue (if
// any) is full, Submit waits for room until ctx ends and then returns
// ctx.Err(); it never returns ErrFull. If ctx is already done, Submit returns
// ctx.Err() without accepting task. After Close, it returns an error that
// wraps ErrClosed. A nil return means the task will run, even if Close is
// called next.
//
// Submit does not allocate. A task that submits to its own full executor
// waits like any caller and can deadlock it: see [Executor].
func (e *Executor) Submit(ctx context.Context, task func()) error {
	if task == nil {
		return errNilTask
	}
	return e.submit(ctx, funcTask(task))
}

// TrySubmit runs task on a worker if there is room now: a free worker, or
// (with a queue) a free place in the queue. It never waits: without room it
// returns an error that wraps ErrFull; after Close, one that wraps ErrClosed.
func (e *Executor) TrySubmit(task func()) error {
	if task == nil {
		return errNilTask
	}
	return e.tryAdmit(funcTask(task))
}

// tryAdmit is TrySubmit for every kind of task.
func (e *Executor) tryAdmit(t runnable) error {
	switch e.admit(t) {
	case admitted:
		return nil
	case admitClosed:
		e.rejected.Add(1)
		return e.errClosed
	default:
		e.rejected.Add(1)
		return e.errFull
	}
}

// submit is Submit for every kind of task.
func (e *Executor) submit(ctx context.Context, t runnable) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	switch e.admit(t) {
	case admitted:
		return nil
	case admitClosed:
		e.rejected.Add(1)
		return e.errClosed
	}
	return e.submitSlow(ctx, t)
}

type admitResult int

const (
	admitted admitResult = iota
	admitFull
	admitClosed
)

// admit accepts t if there is room, and makes sure a worker will take it:
// one that waits for a task, else a new one.
func (e *Executor) admit(t runnable) admitResult {
	for {
		s := e.state.Load()
		if s&closedBit != 0 {
			return admitClosed
		}
		in := inflightOf(s)
		if in >= e.limit {
			return admitFull
		}
		ns := s + 1
		need := min(in+1, e.maxWorkers)
		start := workersOf(s) < need
		if start {
			ns += workerOne
		}
		if peakOf(s) < need {
			ns = withPeak(ns, need)
		}
		if !e.state.CompareAndSwap(s, ns) {
			continue
		}
		e.submitted.Add(1)
		if start {
			// Count the worker before t is published: once t is in the
			// queue, another worker may run it and let Close drain and
			// wait for the workers.
			e.workers.Add(1)
		}
		e.tasks <- t // never blocks: cap(e.tasks) >= e.limit + the exit notices
		if start {
			go e.work()
			e.armReaper()
		}
		return admitted
	}
}

// submitSlow waits for room for t: it parks until a finishing task, or
// Close, gives it a permit to try again. It does not yield first: a parked
// submitter is woken straight onto the processor of the worker that made
// room, and runs as soon as that worker runs out of tasks, whereas a
// submitter that yields lets every worker with a task run first, each
// then yielding in turn.
func (e *Executor) submitSlow(ctx context.Context, t runnable) error {
	e.waiters.Add(1)
	done := ctx.Done()
	for {
		switch e.admit(t) {
		case admitted:
			e.leave()
			return nil
		case admitClosed:
			e.leave()
			e.rejected.Add(1)
			return e.errClosed
		}
		if done == nil {
			<-e.wake
			continue
		}
		select {
		case <-e.wake:
		case <-done:
			e.leave()
			return ctx.Err()
		}
	}
}

// leave ends a wait for room. If there is room left, or the executor is
// closed, and another Submit waits, it passes a permit on, so that a
// permit that found the buffer of e.wake full is never lost.
func (e *Executor) leave() {
	if e.waiters.Add(-1) == 0 {
		return
	}
	if s := e.state.Load(); s&closedBit != 0 || inflightOf(s) < e.limit {
		e.signal()
	}
}

// signal gives a waiting Submit a permit to try again.
func (e *Executor) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// execute runs t, recovering a panic that t does not handle itself.
func execute(e *Executor, t runnable) {
	defer func() {
		if v := recover(); v != nil {
			e.panicked.Add(1)
			if h := e.panicHandler; h != nil {
				h(NewPanicError(v))
			}
		}
	}()
	t.run(e)
}

// finish records the end of an accepted task and makes room.
func (e *Executor) finish() {
	s := e.state.Add(^uint64(0)) // inflight - 1
	if s&closedBit != 0 && inflightOf(s) == 0 {
		e.drained()
	}
	if e.waiters.Load() > 0 {
		e.signal()
	}
}

// work is a worker goroutine. It waits for a task in a plain receive on
// e.tasks, runs it and the tasks it takes over from waiting submitters,
// and waits again; it exits when it receives a nil (the reaper retires it)
// or once the executor is closed and drained.
func (e *Executor) work() {
	returned := false
	defer func() {
		if !returned {
			// The task called runtime.Goexit (t.FailNow, for one): this
			// goroutine ends. A new worker takes its place and the task
			// counts as finished.
			e.workers.Add(1)
			go e.work()
			e.finish()
		}
		e.workers.Done()
	}()
	for {
		t, ok := e.await()
		if !ok {
			e.state.Add(minus(workerOne))
			returned = true
			return
		}
		if t == nil {
			e.exiting.Add(-1)
			returned = true
			return
		}
		execute(e, t)
		e.finish()
	}
}

// await returns the next task, or exit notice, from e.tasks; false once
// tasks is closed. It yields the processor up to workerSpins times, looking
// again after each, before it parks in a plain receive: the next task is
// often a fraction of a microsecond away, and a park and a wake-up cost
// more.
func (e *Executor) await() (runnable, bool) {
	for range workerSpins {
		select {
		case t, ok := <-e.tasks:
			return t, ok
		default:
		}
		runtime.Gosched()
	}
	t, ok := <-e.tasks
	return t, ok
}

// workerSpins is how many times a worker that finds no task yields and
// looks again before it parks.
const workerSpins = 2

// armReaper starts the reaper's timer if it is not running.
func (e *Executor) armReaper() {
	e.reapMu.Lock()
	if e.reaper == nil && !e.stopped {
		e.workers.Add(1)
		e.reaper = time.AfterFunc(e.idle, e.reap)
	}
	e.reapMu.Unlock()
}

// reap runs every e.idle while workers exist. The workers beyond the most
// that were needed at once since the last reap (min(inflight, MaxWorkers)
// at its peak) had nothing to do all that time: it tells that many to exit
// by sending a nil for each, which the next workers to wait for a task
// take. It waits for the notices of the last reap to be taken first, so
// that they never fill tasks.
func (e *Executor) reap() {
	defer e.workers.Done()
	e.reapMu.Lock()
	defer e.reapMu.Unlock()
	e.reaper = nil
	if e.stopped {
		return
	}
	var n uint64
	for {
		s := e.state.Load()
		need := min(inflightOf(s), e.maxWorkers)
		n = 0
		if e.exiting.Load() == 0 {
			n = workersOf(s) - min(workersOf(s), max(need, peakOf(s)))
		}
		if e.state.CompareAndSwap(s, withPeak(s-n*workerOne, need)) {
			if workersOf(s) > n {
				e.workers.Add(1)
				e.reaper = time.AfterFunc(e.idle, e.reap)
			}
			break
		}
	}
	e.exiting.Add(int64(n))
	for range n {
		e.tasks <- nil // never blocks: at most MaxWorkers notices
	}
}

// drained closes tasks, so that the workers exit, and then done. It runs
// once, when the executor is closed and its last accepted task finished.
func (e *Executor) drained() {
	e.reapMu.Lock()
	e.stopped = true
	if e.reaper != nil && e.reaper.Stop() {
		e.workers.Done()
	}
	e.reaper = nil
	close(e.tasks)
	e.reapMu.Unlock()
	close(e.done)
}

// Close stops the executor: from now on Submit, TrySubmit, Go and Group.Go
// return an error that wraps ErrClosed, and Submit calls waiting for room
// return it too. Close then waits until every accepted task (queued or
// running) has finished and the worker goroutines have exited, or until ctx
// ends; then it returns ctx.Err() and the remaining tasks still run to their
// end in the background.
//
// Close is idempotent: a second call waits like the first. A Close called
// from one of the executor's own tasks cannot drain (it waits for its own
// task) and returns when ctx ends.
func (e *Executor) Close(ctx context.Context) error {
	e.closeOnce.Do(func() {
		s := e.state.Or(closedBit)
		e.signal() // the waiting Submit calls pass it on as they leave
		if inflightOf(s) == 0 {
			e.drained()
		}
	})
	select {
	case <-e.done:
	case <-ctx.Done():
		select {
		case <-e.done:
		default:
			return ctx.Err()
		}
	}
	e.workers.Wait()
	return nil
}

// Stats returns a snapshot of the executor's counts.
func (e *Executor) Stats() ExecutorStats {
	sub := e.submitted.Load()
	s := e.state.Load()
	in := int(inflightOf(s))
	q := min(max(0, len(e.tasks)-int(e.exiting.Load())), in)
	return ExecutorStats{
		Running:   in - q,
		Queued:    q,
		Workers:   int(workersOf(s)),
		Submitted: sub,
		Completed: sub - min(uint64(in), sub),
		Panicked:  e.panicked.Load(),
		Rejected:  e.rejected.Load(),
	}
}
