package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Pool is a supervised checkout pool of stateful workers of type W
// (connections, clients, parsers...), in the manner of Erlang's poolboy.
//
// It keeps Size permanent workers and makes up to MaxOverflow temporary ones
// when every worker is busy; idle overflow workers are closed after IdleTTL.
// A caller takes a worker with [Pool.Checkout] (which waits, in FIFO order,
// until a worker is free or its context ends) or [Pool.TryCheckout] (which
// never waits), and gives it back with [Lease.Release] or retires it with
// [Lease.Retire]. [Pool.Do] wraps the two in a transaction that always gives
// the worker back or retires it.
//
// Retired workers and failed constructions are replaced in the background,
// with exponential backoff after failures. When the constructor fails more
// than MaxRestarts times within Period the pool is degraded: checkouts that
// find no idle worker fail at once with an error that wraps [ErrDegraded]
// and the constructor's last error, until a background construction
// succeeds again.
//
// A Pool is safe for concurrent use. After [Pool.Close], Checkout,
// TryCheckout, Do and Resize return [ErrClosed]; Stats keeps working, Close
// may be called again, and nothing panics.
type Pool[W any] struct {
	prefix   string // "pool" or `pool "name"`, the start of every error
	newFn    func(context.Context) (W, error)
	closeFn  func(W) error
	checkFn  func(context.Context, W) error
	checkOut bool
	checkIn  bool
	lifo     bool
	eager    bool
	ttl      time.Duration
	period   time.Duration
	backoff  time.Duration
	maxBack  time.Duration
	log      *slog.Logger
	epoch    time.Time

	// ctx ends at Close. Background constructions and release checks get it.
	ctx    context.Context
	cancel context.CancelFunc

	errClosed   error
	errNoWorker error
	errReleased error

	waiters sync.Pool      // of *poolWaiter[W]
	wg      sync.WaitGroup // background goroutines: builders, reaper, abandoned transactions

	waitNanos atomic.Int64
	waits     atomic.Uint64

	// The fast path of LIFO pools: hot is the top of the idle stack, the
	// worker that came back last, or nil; the rest of the stack is idle.
	// Release swaps its worker in and Checkout takes it out without the
	// mutex while fast is set, that is while nobody waits and the pool is
	// open, within Size and LIFO (see syncFastLocked). checkouts counts the
	// leases handed out, each in its worker's stripe. fast, read by every
	// Checkout and Release and written only when the pool's state changes,
	// and queue (guarded by mu), written only when callers queue, have
	// cache lines of their own, away from the words written at every
	// lease.
	_         [64]byte
	fast      atomic.Bool
	_         [64]byte
	hot       atomic.Pointer[poolEntry[W]]
	_         [64]byte
	checkouts stripedCount
	queue     waitList[W]
	_         [64]byte

	mu          sync.Mutex
	idle        idleRing[W]
	size        int
	maxOverflow int
	// live counts every worker slot in use: idle (hot included) + leased
	// + building + builders + closing. It never exceeds size+maxOverflow,
	// except after a shrink until the surplus comes back.
	live     int
	building int // constructions run by callers of Checkout
	builders int // background constructions (one goroutine each)
	closing  int // workers whose Close hook is running
	shrink   int // workers still to retire after a Resize down
	closed   bool
	drained  chan struct{} // closed when the pool is closed and empty
	isDrain  bool
	reaper   *time.Timer

	failTimes []int64 // ring of the last MaxRestarts+1 failure times
	failNext  int
	failCount int
	streak    int   // consecutive failed constructions
	lastErr   error // the constructor's last error; nil after a success
	probing   bool  // one background builder probes while streak > 0
	probeDone chan struct{}
	degraded  error // non-nil while degraded

	created  uint64
	retired  uint64
	failures uint64
	restarts uint64
}

// poolEntry is one worker and its lease state.
type poolEntry[W any] struct {
	p *Pool[W]
	w W
	// lease counts the leases of the entry that have ended. A lease's id is
	// the count when it began, and ending it moves the count on (a
	// compare-and-swap from the id), so a stale or copied Lease cannot end
	// it, or a later lease, again; beginning a lease writes nothing.
	lease  atomic.Uint64
	since  int64 // when it went idle while overflow existed; 0 if unknown
	used   bool  // leased before (a fresh worker skips the checkout check)
	stripe uint8 // its counter of p.checkouts
}

