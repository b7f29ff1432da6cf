package disker

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// health tracks whether the broker is reachable, so that an outage is
// logged (and evented) once when it starts and once when it ends, not on
// every failed call.
type health struct {
	d    *Disker
	down atomic.Bool
	mu   sync.Mutex
}

// fail records a failed broker call. Errors other than unavailability are
// logged as they come.
func (h *health) fail(op string, err error) {
	if !errors.Is(err, broker.ErrUnavailable) {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, broker.ErrClosed) {
			h.d.log.Warn("disker: broker call failed", "op", op, "error", err)
		}
		return
	}
	if h.down.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down.Swap(true) {
		return
	}
	h.d.log.Error("disker: broker unavailable; retrying with backoff", "op", op, "error", err)
	h.d.emit(Event{Kind: EventUnavailable, Err: err})
}

// ok records a successful broker call.
func (h *health) ok() {
	if !h.down.Load() {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.down.Swap(false) {
		h.d.log.Info("disker: broker available again")
		h.d.emit(Event{Kind: EventAvailable})
	}
}

// wrapBroker gives a broker error the package prefix if it lacks one, and
// turns the broker's ErrClosed into ErrClosed.
func wrapBroker(op string, err error) error {
	if errors.Is(err, broker.ErrClosed) {
		return ErrClosed
	}
	if strings.HasPrefix(err.Error(), "disker: ") {
		return err
	}
	return &opError{op: op, err: err}
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return "disker: " + e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

// Backoff bounds for broker failures in loops.
const (
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = 5 * time.Second
)

// backoff is a capped exponential delay with jitter between attempts of a
// loop whose broker calls fail.
type backoff struct{ attempts int }

func (b *backoff) reset() { b.attempts = 0 }

// wait sleeps for the next delay, or until done is closed (then it returns
// false).
func (b *backoff) wait(done <-chan struct{}) bool {
	delay := maxRetryDelay
	if b.attempts < 10 {
		delay = min(delay, minRetryDelay<<b.attempts)
	}
	b.attempts++
	delay = delay/2 + rand.N(delay/2+1)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// clock converts broker times to local ones. The offset (broker minus local)
// is measured at New and at every heartbeat.
type clock struct {
	offset atomic.Int64 // nanoseconds
}

// sync measures the offset with one Now call, taking the middle of the
// round trip as the moment the broker read its clock.
func (c *clock) sync(ctx context.Context, b broker.Broker) error {
	t0 := time.Now()
	bt, err := b.Now(ctx)
	if err != nil {
		return err
	}
	rtt := time.Since(t0)
	c.offset.Store(int64(bt.Sub(t0.Add(rtt / 2))))
	return nil
}

// local turns a broker time into local time; the zero time stays zero.
func (c *clock) local(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(-time.Duration(c.offset.Load())).Local()
}
