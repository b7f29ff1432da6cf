package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testWorker is a worker made by a factory. It notices being closed twice
// and being used by two callers at once.
type testWorker struct {
	id      int
	closes  atomic.Int32
	inUse   atomic.Int32
	healthy atomic.Bool
}

// use marks w as in use by one caller; it fails the test if another caller
// uses it already. The returned func ends the use.
func (w *testWorker) use(t testing.TB) func() {
	if n := w.inUse.Add(1); n != 1 {
		t.Errorf("worker %d used by %d callers at once", w.id, n)
	}
	return func() { w.inUse.Add(-1) }
}

// factory makes and closes testWorkers and keeps count.
type factory struct {
	mu      sync.Mutex
	made    []*testWorker
	closed  int
	fail    error         // New fails with it when non-nil
	blockCh chan struct{} // when non-nil, New waits on it (or ctx)
}

func (f *factory) new(ctx context.Context) (*testWorker, error) {
	f.mu.Lock()
	err, block := f.fail, f.blockCh
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &testWorker{id: len(f.made)}
	w.healthy.Store(true)
	f.made = append(f.made, w)
	return w, nil
}

func (f *factory) close(w *testWorker) error {
	w.closes.Add(1)
	f.mu.Lock()
	f.closed++
	f.mu.Unlock()
	return nil
}

func (f *factory) setFail(err error) {
	f.mu.Lock()
	f.fail = err
	f.mu.Unlock()
}

// counts returns how many workers were made and closed.
func (f *factory) counts() (made, closed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.made), f.closed
}

// checkAllClosedOnce fails t unless every worker made was closed exactly once.
func (f *factory) checkAllClosedOnce(t testing.TB) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, w := range f.made {
		if n := w.closes.Load(); n != 1 {
			t.Errorf("worker %d closed %d times, want 1", w.id, n)
		}
	}
}

// newTestPool returns a pool of testWorkers configured by cfg (New and Close
// filled in) and closes it, checking for leaks, when the test ends.
func newTestPool(t testing.TB, f *factory, cfg Config[*testWorker]) *Pool[*testWorker] {
	t.Helper()
	cfg.New = f.new
	cfg.Close = f.close
	p, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		f.checkAllClosedOnce(t)
	})
	return p
}

// eventually polls cond until it holds, failing the test after 10 seconds.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func mustCheckout(t testing.TB, p *Pool[*testWorker]) Lease[*testWorker] {
	t.Helper()
	l, err := p.Checkout(context.Background())
	if err != nil {
		t.Fatalf("Checkout: %v", err)
	}
	return l
}

