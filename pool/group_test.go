package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
)

func TestGroupResultsInSubmissionOrder(t *testing.T) {
	t.Parallel()
	const n = 8
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: n})
	g, _ := NewGroup[int](context.Background(), e)
	// Task i finishes after task i+1: the last one given to Go ends first.
	next := make([]chan struct{}, n+1)
	for i := range next {
		next[i] = make(chan struct{})
	}
	close(next[n])
	for i := range n {
		if err := g.Go(func(context.Context) (int, error) {
			<-next[i+1]
			close(next[i])
			return i * i, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := g.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != n {
		t.Fatalf("Wait returned %d results, want %d", len(res), n)
	}
	for i, v := range res {
		if v != i*i {
			t.Errorf("result %d = %d, want %d", i, v, i*i)
		}
	}
}

func TestGroupFirstErrorCancelsTheOthers(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 4})
	g, ctx := NewGroup[string](context.Background(), e)
	started := make(chan struct{}, 3)
	for i := range 3 {
		if err := g.Go(func(ctx context.Context) (string, error) {
			started <- struct{}{}
			<-ctx.Done() // runs until the group is cancelled
			return fmt.Sprint("stopped ", i), ctx.Err()
		}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		<-started
	}
	if err := g.Go(func(context.Context) (string, error) { return "", io.ErrUnexpectedEOF }); err != nil {
		t.Fatal(err)
	}
	res, err := g.Wait()
	if err != io.ErrUnexpectedEOF {
		t.Errorf("Wait error = %v, want the first error", err)
	}
	if cause := context.Cause(ctx); cause != io.ErrUnexpectedEOF {
		t.Errorf("context.Cause of the group's context = %v, want the first error", cause)
	}
	want := []string{"stopped 0", "stopped 1", "stopped 2", ""}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("results %q, want %q", res, want)
	}
}

