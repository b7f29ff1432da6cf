package bench

import (
	"fmt"
	"math"
	"runtime"
	"runtime/metrics"
	"time"
)

// work is what one run did, counted rather than timed: the heap
// allocations, goroutine wake-ups and goroutines created in this process,
// the Redis commands, and the read and write system calls of the clients
// and of the server. Counts move less than times from one host to the
// next.
type work struct {
	// goCounts is the counts of this process below; they are the row's
	// clients' unless clientExternal.
	goCounts goCounters
	// clientExternal says the row's clients ran outside this process
	// (BullMQ's, in node): the Go counts are then not the row's.
	clientExternal bool
	// commands is the Redis commands the run issued (INFO commandstats,
	// which counts the commands run by scripts too); -1 when the server is
	// not Redis.
	commands int64
	// clientIO and serverIO are the read and write system calls of the
	// clients and of the server; the flags say whether they were read
	// (from /proc/PID/io, where it can be read).
	clientIO, serverIO     ioCalls
	clientIOOK, serverIOOK bool
}

// serverProbe is what a run measures of the server it talks to: its CPU
// time and its read and write system calls so far.
type serverProbe interface {
	cpu() (time.Duration, error)
	ioCalls() (ioCalls, bool)
}

// goCounters are cumulative counts of this process.
type goCounters struct {
	// allocs and bytes are the heap allocations (runtime.MemStats: tiny
	// ones included, as in testing's allocs/op) and their bytes.
	allocs, bytes uint64
	// latencySamples is the count of /sched/latencies:seconds samples
	// (runtime/metrics). The runtime records one sample per
	// gTrackingPeriod (8) of a goroutine's transitions out of running,
	// when the goroutine next runs; wakeups scales it back.
	latencySamples uint64
	// created is the goroutines created (runtime/metrics).
	created uint64
}

// trackingPeriod is the Go runtime's gTrackingPeriod: it samples one in
// this many of a goroutine's transitions out of running for
// /sched/latencies:seconds.
const trackingPeriod = 8

// readGoCounters reads this process's counters. runtime.ReadMemStats stops
// the world for a moment, and counts every allocation made so far
// (runtime/metrics' counts leave out those in the per-P caches).
func readGoCounters() goCounters {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	c := goCounters{allocs: ms.Mallocs, bytes: ms.TotalAlloc, created: s[1].Value.Uint64()}
	for _, n := range s[0].Value.Float64Histogram().Counts {
		c.latencySamples += n
	}
	return c
}

// sub returns the counts from b to c.
func (c goCounters) sub(b goCounters) goCounters {
	return goCounters{
		allocs:         c.allocs - b.allocs,
		bytes:          c.bytes - b.bytes,
		latencySamples: c.latencySamples - b.latencySamples,
		created:        c.created - b.created,
	}
}

// wakeups estimates how many times a goroutine of this process was
// scheduled to run after it stopped running (it blocked, yielded or was
// preempted), or first ran: the samples times the sampling period.
func (c goCounters) wakeups() uint64 { return c.latencySamples * trackingPeriod }

// nan is the figure of a count that does not apply to a row.
var nan = math.NaN()

// Per-op extractors of the work counts; NaN where the row has no such
// count (its clients ran outside this process, its server is not Redis, or
// /proc/PID/io could not be read).
func goAllocsPerOp(s sample) float64 {
	return goPerOp(s, func(c goCounters) uint64 { return c.allocs })
}
func goBytesPerOp(s sample) float64 {
	return goPerOp(s, func(c goCounters) uint64 { return c.bytes })
}
func wakeupsPerOp(s sample) float64 {
	return goPerOp(s, goCounters.wakeups)
}
func goroutinesPerOp(s sample) float64 {
	return goPerOp(s, func(c goCounters) uint64 { return c.created })
}
func commandsPerOp(s sample) float64 {
	if s.work.commands < 0 {
		return nan
	}
	return perOpOf(s.work.commands, s.ops)
}
func clientCallsPerOp(s sample) float64 {
	if !s.work.clientIOOK {
		return nan
	}
	return perOpOf(s.work.clientIO.reads+s.work.clientIO.writes, s.ops)
}
func serverCallsPerOp(s sample) float64 {
	if !s.work.serverIOOK {
		return nan
	}
	return perOpOf(s.work.serverIO.reads+s.work.serverIO.writes, s.ops)
}

func goPerOp(s sample, f func(goCounters) uint64) float64 {
	if s.work.clientExternal {
		return nan
	}
	return float64(f(s.work.goCounts)) / float64(max(s.ops, 1))
}

// workRow is one row of a work table: a workload's implementation.
type workRow struct {
	workload, name string
	res            []sample
}

// workTable renders the work per operation of the given rows, medians of
// their runs.
func workTable(rows []workRow) Table {
	t := Table{
		Title: "Work per message and per round trip, counted",
		Notes: []string{"Counts, not times: they move less than times from one host to the next. Medians of the runs above, " +
			"each counted from just before a run's clients are made until they are closed, so a run's setup and " +
			"shutdown are in them (a few hundred allocations, nothing per message). " +
			"\"Go allocs\", \"Go B\", \"wake-ups\" and \"goroutines\" are this process's (runtime.MemStats, runtime/metrics): for Disker " +
			"both sides, the dispatcher's sending and the worker's handling, which run in this one process as two " +
			"instances, and the same for the bare floors and asynq; the harness's own loops allocate nothing per " +
			"operation (a test checks it), but Disker's and NATS's requesters make a context with the 5 s timeout " +
			"per request, as callers do, and the producers' and requesters' waits for a send or a reply are wake-ups " +
			"of the calls; for NATS and River their client side, in this process, their " +
			"servers being processes of their own; for BullMQ nothing, its clients being node processes. A " +
			"wake-up is a goroutine scheduled to run after it blocked, yielded or was preempted, or first ran: " +
			fmt.Sprintf("%d × the samples of /sched/latencies:seconds, which the runtime records for one in %d of a goroutine's ", trackingPeriod, trackingPeriod) +
			"transitions out of running. \"Redis commands\" are INFO commandstats' calls (commands run by scripts " +
			"included). System calls are the reads and writes of /proc/PID/io (syscr + syscw): the clients' (this " +
			"process, or BullMQ's node processes) and the server's (redis-server, nats-server; not PostgreSQL's: it uses " +
			"recv and send on its sockets, which /proc/PID/io does not count). \"–\" is a count that does not apply or " +
			"could not be read."},
		Header: []string{"workload", "implementation", "Go allocs/op", "Go B/op", "wake-ups/op", "goroutines/op",
			"Redis commands/op", "client syscalls/op", "server syscalls/op"},
	}
	for _, r := range rows {
		if len(r.res) == 0 {
			continue
		}
		med := func(f func(sample) float64) string { return fmtCount(series(r.res, f).med) }
		t.Rows = append(t.Rows, []string{r.workload, r.name, med(goAllocsPerOp), med(goBytesPerOp), med(wakeupsPerOp),
			med(goroutinesPerOp), med(commandsPerOp), med(clientCallsPerOp), med(serverCallsPerOp)})
	}
	return t
}

// fmtCount is fmtNum with "–" for a count that does not apply.
func fmtCount(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmtNum(x)
}
