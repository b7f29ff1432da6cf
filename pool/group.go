package pool

import (
	"context"
	"errors"
	"sync"
)

// Group runs a set of tasks on an [Executor] and waits for them all. Results
// come back in the order the tasks were given to Go. The first error, from a
// task or from Go itself, cancels the group's context, so that the other
// tasks can stop early; tasks that have not started by then are not run.
//
// A Group is used once: call Go any number of times, then Wait once. Go must
// not be called once Wait has returned; it may be called while Wait waits
// only by the group's own tasks.
type Group[T any] struct {
	e      *Executor
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	tasks []*groupTask[T]
	err   error
}

// groupTask is one task of a Group, and holds its result.
type groupTask[T any] struct {
	g   *Group[T]
	fn  func(ctx context.Context) (T, error)
	val T
}

// NewGroup returns a Group that runs its tasks on e, and the group's context,
// derived from ctx. The group's context is cancelled, with the error as its
// cause, when a task or Go fails, and when Wait returns.
func NewGroup[T any](ctx context.Context, e *Executor) (*Group[T], context.Context) {
	gctx, cancel := context.WithCancelCause(ctx)
	return &Group[T]{e: e, ctx: gctx, cancel: cancel}, gctx
}

// Go runs fn on the group's executor, with the group's context. It waits for
// room like [Executor.Submit] does, with the group's context. When fn is not
// accepted, Go returns the reason (the group's context's error, or one that
// wraps ErrClosed) and records it as the group's error, as if fn had returned
// it; fn's place in the results stays the zero T.
//
// If fn panics, its error is a [*PanicError] with the panic value and the
// stack; the executor's PanicHandler is not called.
func (g *Group[T]) Go(fn func(ctx context.Context) (T, error)) error {
	if fn == nil {
		g.fail(errNilTask)
		return errNilTask
	}
	t := &groupTask[T]{g: g, fn: fn}
	g.mu.Lock()
	g.tasks = append(g.tasks, t)
	g.mu.Unlock()
	g.wg.Add(1)
	if err := g.e.submit(g.ctx, t); err != nil {
		t.fn = nil
		g.fail(err)
		g.wg.Done()
		return err
	}
	return nil
}

// TryGo runs fn on the group's executor if there is room now, as
// [Executor.TrySubmit] does; it never waits. Without room it returns an error
// that wraps ErrFull and fn is not part of the group (no place in the
// results, no error recorded), so a task of the group can run the work
// itself instead of waiting for its own full executor. Any other failure is
// returned and recorded as [Group.Go] records it. The results of tasks given
// to TryGo come back in the order they were accepted.
func (g *Group[T]) TryGo(fn func(ctx context.Context) (T, error)) error {
	if fn == nil {
		g.fail(errNilTask)
		return errNilTask
	}
	if err := g.ctx.Err(); err != nil {
		g.fail(err)
		return err
	}
	t := &groupTask[T]{g: g, fn: fn}
	g.wg.Add(1)
	if err := g.e.tryAdmit(t); err != nil {
		g.wg.Done()
		if !errors.Is(err, ErrFull) {
			g.fail(err)
		}
		return err
	}
	g.mu.Lock()
	g.tasks = append(g.tasks, t)
	g.mu.Unlock()
	return nil
}

func (t *groupTask[T]) run(e *Executor) {
	g := t.g
	returned := false
	defer func() {
		if !returned {
			if v := recover(); v != nil {
				e.panicked.Add(1)
				g.fail(NewPanicError(v))
			} else {
				g.fail(errTaskGoexit)
			}
		}
		t.fn = nil
		g.wg.Done()
	}()
	if err := g.ctx.Err(); err != nil {
		// The group failed or its parent context ended before this task
		// started: do not start it.
		g.fail(err)
		returned = true
		return
	}
	v, err := t.fn(g.ctx)
	t.val = v
	if err != nil {
		g.fail(err)
	}
	returned = true
}

// fail records err as the group's error if it is the first, and cancels the
// group's context.
func (g *Group[T]) fail(err error) {
	g.mu.Lock()
	first := g.err == nil
	if first {
		g.err = err
	}
	g.mu.Unlock()
	if first {
		g.cancel(err)
	}
}

// Wait waits for every task given to Go and returns their results, in the
// order of the calls to Go, and the group's first error. On error the results
// of the tasks that failed or did not run are the zero T. Wait cancels the
// group's context before it returns.
func (g *Group[T]) Wait() ([]T, error) {
	g.wg.Wait()
	g.cancel(nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	res := make([]T, len(g.tasks))
	for i, t := range g.tasks {
		res[i] = t.val
	}
	return res, g.err
}