func TestGroupDoesNotStartTasksAfterAnError(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1, QueueSize: 10})
	g, _ := NewGroup[int](context.Background(), e)
	release := make(chan struct{})
	if err := g.Go(func(context.Context) (int, error) {
		<-release
		return 0, io.EOF
	}); err != nil {
		t.Fatal(err)
	}
	var ran atomic.Int64
	for range 5 { // queued behind the failing task
		if err := g.Go(func(context.Context) (int, error) {
			ran.Add(1)
			return 1, nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	res, err := g.Wait()
	if err != io.EOF {
		t.Errorf("Wait error = %v, want EOF", err)
	}
	if ran.Load() != 0 {
		t.Errorf("%d tasks started after the group failed, want 0", ran.Load())
	}
	if fmt.Sprint(res) != "[0 0 0 0 0 0]" {
		t.Errorf("results %v, want zero values", res)
	}
}

func TestGroupPanic(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	g, ctx := NewGroup[int](context.Background(), e)
	if err := g.Go(func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := g.Go(func(context.Context) (int, error) { panickingTask("group boom"); return 0, nil }); err != nil {
		t.Fatal(err)
	}
	_, err := g.Wait()
	var pe *PanicError
	if !errors.As(err, &pe) || pe.Value != "group boom" {
		t.Fatalf("Wait error = %v, want a *PanicError with the panic value", err)
	}
	if ctx.Err() == nil {
		t.Error("the group's context was not cancelled")
	}
}

func TestGroupGoexit(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	g, _ := NewGroup[int](context.Background(), e)
	if err := g.Go(func(context.Context) (int, error) { runtime.Goexit(); return 0, nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Wait(); !errors.Is(err, errTaskGoexit) {
		t.Errorf("Wait error = %v, want the Goexit error", err)
	}
}

func TestGroupGoErrors(t *testing.T) {
	t.Parallel()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 1})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := NewGroup[int](context.Background(), e)
	if err := g.Go(func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Go(func(context.Context) (int, error) { return 2, nil }); !errors.Is(err, ErrClosed) {
		t.Errorf("Go after Close = %v, want ErrClosed", err)
	}
	res, err := g.Wait()
	if !errors.Is(err, ErrClosed) {
		t.Errorf("Wait error = %v, want the ErrClosed of Go", err)
	}
	// The refused task keeps its place, so results line up with Go calls.
	if fmt.Sprint(res) != "[1 0]" {
		t.Errorf("results %v, want [1 0]", res)
	}

	g2, _ := NewGroup[int](context.Background(), e)
	if err := g2.Go(nil); err == nil {
		t.Error("Go(nil) = nil error")
	}
	if _, err := g2.Wait(); err == nil {
		t.Error("Wait after Go(nil) = nil error")
	}
}

func TestGroupParentCancelled(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	parent, cancel := context.WithCancel(context.Background())
	g, _ := NewGroup[int](parent, e)
	started := make(chan struct{})
	if err := g.Go(func(ctx context.Context) (int, error) {
		close(started)
		<-ctx.Done()
		return 0, ctx.Err()
	}); err != nil {
		t.Fatal(err)
	}
	<-started
	cancel()
	if _, err := g.Wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait error = %v, want Canceled", err)
	}
	if err := g.Go(func(context.Context) (int, error) { return 0, nil }); !errors.Is(err, context.Canceled) {
		t.Errorf("Go after the group's context ended = %v, want Canceled", err)
	}
}

func TestGroupWaitCancelsContext(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	g, ctx := NewGroup[int](context.Background(), e)
	if err := g.Go(func(context.Context) (int, error) { return 1, nil }); err != nil {
		t.Fatal(err)
	}
	if res, err := g.Wait(); err != nil || fmt.Sprint(res) != "[1]" {
		t.Errorf("Wait = %v, %v; want [1], nil", res, err)
	}
	if ctx.Err() == nil {
		t.Error("the group's context is not cancelled after Wait")
	}
}

func TestGroupNestedOnFullExecutor(t *testing.T) {
	t.Parallel()
	// Tasks of a group add tasks to the group on their own full executor
	// with TryGo, and do the work themselves when it finds no room: no
	// deadlock, and every value comes back.
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 2})
	g, _ := NewGroup[int](context.Background(), e)
	var full atomic.Int64
	for i := range 4 {
		if err := g.Go(func(context.Context) (int, error) {
			nested := func(context.Context) (int, error) { return 100 + i, nil }
			err := g.TryGo(nested)
			if errors.Is(err, ErrFull) {
				full.Add(1)
				v, _ := nested(context.Background())
				return i + v, nil
			}
			return i, err
		}); err != nil {
			t.Fatal(err)
		}
	}
	res, err := g.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if want := 8 - int(full.Load()); len(res) != want {
		t.Fatalf("%d results, want %d: %v", len(res), want, res)
	}
	sum := 0
	for _, v := range res {
		sum += v
	}
	if want := 0 + 1 + 2 + 3 + 100 + 101 + 102 + 103; sum != want {
		t.Errorf("results %v sum to %d, want %d", res, sum, want)
	}
}

func TestGroupTryGo(t *testing.T) {
	t.Parallel()
	e := newTestExecutor(t, ExecutorConfig{MaxWorkers: 1})
	g, gctx := NewGroup[int](context.Background(), e)
	release := make(chan struct{})
	if err := g.TryGo(func(context.Context) (int, error) { <-release; return 1, nil }); err != nil {
		t.Fatalf("TryGo with room: %v", err)
	}
	// No room: TryGo fails, and the group neither fails nor keeps a place.
	if err := g.TryGo(func(context.Context) (int, error) { return 2, nil }); !errors.Is(err, ErrFull) {
		t.Fatalf("TryGo on a full executor = %v, want ErrFull", err)
	}
	if gctx.Err() != nil {
		t.Fatal("ErrFull from TryGo cancelled the group")
	}
	close(release)
	res, err := g.Wait()
	if err != nil || len(res) != 1 || res[0] != 1 {
		t.Fatalf("Wait = %v, %v; want [1], nil", res, err)
	}
	// A closed executor: the error is the group's.
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	g2, _ := NewGroup[int](context.Background(), e)
	if err := g2.TryGo(func(context.Context) (int, error) { return 3, nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("TryGo after Close = %v, want ErrClosed", err)
	}
	if _, err := g2.Wait(); !errors.Is(err, ErrClosed) {
		t.Errorf("Wait after TryGo on a closed executor = %v, want ErrClosed", err)
	}
}
