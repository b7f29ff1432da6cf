package pool

import "context"

// Future is the result of one task started by [Go]: a value and an error,
// available once the task has finished.
type Future[T any] struct {
	fn   func() (T, error)
	val  T
	err  error
	done chan struct{}
}

// Go runs fn on e and returns a Future for its result. It waits for room like
// [Executor.Submit] and returns its error when fn was not accepted (ctx's
// error, or one that wraps ErrClosed).
//
// If fn panics, the future's error is a [*PanicError] with the panic value and
// the stack; e's PanicHandler is not called.
func Go[T any](ctx context.Context, e *Executor, fn func() (T, error)) (*Future[T], error) {
	if fn == nil {
		return nil, errNilTask
	}
	f := &Future[T]{fn: fn, done: make(chan struct{})}
	if err := e.submit(ctx, f); err != nil {
		return nil, err
	}
	return f, nil
}

func (f *Future[T]) run(e *Executor) {
	returned := false
	defer func() {
		if !returned {
			if v := recover(); v != nil {
				e.panicked.Add(1)
				f.err = NewPanicError(v)
			} else {
				f.err = errTaskGoexit
			}
		}
		f.fn = nil
		close(f.done)
	}()
	f.val, f.err = f.fn()
	returned = true
}

// Wait waits until the task has finished and returns its result, or until ctx
// ends and returns the zero T and ctx.Err(). The task goes on after a Wait
// that gave up, and Wait may be called again, from any goroutine.
func (f *Future[T]) Wait(ctx context.Context) (T, error) {
	select {
	case <-f.done:
		return f.val, f.err
	default:
	}
	select {
	case <-f.done:
		return f.val, f.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// Done returns a channel that is closed when the task has finished; Wait then
// returns at once.
func (f *Future[T]) Done() <-chan struct{} {
	return f.done
}
