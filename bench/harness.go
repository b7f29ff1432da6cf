// Package bench runs Disker's pools and its Redis dispatcher side by side with
// their peers on the same workloads, and renders the results as markdown.
//
// Every workload runs each implementation [Options.Runs] times. Within one
// run index the implementations take turns (round robin, with the starting
// implementation rotated from one run index to the next), so that a slow
// phase of the machine hits them all alike instead of one implementation's
// whole series. The tables give the median of the runs with the minimum and
// the maximum, and a ratio against Disker.
//
// The command bench/cmd/bench is the entry point; bench_test.go runs every
// workload at tiny sizes to prove the harness works.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"
)

// Options selects the sizes and the repetition of a benchmark run.
type Options struct {
	// Runs is how many times each implementation runs each workload; the
	// tables report the median. At least 1.
	Runs int
	// Quick selects small sizes for a smoke test instead of the sizes.
	Quick bool
	// Tiny selects the smallest sizes that still exercise every code path;
	// bench_test.go uses it. It implies Quick.
	Tiny bool
	// Progress receives one line per finished run, for the impatient; nil
	// means no progress output.
	Progress io.Writer
	// CommandStats adds to each progress line of a Redis workload the Redis
	// commands the run issued per operation (from INFO commandstats, which
	// counts commands run by scripts too), and the read and write system
	// calls per operation of this process and of redis-server (from
	// /proc/PID/io, where it can be read), to see where a run spends.
	CommandStats bool
	// Workloads, when not empty, limits DiskerSuite to these of its
	// workloads: "ff" (fire-and-forget), "ff256" (fire-and-forget from
	// 256 producers), "rr1" and "rr32" (request/reply from 1 and 32
	// requesters), "dedup", "limits" (flow limits), "delayed"
	// (fire-and-forget, each message due within a second), "groups"
	// (keyed fire-and-forget), "batch" (a backlog handled one message or
	// a batch per call), "stream" (streamed requests), to iterate on one. The targets table needs ff, rr1 and rr32.
	Workloads []string
}

func (o Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

// Table is one rendered result table.
type Table struct {
	// Title is the heading of the table.
	Title string
	// Notes are paragraphs printed between the heading and the table.
	Notes []string
	// Header names the columns.
	Header []string
	// Rows holds the cells, one slice per row.
	Rows [][]string
}

// Markdown renders t as a markdown section.
func (t Table) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", t.Title)
	for _, n := range t.Notes {
		fmt.Fprintf(&b, "%s\n\n", n)
	}
	b.WriteString("| " + strings.Join(t.Header, " | ") + " |\n")
	seps := make([]string, len(t.Header))
	for i := range seps {
		seps[i] = "---"
		if numericColumn(t.Rows, i) {
			seps[i] = "---:"
		}
	}
	b.WriteString("| " + strings.Join(seps, " | ") + " |\n")
	for _, r := range t.Rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	b.WriteString("\n")
	return b.String()
}

// numericColumn reports whether every cell of column i starts with a
// figure, or is "–" (no figure), so that the column is aligned right.
func numericColumn(rows [][]string, i int) bool {
	for _, r := range rows {
		c := strings.TrimPrefix(r[i], "-")
		if c == "–" {
			continue
		}
		if c == "" || c[0] < '0' || c[0] > '9' {
			return false
		}
	}
	return len(rows) > 0
}

// sample is what one run of one implementation measured.
type sample struct {
	elapsed time.Duration
	ops     int     // operations completed in elapsed (tasks, round trips, messages)
	allocs  uint64  // heap allocations during the run
	bytes   uint64  // heap bytes allocated during the run
	peakG   int     // peak goroutines above the count before the run
	p50     float64 // latency percentiles in microseconds, for request/reply
	p99     float64
	// CPU time spent during the run by the server (redis-server, or a
	// peer's own: nats-server, PostgreSQL) and by the clients (this
	// process, both sides of the workload; node's processes for BullMQ),
	// for the Redis workloads and their peers.
	serverCPU, clientCPU time.Duration
	// redisBytes is Redis's used_memory growth per operation, for a
	// workload that keeps state (retained results); 0 when not measured.
	redisBytes float64
	// setupServerCPU and setupClientCPU are the part of the CPU times
	// that a run spent setting up what it measures (queueing a backlog),
	// which runMeasured leaves out of serverCPU and clientCPU.
	setupServerCPU, setupClientCPU time.Duration
	// work is what the run's clients and server did, counted, for the
	// Redis workloads and their peers.
	work work
	// nodeCPU is the CPU time of each master, for the Cluster workloads;
	// serverCPU is their sum. nodeCmd is the part of it each master spent
	// running commands (INFO commandstats).
	nodeCPU, nodeCmd []time.Duration
}

// impl is one contender in a workload. run performs one complete run and
// reports what it measured.
type impl struct {
	name string
	run  func(ctx context.Context) (sample, error)
}