// newEntry returns the entry of a new worker w, with p.mu held (or before
// the pool is shared); used skips its first checkout check. The count of
// workers made deals out the stripes.
func (p *Pool[W]) newEntry(w W, used bool) *poolEntry[W] {
	return &poolEntry[W]{p: p, w: w, used: used, stripe: uint8(p.created % checkoutStripes)}
}

// checkoutStripes is how many counters p.checkouts has. Each worker counts
// its checkouts in one of them: workers leased on different CPUs then write
// different cache lines, where one shared counter, written by every
// checkout, moved its line between the CPUs at every lease.
const checkoutStripes = 8

// stripedCount is a count kept in checkoutStripes counters, each on a cache
// line of its own.
type stripedCount struct {
	s [checkoutStripes]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

// add counts one in stripe i.
func (c *stripedCount) add(i uint8) { c.s[i%checkoutStripes].n.Add(1) }

// load returns the count.
func (c *stripedCount) load() uint64 {
	var n uint64
	for i := range c.s {
		n += c.s[i].n.Load()
	}
	return n
}

// New returns a pool configured by cfg, or an error naming the first invalid
// field. With cfg.Eager it builds the Size permanent workers first and fails
// if one of them cannot be made.
func New[W any](cfg Config[W]) (*Pool[W], error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	prefix := "pool"
	if c.Name != "" {
		prefix = "pool " + strconv.Quote(c.Name)
	}
	p := &Pool[W]{
		prefix:      prefix,
		newFn:       c.New,
		closeFn:     c.Close,
		checkFn:     c.Check,
		checkOut:    c.CheckOn&CheckOnCheckout != 0,
		checkIn:     c.CheckOn&CheckOnRelease != 0,
		lifo:        c.Strategy == LIFO,
		eager:       c.Eager,
		ttl:         c.IdleTTL,
		period:      c.Period,
		backoff:     c.RestartBackoff,
		maxBack:     c.MaxRestartBackoff,
		log:         c.Logger,
		epoch:       time.Now(),
		errClosed:   named(prefix, ErrClosed),
		errNoWorker: named(prefix, ErrNoWorker),
		errReleased: named(prefix, ErrReleased),
		size:        c.Size,
		maxOverflow: c.MaxOverflow,
		drained:     make(chan struct{}),
		failTimes:   make([]int64, c.MaxRestarts+1),
		probeDone:   make(chan struct{}),
	}
	if c.Name != "" {
		p.log = p.log.With("pool", c.Name)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.waiters.New = func() any { return &poolWaiter[W]{ch: make(chan *poolEntry[W], 1)} }
	if c.Eager {
		for i := range c.Size {
			w, err := p.construct(p.ctx)
			if err != nil {
				errs := []error{p.errorf("new worker %d of %d: %w", i+1, c.Size, err)}
				for p.idle.n > 0 {
					if err := p.closeWorker(p.idle.popFront().w); err != nil {
						errs = append(errs, err)
					}
				}
				p.cancel()
				return nil, errors.Join(errs...)
			}
			p.idle.pushBack(p.newEntry(w, false))
			p.live++
			p.created++
		}
	}
	p.syncFastLocked()
	return p, nil
}

// errorf formats an error that starts with the pool's prefix.
func (p *Pool[W]) errorf(format string, args ...any) error {
	return fmt.Errorf(p.prefix+": "+format, args...)
}

// Checkout leases a worker, waiting until one is free. It takes an idle
// worker if there is one, else makes a worker (with ctx) if the pool may
// grow and nobody waits, else waits behind earlier callers, first come first
// served. It gives up with ctx.Err() (unwrapped) when ctx has ended or ends
// first. (Before it queues, a caller that finds every worker busy and
// nobody waiting yields the processor twice, so that workers held for a
// moment come back without anyone parking; callers are ordered from the
// moment they queue.)
//
// It fails at once with an error wrapping ErrDegraded when it would have to
// wait or make a worker while the pool is degraded, and with ErrClosed after
// Close. An error from the constructor is returned wrapped.
//
// The caller must end the lease with Release or Retire.
func (p *Pool[W]) Checkout(ctx context.Context) (Lease[W], error) {
	if err := ctx.Err(); err != nil {
		return Lease[W]{}, err
	}
	if e := p.takeHot(); e != nil {
		if l, ok := p.checked(ctx, e); ok {
			return l, nil
		}
		if err := ctx.Err(); err != nil {
			return Lease[W]{}, err
		}
	}
	yields, allowed := 0, checkoutYields
	for {
		p.lock()
		if p.closed {
			p.unlock()
			return Lease[W]{}, p.errClosed
		}
		var (
			e   *poolEntry[W]
			err error
		)
		if e = p.popIdleLocked(); e != nil {
			p.lease(e)
			p.unlock()
		} else if p.degraded != nil {
			err = p.degraded
			p.unlock()
			return Lease[W]{}, err
		} else if p.live < p.size+p.maxOverflow && p.queue.len() == 0 {
			return p.build(ctx)
		} else if err = ctx.Err(); err != nil {
			p.unlock()
			return Lease[W]{}, err
		} else if yields < allowed && p.queue.len() == 0 {
			// Every worker is busy: let the goroutines that hold one run
			// before queueing. Short leases then come back to the idle
			// set instead of forming a convoy in which every checkout
			// parks and every release wakes a parked caller: once one
			// forms it lasts, since each release hands its worker to the
			// first waiter and the releaser, coming back, queues behind
			// the rest. A yield during which some checkout succeeded
			// earns another, up to checkoutYieldsMax, so callers keep
			// yielding while leases are short and queue soon when they
			// are long. Queued callers lose nothing: a released worker
			// goes to the first of them, and an idle one exists only
			// when none waits. (When some wait already, the workers
			// coming back go to them: yielding would only delay the
			// caller's turn.)
			p.unlock()
			yields++
			seen := p.checkouts.load()
			runtime.Gosched()
			if p.checkouts.load() != seen {
				allowed = min(allowed+1, checkoutYieldsMax)
			}
			continue
		} else if e, err = p.wait(ctx); err != nil {
			return Lease[W]{}, err
		}
		if l, ok := p.checked(ctx, e); ok {
			return l, nil
		}
		if err := ctx.Err(); err != nil {
			return Lease[W]{}, err
		}
	}
}

// checkoutYields is how many times Checkout yields the processor, when every
// worker is busy, before it queues and parks, unless other checkouts succeed
// while it yields; checkoutYieldsMax bounds the yields then.
const (
	checkoutYields    = 2
	checkoutYieldsMax = 16
)

// TryCheckout leases an idle worker if there is one and never waits for a
// worker: it returns an error wrapping ErrNoWorker when none is idle (and
// then, if the pool may grow, starts making one in the background so that a
// later try can succeed). ctx is given to the health check only. It fails
// with ErrDegraded or ErrClosed like Checkout.
func (p *Pool[W]) TryCheckout(ctx context.Context) (Lease[W], error) {
	if e := p.takeHot(); e != nil {
		if l, ok := p.checked(ctx, e); ok {
			return l, nil
		}
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.unlock()
			return Lease[W]{}, p.errClosed
		}
		e := p.popIdleLocked()
		if e == nil {
			err := p.errNoWorker
			if p.degraded != nil {
				err = p.degraded
			} else if p.builders <= p.queue.len() && p.live < p.size+p.maxOverflow {
				p.startBuilderLocked()
			}
			p.unlock()
			return Lease[W]{}, err
		}
		p.lease(e)
		p.unlock()
		if l, ok := p.checked(ctx, e); ok {
			return l, nil
		}
	}
}

// takeHot leases the worker in hot, if the fast path is on and there is
// one, without the mutex.
func (p *Pool[W]) takeHot() *poolEntry[W] {
	if !p.fast.Load() {
		return nil
	}
	// Whoever wins the CAS owns e; e may have been taken and given back in
	// between, which is fine: it is idle again.
	e := p.hot.Load()
	if e == nil || !p.hot.CompareAndSwap(e, nil) {
		return nil
	}
	p.lease(e)
	return e
}

func (p *Pool[W]) popIdleLocked() *poolEntry[W] {
	if p.lifo {
		if p.hot.Load() != nil {
			if e := p.hot.Swap(nil); e != nil {
				return e
			}
		}
		return p.idle.popBack()
	}
	return p.idle.popFront()
}

// lease counts the lease of e, which the caller has just taken out of the
// idle set. Its id is e.lease, as it is until the lease ends.
func (p *Pool[W]) lease(e *poolEntry[W]) {
	p.checkouts.add(e.stripe)
}

// lock locks p.mu, trying for a moment before it parks. sync.Mutex does not
// spin while the processor has other goroutines to run, so under many
// callers it parks at once, and every unlock then pays a wake-up; the
// pool's critical sections are a few loads and stores, so a brief retry
// nearly always wins.
func (p *Pool[W]) lock() {
	for range lockSpins {
		if p.mu.TryLock() {
			return
		}
	}
	p.mu.Lock()
}

// lockSpins is how many times lock tries before it parks.
const lockSpins = 64

// unlock updates the fast path's switch and unlocks p.mu. Every critical
// section ends with it, so that fast always reflects the state it leaves.
func (p *Pool[W]) unlock() {
	p.syncFastLocked()
	p.mu.Unlock()
}

// syncFastLocked turns the fast path on while the pool is LIFO, open and
// within Size (no overflow worker, so no idle time to keep and no surplus
// to close), and off otherwise; when it turns off, the worker in hot joins
// the idle set. (A Release that put its worker in hot meanwhile sees fast
// off, or waiters, and takes it back out: see release.)
func (p *Pool[W]) syncFastLocked() {
	want := p.lifo && !p.closed && p.live <= p.size
	if want == p.fast.Load() {
		return
	}
	p.fast.Store(want)
	if !want {
		if e := p.hot.Swap(nil); e != nil {
			if p.queue.len() > 0 && !p.closed && p.live <= p.size+p.maxOverflow {
				p.lease(e)
				p.queue.pop().ch <- e // never blocks: one value per wait
			} else {
				// Close and Resize, which turn the fast path off, close
				// the idle workers they must.
				p.idleLocked(e)
			}
		}
	}
}

// checked runs the checkout health check on e, which the caller holds under
// its current lease. A worker that fails it is retired; if ctx has ended,
// it is given back instead, since the check may have failed only for that.
func (p *Pool[W]) checked(ctx context.Context, e *poolEntry[W]) (Lease[W], bool) {
	l := Lease[W]{e: e, id: e.lease.Load()}
	if !p.checkOut || !e.used {
		e.used = true
		return l, true
	}
	err := p.check(ctx, e.w)
	if err == nil {
		return l, true
	}
	if ctx.Err() != nil {
		p.release(l, false)
		return Lease[W]{}, false
	}
	p.log.Warn("pool: worker failed its health check on checkout; retiring it", "err", err)
	if err := p.retire(l); err != nil {
		p.log.Warn("pool: closing a retired worker failed", "err", err)
	}
	return Lease[W]{}, false
}

// build makes a worker for the caller of Checkout. p.mu is held on entry and
// released on return.
func (p *Pool[W]) build(ctx context.Context) (Lease[W], error) {
	p.live++
	p.building++
	p.unlock()
	start := p.now()
	w, err := p.construct(ctx)
	p.mu.Lock()
	p.building--
	if err != nil {
		p.live--
		degraded := p.failedLocked(err)
		p.refillLocked(true)
		p.drainCheckLocked()
		p.unlock()
		if degraded {
			p.logDegraded(err)
		}
		return Lease[W]{}, p.errorf("new worker: %w", err)
	}
	if p.succeededLocked() {
		defer p.logRecovered()
	}
	p.created++
	e := p.newEntry(w, true)
	if p.closed {
		p.closing++
		p.unlock()
		p.finishClose(w, false)
		return Lease[W]{}, p.errClosed
	}
	p.unlock()
	p.lease(e)
	p.noteWait(start)
	l := Lease[W]{e: e, id: e.lease.Load()}
	if err := ctx.Err(); err != nil {
		p.release(l, false)
		return Lease[W]{}, err
	}
	return l, nil
}

// wait queues the caller behind earlier waiters until a worker is handed to
// it. p.mu is held on entry and released on return.
func (p *Pool[W]) wait(ctx context.Context) (*poolEntry[W], error) {
	w := p.waiters.Get().(*poolWaiter[W])
	p.queue.push(w)
	// A Release may have put its worker in hot before it could see this
	// waiter: it goes to the first waiter. (With the fast path off, such a
	// Release sees it and takes its worker back itself.)
	var (
		to *poolWaiter[W]
		e  *poolEntry[W]
	)
	if p.fast.Load() && p.hot.Load() != nil {
		if e = p.hot.Swap(nil); e != nil {
			to = p.queue.pop()
			p.lease(e)
		}
	}
	p.growForWaitersLocked()
	p.unlock()
	if to != nil {
		to.ch <- e
		e = nil
	}
	start := p.now()
	if done := ctx.Done(); done == nil {
		e = <-w.ch
	} else {
		select {
		case e = <-w.ch:
		case <-done:
			p.mu.Lock()
			if w.queued {
				p.queue.remove(w)
				p.unlock()
				p.waiters.Put(w)
				return nil, ctx.Err()
			}
			p.unlock()
			// Someone is handing us a worker (or an error) right now:
			// take it and give it back.
			if e = <-w.ch; e != nil {
				p.release(Lease[W]{e: e, id: e.lease.Load()}, false)
			}
			w.err = nil
			p.waiters.Put(w)
			return nil, ctx.Err()
		}
	}
	err := w.err
	w.err = nil
	p.waiters.Put(w)
	if e == nil {
		return nil, err
	}
	p.noteWait(start)
	return e, nil
}

// noteWait counts a checkout that waited since start (from p.now).
func (p *Pool[W]) noteWait(start int64) {
	p.waitNanos.Add(p.now() - start)
	p.waits.Add(1)
}

// release ends lease l and gives its worker back: to the first waiter, to
// the idle set, or to Close if it is surplus or the pool is closed. With
// check, the release health check runs first.
func (p *Pool[W]) release(l Lease[W], check bool) error {
	e := l.e
	if e == nil || !e.lease.CompareAndSwap(l.id, l.id+1) {
		return p.errReleased
	}
	if check && p.checkIn && p.ctx.Err() == nil {
		if err := p.check(p.ctx, e.w); err != nil {
			p.log.Warn("pool: worker failed its health check on release; retiring it", "err", err)
			return p.retireOwned(e)
		}
	}
	if p.fast.Load() && p.queue.len() == 0 {
		old := p.hot.Swap(e)
		if old == nil && p.fast.Load() && p.queue.len() == 0 {
			return nil
		}
		// The worker that was in hot goes under e in the idle set; and if
		// someone queued or the fast path turned off meanwhile, the worker
		// in hot (e or a later one) goes the slow way, unless a waiter or
		// syncFastLocked took it already.
		var err error
		if old != nil {
			err = p.putBack(old)
		}
		if !p.fast.Load() || p.queue.len() > 0 {
			if h := p.hot.Swap(nil); h != nil {
				err = errors.Join(err, p.putBack(h))
			}
		}
		return err
	}
	return p.putBack(e)
}

// putBack gives e, a worker counted in live but in no other state, to the
// first waiter or the idle set, or closes it if it is surplus or the pool
// is closed.
func (p *Pool[W]) putBack(e *poolEntry[W]) error {
	p.lock()
	if p.closed || p.surplusLocked() {
		p.closing++
		p.unlock()
		return p.finishClose(e.w, false)
	}
	p.deliverLocked(e)
	return nil
}

// retire ends lease l and closes its worker; a replacement is made in the
// background when the pool needs one.
func (p *Pool[W]) retire(l Lease[W]) error {
	e := l.e
	if e == nil || !e.lease.CompareAndSwap(l.id, l.id+1) {
		return p.errReleased
	}
	return p.retireOwned(e)
}

// retireOwned retires e, whose lease the caller has just ended.
func (p *Pool[W]) retireOwned(e *poolEntry[W]) error {
	p.mu.Lock()
	p.retired++
	p.closing++
	p.unlock()
	return p.finishClose(e.w, true)
}

// surplusLocked reports whether a worker coming back (or about to be made)
// is one too many: the pool is above its cap, or shrinking after a Resize
// with nobody waiting. It counts the worker as gone from the shrink.
func (p *Pool[W]) surplusLocked() bool {
	if p.live > p.size+p.maxOverflow || (p.shrink > 0 && p.live > p.size && p.queue.len() == 0) {
		if p.shrink > 0 {
			p.shrink--
		}
		return true
	}
	return false
}

// deliverLocked hands e, a worker counted in live but in no other state, to
// the first waiter or puts it in the idle set. p.mu is held on entry and
// released on return.
func (p *Pool[W]) deliverLocked(e *poolEntry[W]) {
	if w := p.queue.pop(); w != nil {
		p.lease(e)
		p.unlock()
		w.ch <- e
		return
	}
	p.idleLocked(e)
	p.unlock()
}

// idleLocked puts e on top of the idle set, noting when it went idle if it
// is an overflow worker.
func (p *Pool[W]) idleLocked(e *poolEntry[W]) {
	e.since = 0
	if p.live > p.size {
		e.since = p.now()
		p.armReaperLocked()
	}
	p.idle.pushBack(e)
}

// idleCountLocked is the number of idle workers, hot included.
func (p *Pool[W]) idleCountLocked() int {
	n := p.idle.n
	if p.hot.Load() != nil {
		n++
	}
	return n
}

// busyLocked is the number of leased workers (including a worker on its
// way back from a fast Release).
func (p *Pool[W]) busyLocked() int {
	return max(0, p.live-p.idleCountLocked()-p.building-p.builders-p.closing)
}

// finishClose closes w, a worker counted in closing, and then lets its slot
// go; with restart, a replacement counts as a restart.
func (p *Pool[W]) finishClose(w W, restart bool) error {
	err := p.closeWorker(w)
	p.mu.Lock()
	p.closing--
	p.live--
	p.shrink = min(p.shrink, max(0, p.live-p.size))
	p.refillLocked(restart)
	p.drainCheckLocked()
	p.unlock()
	return err
}

// construct calls the constructor, turning a panic into an error.
func (p *Pool[W]) construct(ctx context.Context) (w W, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = NewPanicError(r)
		}
	}()
	return p.newFn(ctx)
}

