package pool

import (
	"context"
	"sync/atomic"
)

// Do runs fn with a worker in a transaction: it checks a worker out (as
// Checkout does), calls fn with ctx and the worker, and always ends the
// lease. It returns fn's error, or the checkout's.
//
// The worker goes back to the pool when fn returns, unless:
//   - fn panics: the panic is recovered and returned as a [*PanicError]
//     carrying the value and the stack;
//   - fn returns an error marked with [Broken]: Do returns that error;
//   - ctx ends while fn is still running: Do returns ctx.Err() at once,
//     and fn keeps its worker until it returns (it should watch ctx).
//
// In each of these cases the worker is retired, and a replacement is made in
// the background: a retired worker never goes back to the idle set, and an
// abandoned one is retired only once fn has returned, so it is never used by
// two callers at a time. Close waits for abandoned calls like it waits for
// any lease.
//
// When ctx can be cancelled, fn runs on a goroutine of its own so that Do
// can return when ctx ends; otherwise it runs on the caller's goroutine.
func (p *Pool[W]) Do(ctx context.Context, fn func(ctx context.Context, w W) error) error {
	l, err := p.Checkout(ctx)
	if err != nil {
		return err
	}
	if ctx.Done() == nil {
		return p.runInline(ctx, l, fn)
	}
	c := &doCall{done: make(chan struct{})}
	p.wg.Add(1)
	go p.runAsync(ctx, l, fn, c)
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		if c.state.CompareAndSwap(doRunning, doAbandoned) {
			return ctx.Err()
		}
		<-c.done
		return c.err
	}
}

// runInline runs fn on the caller's goroutine and ends the lease, also when
// fn panics or calls runtime.Goexit.
func (p *Pool[W]) runInline(ctx context.Context, l Lease[W], fn func(context.Context, W) error) (err error) {
	returned := false
	defer func() {
		if returned {
			return
		}
		if r := recover(); r != nil {
			err = NewPanicError(r)
		}
		p.endDo(l, true)
	}()
	err = fn(ctx, l.Worker())
	returned = true
	p.endDo(l, IsBroken(err))
	return err
}

// States of a doCall.
const (
	doRunning int32 = iota
	doFinished
	doAbandoned
)

// doCall is one Do whose fn runs on its own goroutine. Whichever of fn's
// return and the end of ctx comes first claims state; fn's goroutine always
// ends the lease.
type doCall struct {
	state atomic.Int32
	done  chan struct{}
	err   error
}

func (p *Pool[W]) runAsync(ctx context.Context, l Lease[W], fn func(context.Context, W) error, c *doCall) {
	defer p.wg.Done()
	var err error
	returned := false
	defer func() {
		if !returned {
			if r := recover(); r != nil {
				err = NewPanicError(r)
			} else {
				err = errDoGoexit
			}
		}
		if c.state.CompareAndSwap(doRunning, doFinished) {
			p.endDo(l, !returned || IsBroken(err))
			c.err = err
			close(c.done)
			return
		}
		// Do has returned ctx.Err(): the worker was in use past the
		// caller's deadline, so it is retired.
		if !returned {
			p.log.Warn("pool: abandoned transaction ended abnormally", "err", err)
		}
		p.endDo(l, true)
	}()
	err = fn(ctx, l.Worker())
	returned = true
}

// endDo releases or retires the lease of a transaction. Errors from
// closing the worker are logged, not returned: fn's outcome is what the
// caller of Do needs.
func (p *Pool[W]) endDo(l Lease[W], retire bool) {
	var err error
	if retire {
		err = l.Retire()
	} else {
		err = l.Release()
	}
	if err != nil {
		p.log.Warn("pool: ending a transaction's lease failed", "err", err)
	}
}