func mustRelease(t testing.TB, l Lease[*testWorker]) {
	t.Helper()
	if err := l.Release(); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

func TestPoolConfigValidation(t *testing.T) {
	newFn := func(context.Context) (int, error) { return 0, nil }
	check := func(context.Context, int) error { return nil }
	tests := []struct {
		name string
		cfg  Config[int]
		want string
	}{
		{"no New", Config[int]{}, "pool: Config.New must not be nil"},
		{"negative Size", Config[int]{New: newFn, Size: -1}, "pool: Config.Size must be >= 0"},
		{"negative MaxOverflow", Config[int]{New: newFn, MaxOverflow: -1}, "pool: Config.MaxOverflow must be >= 0"},
		{"negative IdleTTL", Config[int]{New: newFn, IdleTTL: -time.Second}, "pool: Config.IdleTTL must be >= 0"},
		{"bad Strategy", Config[int]{New: newFn, Strategy: 7}, "pool: Config.Strategy must be LIFO or FIFO"},
		{"CheckOn without Check", Config[int]{New: newFn, CheckOn: CheckOnRelease}, "pool: Config.CheckOn must be 0 when Config.Check is nil"},
		{"bad CheckOn", Config[int]{New: newFn, Check: check, CheckOn: 8}, "pool: Config.CheckOn has unknown bits"},
		{"negative MaxRestarts", Config[int]{New: newFn, MaxRestarts: -1}, "pool: Config.MaxRestarts must be >= 0"},
		{"negative Period", Config[int]{New: newFn, Period: -1}, "pool: Config.Period must be >= 0"},
		{"negative RestartBackoff", Config[int]{New: newFn, RestartBackoff: -1}, "pool: Config.RestartBackoff must be >= 0"},
		{"negative MaxRestartBackoff", Config[int]{New: newFn, MaxRestartBackoff: -1}, "pool: Config.MaxRestartBackoff must be >= 0"},
		{"backoff cap below start", Config[int]{New: newFn, RestartBackoff: time.Second, MaxRestartBackoff: time.Millisecond}, "pool: Config.MaxRestartBackoff (1ms) must be >= Config.RestartBackoff (1s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(tt.cfg)
			if err == nil {
				p.Close(context.Background())
				t.Fatalf("New succeeded, want an error containing %q", tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New: %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestPoolConfigDefaults(t *testing.T) {
	c, err := Config[int]{New: func(context.Context) (int, error) { return 0, nil }, Check: func(context.Context, int) error { return nil }}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Size != runtime.GOMAXPROCS(0) || c.MaxOverflow != 0 || c.IdleTTL != DefaultIdleTTL ||
		c.MaxRestarts != DefaultMaxRestarts || c.Period != DefaultPeriod || c.RestartBackoff != DefaultRestartBackoff ||
		c.MaxRestartBackoff != DefaultMaxRestartBackoff || c.CheckOn != CheckOnCheckout || c.Logger == nil || c.Strategy != LIFO {
		t.Fatalf("defaults not applied: %+v", c)
	}
	// Size 0 with overflow stays 0: every worker is an overflow worker.
	c, err = Config[int]{New: func(context.Context) (int, error) { return 0, nil }, MaxOverflow: 2}.withDefaults()
	if err != nil || c.Size != 0 {
		t.Fatalf("Size = %d, %v; want 0", c.Size, err)
	}
}

func TestPoolCheckoutReusesWorker(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 2})
	l := mustCheckout(t, p)
	w := l.Worker()
	if s := p.Stats(); s.Busy != 1 || s.Idle != 0 || s.Created != 1 {
		t.Fatalf("after checkout: %+v", s)
	}
	mustRelease(t, l)
	if s := p.Stats(); s.Busy != 0 || s.Idle != 1 {
		t.Fatalf("after release: %+v", s)
	}
	l = mustCheckout(t, p)
	if l.Worker() != w {
		t.Fatalf("second checkout got worker %d, want the idle worker %d", l.Worker().id, w.id)
	}
	mustRelease(t, l)
	if made, _ := f.counts(); made != 1 {
		t.Fatalf("made %d workers, want 1", made)
	}
}

func TestPoolReleaseTwice(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	l := mustCheckout(t, p)
	copyOfL := l
	mustRelease(t, l)
	if err := l.Release(); !errors.Is(err, ErrReleased) {
		t.Fatalf("second Release: %v, want ErrReleased", err)
	}
	// The worker is leased again; the stale lease must not touch it.
	l2 := mustCheckout(t, p)
	if err := copyOfL.Release(); !errors.Is(err, ErrReleased) {
		t.Fatalf("stale Release: %v, want ErrReleased", err)
	}
	if err := copyOfL.Retire(); !errors.Is(err, ErrReleased) {
		t.Fatalf("stale Retire: %v, want ErrReleased", err)
	}
	if s := p.Stats(); s.Busy != 1 || s.Idle != 0 || s.Retired != 0 {
		t.Fatalf("stale lease changed the pool: %+v", s)
	}
	if err := l2.Retire(); err != nil {
		t.Fatalf("Retire: %v", err)
	}
	if err := l2.Release(); !errors.Is(err, ErrReleased) {
		t.Fatalf("Release after Retire: %v, want ErrReleased", err)
	}
	var zero Lease[*testWorker]
	if err := zero.Release(); !errors.Is(err, ErrReleased) {
		t.Fatalf("zero Lease Release: %v, want ErrReleased", err)
	}
	if err := zero.Retire(); !errors.Is(err, ErrReleased) {
		t.Fatalf("zero Lease Retire: %v, want ErrReleased", err)
	}
	if zero.Worker() != nil {
		t.Fatal("zero Lease has a worker")
	}
}

func TestPoolStrategy(t *testing.T) {
	for _, tt := range []struct {
		strategy Strategy
		want     int // index, in release order, of the worker reused first
	}{{LIFO, 2}, {FIFO, 0}} {
		t.Run(tt.strategy.String(), func(t *testing.T) {
			f := &factory{}
			p := newTestPool(t, f, Config[*testWorker]{Size: 3, Eager: true, Strategy: tt.strategy})
			var ls []Lease[*testWorker]
			for range 3 {
				ls = append(ls, mustCheckout(t, p))
			}
			for _, l := range ls {
				mustRelease(t, l)
			}
			l := mustCheckout(t, p)
			defer mustRelease(t, l)
			if got, want := l.Worker(), ls[tt.want].Worker(); got != want {
				t.Fatalf("reused worker %d, want %d", got.id, want.id)
			}
		})
	}
}

func TestPoolEagerStart(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 3, Eager: true})
	if s := p.Stats(); s.Idle != 3 || s.Created != 3 {
		t.Fatalf("eager pool: %+v, want 3 idle workers", s)
	}
	// Lazy: nothing is made before a checkout.
	f2 := &factory{}
	p2 := newTestPool(t, f2, Config[*testWorker]{Size: 3})
	if s := p2.Stats(); s.Idle != 0 || s.Created != 0 {
		t.Fatalf("lazy pool: %+v, want no worker", s)
	}
}

func TestPoolEagerStartFails(t *testing.T) {
	down := errors.New("backend down")
	f := &factory{}
	n := 0
	p, err := New(Config[*testWorker]{
		Name: "db",
		Size: 3, Eager: true,
		New: func(ctx context.Context) (*testWorker, error) {
			if n++; n == 3 {
				return nil, down
			}
			return f.new(ctx)
		},
		Close: f.close,
	})
	if err == nil {
		p.Close(context.Background())
		t.Fatal("New succeeded with a failing constructor")
	}
	if !errors.Is(err, down) || !strings.Contains(err.Error(), `pool "db": new worker 3 of 3: backend down`) {
		t.Fatalf("New: %v", err)
	}
	f.checkAllClosedOnce(t)
	if made, closed := f.counts(); made != 2 || closed != 2 {
		t.Fatalf("made %d, closed %d; want the 2 made workers closed", made, closed)
	}
}

func TestPoolCheckoutWaitsInOrder(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	held := mustCheckout(t, p)
	const n = 8
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := p.Checkout(context.Background())
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			l.Release()
		}()
		// Start the next waiter only once this one is queued.
		eventually(t, fmt.Sprintf("waiter %d to queue", i), func() bool { return p.Stats().Waiting == i+1 })
	}
	mustRelease(t, held)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("waiter %d served when waiter %d was first in line", got, want)
		}
		want++
	}
	// The first checkout waited for the worker to be made.
	if s := p.Stats(); s.Waits != n+1 || s.Checkouts != n+1 || s.WaitTime <= 0 || s.AvgWait != s.WaitTime/time.Duration(s.Checkouts) {
		t.Fatalf("wait stats: %+v", s)
	}
}

