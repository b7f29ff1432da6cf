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

// DefaultIdleTimeout is how long an idle worker goroutine of an [Executor]
// waits for a task before it exits, when [ExecutorConfig.IdleTimeout] is 0.
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
	// IdleTimeout is how long a worker goroutine waits for a task before it
	// exits; the next task that needs it starts a new one. 0 means
	// DefaultIdleTimeout (10s).
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
// free, and exits after IdleTimeout without work. Tasks start roughly, not
// strictly, in the order they were accepted. When Submit waits for room and
// nothing waits in the queue, a worker that finishes a task takes the waiting
// task directly.
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
	tasks        chan runnable // accepted tasks not yet taken by a worker; never full
	wakeups      chan struct{} // a token wakes one parked worker; never full
	wake         chan struct{} // a permit for one waiting Submit to try again
	handoff      chan runnable // unbuffered: a waiting Submit offers its task to a worker that finishes one
	closing      chan struct{} // closed by Close
	done         chan struct{} // closed when closed and every accepted task finished
	errClosed    error
	errFull      error
	closeOnce    sync.Once
	workers      sync.WaitGroup

	_ [64]byte
	// state packs the executor's counts, so that one atomic operation both
	// decides and records a change:
	//
	//	bits  0-24 inflight: accepted tasks that have not finished
	//	bits 25-43 active:   workers running or looking for a task, plus the
	//	                     parked workers a token was sent to
	//	bits 44-62 total:    worker goroutines alive
	//	bit     63 closed:   Close was called
	//
	// The invariant active >= min(inflight, maxWorkers) means that every
	// accepted task has a worker that will take it; the workers that are not
	// active park on wakeups.
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
	activeOne  = 1 << 25
	totalOne   = 1 << 44
	closedBit  = 1 << 63
)

func inflightOf(s uint64) uint64 { return s & inflightMk }
func activeOf(s uint64) uint64   { return s >> 25 & fieldMask }
func totalOf(s uint64) uint64    { return s >> 44 & fieldMask }

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
		tasks:        make(chan runnable, limit),
		wakeups:      make(chan struct{}, cfg.MaxWorkers),
		wake:         make(chan struct{}, 1),
		handoff:      make(chan runnable),
		closing:      make(chan struct{}),
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
// an active worker that is free, else a parked one it wakes, else a new one.
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
		wake, start := false, false
		if act := activeOf(s); act <= in && act < e.maxWorkers {
			ns += activeOne
			if totalOf(s) > act {
				wake = true
			} else {
				start = true
				ns += totalOne
			}
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
		e.tasks <- t // never blocks: cap(e.tasks) == e.limit
		switch {
		case wake:
			e.wakeups <- struct{}{} // never blocks: a token per parked worker at most
		case start:
			go e.work()
		}
		return admitted
	}
}

// submitSlow waits for room for t. It first yields the processor a few
// times, trying again after each: a task often finishes meanwhile, and the
// caller then goes on without parking or being woken.
func (e *Executor) submitSlow(ctx context.Context, t runnable) error {
	for range submitSpins {
		runtime.Gosched()
		switch e.admit(t) {
		case admitted:
			return nil
		case admitClosed:
			e.rejected.Add(1)
			return e.errClosed
		}
	}
	e.waiters.Add(1)
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
		select {
		case e.handoff <- t:
			// A worker that finished a task took t in its place.
			e.leave()
			return nil
		case <-e.wake:
		case <-e.closing:
		case <-ctx.Done():
			e.leave()
			return ctx.Err()
		}
	}
}

// leave ends a wait for room. If there is room left and another Submit
// waits, it passes a permit on, so that a permit that found the buffer of
// e.wake full is never lost.
func (e *Executor) leave() {
	if e.waiters.Add(-1) > 0 && inflightOf(e.state.Load()) < e.limit {
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

// next records the end of an accepted task. If a Submit waits for room and no
// accepted task waits in the queue, it takes the waiting Submit's task, which
// inherits the finished task's place, and returns it: the handoff spares the
// worker a park and the submitter the wake-up of a worker. Else it makes room
// and returns nil.
func (e *Executor) next() runnable {
	if e.waiters.Load() > 0 && len(e.tasks) == 0 {
		select {
		case t := <-e.handoff:
			e.submitted.Add(1)
			return t
		default:
		}
	}
	e.finish()
	return nil
}

// finish records the end of an accepted task and makes room.
func (e *Executor) finish() {
	s := e.state.Add(^uint64(0)) // inflight - 1
	if s&closedBit != 0 && inflightOf(s) == 0 {
		close(e.done)
	}
	if e.waiters.Load() > 0 {
		e.signal()
	}
}

// submitSpins is how many times Submit yields the processor and tries again,
// when there is no room, before it waits.
const submitSpins = 2

// workerSpins is how many times a worker that found no task yields and looks
// again before it parks.
const workerSpins = 4

// work is a worker goroutine. It starts active: it takes tasks from the
// queue while there are any, parks when no accepted task needs it, and exits
// after e.idle parked, or once the executor is closed and drained.
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
	idle := time.NewTimer(e.idle)
	idle.Stop()
	spins := 0
	for {
		// Active: take tasks while there are any.
		select {
		case t := <-e.tasks:
			for t != nil {
				execute(e, t)
				t = e.next()
			}
			spins = 0
			continue
		default:
		}
		if spins < workerSpins {
			// Yield to the submitters before parking: the next task is
			// often a fraction of a microsecond away, a park and a wakeup
			// cost more.
			spins++
			runtime.Gosched()
			continue
		}
		spins = 0
		s := e.state.Load()
		if activeOf(s) <= inflightOf(s) {
			// An accepted task still needs this worker: it is on its way
			// to the queue. Wait for it.
			idle.Reset(e.idle)
			select {
			case t := <-e.tasks:
				for t != nil {
					execute(e, t)
					t = e.next()
				}
			case <-idle.C:
			case <-e.done:
				e.state.Add(minus(activeOne + totalOne))
				returned = true
				return
			}
			continue
		}
		if !e.state.CompareAndSwap(s, s-activeOne) {
			continue
		}
		// Parked: wait for a token, which makes it active again.
		idle.Reset(e.idle)
	parked:
		for {
			select {
			case <-e.wakeups:
				break parked
			case <-idle.C:
				if e.retire() {
					returned = true
					return
				}
				// A token is on its way to a parked worker: wait for it.
				idle.Reset(e.idle)
			case <-e.done:
				d := uint64(totalOne)
				select {
				case <-e.wakeups:
					d += activeOne
				default:
				}
				e.state.Add(minus(d))
				returned = true
				return
			}
		}
	}
}

// retire takes a parked worker out of the count, unless every parked worker
// is due a token.
func (e *Executor) retire() bool {
	for {
		s := e.state.Load()
		if totalOf(s) <= activeOf(s) {
			return false
		}
		if e.state.CompareAndSwap(s, s-totalOne) {
			return true
		}
	}
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
		close(e.closing)
		if inflightOf(s) == 0 {
			close(e.done)
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
	q := min(len(e.tasks), in)
	return ExecutorStats{
		Running:   in - q,
		Queued:    q,
		Workers:   int(totalOf(s)),
		Submitted: sub,
		Completed: sub - min(uint64(in), sub),
		Panicked:  e.panicked.Load(),
		Rejected:  e.rejected.Load(),
	}
}
