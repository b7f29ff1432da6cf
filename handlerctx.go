package disker

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// handlerCtx is a handler's context: its consumer's hardCtx, with the
// delivery's deadline (if any), cancelled with a cause when its task ends
// or is lost (cancel). It makes the contexts that carry that out, a
// context.WithCancelCause of the parent and a context.WithDeadline of
// that, only once something asks for what needs them: Done, or the
// context package's own lookup of a cancelable parent (Value of
// cancelCtxKey: context.Cause, a context derived from this one). A
// handler that never looks costs no allocation and no timer; one that
// does gets the same contexts, in the same states, as if they had been
// made at the start. It is held in its task (one allocation for both).
type handlerCtx struct {
	parent   context.Context // the consumer's hardCtx
	deadline time.Time       // zero for none
	made     atomic.Pointer[madeCtx]
	mu       sync.Mutex // guards cause, deadlineFirst and the making of made
	// cause is what cancel gave, until made; deadlineFirst is set when the
	// deadline had passed by then (the handler's context ended with it
	// first).
	cause         error
	deadlineFirst bool
}

// madeCtx is what a handlerCtx made: outer, the cancelable context whose
// cause cancel sets, and inner, the handler's (outer with the deadline).
type madeCtx struct {
	outer, inner context.Context
	cancel       context.CancelCauseFunc
	stop         context.CancelFunc // the deadline's timer; nil for none
}

// init sets the parent and the deadline of a handlerCtx not in use yet.
func (h *handlerCtx) init(parent context.Context, deadline time.Time) {
	h.parent, h.deadline = parent, deadline
}

// Deadline is the delivery's deadline, or the parent's.
func (h *handlerCtx) Deadline() (time.Time, bool) {
	if !h.deadline.IsZero() {
		return h.deadline, true
	}
	return h.parent.Deadline()
}

// Done makes the contexts (see handlerCtx) and returns the handler's Done.
func (h *handlerCtx) Done() <-chan struct{} { return h.make().inner.Done() }

// Err is what the handler's context's Err would be, without making it.
func (h *handlerCtx) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.made.Load(); m != nil {
		return m.inner.Err()
	}
	switch {
	case h.cause != nil && h.deadlineFirst:
		return context.DeadlineExceeded
	case h.cause != nil:
		return context.Canceled
	case h.parent.Err() != nil:
		return h.parent.Err()
	case h.passed():
		return context.DeadlineExceeded
	}
	return nil
}

// Value answers the context package's lookup of a cancelable parent from
// the contexts it makes, and every other key from the parent.
func (h *handlerCtx) Value(key any) any {
	if key == cancelCtxKey || cancelCtxKey == nil {
		return h.make().inner.Value(key)
	}
	return h.parent.Value(key)
}

// passed reports whether the deadline passed.
func (h *handlerCtx) passed() bool {
	return !h.deadline.IsZero() && !time.Now().Before(h.deadline)
}

// make makes the contexts, once, in the state the handler's context
// would be in had they been made at the start, and returns them.
func (h *handlerCtx) make() *madeCtx {
	if m := h.made.Load(); m != nil {
		return m
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.made.Load(); m != nil {
		return m
	}
	m := &madeCtx{}
	m.outer, m.cancel = context.WithCancelCause(h.parent)
	if h.cause != nil && !h.deadlineFirst {
		m.cancel(h.cause) // before the deadline: the inner one ends cancelled
	}
	m.inner = m.outer
	if !h.deadline.IsZero() {
		m.inner, m.stop = context.WithDeadline(m.outer, h.deadline)
	}
	if h.deadlineFirst {
		m.cancel(h.cause) // after: the inner one ended by its deadline
	}
	h.made.Store(m)
	return m
}

// cancel ends the context with cause (nil: the task ended), and releases
// what it made. The first cause is kept, and the parent's when it ended
// first.
func (h *handlerCtx) cancel(cause error) {
	if cause == nil {
		cause = context.Canceled
	}
	h.mu.Lock()
	m := h.made.Load()
	if m == nil && h.cause == nil && h.parent.Err() == nil { // else ended by the parent first
		h.cause, h.deadlineFirst = cause, h.passed()
	}
	h.mu.Unlock()
	if m != nil {
		m.cancel(cause)
		if m.stop != nil {
			m.stop()
		}
	}
}

// causeOf is context.Cause of the context cancel ends (the outer one):
// the first cause given to cancel, or the parent's, or nil.
func (h *handlerCtx) causeOf() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m := h.made.Load(); m != nil {
		return context.Cause(m.outer)
	}
	if h.cause != nil {
		return h.cause
	}
	return context.Cause(h.parent)
}

// cancelCtxKey is the key under which the context package looks up a
// context's cancelable parent (context.Cause, and a context derived from
// this one, both call Value with it). The package does not export it:
// it is learnt from a context.Cause of a probe. Should that change, nil
// makes handlerCtx answer every Value from the contexts it makes.
var cancelCtxKey = func() any {
	p := &keyProbe{Context: context.Background()}
	_ = context.Cause(p)
	return p.key
}()

// keyProbe records the key of its one Value call. It is cancelled:
// context.Cause asks a context that is not for nothing.
type keyProbe struct {
	context.Context
	key any
}

func (p *keyProbe) Err() error { return context.Canceled }

func (p *keyProbe) Value(key any) any {
	p.key = key
	return nil
}