func TestPoolCheckoutGivesUpWithContext(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	held := mustCheckout(t, p)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := p.Checkout(ctx); err != context.DeadlineExceeded {
		t.Fatalf("Checkout with deadline: %v, want context.DeadlineExceeded", err)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Checkout(ctx2)
		errc <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return p.Stats().Waiting == 1 })
	cancel2()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("cancelled Checkout: %v, want context.Canceled", err)
	}
	if s := p.Stats(); s.Waiting != 0 {
		t.Fatalf("cancelled waiter still queued: %+v", s)
	}

	// An already ended context does not wait at all.
	if _, err := p.Checkout(ctx2); err != context.Canceled {
		t.Fatalf("Checkout with a cancelled ctx: %v", err)
	}

	// The pool is intact: the held worker goes to the next caller.
	mustRelease(t, held)
	l := mustCheckout(t, p)
	if l.Worker() != held.Worker() {
		t.Fatal("the held worker did not come back")
	}
	mustRelease(t, l)
}

func TestPoolTryCheckout(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Name: "try", Size: 1})
	// Lazy pool with room: the try fails but starts making a worker.
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("TryCheckout on an empty pool: %v, want ErrNoWorker", err)
	}
	var l Lease[*testWorker]
	eventually(t, "the background worker", func() bool {
		var err error
		l, err = p.TryCheckout(context.Background())
		return err == nil
	})
	// Full pool: fails at once, naming the pool.
	_, err := p.TryCheckout(context.Background())
	if !errors.Is(err, ErrNoWorker) || err.Error() != `pool "try": no worker available` {
		t.Fatalf("TryCheckout on a busy pool: %v", err)
	}
	mustRelease(t, l)
	if made, _ := f.counts(); made != 1 {
		t.Fatalf("made %d workers, want 1", made)
	}
}

func TestPoolOverflow(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1, MaxOverflow: 2, IdleTTL: time.Hour})
	var ls []Lease[*testWorker]
	for range 3 {
		ls = append(ls, mustCheckout(t, p))
	}
	if s := p.Stats(); s.Busy != 3 || s.Overflow != 2 {
		t.Fatalf("at the cap: %+v", s)
	}
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("TryCheckout beyond the cap: %v", err)
	}
	for _, l := range ls {
		mustRelease(t, l)
	}
	// Overflow workers linger idle (IdleTTL is long) and are reused.
	if s := p.Stats(); s.Idle != 3 || s.Overflow != 2 {
		t.Fatalf("after release: %+v", s)
	}
	for i := range ls {
		ls[i] = mustCheckout(t, p)
	}
	for _, l := range ls {
		mustRelease(t, l)
	}
	if made, closed := f.counts(); made != 3 || closed != 0 {
		t.Fatalf("made %d, closed %d; want 3 made and none closed", made, closed)
	}
}

func TestPoolOverflowReaped(t *testing.T) {
	for _, strategy := range []Strategy{LIFO, FIFO} {
		t.Run(strategy.String(), func(t *testing.T) {
			f := &factory{}
			p := newTestPool(t, f, Config[*testWorker]{Size: 2, MaxOverflow: 3, IdleTTL: 5 * time.Millisecond, Strategy: strategy})
			var ls []Lease[*testWorker]
			for range 5 {
				ls = append(ls, mustCheckout(t, p))
			}
			for _, l := range ls {
				mustRelease(t, l)
			}
			eventually(t, "overflow workers to be reaped", func() bool {
				s := p.Stats()
				return s.Idle == 2 && s.Overflow == 0 && s.Closing == 0
			})
			if _, closed := f.counts(); closed != 3 {
				t.Fatalf("closed %d workers, want the 3 overflow ones", closed)
			}
		})
	}
}

