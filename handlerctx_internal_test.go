package disker

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// ctxKey is a key of a value the parent of a handlerCtx carries.
type ctxKey struct{}

// newHandlerCtx returns a handlerCtx of a cancelable parent that carries
// a value, and the parent's cancel.
func newHandlerCtx(t *testing.T, deadline time.Time) (*handlerCtx, context.CancelCauseFunc) {
	t.Helper()
	parent, cancel := context.WithCancelCause(context.WithValue(context.Background(), ctxKey{}, "v"))
	t.Cleanup(func() { cancel(nil) })
	h := &handlerCtx{}
	h.init(parent, deadline)
	return h, cancel
}

// isDone reports whether ch is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// The context package's key of a cancelable parent is learnt: without it
// every Value call would make the contexts.
func TestCancelCtxKeyLearnt(t *testing.T) {
	if cancelCtxKey == nil {
		t.Fatal("cancelCtxKey is nil: context.Cause no longer asks Value for it")
	}
}

// A handler's context answers as the contexts it stands for would,
// whether it made them before it was cancelled, after, or never.
func TestHandlerCtxStates(t *testing.T) {
	for _, look := range []string{"before", "after", "never"} {
		t.Run("made "+look, func(t *testing.T) {
			h, _ := newHandlerCtx(t, time.Now().Add(time.Hour))
			if look == "before" {
				if isDone(h.Done()) {
					t.Fatal("Done closed before the cancel")
				}
			}
			if h.Err() != nil || h.causeOf() != nil {
				t.Fatalf("before the cancel: Err %v, cause %v", h.Err(), h.causeOf())
			}
			if dl, ok := h.Deadline(); !ok || time.Until(dl) < 59*time.Minute {
				t.Fatalf("Deadline = %v, %v", dl, ok)
			}
			if h.Value(ctxKey{}) != "v" {
				t.Fatalf("Value of the parent's key = %v", h.Value(ctxKey{}))
			}
			h.cancel(broker.ErrLeaseLost)
			h.cancel(ErrCancelled) // the first cause stays
			if look == "after" && !isDone(h.Done()) {
				t.Fatal("Done not closed after the cancel")
			}
			if !errors.Is(h.Err(), context.Canceled) || h.causeOf() != broker.ErrLeaseLost {
				t.Fatalf("after the cancel: Err %v, cause %v; want Canceled, ErrLeaseLost", h.Err(), h.causeOf())
			}
			if look == "never" {
				if h.made.Load() != nil {
					t.Fatal("Err, Deadline, Value of another key and causeOf made the contexts")
				}
				return
			}
			if got := context.Cause(h); got != broker.ErrLeaseLost {
				t.Fatalf("context.Cause = %v, want ErrLeaseLost", got)
			}
		})
	}
}

// A context derived from a handler's ends with it, with its cause.
func TestHandlerCtxDerived(t *testing.T) {
	h, _ := newHandlerCtx(t, time.Time{})
	child, cancel := context.WithTimeout(h, time.Hour)
	defer cancel()
	if child.Value(ctxKey{}) != "v" {
		t.Fatal("the derived context lost the parent's value")
	}
	h.cancel(broker.ErrLeaseLost)
	select {
	case <-child.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the derived context did not end with the handler's")
	}
	if got := context.Cause(child); got != broker.ErrLeaseLost {
		t.Fatalf("context.Cause of the derived context = %v, want ErrLeaseLost", got)
	}
}

// A deadline that passed before the cancel ends the handler's context
// first (DeadlineExceeded), as a timer would have, while the cause of the
// cancel is the task's.
func TestHandlerCtxDeadlineFirst(t *testing.T) {
	for _, lookFirst := range []bool{false, true} {
		h, _ := newHandlerCtx(t, time.Now().Add(20*time.Millisecond))
		if lookFirst {
			h.Done()
		}
		time.Sleep(40 * time.Millisecond)
		if !errors.Is(h.Err(), context.DeadlineExceeded) {
			t.Fatalf("after the deadline (made %v): Err = %v", lookFirst, h.Err())
		}
		h.cancel(broker.ErrLeaseLost)
		if !isDone(h.Done()) || !errors.Is(h.Err(), context.DeadlineExceeded) || context.Cause(h) != context.DeadlineExceeded {
			t.Fatalf("made %v: Err %v, Cause %v; want DeadlineExceeded for both", lookFirst, h.Err(), context.Cause(h))
		}
		if h.causeOf() != broker.ErrLeaseLost {
			t.Fatalf("made %v: causeOf = %v, want ErrLeaseLost", lookFirst, h.causeOf())
		}
	}
}

// A parent that ended first keeps its cause: a later cancel does not
// replace it.
func TestHandlerCtxParentFirst(t *testing.T) {
	for _, lookFirst := range []bool{false, true} {
		h, stop := newHandlerCtx(t, time.Time{})
		if lookFirst {
			h.Done()
		}
		stop(errStopped)
		h.cancel(broker.ErrLeaseLost)
		if !errors.Is(h.Err(), context.Canceled) || h.causeOf() != errStopped || context.Cause(h) != errStopped {
			t.Fatalf("made %v: Err %v, causeOf %v, Cause %v; want Canceled, errStopped", lookFirst, h.Err(), h.causeOf(), context.Cause(h))
		}
	}
}

// A handler that never looks at its context costs no allocation for it.
func TestHandlerCtxUnlookedAllocatesNothing(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	deadline := time.Now().Add(time.Hour)
	var h handlerCtx
	allocs := testing.AllocsPerRun(100, func() {
		h = handlerCtx{}
		h.init(parent, deadline)
		_ = h.Err()
		_, _ = h.Deadline()
		_ = h.causeOf()
		h.cancel(nil)
	})
	if allocs != 0 {
		t.Fatalf("allocations = %v, want 0", allocs)
	}
}
