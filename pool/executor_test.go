package pool

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// newTestExecutor returns an Executor that the test closes at its end.
func newTestExecutor(t *testing.T, cfg ExecutorConfig) *Executor {
	t.Helper()
	e, err := NewExecutor(cfg)
	if err != nil {
		t.Fatalf("NewExecutor(%+v): %v", cfg, err)
	}
	t.Cleanup(func() {
		if err := e.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// blockers submits n tasks that each signal started and then wait for
// release to be closed.
func blockers(t *testing.T, e *Executor, n int, release <-chan struct{}) {
	t.Helper()
	started := make(chan struct{}, n)
	for range n {
		if err := e.Submit(context.Background(), func() {
			started <- struct{}{}
			<-release
		}); err != nil {
			t.Fatalf("Submit blocker: %v", err)
		}
	}
	for range n {
		<-started
	}
}

func TestExecutorConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   ExecutorConfig
		field string
	}{
		{ExecutorConfig{MaxWorkers: -1}, "MaxWorkers"},
		{ExecutorConfig{QueueSize: -1}, "QueueSize"},
		{ExecutorConfig{IdleTimeout: -time.Second}, "IdleTimeout"},
		{ExecutorConfig{MaxWorkers: maxWorkersLimit + 1}, "MaxWorkers"},
		{ExecutorConfig{MaxWorkers: 1, QueueSize: maxExecutorLimit}, "QueueSize"},
	} {
		e, err := NewExecutor(tc.cfg)
		if err == nil {
			e.Close(context.Background())
			t.Errorf("NewExecutor(%+v) = nil error, want one naming %s", tc.cfg, tc.field)
			continue
		}
		if !strings.HasPrefix(err.Error(), "pool: ") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("NewExecutor(%+v) = %q, want a pool: error naming %s", tc.cfg, err, tc.field)
		}
	}
}

func TestExecutorDefaults(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{})
	n := runtime.GOMAXPROCS(0)
	release := make(chan struct{})
	blockers(t, e, n, release)
	if err := e.TrySubmit(func() {}); !errors.Is(err, ErrFull) {
		t.Errorf("TrySubmit with GOMAXPROCS tasks running = %v, want ErrFull", err)
	}
	close(release)
}