func TestPoolOverflowOnly(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 0, MaxOverflow: 2, IdleTTL: 5 * time.Millisecond})
	l := mustCheckout(t, p)
	mustRelease(t, l)
	eventually(t, "the only worker to be reaped", func() bool {
		_, closed := f.counts()
		return closed == 1 && p.Stats().Idle == 0
	})
}

func TestPoolDo(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	for _, ctx := range []context.Context{context.Background(), t.Context()} {
		var got *testWorker
		err := p.Do(ctx, func(ctx context.Context, w *testWorker) error {
			got = w
			return nil
		})
		if err != nil || got == nil {
			t.Fatalf("Do: %v, worker %v", err, got)
		}
		// A plain error is the caller's: the worker goes back.
		plain := errors.New("not found")
		if err := p.Do(ctx, func(context.Context, *testWorker) error { return plain }); err != plain {
			t.Fatalf("Do: %v, want %v", err, plain)
		}
		if s := p.Stats(); s.Idle != 1 || s.Busy != 0 || s.Retired != 0 {
			t.Fatalf("after Do: %+v", s)
		}
	}
}

// TestPoolDoRetires runs Do's failure cases on both paths: fn on the
// caller's goroutine (a context that cannot end) and on its own.
func TestPoolDoRetires(t *testing.T) {
	broken := errors.New("connection reset")
	cases := []struct {
		name  string
		fn    func(context.Context, *testWorker) error
		check func(t *testing.T, err error)
	}{
		{"panic", func(context.Context, *testWorker) error { panic("boom") }, func(t *testing.T, err error) {
			var pe *PanicError
			if !errors.As(err, &pe) || pe.Value != "boom" || !strings.Contains(string(pe.Stack), "TestPoolDoRetires") {
				t.Fatalf("Do: %v, want a *PanicError with the value and the stack", err)
			}
		}},
		{"broken", func(context.Context, *testWorker) error { return fmt.Errorf("query: %w", Broken(broken)) }, func(t *testing.T, err error) {
			if !errors.Is(err, broken) || !IsBroken(err) {
				t.Fatalf("Do: %v, want the broken error", err)
			}
		}},
	}
	for _, tc := range cases {
		for _, inline := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/inline=%v", tc.name, inline), func(t *testing.T) {
				f := &factory{}
				p := newTestPool(t, f, Config[*testWorker]{Size: 1})
				ctx := t.Context()
				if inline {
					ctx = context.Background()
				}
				var first *testWorker
				err := p.Do(ctx, func(ctx context.Context, w *testWorker) error {
					first = w
					return tc.fn(ctx, w)
				})
				tc.check(t, err)
				if first.closes.Load() != 1 {
					t.Fatal("the worker was not retired")
				}
				// It is replaced in the background.
				eventually(t, "the replacement", func() bool { return p.Stats().Idle == 1 })
				if s := p.Stats(); s.Retired != 1 || s.Restarts != 1 || s.Created != 2 {
					t.Fatalf("after the replacement: %+v", s)
				}
				if err := p.Do(ctx, func(_ context.Context, w *testWorker) error {
					if w == first {
						t.Error("the retired worker came back")
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

func TestPoolDoContextEnds(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	ctx, cancel := context.WithCancel(context.Background())
	started, finish := make(chan *testWorker), make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- p.Do(ctx, func(ctx context.Context, w *testWorker) error {
			started <- w
			<-finish // ignores ctx: a slow job
			return nil
		})
	}()
	w := <-started
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Do: %v, want context.Canceled", err)
	}
	// fn still runs: its worker must not be handed out.
	if s := p.Stats(); s.Busy != 1 || s.Idle != 0 {
		t.Fatalf("while the abandoned fn runs: %+v", s)
	}
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrNoWorker) {
		t.Fatalf("TryCheckout while the abandoned fn runs: %v", err)
	}
	close(finish)
	eventually(t, "the abandoned worker to be retired", func() bool { return w.closes.Load() == 1 })
	l := mustCheckout(t, p)
	if l.Worker() == w {
		t.Fatal("the abandoned worker came back")
	}
	mustRelease(t, l)
}

func TestPoolDoGoexit(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1})
	// Own goroutine: Do reports it.
	if err := p.Do(t.Context(), func(context.Context, *testWorker) error {
		runtime.Goexit()
		return nil
	}); !errors.Is(err, errDoGoexit) {
		t.Fatalf("Do: %v, want errDoGoexit", err)
	}
	// Caller's goroutine: the goroutine exits, the worker is retired.
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Do(context.Background(), func(context.Context, *testWorker) error {
			runtime.Goexit()
			return nil
		})
	}()
	<-done
	if s := p.Stats(); s.Retired != 2 || s.Busy != 0 {
		t.Fatalf("after Goexit: %+v", s)
	}
}

