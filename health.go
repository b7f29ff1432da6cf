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
