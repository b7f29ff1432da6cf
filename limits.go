package disker

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/pool"
)

// WithGlobalConcurrency limits how many messages of the receiver are
// handled at once across every instance that serves it to n (n >= 1); it
// generalises WithExclusive, which is one instance at a time, to n
// messages at a time. Give every instance that serves the receiver the
// same n.
//
// The promise: never more than n handlers of the receiver run at once,
// except that a handler whose instance stalled or was cut off from the
// broker for longer than the lease may run on beside the slot's next
// holder until it ends, as a handler whose message lease lapsed runs on
// beside the message's next delivery.
//
// Each instance holds slots in the broker under a lease (the receiver's
// WithLease) and takes them before it fetches, so it never fetches a
// message it may not start. The lease keeper renews them with the
// deliveries' leases; the slots of an instance that died come back when
// its lease runs out, on the broker's clock. A handler starts only on a
// slot the broker still counts for its instance: by the local clock, within
// the lease of the last call that found the slots held (a call past it
// renews them first, and asks the broker whether it still counts them). A
// fetched message whose slot lapsed meanwhile (a prefetched one, after a
// stall) is given back without starting and without counting an attempt.
// An instance that learns that its slots lapsed reports EventSlotsLapsed.
// An instance that finds every slot taken looks again after a delay that
// doubles up to Config.ReceiverBlockTimeout (or when one of its own
// handlers ends).
//
// The slots are not shared out evenly: a slot stays with its instance
// while it keeps finding messages, and is given back only when a fetch
// finds fewer messages than it had slots for. Under a steady backlog the
// instances that took the slots first keep them, and the others wait: an
// instance whose WithConcurrency (plus WithPrefetch) is n or more may
// handle every message while the others handle none. An instance never
// holds more slots than messages it may hold at once (WithConcurrency plus
// WithPrefetch; for HandleBatch, WithConcurrency times WithBatchSize plus
// WithPrefetch), so to spread the messages over the instances, give each
// less than n: with n = 5 on three instances, WithConcurrency(2) runs 2, 2
// and 1 at once.
func WithGlobalConcurrency(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 1 {
			o.setErr(invalid("WithGlobalConcurrency", "must be >= 1, got %d", n))
		}
		o.globalConcurrency = n
	}
}

// WithRateLimit limits how many messages of the receiver start per second
// across every instance that serves it: rate per second on average (> 0,
// may be fractional), with bursts of up to burst (>= 1) after a quiet
// spell. Give every instance that serves the receiver the same values.
//
// It is a token bucket in the broker, on the broker's clock. An instance
// takes a token for each message before it fetches it, so a message over
// the limit stays queued: it is not fetched, not retried, and uses no
// attempt. Tokens not used by a fetch are put back. A rate-limited
// receiver does not block in the broker waiting for messages: while its
// queue is empty it looks again after a delay that grows up to
// Config.ReceiverBlockTimeout.
func WithRateLimit(rate float64, burst int) HandleOption {
	return func(o *handleOptions) {
		switch {
		case !(rate > 0) || math.IsInf(rate, 1):
			o.setErr(invalid("WithRateLimit.rate", "must be > 0 and finite, got %v", rate))
		case burst < 1:
			o.setErr(invalid("WithRateLimit.burst", "must be >= 1, got %d", burst))
		}
		o.rate, o.burst = rate, burst
	}
}

// HandleWithPool serves receiver with fn run on a worker of p, a pool of
// stateful workers (connections, browsers, sessions): each message is
// handled inside p.Do, so the worker is returned, or retired when fn
// returns an error marked with pool.Broken.
//
// The pool sets the pace: the instance fetches only as many messages as
// p has workers ready (its size and overflow, less those busy or being
// made), and none while p is degraded (pool.ErrDegraded: its constructor
// keeps failing), resuming by itself when p recovers; meanwhile the
// messages wait in the queue for this or another instance. A message whose
// worker could not be had (a failed or degraded checkout), or whose worker
// fn reported broken, is given back at once for any instance without
// counting an attempt; other errors of fn count as usual. Once p is
// closed the instance fetches no more of receiver's messages (Unhandle it).
//
// opts are those of Handle. It returns what Handle returns, and a
// *ValidationError when p or fn is nil.
func HandleWithPool[W any](d *Disker, receiver string, p *pool.Pool[W], fn func(ctx context.Context, w W, msg *Message) ([]byte, error), opts ...HandleOption) error {
	if p == nil {
		return invalid("Pool", "must not be nil")
	}
	if fn == nil {
		return invalid("Handler", "must not be nil")
	}
	var closed atomic.Bool
	h := HandlerFunc(func(ctx context.Context, msg *Message) ([]byte, error) {
		var resp []byte
		ran := false
		err := p.Do(ctx, func(ctx context.Context, w W) error {
			ran = true
			var err error
			resp, err = fn(ctx, w, msg)
			return err
		})
		if !ran && errors.Is(err, pool.ErrClosed) && !closed.Swap(true) {
			d.log.Warn("disker: the pool of a receiver is closed; this instance fetches no more of its messages", "receiver", receiver)
		}
		switch {
		case err == nil:
			return resp, nil
		case !ran && ctx.Err() == nil, pool.IsBroken(err):
			// Not the message's fault: no worker, or a broken one.
			return nil, &givenBack{err}
		}
		return resp, err
	})
	ready := func(inFlight int) int {
		s := p.Stats()
		if s.Degraded || closed.Load() {
			return 0
		}
		return s.Size + s.MaxOverflow - max(s.Busy+s.Starting, inFlight)
	}
	return d.Handle(receiver, h, append(opts, func(o *handleOptions) { o.ready = ready })...)
}

