package disker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

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

// call runs f, the broker I/O of the public operation op, with the steps
// every such operation takes around it, so that none has to write them by
// hand:
//
//   - after Close, it returns ErrClosed and does not call f;
//   - it records the broker's health from f's error (see record): an
//     outage is logged and evented once, and so is its end;
//   - it returns f's error as op's (see wrapBroker).
//
// f is one step of the operation as the broker sees it (one or a few
// calls); checks of the arguments come before call, and what the
// operation makes of f's result (its events and counters, which depend on
// the result) after it. The steps that run on behalf of work already under
// way, and so after Close too (a reply from a handler that Close drains, a
// Request settling), use record alone.
func call[T any](d *Disker, op string, f func() (T, error)) (T, error) {
	if d.closed.Load() {
		var zero T
		return zero, ErrClosed
	}
	v, err := f()
	return v, d.record(op, err)
}

// record is the bookkeeping of err, the outcome of a broker call of op: a
// success marks the broker reachable (health.ok), a failure is recorded
// (health.fail, which logs an outage once and ignores the ends of a
// context and the broker's closing) and returned as op's error (wrapBroker).
// An error by which the broker answers, not fails, the call (ErrLate: a
// reply too late; broker.ErrBadRef: no such dead letter) is returned as
// op's error too, and leaves the health as it is.
func (d *Disker) record(op string, err error) error {
	switch {
	case err == nil:
		d.health.ok()
		return nil
	case errors.Is(err, broker.ErrLate), errors.Is(err, broker.ErrBadRef), errors.Is(err, broker.ErrNoResult), errors.Is(err, broker.ErrResultFinal):
	default:
		d.health.fail(op, err)
	}
	return wrapBroker(op, err)
}