func TestPoolHealthCheck(t *testing.T) {
	t.Run("on checkout", func(t *testing.T) {
		f := &factory{}
		var checks atomic.Int32
		p := newTestPool(t, f, Config[*testWorker]{Size: 2, Check: func(_ context.Context, w *testWorker) error {
			checks.Add(1)
			if !w.healthy.Load() {
				return errors.New("stale")
			}
			return nil
		}})
		l := mustCheckout(t, p)
		if checks.Load() != 0 {
			t.Fatal("a worker just made was checked")
		}
		w := l.Worker()
		mustRelease(t, l)
		w.healthy.Store(false)
		l = mustCheckout(t, p)
		if l.Worker() == w || w.closes.Load() != 1 {
			t.Fatal("the unhealthy worker was not retired on checkout")
		}
		mustRelease(t, l)
		if s := p.Stats(); s.Retired != 1 {
			t.Fatalf("Retired = %d, want 1", s.Retired)
		}
	})
	t.Run("on release", func(t *testing.T) {
		f := &factory{}
		p := newTestPool(t, f, Config[*testWorker]{Size: 1, CheckOn: CheckOnRelease, Check: func(_ context.Context, w *testWorker) error {
			if !w.healthy.Load() {
				return errors.New("stale")
			}
			return nil
		}})
		l := mustCheckout(t, p)
		w := l.Worker()
		w.healthy.Store(false)
		mustRelease(t, l)
		if w.closes.Load() != 1 {
			t.Fatal("the unhealthy worker was not retired on release")
		}
		eventually(t, "the replacement", func() bool { return p.Stats().Idle == 1 })
	})
}

func TestPoolConstructorError(t *testing.T) {
	down := errors.New("dial: connection refused")
	f := &factory{fail: down}
	p := newTestPool(t, f, Config[*testWorker]{Name: "db", Size: 1, RestartBackoff: time.Hour, MaxRestartBackoff: time.Hour})
	_, err := p.Checkout(context.Background())
	if !errors.Is(err, down) || err.Error() != `pool "db": new worker: dial: connection refused` {
		t.Fatalf("Checkout: %v, want the constructor's error", err)
	}
	if s := p.Stats(); s.Failures != 1 || s.LastError != down || s.Degraded {
		t.Fatalf("after a failure: %+v", s)
	}
}

func TestPoolConstructorPanics(t *testing.T) {
	p, err := New(Config[int]{Size: 1, New: func(context.Context) (int, error) { panic("no config") }, RestartBackoff: time.Hour, MaxRestartBackoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(context.Background())
	var pe *PanicError
	if _, err := p.Checkout(context.Background()); !errors.As(err, &pe) || pe.Value != "no config" {
		t.Fatalf("Checkout: %v, want a *PanicError", err)
	}
}

func TestPoolDegradedAndRecovers(t *testing.T) {
	down := errors.New("backend down")
	f := &factory{fail: down}
	p := newTestPool(t, f, Config[*testWorker]{
		Name: "db", Size: 1,
		MaxRestarts: 2, Period: time.Hour,
		RestartBackoff: time.Millisecond, MaxRestartBackoff: 2 * time.Millisecond,
	})
	// The first failure is the caller's; the background retries fail too
	// until the pool degrades. Checkouts fail fast from then on.
	var err error
	eventually(t, "the pool to degrade", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = p.Checkout(ctx)
		return errors.Is(err, ErrDegraded)
	})
	if !errors.Is(err, down) || !strings.Contains(err.Error(), `pool "db": degraded`) || !strings.Contains(err.Error(), "backend down") {
		t.Fatalf("degraded error: %v", err)
	}
	if _, err := p.Checkout(context.Background()); !errors.Is(err, ErrDegraded) {
		t.Fatalf("Checkout while degraded: %v, want to fail fast", err)
	}
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrDegraded) {
		t.Fatalf("TryCheckout while degraded: %v", err)
	}
	if s := p.Stats(); !s.Degraded || s.Failures < 3 || s.Restarts == 0 || s.LastError != down {
		t.Fatalf("degraded stats: %+v", s)
	}
	// The backend comes back: the pool recovers by itself.
	f.setFail(nil)
	eventually(t, "the pool to recover", func() bool { return !p.Stats().Degraded })
	l := mustCheckout(t, p)
	mustRelease(t, l)
	if s := p.Stats(); s.LastError != nil || s.Idle != 1 {
		t.Fatalf("recovered stats: %+v", s)
	}
}

