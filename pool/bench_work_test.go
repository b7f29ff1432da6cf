package pool

import (
	"runtime/metrics"
	"testing"
)

// workCount counts, over a benchmark's timed region, the scheduling work
// that does not depend on how loaded the machine is: goroutine switches
// and, where the OS reports them, the threads' sleeps (see osCount).
type workCount struct {
	sched  uint64
	sleeps int64
	cpu    int64
}

// trackingPeriod is the Go runtime's gTrackingPeriod: it records a sample
// of /sched/latencies:seconds for one in this many of a goroutine's
// transitions out of running (a park, a yield or a preemption), when the
// goroutine next runs.
const trackingPeriod = 8

func readWork() workCount {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	w := workCount{sched: n * trackingPeriod}
	w.sleeps, w.cpu = osCount()
	return w
}

// measureWork runs fn, the timed region of a benchmark of b.N ops, and
// reports per op: "switches/op", the goroutines scheduled to run again
// after they parked, yielded or were preempted; "sleeps/op", the times a
// thread of the process went to sleep in the kernel (a parked M, an idle
// P's thread); and "cpu-ns/op", the process's CPU time. The last two only
// where the OS gives them.
func measureWork(b *testing.B, fn func()) {
	b.Helper()
	start := readWork()
	b.ResetTimer()
	fn()
	b.StopTimer()
	end := readWork()
	n := float64(b.N)
	b.ReportMetric(float64(end.sched-start.sched)/n, "switches/op")
	if start.cpu >= 0 {
		b.ReportMetric(float64(end.sleeps-start.sleeps)/n, "sleeps/op")
		b.ReportMetric(float64(end.cpu-start.cpu)/n, "cpu-ns/op")
	}
}
