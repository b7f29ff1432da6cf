package pool

import (
	"context"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestFutureResult(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	ctx := context.Background()
	ok, err := Go(ctx, e, func() (string, error) { return "done", nil })
	if err != nil {
		t.Fatal(err)
	}
	failed, err := Go(ctx, e, func() (int, error) { return 7, io.EOF })
	if err != nil {
		t.Fatal(err)
	}
	if v, err := ok.Wait(ctx); v != "done" || err != nil {
		t.Errorf("Wait = %q, %v; want done, nil", v, err)
	}
	<-failed.Done()
	if v, err := failed.Wait(ctx); v != 7 || err != io.EOF {
		t.Errorf("Wait = %d, %v; want 7, EOF", v, err)
	}
	// Wait again, from another goroutine: the same result.
	again := make(chan string)
	go func() {
		v, _ := ok.Wait(ctx)
		again <- v
	}()
	if v := <-again; v != "done" {
		t.Errorf("second Wait = %q, want done", v)
	}
}

func TestFutureWaitContext(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	release := make(chan struct{})
	f, err := Go(context.Background(), e, func() (int, error) {
		<-release
		return 42, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if v, err := f.Wait(ctx); v != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait until the deadline = %d, %v; want 0, DeadlineExceeded", v, err)
	}
	select {
	case <-f.Done():
		t.Fatal("Done closed before the task finished")
	default:
	}
	close(release)
	if v, err := f.Wait(context.Background()); v != 42 || err != nil {
		t.Errorf("Wait after the task finished = %d, %v; want 42, nil", v, err)
	}
}

func TestFuturePanic(t *testing.T) {
	t.Parallel()
	handled := false
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1, PanicHandler: func(*PanicError) { handled = true }})
	f, err := Go(context.Background(), e, func() (int, error) {
		panickingTask(io.ErrUnexpectedEOF)
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.Wait(context.Background())
	var pe *PanicError
	if !errors.As(err, &pe) {
		t.Fatalf("Wait = %d, %v; want a *PanicError", v, err)
	}
	if pe.Value != io.ErrUnexpectedEOF || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("PanicError.Value = %v, want the panic value, seen through by errors.Is", pe.Value)
	}
	if !strings.Contains(string(pe.Stack), "panickingTask") {
		t.Errorf("PanicError.Stack does not show the panicking function:\n%s", pe.Stack)
	}
	// The executor keeps running.
	g, err := Go(context.Background(), e, func() (int, error) { return 2, nil })
	if err != nil {
		t.Fatal(err)
	}
	if v, err := g.Wait(context.Background()); v != 2 || err != nil {
		t.Errorf("Wait after a panic = %d, %v; want 2, nil", v, err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if handled {
		t.Error("PanicHandler called for a future's panic")
	}
	if st := e.Stats(); st.Panicked != 1 {
		t.Errorf("Stats().Panicked = %d, want 1", st.Panicked)
	}
}

func TestFutureGoexit(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	f, err := Go(context.Background(), e, func() (int, error) {
		runtime.Goexit()
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Wait(context.Background()); !errors.Is(err, errTaskGoexit) {
		t.Errorf("Wait = %v, want the Goexit error", err)
	}
}

func TestFutureGoErrors(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	if f, err := Go[int](context.Background(), e, nil); f != nil || err == nil {
		t.Errorf("Go(nil) = %v, %v; want nil and an error", f, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if f, err := Go(ctx, e, func() (int, error) { return 0, nil }); f != nil || !errors.Is(err, context.Canceled) {
		t.Errorf("Go with a cancelled context = %v, %v; want nil, Canceled", f, err)
	}
}

func TestFutureFromTaskWithQueue(t *testing.T) {
	t.Parallel()
	// A task that starts a future on its own executor, whose only worker it
	// holds, and waits for it: the queue holds the future until the task
	// returns, so this needs a queue (see Executor).
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2, QueueSize: 1})
	outer, err := Go(context.Background(), e, func() (int, error) {
		inner, err := Go(context.Background(), e, func() (int, error) { return 20, nil })
		if err != nil {
			return 0, err
		}
		v, err := inner.Wait(context.Background())
		return v + 1, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := outer.Wait(context.Background()); v != 21 || err != nil {
		t.Errorf("Wait = %d, %v; want 21, nil", v, err)
	}
}
