package pool_test

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/diskerhq/disker/pool"
)

// New makes a pool of Size workers, made by New and closed by Close.
func ExampleNew() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Name: "db", Size: 2, New: d.dial})
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	fmt.Println(p.Stats().Size)
	// Output: 2
}

// Close closes the idle workers and waits for the leased ones to come back.
func ExamplePool_Close() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Name: "db", Size: 1, New: d.dial,
		Close: func(c *conn) error { fmt.Println("closed conn", c.id); return nil }})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	_ = p.Do(ctx, func(context.Context, *conn) error { return nil })
	fmt.Println("close:", p.Close(ctx))
	// Output:
	// closed conn 1
	// close: <nil>
}

// Resize changes the number of permanent workers.
func ExamplePool_Resize() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial})
	if err != nil {
		panic(err)
	}
	defer p.Close(context.Background())
	fmt.Println(p.Resize(3), p.Stats().Size)
	// Output: <nil> 3
}

// Stats is a snapshot of the pool's counters.
func ExamplePool_Stats() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 2, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)
	l, err := p.Checkout(ctx)
	if err != nil {
		panic(err)
	}
	s := p.Stats()
	fmt.Printf("busy %d, checkouts %d\n", s.Busy, s.Checkouts)
	l.Release()
	// Output: busy 1, checkouts 1
}

// TryCheckout leases a worker only if one is free now.
func ExamplePool_TryCheckout() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)
	_ = p.Do(ctx, func(context.Context, *conn) error { return nil }) // makes the worker
	l, err := p.TryCheckout(ctx)
	fmt.Println(err)
	_, err = p.TryCheckout(ctx)
	fmt.Println(errors.Is(err, pool.ErrNoWorker))
	l.Release()
	// Output:
	// <nil>
	// true
}

// Worker is the leased worker; Release gives it back.
func ExampleLease_Worker() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)
	l, err := p.Checkout(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("conn", l.Worker().id)
	fmt.Println(l.Release())
	// Output:
	// conn 1
	// <nil>
}

// Release gives the worker back for the next caller.
func ExampleLease_Release() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)
	l, _ := p.Checkout(ctx)
	fmt.Println(l.Release())
	fmt.Println(errors.Is(l.Release(), pool.ErrReleased))
	// Output:
	// <nil>
	// true
}

// Retire closes a broken worker instead of giving it back; the pool makes a
// new one.
func ExampleLease_Retire() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial,
		Close: func(c *conn) error { fmt.Println("closed conn", c.id); return nil }})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	l, _ := p.Checkout(ctx)
	fmt.Println(l.Retire())
	l, _ = p.Checkout(ctx)
	fmt.Println("now conn", l.Worker().id)
	l.Release()
	p.Close(ctx)
	// Output:
	// closed conn 1
	// <nil>
	// now conn 2
	// closed conn 2
}

// Broken marks an error as meaning the worker is broken: Do retires it.
func ExampleBroken() {
	err := pool.Broken(io.ErrUnexpectedEOF)
	fmt.Println(err, pool.IsBroken(err), errors.Is(err, io.ErrUnexpectedEOF))
	// Output: unexpected EOF true true
}

// IsBroken reports whether an error was marked with Broken.
func ExampleIsBroken() {
	fmt.Println(pool.IsBroken(io.EOF), pool.IsBroken(fmt.Errorf("query: %w", pool.Broken(io.EOF))))
	// Output: false true
}

// Strategy says which idle worker is reused first.
func ExampleStrategy_String() {
	fmt.Println(pool.LIFO, pool.FIFO)
	// Output: LIFO FIFO
}

// NewExecutor makes an executor of up to MaxWorkers goroutines.
func ExampleNewExecutor() {
	e, err := pool.NewExecutor(pool.ExecutorConfig{Name: "resize", MaxWorkers: 4})
	if err != nil {
		panic(err)
	}
	fmt.Println(e.Close(context.Background()))
	// Output: <nil>
}