func TestPoolDegradedFailsWaiters(t *testing.T) {
	down := errors.New("backend down")
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{
		Size: 1, MaxRestarts: 1, Period: time.Hour,
		RestartBackoff: time.Millisecond, MaxRestartBackoff: time.Millisecond,
	})
	l := mustCheckout(t, p)
	errc := make(chan error, 1)
	go func() {
		_, err := p.Checkout(context.Background())
		errc <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return p.Stats().Waiting == 1 })
	f.setFail(down)
	if err := l.Retire(); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; !errors.Is(err, ErrDegraded) || !errors.Is(err, down) {
		t.Fatalf("waiter: %v, want ErrDegraded", err)
	}
	f.setFail(nil)
	eventually(t, "the pool to recover", func() bool { return p.Stats().Idle == 1 })
}

func TestPoolRetireReplaces(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 2, Eager: true})
	l := mustCheckout(t, p)
	if err := l.Retire(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replacement", func() bool { return p.Stats().Idle == 2 })
	if s := p.Stats(); s.Created != 3 || s.Retired != 1 || s.Restarts != 1 {
		t.Fatalf("after a retire: %+v", s)
	}
}

func TestPoolResize(t *testing.T) {
	t.Run("grow eager", func(t *testing.T) {
		f := &factory{}
		p := newTestPool(t, f, Config[*testWorker]{Size: 2, Eager: true})
		if err := p.Resize(4); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the new workers", func() bool { return p.Stats().Idle == 4 })
	})
	t.Run("grow serves waiters", func(t *testing.T) {
		f := &factory{}
		p := newTestPool(t, f, Config[*testWorker]{Size: 1})
		held := mustCheckout(t, p)
		got := make(chan Lease[*testWorker])
		go func() {
			l, err := p.Checkout(context.Background())
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		eventually(t, "the waiter to queue", func() bool { return p.Stats().Waiting == 1 })
		if err := p.Resize(2); err != nil {
			t.Fatal(err)
		}
		l := <-got
		mustRelease(t, l)
		mustRelease(t, held)
		if s := p.Stats(); s.Size != 2 || s.Idle != 2 {
			t.Fatalf("after growing: %+v", s)
		}
	})
	t.Run("shrink", func(t *testing.T) {
		f := &factory{}
		p := newTestPool(t, f, Config[*testWorker]{Size: 4, Eager: true})
		a, b := mustCheckout(t, p), mustCheckout(t, p)
		if err := p.Resize(1); err != nil {
			t.Fatal(err)
		}
		if s := p.Stats(); s.Idle != 0 || s.Busy != 2 {
			t.Fatalf("idle workers not closed at once: %+v", s)
		}
		mustRelease(t, a)
		if a.Worker().closes.Load() != 1 {
			t.Fatal("a surplus leased worker was not closed when it came back")
		}
		mustRelease(t, b)
		if s := p.Stats(); s.Idle != 1 || s.Busy != 0 || s.Size != 1 {
			t.Fatalf("after shrinking: %+v", s)
		}
		if _, closed := f.counts(); closed != 3 {
			t.Fatalf("closed %d workers, want 3", closed)
		}
	})
	t.Run("invalid", func(t *testing.T) {
		f := &factory{}
		p := newTestPool(t, f, Config[*testWorker]{Name: "r", Size: 1})
		if err := p.Resize(-1); err == nil || err.Error() != `pool "r": Resize: n must be >= 0, got -1` {
			t.Fatalf("Resize(-1): %v", err)
		}
	})
}

func TestPoolClose(t *testing.T) {
	f := &factory{}
	p, err := New(Config[*testWorker]{Name: "db", Size: 2, Eager: true, New: f.new, Close: f.close})
	if err != nil {
		t.Fatal(err)
	}
	held := mustCheckout(t, p)
	held2 := mustCheckout(t, p)
	errc := make(chan error, 1)
	go func() {
		_, err := p.Checkout(context.Background())
		errc <- err
	}()
	eventually(t, "the waiter to queue", func() bool { return p.Stats().Waiting == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	err = p.Close(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "2 workers still leased") {
		t.Fatalf("Close with leased workers: %v", err)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) || err.Error() != `pool "db": closed` {
		t.Fatalf("waiter: %v, want ErrClosed", err)
	}
	// Every call fails with ErrClosed, none panics.
	if _, err := p.Checkout(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Checkout: %v", err)
	}
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("TryCheckout: %v", err)
	}
	if err := p.Do(context.Background(), func(context.Context, *testWorker) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Do: %v", err)
	}
	if err := p.Resize(5); !errors.Is(err, ErrClosed) {
		t.Fatalf("Resize: %v", err)
	}
	// Leased workers are closed when they come back.
	mustRelease(t, held)
	if held.Worker().closes.Load() != 1 {
		t.Fatal("a worker released after Close was not closed")
	}
	done := make(chan error, 1)
	go func() { done <- p.Close(context.Background()) }()
	if err := held2.Retire(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("third Close: %v", err)
	}
	f.checkAllClosedOnce(t)
	if s := p.Stats(); s.Idle != 0 || s.Busy != 0 || s.Starting != 0 {
		t.Fatalf("after Close: %+v", s)
	}
}

func TestPoolCloseStopsBackgroundConstruction(t *testing.T) {
	f := &factory{blockCh: make(chan struct{})}
	p, err := New(Config[*testWorker]{Size: 1, New: f.new, Close: f.close})
	if err != nil {
		t.Fatal(err)
	}
	// TryCheckout starts a background construction that blocks until its
	// context (the pool's) ends.
	if _, err := p.TryCheckout(context.Background()); !errors.Is(err, ErrNoWorker) {
		t.Fatal(err)
	}
	eventually(t, "the construction to start", func() bool { return p.Stats().Starting == 1 })
	if err := p.Close(context.Background()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if s := p.Stats(); s.Starting != 0 {
		t.Fatalf("after Close: %+v", s)
	}
}

func TestPoolCheckoutNoAllocs(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 2, Eager: true})
	ctx := t.Context()
	allocs := testing.AllocsPerRun(1000, func() {
		l, err := p.Checkout(ctx)
		if err != nil {
			t.Fatal(err)
		}
		l.Release()
	})
	if allocs != 0 {
		t.Fatalf("Checkout+Release allocates %v times, want 0", allocs)
	}
}

func TestPoolCloseHookError(t *testing.T) {
	f := &factory{}
	closeErr := errors.New("socket already closed")
	p, err := New(Config[*testWorker]{
		Name: "db", Size: 1, New: f.new,
		Close: func(w *testWorker) error { f.close(w); return closeErr },
	})
	if err != nil {
		t.Fatal(err)
	}
	l := mustCheckout(t, p)
	if err := l.Retire(); !errors.Is(err, closeErr) || !strings.HasPrefix(err.Error(), `pool "db": close worker: `) {
		t.Fatalf("Retire: %v, want the Close hook's error", err)
	}
	eventually(t, "the replacement", func() bool { return p.Stats().Idle == 1 })
	if err := p.Close(context.Background()); !errors.Is(err, closeErr) {
		t.Fatalf("Close: %v, want the Close hook's error", err)
	}
	f.checkAllClosedOnce(t)
}

func TestPoolCheckoutEndedContext(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 1, Eager: true})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := p.Checkout(ctx); err != context.Canceled {
		t.Fatalf("Checkout with an ended ctx and an idle worker: %v, want context.Canceled", err)
	}
	if err := p.Do(ctx, func(context.Context, *testWorker) error { return nil }); err != context.Canceled {
		t.Fatalf("Do with an ended ctx: %v, want context.Canceled", err)
	}
	if s := p.Stats(); s.Idle != 1 || s.Checkouts != 0 {
		t.Fatalf("stats: %+v", s)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes, for log output.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPoolLogsDegradedAndRecovered(t *testing.T) {
	var logs syncBuffer
	down := errors.New("backend down")
	f := &factory{fail: down}
	p := newTestPool(t, f, Config[*testWorker]{
		Name: "db", Size: 1, MaxRestarts: 1, Period: time.Hour,
		RestartBackoff: time.Millisecond, MaxRestartBackoff: time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if _, err := p.Checkout(context.Background()); !errors.Is(err, down) {
		t.Fatalf("Checkout: %v", err)
	}
	eventually(t, "the pool to degrade", func() bool { return p.Stats().Degraded })
	_, err := p.Checkout(context.Background())
	if want := `pool "db": degraded: workers cannot be made: the constructor failed 2 times within 1h0m0s; last error: backend down`; err == nil || err.Error() != want {
		t.Fatalf("Checkout: %v\nwant: %s", err, want)
	}
	f.setFail(nil)
	eventually(t, "the pool to recover", func() bool { return !p.Stats().Degraded })
	eventually(t, "the recovery to be logged", func() bool { return strings.Contains(logs.String(), "recovered") })
	out := logs.String()
	for _, want := range []string{"pool=db", "degraded", "backend down", "background construction failed"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestPoolCloseUnderLoad closes the pool while goroutines use it: they all
// end with ErrClosed, nothing panics, and every worker is closed once.
func TestPoolCloseUnderLoad(t *testing.T) {
	f := &factory{}
	p, err := New(Config[*testWorker]{Size: 2, MaxOverflow: 2, New: f.new, Close: f.close})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				var err error
				if (g+i)%2 == 0 {
					err = p.Do(t.Context(), func(_ context.Context, w *testWorker) error {
						defer w.use(t)()
						runtime.Gosched()
						return nil
					})
				} else {
					var l Lease[*testWorker]
					if l, err = p.Checkout(context.Background()); err == nil {
						done := l.Worker().use(t)
						runtime.Gosched()
						done()
						if i%5 == 0 {
							err = l.Retire()
						} else {
							err = l.Release()
						}
					}
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Errorf("goroutine %d: %v", g, err)
					return
				}
			}
		}()
	}
	eventually(t, "some load", func() bool { return p.Stats().Checkouts > 500 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wg.Wait()
	f.checkAllClosedOnce(t)
	if made, closed := f.counts(); made != closed {
		t.Fatalf("made %d, closed %d", made, closed)
	}
}

// TestPoolSlowConstructor covers a constructor that ignores its context:
// the caller gives up when its ctx ends and the worker it made is kept; a
// worker made after Close is closed.
func TestPoolSlowConstructor(t *testing.T) {
	f := &factory{}
	entered, proceed := make(chan struct{}), make(chan struct{})
	p, err := New(Config[*testWorker]{
		Size: 2,
		New: func(ctx context.Context) (*testWorker, error) {
			entered <- struct{}{}
			<-proceed
			return f.new(context.Background())
		},
		Close: f.close,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Checkout(ctx)
		errc <- err
	}()
	<-entered
	cancel()
	proceed <- struct{}{}
	if err := <-errc; err != context.Canceled {
		t.Fatalf("Checkout: %v, want context.Canceled", err)
	}
	if s := p.Stats(); s.Idle != 1 || s.Created != 1 {
		t.Fatalf("the worker made for a caller that gave up was not kept: %+v", s)
	}

	// Close while a caller makes a worker.
	held := mustCheckout(t, p) // the idle one
	go func() {
		_, err := p.Checkout(context.Background())
		errc <- err
	}()
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- p.Close(context.Background()) }()
	eventually(t, "Close to start", func() bool {
		_, err := p.TryCheckout(context.Background())
		return errors.Is(err, ErrClosed)
	})
	proceed <- struct{}{}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Checkout during Close: %v, want ErrClosed", err)
	}
	mustRelease(t, held)
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
	f.checkAllClosedOnce(t)
	if made, closed := f.counts(); made != 2 || closed != 2 {
		t.Fatalf("made %d, closed %d", made, closed)
	}
}

// TestPoolLIFOFastPath checks that a LIFO pool keeps the order of its idle
// stack when workers come back through the lock-free slot, and that Resize
// and Close find the worker that sits there.
func TestPoolLIFOFastPath(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 4, Eager: true})
	var ls []Lease[*testWorker]
	for range 4 {
		ls = append(ls, mustCheckout(t, p))
	}
	for _, l := range ls {
		mustRelease(t, l)
	}
	if s := p.Stats(); s.Idle != 4 || s.Busy != 0 || s.Checkouts != 4 {
		t.Fatalf("after releasing every worker: %+v", s)
	}
	for i := 3; i >= 0; i-- {
		l := mustCheckout(t, p)
		if got, want := l.Worker(), ls[i].Worker(); got != want {
			t.Fatalf("checkout %d reused worker %d, want %d (the last released)", 3-i, got.id, want.id)
		}
		ls[i] = l
	}
	if s := p.Stats(); s.Idle != 0 || s.Busy != 4 {
		t.Fatalf("with every worker leased: %+v", s)
	}
	for _, l := range ls {
		mustRelease(t, l)
	}
	// The last released worker is the top of the stack: Resize closes the
	// others, oldest first, and keeps it.
	if err := p.Resize(1); err != nil {
		t.Fatal(err)
	}
	if s := p.Stats(); s.Idle != 1 || s.Busy != 0 {
		t.Fatalf("after Resize(1): %+v", s)
	}
	for i, l := range ls {
		want := int32(1)
		if i == 3 {
			want = 0
		}
		if got := l.Worker().closes.Load(); got != want {
			t.Errorf("worker %d (released %d of 4) closed %d times after Resize(1), want %d", l.Worker().id, i+1, got, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ls[3].Worker().closes.Load(); got != 1 {
		t.Errorf("the idle worker was closed %d times by Close, want 1", got)
	}
	if s := p.Stats(); s.Idle != 0 || s.Busy != 0 {
		t.Fatalf("after Close: %+v", s)
	}
}

// TestPoolContendedRoundTrips runs many goroutines through a pool smaller
// than their number, so that releases race with callers that are about to
// queue: a worker left in the lock-free slot while a caller waits would
// hang the test. At the end every worker is idle and every checkout counted.
func TestPoolContendedRoundTrips(t *testing.T) {
	for _, strategy := range []Strategy{LIFO, FIFO} {
		t.Run(strategy.String(), func(t *testing.T) {
			const goroutines, rounds = 16, 2000
			f := &factory{}
			p := newTestPool(t, f, Config[*testWorker]{Size: 2, Eager: true, Strategy: strategy})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := context.Background()
					if g%2 == 1 {
						c = ctx // a caller that waits selects on its context
					}
					for range rounds {
						l, err := p.Checkout(c)
						if err != nil {
							t.Error(err)
							return
						}
						if err := l.Release(); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if s := p.Stats(); s.Idle != 2 || s.Busy != 0 || s.Waiting != 0 || s.Checkouts != goroutines*rounds {
				t.Fatalf("after %d round trips: %+v", goroutines*rounds, s)
			}
			if _, closed := f.counts(); closed != 0 {
				t.Fatalf("%d workers closed, want 0", closed)
			}
		})
	}
}