func TestExecutorRunsEveryTask(t *testing.T) {
	t.Parallel()
	for _, cfg := range []ExecutorConfig{
		{MaxWorkers: 1},
		{MaxWorkers: 4},
		{MaxWorkers: 4, QueueSize: 16},
		{MaxWorkers: 100},
	} {
		e, err := NewExecutor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		const n = 5000
		var ran atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range n / 4 {
					if err := e.Submit(context.Background(), func() { ran.Add(1) }); err != nil {
						t.Errorf("Submit: %v", err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err := e.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if got := ran.Load(); got != n {
			t.Errorf("%+v: %d tasks ran, want %d", cfg, got, n)
		}
		st := e.Stats()
		want := ExecutorStats{Submitted: n, Completed: n}
		if st != want {
			t.Errorf("%+v: Stats after Close = %+v, want %+v", cfg, st, want)
		}
	}
}

func TestExecutorBoundsConcurrency(t *testing.T) {
	t.Parallel()
	const max = 3
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: max, QueueSize: 5})
	var cur, peak atomic.Int64
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		if err := e.Submit(context.Background(), func() {
			defer wg.Done()
			c := cur.Add(1)
			for {
				p := peak.Load()
				if c <= p || peak.CompareAndSwap(p, c) {
					break
				}
			}
			runtime.Gosched()
			cur.Add(-1)
		}); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if p := peak.Load(); p > max {
		t.Errorf("%d tasks ran at once, want at most %d", p, max)
	}
	if w := e.Stats().Workers; w > max {
		t.Errorf("Stats().Workers = %d, want at most %d", w, max)
	}
}

func TestExecutorSubmitWaitsForAFreeWorker(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	release := make(chan struct{})
	blockers(t, e, 2, release)
	if st := e.Stats(); st.Running != 2 || st.Queued != 0 || st.Workers != 2 {
		t.Errorf("Stats with 2 blocked tasks = %+v, want Running 2, Queued 0, Workers 2", st)
	}
	if err := e.TrySubmit(func() {}); !errors.Is(err, ErrFull) {
		t.Fatalf("TrySubmit on a full executor without queue = %v, want ErrFull", err)
	}
	ran := make(chan struct{})
	submitted := make(chan error, 1)
	go func() {
		submitted <- e.Submit(context.Background(), func() { close(ran) })
	}()
	// The Submit waits, though as many callers wait as there are workers.
	waitFor(t, "Submit to wait", func() bool { return e.waiters.Load() == 1 })
	select {
	case err := <-submitted:
		t.Fatalf("Submit returned %v while every worker was busy", err)
	case <-ran:
		t.Fatal("task ran while every worker was busy")
	default:
	}
	close(release)
	if err := <-submitted; err != nil {
		t.Fatalf("Submit: %v", err)
	}
	<-ran
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Submitted != 3 || st.Completed != 3 || st.Rejected != 1 {
		t.Errorf("Stats = %+v, want Submitted 3, Completed 3, Rejected 1", st)
	}
}

func TestExecutorQueue(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1, QueueSize: 2})
	release := make(chan struct{})
	blockers(t, e, 1, release)
	var order []int
	var mu sync.Mutex
	for i := range 2 {
		if err := e.TrySubmit(func() {
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
		}); err != nil {
			t.Fatalf("TrySubmit %d with room in the queue: %v", i, err)
		}
	}
	if st := e.Stats(); st.Running != 1 || st.Queued != 2 {
		t.Errorf("Stats = %+v, want Running 1, Queued 2", st)
	}
	if err := e.TrySubmit(func() {}); !errors.Is(err, ErrFull) {
		t.Errorf("TrySubmit on a full queue = %v, want ErrFull", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := e.Submit(ctx, func() { t.Error("task of an abandoned Submit ran") }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Submit on a full queue until the deadline = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 || order[0] != 0 || order[1] != 1 {
		t.Errorf("queued tasks ran in order %v, want [0 1]", order)
	}
	if st := e.Stats(); st.Submitted != 3 || st.Completed != 3 || st.Rejected != 1 {
		t.Errorf("Stats after Close = %+v, want Submitted 3, Completed 3, Rejected 1", st)
	}
}

func TestExecutorSubmitContext(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})

	// A done context refuses the task even with room to spare.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.Submit(ctx, func() { t.Error("task of a cancelled Submit ran") }); !errors.Is(err, context.Canceled) {
		t.Errorf("Submit with a cancelled context = %v, want Canceled", err)
	}

	// A Submit waiting for room gives up when its context is cancelled.
	release := make(chan struct{})
	blockers(t, e, 1, release)
	ctx, cancel = context.WithCancel(context.Background())
	submitted := make(chan error, 1)
	go func() {
		submitted <- e.Submit(ctx, func() { t.Error("task of an abandoned Submit ran") })
	}()
	cancel()
	if err := <-submitted; !errors.Is(err, context.Canceled) {
		t.Errorf("waiting Submit after cancel = %v, want Canceled", err)
	}
	close(release)
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Submitted != 1 || st.Rejected != 0 {
		t.Errorf("Stats = %+v, want Submitted 1 and Rejected 0", st)
	}
}