// closeWorker calls the Close hook, turning a panic into an error.
func (p *Pool[W]) closeWorker(w W) (err error) {
	if p.closeFn == nil {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = NewPanicError(r)
		}
		if err != nil {
			err = p.errorf("close worker: %w", err)
		}
	}()
	return p.closeFn(w)
}

// check calls the health check, turning a panic into an error.
func (p *Pool[W]) check(ctx context.Context, w W) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = NewPanicError(r)
		}
	}()
	return p.checkFn(ctx, w)
}

// now is the time since the pool was made, from the monotonic clock; it is
// never 0.
func (p *Pool[W]) now() int64 {
	return max(1, int64(time.Since(p.epoch)))
}

// Resize sets the number of permanent workers to n (n >= 0). Growing an
// eager pool makes the new workers in the background; growing a lazy one
// lets it make them on demand, and serves waiting callers at once. Shrinking
// closes idle workers now and leased ones as they come back (a worker coming
// back while callers wait goes to them instead, within the MaxOverflow cap).
// It returns the errors of closing idle workers, ErrClosed after Close.
func (p *Pool[W]) Resize(n int) error {
	if n < 0 {
		return p.errorf("Resize: n must be >= 0, got %d", n)
	}
	var victims []W
	p.mu.Lock()
	if p.closed {
		p.unlock()
		return p.errClosed
	}
	p.size = n
	p.syncFastLocked()
	if p.live > n {
		for p.live-len(victims) > n && p.idle.n > 0 {
			victims = append(victims, p.idle.popFront().w)
		}
		p.closing += len(victims)
		p.shrink = p.live - len(victims) - n
	} else {
		p.shrink = 0
		if p.eager {
			for p.live < n {
				p.startBuilderLocked()
			}
		}
		p.growForWaitersLocked()
	}
	p.unlock()
	var errs []error
	for _, w := range victims {
		if err := p.finishClose(w, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// PoolStats is a snapshot of a [Pool], from [Pool.Stats].
type PoolStats struct {
	// Size is the number of permanent workers (Config.Size or the last
	// Resize) and MaxOverflow the number of temporary ones allowed beyond.
	Size, MaxOverflow int
	// Idle workers wait for a checkout; Busy ones are leased.
	Idle, Busy int
	// Overflow is how many of the Idle+Busy workers are beyond Size.
	Overflow int
	// Starting workers are being made; Closing ones are being closed.
	Starting, Closing int
	// Waiting is the number of callers queued in Checkout.
	Waiting int
	// Checkouts counts the leases handed out; Waits counts those whose
	// caller had to queue for a worker or make one.
	Checkouts, Waits uint64
	// WaitTime is the total time those callers spent queued or making a
	// worker, and AvgWait is WaitTime divided by Checkouts (the average
	// over all checkouts, most of which wait for nothing).
	WaitTime, AvgWait time.Duration
	// Created counts the workers made; Retired those retired (by Retire, a
	// failed transaction or a failed health check); Failures the failed
	// constructions; Restarts the background constructions that replaced
	// a retired worker or retried a failed construction.
	Created, Retired, Failures, Restarts uint64
	// Degraded is true while the pool is degraded, and LastError is the
	// constructor's last error, nil once a construction succeeds.
	Degraded  bool
	LastError error
}

// Stats returns a snapshot of the pool. It works after Close too.
func (p *Pool[W]) Stats() PoolStats {
	p.mu.Lock()
	idle, busy := p.idleCountLocked(), p.busyLocked()
	s := PoolStats{
		Size:        p.size,
		MaxOverflow: p.maxOverflow,
		Idle:        idle,
		Busy:        busy,
		Overflow:    max(0, idle+busy-p.size),
		Starting:    p.building + p.builders,
		Closing:     p.closing,
		Waiting:     p.queue.len(),
		Checkouts:   p.checkouts.load(),
		Created:     p.created,
		Retired:     p.retired,
		Failures:    p.failures,
		Restarts:    p.restarts,
		Degraded:    p.degraded != nil,
		LastError:   p.lastErr,
	}
	p.unlock()
	s.Waits = p.waits.Load()
	s.WaitTime = time.Duration(p.waitNanos.Load())
	if s.Checkouts > 0 {
		s.AvgWait = s.WaitTime / time.Duration(s.Checkouts)
	}
	return s
}

// Close shuts the pool down: callers waiting in Checkout get ErrClosed, idle
// workers are closed now, and Close waits until ctx ends for the leased ones
// to come back (each is closed when it does, even after Close returned) and
// for background constructions to stop. It returns the errors of closing
// workers, and ctx's error if it ended first.
//
// Close is idempotent: every call waits for the same drain, and only the
// first one closes the idle workers. Every other method returns ErrClosed
// once Close has been called.
func (p *Pool[W]) Close(ctx context.Context) error {
	var errs []error
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		p.syncFastLocked()
		if p.reaper != nil && p.reaper.Stop() {
			p.reaper = nil
			p.wg.Done()
		}
		for w := p.queue.pop(); w != nil; w = p.queue.pop() {
			w.err = p.errClosed
			w.ch <- nil
		}
		var victims []W
		for p.idle.n > 0 {
			victims = append(victims, p.idle.popFront().w)
		}
		p.closing += len(victims)
		p.unlock()
		p.cancel()
		for _, w := range victims {
			if err := p.finishClose(w, false); err != nil {
				errs = append(errs, err)
			}
		}
		p.mu.Lock()
		p.drainCheckLocked()
	}
	p.unlock()
	select {
	case <-p.drained:
	default:
		select {
		case <-p.drained:
		case <-ctx.Done():
			p.mu.Lock()
			busy, starting := p.busyLocked(), p.building+p.builders
			p.unlock()
			errs = append(errs, p.errorf("close: %d workers still leased, %d being made: %w", busy, starting, ctx.Err()))
			return errors.Join(errs...)
		}
	}
	p.wg.Wait()
	return errors.Join(errs...)
}

// drainCheckLocked closes p.drained once the pool is closed and empty.
func (p *Pool[W]) drainCheckLocked() {
	if p.closed && !p.isDrain && p.live == 0 && p.reaper == nil {
		p.isDrain = true
		close(p.drained)
	}
}
