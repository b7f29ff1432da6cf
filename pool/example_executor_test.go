package pool_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/diskerhq/disker/pool"
)

// An Executor runs tasks on a bounded set of workers; Close waits for them.
func ExampleExecutor() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{Name: "resize", MaxWorkers: 4})
	if err != nil {
		panic(err)
	}
	var done atomic.Int64
	for range 100 {
		// Submit waits while 4 tasks run.
		if err := e.Submit(ctx, func() { done.Add(1) }); err != nil {
			panic(err)
		}
	}
	if err := e.Close(ctx); err != nil { // drains every accepted task
		panic(err)
	}
	fmt.Println("tasks done:", done.Load())
	fmt.Println(e.Submit(ctx, func() {}))
	// Output:
	// tasks done: 100
	// pool: executor "resize": closed
}

// TrySubmit never waits: with every worker busy and the queue full, it
// returns ErrFull, and the caller can shed the load.
func ExampleExecutor_TrySubmit() {
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 1, QueueSize: 1})
	if err != nil {
		panic(err)
	}
	release := make(chan struct{})
	started := make(chan struct{})
	fmt.Println(e.TrySubmit(func() { close(started); <-release })) // runs
	<-started
	fmt.Println(e.TrySubmit(func() {})) // waits in the queue
	err = e.TrySubmit(func() {})
	fmt.Println(errors.Is(err, pool.ErrFull))
	close(release)
	if err := e.Close(context.Background()); err != nil {
		panic(err)
	}
	// Output:
	// <nil>
	// <nil>
	// true
}

// A task that submits to its own executor waits for room like any caller, so
// tasks that all do so on a full executor would wait for each other. A task
// that must not wait uses TrySubmit and, when the executor is full, runs the
// work itself.
func ExampleExecutor_TrySubmit_fromTask() {
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	err = e.Submit(context.Background(), func() {
		defer close(done)
		child := func() { fmt.Println("child ran") }
		if err := e.TrySubmit(child); errors.Is(err, pool.ErrFull) {
			child() // the only worker is this task's: run it here
		}
	})
	if err != nil {
		panic(err)
	}
	<-done
	if err := e.Close(context.Background()); err != nil {
		panic(err)
	}
	// Output:
	// child ran
}

// A panic in a task becomes an error for whoever waits; plain tasks report
// theirs to the PanicHandler.
func ExampleExecutor_panics() {
	e, err := pool.NewExecutor(pool.ExecutorConfig{
		PanicHandler: func(p *pool.PanicError) { fmt.Println("handler:", p.Value) },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := e.Submit(ctx, func() { panic("lost tile") }); err != nil {
		panic(err)
	}
	f, err := pool.Go(ctx, e, func() (int, error) { panic("bad row") })
	if err != nil {
		panic(err)
	}
	_, err = f.Wait(ctx)
	var pe *pool.PanicError
	fmt.Println("future:", errors.As(err, &pe), pe.Value)
	if err := e.Close(ctx); err != nil {
		panic(err)
	}
	fmt.Println("panicked:", e.Stats().Panicked)
	// Unordered output:
	// handler: lost tile
	// future: true bad row
	// panicked: 2
}

// Go runs a function on the executor and returns a typed Future for its
// result.
func ExampleGo() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)
	f, err := pool.Go(ctx, e, func() (string, error) {
		return strings.ToUpper("hello"), nil
	})
	if err != nil {
		panic(err)
	}
	s, err := f.Wait(ctx)
	fmt.Println(s, err)
	// Output: HELLO <nil>
}

// A Group collects results in the order of the calls to Go, and cancels the
// group's context on the first error.
func ExampleGroup() {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: 3})
	if err != nil {
		panic(err)
	}
	defer e.Close(ctx)

	g, _ := pool.NewGroup[int](ctx, e)
	for _, word := range []string{"one", "three", "seventeen"} {
		if err := g.Go(func(ctx context.Context) (int, error) {
			return len(word), nil
		}); err != nil {
			panic(err)
		}
	}
	lengths, err := g.Wait()
	fmt.Println(lengths, err)

	g, gctx := pool.NewGroup[int](ctx, e)
	errNotFound := errors.New("not found")
	g.Go(func(ctx context.Context) (int, error) { return 0, errNotFound })
	g.Go(func(ctx context.Context) (int, error) {
		<-ctx.Done() // stops when a sibling fails
		return 0, ctx.Err()
	})
	_, err = g.Wait()
	fmt.Println(err, context.Cause(gctx))
	// Output:
	// [3 5 9] <nil>
	// not found not found
}