func TestExecutorManyWaitingSubmitters(t *testing.T) {
	t.Parallel()
	// Submitters that wait for room all get in, however their wake-ups
	// interleave, and some give up on the way.
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2, QueueSize: 1})
	var ran, accepted atomic.Int64
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := context.Background()
			if i%4 == 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Millisecond)
				defer cancel()
			}
			for range 100 {
				err := e.Submit(ctx, func() { ran.Add(1); runtime.Gosched() })
				switch {
				case err == nil:
					accepted.Add(1)
				case errors.Is(err, context.DeadlineExceeded):
				default:
					t.Errorf("Submit: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if ran.Load() != accepted.Load() {
		t.Errorf("%d tasks ran, %d accepted", ran.Load(), accepted.Load())
	}
}

func TestExecutorPanicHandler(t *testing.T) {
	t.Parallel()
	panics := make(chan *PanicError, 1)
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1, PanicHandler: func(p *PanicError) { panics <- p }})
	if err := e.Submit(context.Background(), func() { panickingTask("boom") }); err != nil {
		t.Fatal(err)
	}
	p := <-panics
	if p.Value != "boom" {
		t.Errorf("PanicError.Value = %v, want boom", p.Value)
	}
	if !strings.Contains(string(p.Stack), "panickingTask") {
		t.Errorf("PanicError.Stack does not show the panicking function:\n%s", p.Stack)
	}
	// The executor, and its only worker, keep running tasks.
	ran := make(chan struct{})
	if err := e.Submit(context.Background(), func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Panicked != 1 || st.Completed != 2 {
		t.Errorf("Stats = %+v, want Panicked 1, Completed 2", st)
	}
}

func panickingTask(v any) { panic(v) }

