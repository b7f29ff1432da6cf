package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// invariantError returns what is wrong with the pool's bookkeeping, or nil.
// maxLive is the most workers (alive, being made or being closed) allowed at
// once.
func (p *Pool[W]) invariantError(maxLive int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	// Leased workers are not counted: they are what live leaves over.
	if sum := p.idleCountLocked() + p.building + p.builders + p.closing; p.live < sum {
		return fmt.Errorf("live = %d, but idle %d + building %d + builders %d + closing %d = %d",
			p.live, p.idleCountLocked(), p.building, p.builders, p.closing, sum)
	}
	if p.live > maxLive {
		return fmt.Errorf("%d live workers, more than the %d allowed", p.live, maxLive)
	}
	// (A worker in hot while callers wait is a fast Release on its way to
	// them.)
	if p.idle.n > 0 && p.queue.len() > 0 {
		return fmt.Errorf("%d idle workers while %d callers wait: a worker was not handed to the first waiter", p.idle.n, p.queue.len())
	}
	if p.hot.Load() != nil && !p.lifo {
		return errors.New("a FIFO pool has a worker in hot")
	}
	n := 0
	for w, prev := p.queue.head, (*poolWaiter[W])(nil); w != nil; prev, w = w, w.next {
		if w.prev != prev || !w.queued {
			return errors.New("the wait queue is corrupt")
		}
		n++
	}
	if n != p.queue.len() {
		return fmt.Errorf("wait queue holds %d waiters, its count says %d", n, p.queue.len())
	}
	if p.building < 0 || p.builders < 0 || p.closing < 0 || p.shrink < 0 {
		return fmt.Errorf("negative count: building %d builders %d closing %d shrink %d",
			p.building, p.builders, p.closing, p.shrink)
	}
	return nil
}

// TestPoolStress runs 64 goroutines that check out, release, retire, cancel
// and run transactions at random, with failing constructions and health
// checks, and checks the pool's invariants after every step: never more
// than Size+MaxOverflow workers, no worker leased twice, no idle worker
// while callers wait, and at Close every worker made closed exactly once.
func TestPoolStress(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	for _, tc := range []struct {
		name     string
		strategy Strategy
		resize   bool
	}{
		{"LIFO", LIFO, false},
		{"FIFO", FIFO, false},
		{"LIFO/resize", LIFO, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stress(t, tc.strategy, tc.resize)
		})
	}
}

