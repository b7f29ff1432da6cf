package pool

import (
	"context"
	"fmt"
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
	b.ResetTimer()
	for range b.N {
		if err := e.Submit(ctx, task); err != nil {
			b.Fatal(err)
		}
	}
	if err := e.Close(ctx); err != nil {
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