func TestExecutorPanicWithoutHandler(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	for range 10 {
		if err := e.Submit(context.Background(), func() { panic("dropped") }); err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan struct{})
	if err := e.Submit(context.Background(), func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Panicked != 10 || st.Completed != 11 {
		t.Errorf("Stats = %+v, want Panicked 10, Completed 11", st)
	}
}

func TestExecutorGoexit(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	for range 3 {
		if err := e.Submit(context.Background(), runtime.Goexit); err != nil {
			t.Fatal(err)
		}
	}
	ran := make(chan struct{})
	if err := e.Submit(context.Background(), func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := e.Stats(); st.Completed != 4 || st.Workers != 0 {
		t.Errorf("Stats after Close = %+v, want Completed 4, Workers 0", st)
	}
}

func TestExecutorNilTask(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{})
	if err := e.Submit(context.Background(), nil); err == nil {
		t.Error("Submit(nil) = nil error")
	}
	if err := e.TrySubmit(nil); err == nil {
		t.Error("TrySubmit(nil) = nil error")
	}
}

func TestExecutorAfterClose(t *testing.T) {
	t.Parallel()
	e, err := NewExecutor(ExecutorConfig{Name: "jobs"})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	task := func() { t.Error("task ran after Close") }
	err = e.Submit(context.Background(), task)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Submit after Close = %v, want ErrClosed", err)
	}
	if got, want := err.Error(), `pool: executor "jobs": closed`; got != want {
		t.Errorf("error text %q, want %q", got, want)
	}
	if err := e.TrySubmit(task); !errors.Is(err, ErrClosed) {
		t.Errorf("TrySubmit after Close = %v, want ErrClosed", err)
	}
	if _, err := Go(context.Background(), e, func() (int, error) { return 0, nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Go after Close = %v, want ErrClosed", err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if st := e.Stats(); st.Rejected != 3 {
		t.Errorf("Stats().Rejected = %d, want 3", st.Rejected)
	}
}

func TestExecutorCloseDrains(t *testing.T) {
	t.Parallel()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 2, QueueSize: 10})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	blockers(t, e, 2, release)
	var ran atomic.Int64
	for range 10 {
		if err := e.TrySubmit(func() { ran.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	// Close refuses new tasks at once, while it drains.
	waitFor(t, "Close to refuse tasks", func() bool {
		return errors.Is(e.TrySubmit(func() {}), ErrClosed)
	})
	select {
	case err := <-closed:
		t.Fatalf("Close returned %v before the running tasks finished", err)
	default:
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := ran.Load(); got != 10 {
		t.Errorf("%d queued tasks ran before Close returned, want 10", got)
	}
	if st := e.Stats(); st.Workers != 0 || st.Running != 0 || st.Queued != 0 {
		t.Errorf("Stats after Close = %+v, want no workers and no tasks", st)
	}
}

func TestExecutorCloseContext(t *testing.T) {
	t.Parallel()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	blockers(t, e, 1, release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := e.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Close with a task still running = %v, want DeadlineExceeded", err)
	}
	close(release)
	if err := e.Close(context.Background()); err != nil {
		t.Errorf("second Close after the task finished = %v", err)
	}
	if err := e.Close(ctx); err != nil {
		t.Errorf("Close of a drained executor with an expired context = %v, want nil", err)
	}
}

func TestExecutorCloseWakesWaitingSubmit(t *testing.T) {
	t.Parallel()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	blockers(t, e, 1, release)
	submitted := make(chan error, 1)
	go func() {
		submitted <- e.Submit(context.Background(), func() { t.Error("task accepted during Close ran") })
	}()
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	if err := <-submitted; !errors.Is(err, ErrClosed) {
		t.Errorf("Submit waiting when Close was called = %v, want ErrClosed", err)
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestExecutorCloseRace(t *testing.T) {
	t.Parallel()
	for round := range 20 {
		e, err := NewExecutor(ExecutorConfig{MaxWorkers: 4, QueueSize: round % 3})
		if err != nil {
			t.Fatal(err)
		}
		var ran, accepted, refused atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; ; i++ {
					var err error
					if (g+i)%2 == 0 {
						err = e.Submit(context.Background(), func() { ran.Add(1) })
					} else {
						err = e.TrySubmit(func() { ran.Add(1) })
					}
					switch {
					case err == nil:
						accepted.Add(1)
					case errors.Is(err, ErrClosed):
						refused.Add(1)
						return
					case errors.Is(err, ErrFull):
					default:
						t.Errorf("Submit: %v", err)
						return
					}
				}
			}()
		}
		close(start)
		waitFor(t, "tasks to run", func() bool { return ran.Load() > 100 })
		if err := e.Close(context.Background()); err != nil {
			t.Fatalf("Close: %v", err)
		}
		ranAtClose := ran.Load()
		wg.Wait()
		// Every accepted task has run when Close returns, none after; every
		// Submit was either accepted or refused.
		if ran.Load() != ranAtClose {
			t.Fatalf("round %d: %d tasks ran after Close returned", round, ran.Load()-ranAtClose)
		}
		if ran.Load() != accepted.Load() || refused.Load() != 16 {
			t.Fatalf("round %d: %d ran, %d accepted, %d submitters refused (want 16)", round, ran.Load(), accepted.Load(), refused.Load())
		}
		if st := e.Stats(); st.Submitted != uint64(accepted.Load()) || st.Completed != st.Submitted || st.Workers != 0 {
			t.Fatalf("round %d: Stats = %+v, want Submitted = Completed = %d, Workers 0", round, st, accepted.Load())
		}
	}
}

func TestExecutorIdleWorkersExit(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 4, IdleTimeout: 20 * time.Millisecond})
	release := make(chan struct{})
	blockers(t, e, 4, release)
	if w := e.Stats().Workers; w != 4 {
		t.Fatalf("Stats().Workers with 4 tasks running = %d, want 4", w)
	}
	close(release)
	waitFor(t, "idle workers to exit", func() bool { return e.Stats().Workers == 0 })
	// A later task starts a new worker.
	ran := make(chan struct{})
	if err := e.Submit(context.Background(), func() { close(ran) }); err != nil {
		t.Fatal(err)
	}
	<-ran
	if w := e.Stats().Workers; w != 1 {
		t.Errorf("Stats().Workers after one more task = %d, want 1", w)
	}
}

func TestExecutorReusesWorkers(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	for range 1000 {
		done := make(chan struct{})
		if err := e.Submit(context.Background(), func() { close(done) }); err != nil {
			t.Fatal(err)
		}
		<-done
		if w := e.Stats().Workers; w > 2 {
			t.Fatalf("Stats().Workers = %d, want at most 2", w)
		}
	}
}

// highWater counts the tasks that run at once and keeps the most seen.
type highWater struct{ cur, peak atomic.Int64 }

// enter records a task that starts running, and returns what records its end.
func (h *highWater) enter() (exit func()) {
	c := h.cur.Add(1)
	for {
		p := h.peak.Load()
		if c <= p || h.peak.CompareAndSwap(p, c) {
			break
		}
	}
	return func() { h.cur.Add(-1) }
}

func TestExecutorSelfSubmitWaits(t *testing.T) {
	t.Parallel()
	// One worker, no queue: a task that submits to its own executor finds
	// it full and waits for room like any caller, until its context ends;
	// the new task never runs on the submitting task's goroutine.
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan struct{})
	done := make(chan error, 1)
	if err := e.Submit(context.Background(), func() {
		done <- e.Submit(ctx, func() { close(ran) })
	}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the task's Submit to wait", func() bool { return e.waiters.Load() == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Submit from the only running task = %v, want context.Canceled", err)
	}
	select {
	case <-ran:
		t.Fatal("the inner task ran although the executor was full")
	default:
	}
}