// errSlotLapsed is why a delivery is given back without starting: the
// global concurrency slot it was fetched under is no longer this
// instance's (its lease ran out), or could not be renewed.
var errSlotLapsed = errors.New("disker: its global concurrency slot lapsed before it started")

// givenBack is a handler's error that gives the message back at once
// without counting an attempt (HandleWithPool).
type givenBack struct{ err error }

func (e *givenBack) Error() string { return "disker: given back: " + e.err.Error() }
func (e *givenBack) Unwrap() error { return e.err }

func isGivenBack(err error) bool {
	var g *givenBack
	return errors.As(err, &g)
}

// Waits of a gated fetch loop (WithGlobalConcurrency, WithRateLimit,
// HandleWithPool).
// The first look again after finding nothing; the waits double from it up
// to Config.ReceiverBlockTimeout while nothing is found.
const gatePoll = 10 * time.Millisecond

// limiter is a consumer's share of its receiver's cluster-wide limits.
type limiter struct {
	c    *consumer
	mu   sync.Mutex // serialises Slots calls, and guards held, running and until
	held int        // global concurrency slots held
	// running is how many of the held slots handlers run on (start, end).
	running int
	// until is, by the local monotonic clock, the earliest the lease of the
	// held slots may end: a lease from the broker's time when it ran the
	// last call that found them held, which is no earlier than when that
	// call was sent.
	until time.Time
	sp    broker.SlotsParams
	tp    broker.TokensParams
	idle  time.Duration // the wait after the last empty non-blocking fetch
	full  time.Duration // the wait after the last look that found every slot taken
}

func (c *consumer) gated() bool {
	return c.o.globalConcurrency > 0 || c.o.rate > 0 || c.o.ready != nil
}

func newLimiter(c *consumer) *limiter {
	return &limiter{
		c:  c,
		sp: broker.SlotsParams{Receiver: c.name, Holder: c.d.id, Limit: c.o.globalConcurrency, Lease: c.o.lease},
		tp: broker.TokensParams{Receiver: c.name, Rate: c.o.rate, Burst: c.o.burst},
	}
}

// slots changes the slots held by delta (under l.mu) and returns how many
// are held. A call that finds that the broker no longer counted the slots
// held (their lease ran out before it) reports it: in the log and as
// EventSlotsLapsed.
func (l *limiter) slots(ctx context.Context, delta int) (int, error) {
	l.sp.Delta = delta
	sent := time.Now()
	n, had, err := l.c.d.b.Slots(ctx, &l.sp)
	if err != nil {
		return l.held, err
	}
	if had < l.held {
		l.lapsed(had, n)
	}
	l.held = n
	if n > 0 {
		l.until = sent.Add(l.sp.Lease)
	}
	return n, nil
}

// lapsed reports that the broker no longer counted the slots held: their
// lease ran out at l.until at the earliest, and now, after the call that
// found it, at the latest.
func (l *limiter) lapsed(had, n int) {
	c := l.c
	since := max(time.Since(l.until), 0)
	c.d.log.Warn("disker: global concurrency slots lost (their lease ran out); the handlers still running run beside their next holders",
		"receiver", c.name, "held", l.held, "had", had, "now", n, "running", l.running, "lapsed_within", since)
	if c.d.onEvent != nil {
		c.d.emit(Event{Kind: EventSlotsLapsed, Receiver: c.name, Duration: since})
	}
}

