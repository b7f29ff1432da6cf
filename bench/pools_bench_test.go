//go:build unix

package bench

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

// The workloads of ExecutorSuite and CheckoutSuite as testing benchmarks,
// for the work each does per op, counted rather than timed: besides
// -benchmem's allocations, "switches/op" (a goroutine scheduled to run again
// after it parked, yielded or was preempted, from /sched/latencies:seconds),
// "sleeps/op" (a thread of the process that went to sleep in the kernel,
// getrusage's voluntary context switches) and "cpu-ns/op" (the process's
// CPU time).
//
//	go test -run '^$' -bench 'Executors/sum/c=4|Checkouts' -benchmem .

// benchName makes an implementation's name one level of a benchmark's name.
var benchName = strings.NewReplacer(" ", "_", "/", "-", ",", "").Replace

// rusage returns the process's voluntary context switches and CPU time.
func rusage(b *testing.B) (sleeps int64, cpuNanos int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return int64(ru.Nvcsw), syscall.TimevalToNsec(ru.Utime) + syscall.TimevalToNsec(ru.Stime)
}

// countWork runs fn, b.N ops, as the timed region and reports the work
// counts per op.
func countWork(b *testing.B, fn func() error) {
	b.ReportAllocs()
	g0 := readGoCounters()
	s0, c0 := rusage(b)
	b.ResetTimer()
	err := fn()
	b.StopTimer()
	s1, c1 := rusage(b)
	g := readGoCounters().sub(g0)
	if err != nil {
		b.Fatal(err)
	}
	n := float64(b.N)
	b.ReportMetric(float64(g.wakeups())/n, "switches/op")
	b.ReportMetric(float64(s1-s0)/n, "sleeps/op")
	b.ReportMetric(float64(c1-c0)/n, "cpu-ns/op")
}

// BenchmarkExecutors runs b.N tasks on each executor of ExecutorSuite.
func BenchmarkExecutors(b *testing.B) {
	for _, w := range []struct {
		kind string
		task func()
	}{{"sum", sumTask}, {"sleep", sleepTask}} {
		for _, c := range []int{4, 1000} {
			for _, e := range executors() {
				b.Run(fmt.Sprintf("%s/c=%d/%s", w.kind, c, benchName(e.name)), func(b *testing.B) {
					countWork(b, func() error { return e.run(b.N, c, w.task) })
				})
			}
		}
	}
}

// BenchmarkCheckouts runs b.N checkout+release round trips, shared by g
// goroutines, on each pool of CheckoutSuite.
func BenchmarkCheckouts(b *testing.B) {
	for _, size := range []int{4, 64} {
		for _, g := range []int{1, 8, 64} {
			for _, ci := range checkoutImpls() {
				b.Run(fmt.Sprintf("g=%d/size=%d/%s", g, size, benchName(ci.name)), func(b *testing.B) {
					op, cleanup, err := ci.build(size)
					if err != nil {
						b.Fatal(err)
					}
					defer cleanup()
					countWork(b, func() error { return roundTrips(context.Background(), op, g, b.N) })
				})
			}
		}
	}
}