func TestExecutorSelfSubmitSaturated(t *testing.T) {
	t.Parallel()
	// Every worker submits to its own full executor at the same time, and
	// some tasks recurse. A task that finds no room (TrySubmit returns
	// ErrFull) runs the work itself, as the Executor's doc says: all
	// complete, and never more than MaxWorkers run at once.
	const workers = 3
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: workers})
	var hw highWater
	var ran, inline atomic.Int64
	var all sync.WaitGroup // every task, to wait for before Close
	var spawn func(depth int)
	spawn = func(depth int) {
		defer all.Done()
		exit := hw.enter()
		defer func() { exit() }()
		ran.Add(1)
		if depth == 0 {
			return
		}
		for range 2 {
			all.Add(1)
			task := func() { spawn(depth - 1) }
			if err := e.TrySubmit(task); errors.Is(err, ErrFull) {
				// This goroutine runs the task: it is not running its own
				// meanwhile.
				exit()
				inline.Add(1)
				task()
				exit = hw.enter()
			} else if err != nil {
				all.Done()
				t.Errorf("TrySubmit: %v", err)
			}
		}
	}
	var barrier sync.WaitGroup
	barrier.Add(workers)
	all.Add(workers)
	for range workers {
		if err := e.Submit(context.Background(), func() {
			barrier.Done()
			barrier.Wait() // every worker is busy before any submits
			spawn(6)
		}); err != nil {
			t.Fatal(err)
		}
	}
	all.Wait()
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if want := int64(workers * (1<<7 - 1)); ran.Load() != want {
		t.Errorf("%d tasks ran, want %d", ran.Load(), want)
	}
	if inline.Load() == 0 {
		t.Error("no TrySubmit found the executor full: the test did not saturate it")
	}
	if p := hw.peak.Load(); p > workers {
		t.Errorf("%d tasks ran at once, want at most %d", p, workers)
	}
	if st := e.Stats(); st.Submitted != uint64(ran.Load()-inline.Load()) {
		t.Errorf("Stats().Submitted = %d, want %d (tasks that ran inline are not the executor's)", st.Submitted, ran.Load()-inline.Load())
	}
}