// start reports whether a handler may start on k of the slots held, and
// counts them as run on until end: only on slots whose lease the broker
// still counts for this instance, by the local clock against the lease
// of the last call that found them held. Past that (the lease keeper
// stalled or could not reach the broker), it renews them first, in one
// call, which tells whether the broker still counts them. A limiter
// without global concurrency always allows.
func (l *limiter) start(ctx context.Context, k int) bool {
	if l.c.o.globalConcurrency == 0 {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held > 0 && !time.Now().Before(l.until) {
		if _, err := l.slots(ctx, 0); err != nil {
			l.c.d.health.fail("renew slots", err)
			return false
		}
	}
	if l.running+k > l.held || !time.Now().Before(l.until) {
		return false
	}
	l.running += k
	return true
}

// end ends what start counted.
func (l *limiter) end(k int) {
	if l.c.o.globalConcurrency == 0 {
		return
	}
	l.mu.Lock()
	l.running -= k
	l.mu.Unlock()
}

// gate returns how many messages the fetch loop may fetch now, at most
// free, and the block of that fetch; 0 with the time to wait before asking
// again, and whether a freed handler slot should end that wait (it does
// for a global slot or a pool worker, not for a token).
func (l *limiter) gate(ctx context.Context, free int) (n int, block, wait time.Duration, onFree bool, err error) {
	c := l.c
	inFlight := int(c.n.Load())
	block = c.d.cfg.ReceiverBlockTimeout
	if c.o.ready != nil {
		if free = min(free, c.o.ready(inFlight)); free <= 0 {
			return 0, 0, 5 * gatePoll, true, nil
		}
	}
	if c.o.globalConcurrency > 0 {
		l.mu.Lock()
		if need := inFlight + free - l.held; need > 0 && l.held < c.o.globalConcurrency {
			_, err = l.slots(ctx, need)
		}
		free = min(free, l.held-inFlight)
		l.mu.Unlock()
		if err != nil {
			return 0, 0, 0, false, err
		}
		if free <= 0 {
			l.full = min(max(2*l.full, gatePoll), c.d.cfg.ReceiverBlockTimeout)
			return 0, 0, l.full, true, nil
		}
		l.full = 0
	}
	if c.o.rate > 0 {
		l.tp.Want = free
		took, w, err := c.d.b.TakeTokens(ctx, &l.tp)
		if err != nil {
			return 0, 0, 0, false, err
		}
		if took == 0 {
			return 0, 0, w, false, nil
		}
		free, block = took, 0
	}
	return free, block, 0, false, nil
}

// ungate gives back what a fetch of asked messages that got got did not
// use: tokens at once, and slots beyond the messages held.
func (l *limiter) ungate(ctx context.Context, asked, got int) {
	c := l.c
	unused := asked - got
	if unused <= 0 {
		l.idle = 0
		return
	}
	if c.o.rate > 0 {
		l.tp.Want = -unused
		if _, _, err := c.d.b.TakeTokens(ctx, &l.tp); err != nil {
			c.d.health.fail("put back tokens", err)
		}
	}
	if c.o.globalConcurrency > 0 {
		l.mu.Lock()
		// The got messages are not dispatched yet: they are not in c.n.
		if spare := l.held - int(c.n.Load()) - got; spare > 0 {
			if _, err := l.slots(ctx, -spare); err != nil {
				c.d.health.fail("give back slots", err)
			}
		}
		l.mu.Unlock()
	}
}

// idleWait is how long to wait after a non-blocking fetch found nothing:
// gatePoll, doubling up to Config.ReceiverBlockTimeout while it keeps
// finding nothing.
func (l *limiter) idleWait() time.Duration {
	l.idle = min(max(2*l.idle, gatePoll), l.c.d.cfg.ReceiverBlockTimeout)
	return l.idle
}

// renew renews the lease of the slots held (the lease keeper calls it).
func (l *limiter) renew(ctx context.Context) {
	if l.c.o.globalConcurrency == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held == 0 {
		return
	}
	if _, err := l.slots(ctx, 0); err != nil {
		l.c.d.health.fail("renew slots", err)
	}
}

// releaseAll gives back every slot held (when the consumer stops): all
// that the broker counts for this holder, not only l.held, which misses
// slots taken by a call whose answer was lost (a fetch cancelled by the
// stop while its gate's call was in flight). The broker gives back no
// more than the holder holds.
func (l *limiter) releaseAll(ctx context.Context) {
	if l.c.o.globalConcurrency == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.slots(ctx, -l.c.o.globalConcurrency); err != nil {
		l.c.d.log.Warn("disker: cannot give back the global concurrency slots; they come back after their lease", "receiver", l.c.name, "error", err)
	}
}

// heldSlots is how many slots the consumer holds now.
func (l *limiter) heldSlots() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held
}

// sleep waits for d or for the loop's end, and with onFree also for a
// freed handler slot (which frees a global slot or a pool worker, but
// brings no token).
func (c *consumer) sleep(d time.Duration, onFree bool) {
	d = min(max(d, time.Millisecond), c.d.cfg.ReceiverBlockTimeout)
	t := time.NewTimer(d)
	defer t.Stop()
	var freed <-chan struct{}
	if onFree {
		freed = c.freedSignal()
	}
	select {
	case <-t.C:
	case <-freed:
	case <-c.fetchCtx.Done():
	}
}