// Submit runs a task, waiting for room while MaxWorkers tasks run.
func ExampleExecutor_Submit() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		panic(err)
	}
	ran := make(chan string, 1)
	err = e.Submit(ctx, func() { ran <- "task ran" })
	fmt.Println(err)
	fmt.Println(<-ran) // the task runs on a worker: the example waits for it
	e.Close(ctx)
	// Output:
	// <nil>
	// task ran
}

// Close stops taking tasks and waits for the accepted ones.
func ExampleExecutor_Close() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	_ = e.Submit(ctx, func() { fmt.Println("drained") })
	fmt.Println(e.Close(ctx))
	fmt.Println(errors.Is(e.Submit(ctx, func() {}), pool.ErrClosed))
	// Output:
	// drained
	// <nil>
	// true
}

// Stats counts the executor's tasks.
func ExampleExecutor_Stats() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	_ = e.Submit(ctx, func() {})
	e.Close(ctx)
	s := e.Stats()
	fmt.Println(s.Submitted, s.Completed)
	// Output: 1 1
}

// Done is closed when the task has finished; Wait returns its result.
func ExampleFuture_Done() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	f, err := pool.Go(ctx, e, func() (int, error) { return 42, nil })
	if err != nil {
		panic(err)
	}
	<-f.Done()
	fmt.Println(f.Wait(ctx))
	// Output: 42 <nil>
}

// Wait waits for the task's result, or for ctx to end.
func ExampleFuture_Wait() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	f, _ := pool.Go(ctx, e, func() (string, error) { return "", errors.New("no such file") })
	_, err = f.Wait(ctx)
	fmt.Println(err)
	// Output: no such file
}

// NewGroup returns a group and its context, cancelled on the first error.
func ExampleNewGroup() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 2})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	g, gctx := pool.NewGroup[string](ctx, e)
	g.Go(func(context.Context) (string, error) { return "a", nil })
	fmt.Println(g.Wait())
	fmt.Println(gctx.Err() != nil) // the group's context ends with Wait
	// Output:
	// [a] <nil>
	// true
}

// Go adds a task to the group, waiting for room in the executor.
func ExampleGroup_Go() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 2})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	g, _ := pool.NewGroup[int](ctx, e)
	for i := range 3 {
		if err := g.Go(func(context.Context) (int, error) { return i * i, nil }); err != nil {
			panic(err)
		}
	}
	fmt.Println(g.Wait())
	// Output: [0 1 4] <nil>
}

// TryGo adds a task only if the executor has room now; otherwise the caller
// does the work itself.
func ExampleGroup_TryGo() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	release := make(chan struct{})
	g, _ := pool.NewGroup[string](ctx, e)
	g.Go(func(context.Context) (string, error) { <-release; return "first", nil })
	err = g.TryGo(func(context.Context) (string, error) { return "second", nil })
	fmt.Println(errors.Is(err, pool.ErrFull))
	close(release)
	fmt.Println(g.Wait())
	// Output:
	// true
	// [first] <nil>
}

// Wait waits for the group's tasks and returns their results in the order
// of the calls to Go, or the first error.
func ExampleGroup_Wait() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	g, _ := pool.NewGroup[string](ctx, e)
	g.Go(func(context.Context) (string, error) { return "x", nil })
	g.Go(func(context.Context) (string, error) { return "", errors.New("y failed") })
	_, err = g.Wait()
	fmt.Println(err)
	// Output: y failed
}

// NewPanicError turns a recovered panic into an error.
func ExampleNewPanicError() {
	err := func() (err error) {
		defer func() {
			if v := recover(); v != nil {
				err = pool.NewPanicError(v)
			}
		}()
		panic(io.ErrClosedPipe)
	}()
	var pe *pool.PanicError
	fmt.Println(errors.As(err, &pe), pe.Value)
	// Output: true io: read/write on closed pipe
}

// Error gives the panic value and the stack.
func ExamplePanicError_Error() {
	err := pool.NewPanicError("boom")
	fmt.Println(err.Error()[:17])
	// Output: pool: panic: boom
}

// Unwrap lets errors.Is see the panic value when it is an error.
func ExamplePanicError_Unwrap() {
	err := pool.NewPanicError(io.EOF)
	fmt.Println(errors.Is(err, io.EOF), err.Unwrap() == io.EOF)
	// Output: true true
}