func TestExecutorTaskSubmitsToOtherFullExecutor(t *testing.T) {
	t.Parallel()
	// The tasks of executor a submit to executor b, which is full: they
	// wait for b's room, and b never runs more than its MaxWorkers.
	const aWorkers, bWorkers = 3, 1
	a := newTestExecutor(t, ExecutorConfig{MaxWorkers: aWorkers})
	b := newTestExecutor(t, ExecutorConfig{MaxWorkers: bWorkers})
	var hw highWater
	release := make(chan struct{})
	if err := b.Submit(context.Background(), func() {
		defer hw.enter()()
		<-release
	}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	var all sync.WaitGroup
	all.Add(aWorkers)
	for range aWorkers {
		if err := a.Submit(context.Background(), func() {
			defer all.Done()
			if err := b.Submit(context.Background(), func() {
				defer hw.enter()()
				ran.Add(1)
			}); err != nil {
				t.Errorf("Submit to b: %v", err)
			}
		}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "a's tasks to wait for b", func() bool { return b.waiters.Load() == aWorkers })
	if n := ran.Load(); n != 0 {
		t.Fatalf("%d of a's tasks ran on b while b was full", n)
	}
	close(release)
	all.Wait()
	if err := b.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != aWorkers {
		t.Errorf("%d tasks ran on b, want %d", n, aWorkers)
	}
	if p := hw.peak.Load(); p > bWorkers {
		t.Errorf("%d tasks ran on b at once, want at most %d", p, bWorkers)
	}
}

func TestExecutorTrySubmitFromTaskDoesNotWait(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	got := make(chan error, 1)
	if err := e.Submit(context.Background(), func() { got <- e.TrySubmit(func() {}) }); err != nil {
		t.Fatal(err)
	}
	if err := <-got; !errors.Is(err, ErrFull) {
		t.Errorf("TrySubmit from the only running task = %v, want ErrFull", err)
	}
}

func TestExecutorSubmitDoesNotAllocate(t *testing.T) {
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2, QueueSize: 64})
	ctx := context.Background()
	task := func() {}
	// Warm up: start the workers.
	for range 100 {
		if err := e.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(10000, func() {
		if err := e.Submit(ctx, task); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 0.01 {
		t.Errorf("Submit allocates %.3f times per task, want 0", allocs)
	}
}

func TestExecutorCloseWakesEveryWaitingSubmit(t *testing.T) {
	t.Parallel()
	// Close gives one permit; each waiting Submit that leaves with
	// ErrClosed passes it on to the next.
	const waiting = 8
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	blockers(t, e, 1, release)
	errs := make(chan error, waiting)
	for range waiting {
		go func() { errs <- e.Submit(context.Background(), func() { t.Error("task accepted during Close ran") }) }()
	}
	waitFor(t, "the submitters to wait", func() bool { return e.waiters.Load() == waiting })
	closed := make(chan error, 1)
	go func() { closed <- e.Close(context.Background()) }()
	for i := range waiting {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("Submit waiting when Close was called = %v, want ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d waiting Submit calls still wait after Close", waiting-i, waiting)
		}
	}
	close(release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

func TestExecutorReapsOnlyIdleWorkers(t *testing.T) {
	t.Parallel()
	// Of four workers, two keep running their tasks: the two idle ones
	// exit, and tasks submitted after still start at once, beside the
	// running ones.
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 4, IdleTimeout: 5 * time.Millisecond})
	releaseFirst, releaseRest := make(chan struct{}), make(chan struct{})
	blockers(t, e, 2, releaseFirst)
	blockers(t, e, 2, releaseRest)
	close(releaseFirst)
	waitFor(t, "the two idle workers to exit", func() bool { return e.Stats().Workers == 2 })
	blockers(t, e, 2, releaseRest) // returns once both run, with the two before still running
	if st := e.Stats(); st.Workers != 4 || st.Running != 4 {
		t.Fatalf("Stats with four tasks running = %+v, want 4 workers, 4 running", st)
	}
	close(releaseRest)
	waitFor(t, "every worker to exit", func() bool { return e.Stats().Workers == 0 })
	var ran atomic.Int64
	for range 100 {
		if err := e.Submit(context.Background(), func() { ran.Add(1) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 100 {
		t.Errorf("%d of 100 tasks ran after the workers had exited", n)
	}
}