// runAlternating runs every implementation runs times, round robin within
// each run index with the first implementation rotated per run index. It
// returns the samples by implementation name. An implementation whose run
// fails with errNotRun (something it needs is missing here) is left out of
// the rest of the runs and has no samples.
func runAlternating(ctx context.Context, o Options, workload string, impls []impl) (map[string][]sample, error) {
	out := make(map[string][]sample, len(impls))
	notRun := map[string]bool{}
	for r := range o.Runs {
		for k := range impls {
			im := impls[(r+k)%len(impls)]
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if notRun[im.name] {
				continue
			}
			s, err := im.run(ctx)
			if errors.Is(err, errNotRun) {
				notRun[im.name] = true
				delete(out, im.name)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("%s / %s, run %d: %w", workload, im.name, r+1, err)
			}
			o.progressf("  %-40s %-22s run %d/%d: %v", workload, im.name, r+1, o.Runs, s.elapsed.Round(time.Microsecond))
			out[im.name] = append(out[im.name], s)
		}
	}
	return out, nil
}

// stat is the median, minimum and maximum of a series.
type stat struct{ med, min, max float64 }

func summarize(xs []float64) stat {
	s := slices.Clone(xs)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return stat{math.NaN(), math.NaN(), math.NaN()}
	}
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return stat{med: med, min: s[0], max: s[n-1]}
}

func series(ss []sample, f func(sample) float64) stat {
	xs := make([]float64, len(ss))
	for i, s := range ss {
		xs[i] = f(s)
	}
	return summarize(xs)
}

// Field extractors.
func wallMS(s sample) float64    { return float64(s.elapsed) / 1e6 }
func nsPerOp(s sample) float64   { return float64(s.elapsed) / float64(s.ops) }
func opsPerSec(s sample) float64 { return float64(s.ops) / s.elapsed.Seconds() }
func allocsPerOp(s sample) float64 {
	return float64(s.allocs) / float64(s.ops)
}
func bytesPerOp(s sample) float64 { return float64(s.bytes) / float64(s.ops) }
func peakG(s sample) float64      { return float64(s.peakG) }
func p50(s sample) float64        { return s.p50 }
func p99(s sample) float64        { return s.p99 }
func serverCPUPerOp(s sample) float64 {
	return float64(s.serverCPU) / 1e3 / float64(s.ops)
}
func clientCPUPerOp(s sample) float64 { return float64(s.clientCPU) / 1e3 / float64(s.ops) }

// fmtNum formats x with a precision that suits its size and thousands
// separators for large values.
func fmtNum(x float64) string {
	switch {
	case math.IsNaN(x):
		return "n/a"
	case math.Abs(x) >= 1000:
		return thousands(int64(math.Round(x)))
	case math.Abs(x) >= 100:
		return fmt.Sprintf("%.0f", x)
	case math.Abs(x) >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}

func thousands(n int64) string {
	neg := n < 0
	if neg {
		n = -n
	}
	s := fmt.Sprint(n)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtStat renders a median with its range: "123 (110–140)".
func fmtStat(s stat) string {
	return fmt.Sprintf("%s (%s–%s)", fmtNum(s.med), fmtNum(s.min), fmtNum(s.max))
}

// fmtRatio renders a/b as "1.23×".
func fmtRatio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// measure runs fn once with the garbage collector settled beforehand and
// reports the wall time, heap allocation deltas and the peak goroutine count
// above the count at the start. A background goroutine samples
// runtime.NumGoroutine every 200µs; the sampler itself is not counted.
func measure(ops int, fn func() error) (sample, error) {
	runtime.GC()
	base := runtime.NumGoroutine()
	stop := make(chan struct{})
	peak := make(chan int, 1)
	go func() {
		max := 0
		t := time.NewTicker(200 * time.Microsecond)
		defer t.Stop()
		for {
			if n := runtime.NumGoroutine(); n > max {
				max = n
			}
			select {
			case <-stop:
				peak <- max
				return
			case <-t.C:
			}
		}
	}()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	err := fn()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	close(stop)
	p := <-peak - base - 1 // the sampler
	if p < 0 {
		p = 0
	}
	return sample{
		elapsed: elapsed,
		ops:     ops,
		allocs:  after.Mallocs - before.Mallocs,
		bytes:   after.TotalAlloc - before.TotalAlloc,
		peakG:   p,
	}, err
}

// percentiles returns the p50 and p99 of ds in microseconds. It sorts ds.
func percentiles(ds []time.Duration) (float64, float64) {
	if len(ds) == 0 {
		return math.NaN(), math.NaN()
	}
	slices.Sort(ds)
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(ds)))) - 1
		i = max(0, min(i, len(ds)-1))
		return float64(ds[i]) / 1e3
	}
	return at(0.50), at(0.99)
}

// runsWorkload reports whether DiskerSuite runs workload w.
func (o Options) runsWorkload(w string) bool {
	return len(o.Workloads) == 0 || slices.Contains(o.Workloads, w)
}

// LoadAverage returns the machine's 1, 5 and 15 minute load averages,
// which say whether something else competed for the CPUs during a run, or
// "unknown".
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
