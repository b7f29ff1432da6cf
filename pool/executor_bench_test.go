package pool

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// The workloads of the performance target: tiny CPU-bound tasks
// (each sums 100 integers) and tasks that each sleep 10µs, at concurrency 4
// and 1000. Each op is one task; the timed region includes draining every
// task with Close.

var benchData = func() []int {
	d := make([]int, 100)
	for i := range d {
		d[i] = i
	}
	return d
}()

var benchSink atomic.Int64

func sumTask() {
	s := 0
	for _, v := range benchData {
		s += v
	}
	if s == -1 { // never; keeps the sum alive
		benchSink.Store(int64(s))
	}
}

func sleepTask() { time.Sleep(10 * time.Microsecond) }

func benchmarkSubmit(b *testing.B, cfg ExecutorConfig, task func()) {
	ctx := context.Background()
	e, err := NewExecutor(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	measureWork(b, func() {
		for range b.N {
			if err = e.Submit(ctx, task); err != nil {
				return
			}
		}
		err = e.Close(ctx)
	})
	if err != nil {
		b.Fatal(err)
	}
}

func BenchmarkExecutorSubmit(b *testing.B) {
	for _, w := range []struct {
		name string
		task func()
	}{{"sum", sumTask}, {"sleep", sleepTask}} {
		for _, c := range []int{4, 1000} {
			for _, q := range []int{0, 1024} {
				b.Run(fmt.Sprintf("%s/workers=%d/queue=%d", w.name, c, q), func(b *testing.B) {
					benchmarkSubmit(b, ExecutorConfig{MaxWorkers: c, QueueSize: q}, w.task)
				})
			}
		}
	}
}

// BenchmarkExecutorTrySubmit measures TrySubmit with room to spare.
func BenchmarkExecutorTrySubmit(b *testing.B) {
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 4, QueueSize: 1024})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for e.TrySubmit(sumTask) != nil {
			runtime.Gosched() // full: let the workers catch up
		}
	}
	if err := e.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGo measures a future per task: Go, then Wait.
func BenchmarkGo(b *testing.B) {
	ctx := context.Background()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 4, QueueSize: 1024})
	if err != nil {
		b.Fatal(err)
	}
	fn := func() (int, error) { sumTask(); return 1, nil }
	futures := make([]*Future[int], 0, 1024)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		f, err := Go(ctx, e, fn)
		if err != nil {
			b.Fatal(err)
		}
		futures = append(futures, f)
		if len(futures) == cap(futures) || i == b.N-1 {
			for _, f := range futures {
				if _, err := f.Wait(ctx); err != nil {
					b.Fatal(err)
				}
			}
			futures = futures[:0]
		}
	}
	if err := e.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkGroup measures groups of 100 tasks.
func BenchmarkGroup(b *testing.B) {
	ctx := context.Background()
	e, err := NewExecutor(ExecutorConfig{MaxWorkers: 4, QueueSize: 1024})
	if err != nil {
		b.Fatal(err)
	}
	fn := func(context.Context) (int, error) { sumTask(); return 1, nil }
	b.ReportAllocs()
	b.ResetTimer()
	for n := b.N; n > 0; n -= 100 {
		g, _ := NewGroup[int](ctx, e)
		for range min(n, 100) {
			if err := g.Go(fn); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := g.Wait(); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Close(ctx); err != nil {
		b.Fatal(err)
	}
}