func stress(t *testing.T, strategy Strategy, resize bool) {
	const (
		goroutines  = 64
		iterations  = 300
		size        = 4
		maxOverflow = 4
		maxResize   = 8
	)
	f := &factory{}
	var (
		failMu sync.Mutex
		rng    = rand.New(rand.NewPCG(1, 2))
	)
	chance := func(percent int) bool {
		failMu.Lock()
		defer failMu.Unlock()
		return rng.IntN(100) < percent
	}
	errDown := errors.New("constructor down")
	p, err := New(Config[*testWorker]{
		Size:        size,
		MaxOverflow: maxOverflow,
		IdleTTL:     time.Millisecond,
		Strategy:    strategy,
		New: func(ctx context.Context) (*testWorker, error) {
			if chance(3) {
				return nil, errDown
			}
			return f.new(ctx)
		},
		Close: f.close,
		Check: func(ctx context.Context, w *testWorker) error {
			defer w.use(t)()
			if chance(2) {
				return errors.New("unhealthy")
			}
			return nil
		},
		CheckOn:           CheckOnCheckout | CheckOnRelease,
		MaxRestarts:       1 << 20, // never degraded here; TestPoolDegradedAndRecovers covers that
		RestartBackoff:    time.Microsecond,
		MaxRestartBackoff: 100 * time.Microsecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	maxLive := size + maxOverflow
	if resize {
		maxLive = maxResize + maxOverflow
	}
	check := func() {
		if err := p.invariantError(maxLive); err != nil {
			t.Error(err)
		}
		made, closed := f.counts()
		if made-closed > maxLive {
			t.Errorf("%d workers alive, more than %d", made-closed, maxLive)
		}
	}
	okErr := func(err error) bool {
		return err == nil || errors.Is(err, errDown) || errors.Is(err, ErrNoWorker) ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	}
	// hold uses the worker of l a little and ends the lease at random.
	hold := func(r *rand.Rand, l Lease[*testWorker]) {
		done := l.Worker().use(t)
		for range r.IntN(3) {
			runtime.Gosched()
		}
		done()
		switch r.IntN(10) {
		case 0:
			if err := l.Retire(); err != nil {
				t.Errorf("Retire: %v", err)
			}
		case 1:
			if err := l.Release(); err != nil {
				t.Errorf("Release: %v", err)
			}
			if err := l.Release(); !errors.Is(err, ErrReleased) {
				t.Errorf("second Release: %v, want ErrReleased", err)
			}
		default:
			if err := l.Release(); err != nil {
				t.Errorf("Release: %v", err)
			}
		}
	}
	timeout := func(r *rand.Rand) (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.Background(), time.Duration(r.IntN(300))*time.Microsecond)
	}

	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 42))
			for i := 0; i < iterations && !t.Failed(); i++ {
				switch op := r.IntN(10); {
				case op < 3: // Checkout, maybe giving up
					ctx, cancel := timeout(r)
					if r.IntN(4) == 0 {
						ctx, cancel = context.WithCancel(context.Background())
						if r.IntN(2) == 0 {
							cancel()
						}
					}
					l, err := p.Checkout(ctx)
					cancel()
					if err == nil {
						hold(r, l)
					} else if !okErr(err) {
						t.Errorf("Checkout: %v", err)
					}
				case op < 4: // TryCheckout
					l, err := p.TryCheckout(context.Background())
					if err == nil {
						hold(r, l)
					} else if !okErr(err) {
						t.Errorf("TryCheckout: %v", err)
					}
				case op < 9: // Do, with every outcome
					ctx, cancel := timeout(r)
					behaviour := r.IntN(5)
					err := p.Do(ctx, func(ctx context.Context, w *testWorker) error {
						defer w.use(t)()
						switch behaviour {
						case 0:
							return errors.New("plain")
						case 1:
							return Broken(errors.New("broken"))
						case 2:
							panic("boom")
						case 3:
							<-ctx.Done() // outlives the caller's deadline
							return nil
						}
						return nil
					})
					cancel()
					var pe *PanicError
					if !okErr(err) && !IsBroken(err) && !errors.As(err, &pe) && err.Error() != "plain" {
						t.Errorf("Do: %v", err)
					}
				default:
					if resize {
						if err := p.Resize(1 + r.IntN(maxResize)); err != nil {
							t.Errorf("Resize: %v", err)
						}
					} else {
						s := p.Stats()
						if s.Busy+s.Idle > maxLive {
							t.Errorf("stats: %+v", s)
						}
					}
				}
				check()
			}
		}()
	}
	wg.Wait()
	check()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	f.checkAllClosedOnce(t)
	made, closed := f.counts()
	s := p.Stats()
	if made != closed || s.Busy != 0 || s.Idle != 0 || s.Starting != 0 || s.Closing != 0 {
		t.Fatalf("after Close: made %d, closed %d, stats %+v", made, closed, s)
	}
	t.Logf("made %d workers; stats %+v", made, s)
}

// TestPoolStressChecksCanFail makes sure the stress test's invariant check
// notices broken bookkeeping.
func TestPoolStressChecksCanFail(t *testing.T) {
	f := &factory{}
	p := newTestPool(t, f, Config[*testWorker]{Size: 2, Eager: true})
	if err := p.invariantError(2); err != nil {
		t.Fatalf("a sound pool: %v", err)
	}
	if err := p.invariantError(1); err == nil {
		t.Fatal("2 live workers passed a limit of 1")
	}
	p.mu.Lock()
	p.closing++
	p.mu.Unlock()
	if err := p.invariantError(2); err == nil {
		t.Fatal("a miscount passed")
	}
	p.mu.Lock()
	p.closing--
	p.mu.Unlock()
}
