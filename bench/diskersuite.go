package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"syscall"
	"time"
)

// DiskerSuite runs the Redis workloads against one private redis-server per
// workload (persistence off), emptied with FLUSHALL before every run:
// fire-and-forget (8 producers, 32 handlers, 100,000 no-op messages), the
// same with 256 producers, request/reply with a 5 s timeout from 1 and
// from 32 requesters, sends with and without a dedup key, the flow limits
// (a rate-limited receiver, global against local concurrency), delayed
// fire-and-forget, keyed fire-and-forget, and a backlog handled a message
// or a batch per call (fewer messages with Quick or Tiny). Fire-and-forget and
// request/reply run the peers beside Disker (peers.go); a peer missing
// something on the machine leaves its row out, and its table says why.
// The work table counts the work per message and per round trip.
func DiskerSuite(ctx context.Context, o Options) ([]Table, error) {
	pe := newPeers(o)
	defer pe.close()
	nFF, nRR1, nRR32, nLim, nDelayed := 100_000, 10_000, 50_000, 5_000, 100_000
	switch {
	case o.Tiny:
		nFF, nRR1, nRR32, nLim, nDelayed = 400, 50, 320, 100, 400
	case o.Quick:
		nFF, nRR1, nRR32, nLim, nDelayed = 10_000, 1_000, 5_000, 1_000, 10_000
	}
	// Every one of the many producers sends at least one message.
	nMany := max(nFF, 2*ffManyProducers)

	nDedup, nGroups := 50_000, 30_000
	switch {
	case o.Tiny:
		nDedup, nGroups = 400, 400
	case o.Quick:
		nDedup, nGroups = 5_000, 3_000
	}
	var ff, ff256, rr1, rr32, dd map[string][]sample
	var err error
	if o.runsWorkload("ff") {
		if ff, err = runRedisWorkload(ctx, o, "fire-and-forget", ffAllImpls(pe, nFF)); err != nil {
			return nil, err
		}
	}
	if o.runsWorkload("ff256") {
		if ff256, err = runRedisWorkload(ctx, o, "fire-and-forget p=256", ffManyImpls(nMany)); err != nil {
			return nil, err
		}
	}
	if o.runsWorkload("rr1") {
		if rr1, err = runRedisWorkload(ctx, o, "request/reply r=1", rrAllImpls(pe, nRR1, 1)); err != nil {
			return nil, err
		}
	}
	if o.runsWorkload("rr32") {
		if rr32, err = runRedisWorkload(ctx, o, "request/reply r=32", rrAllImpls(pe, nRR32, 32)); err != nil {
			return nil, err
		}
	}
	if o.runsWorkload("dedup") {
		if dd, err = runRedisWorkload(ctx, o, "dedup sends", dedupImpls(nDedup)); err != nil {
			return nil, err
		}
	}
	var lim map[string][]sample
	if o.runsWorkload("limits") {
		if lim, err = runRedisWorkload(ctx, o, "flow limits", limitsImpls(nLim)); err != nil {
			return nil, err
		}
	}
	var groups map[string][]sample
	if o.runsWorkload("groups") {
		if groups, err = runRedisWorkload(ctx, o, "keyed fire-and-forget", groupsImpls(nGroups)); err != nil {
			return nil, err
		}
	}
	var delayed map[string][]sample
	if o.runsWorkload("delayed") {
		if delayed, err = runRedisWorkload(ctx, o, "delayed fire-and-forget", delayedImpls(nDelayed)); err != nil {
			return nil, err
		}
	}
	var retained map[string][]sample
	if o.runsWorkload("retention") {
		if retained, err = runRedisWorkload(ctx, o, "fire-and-forget with a retention", retentionImpls(nFF)); err != nil {
			return nil, err
		}
	}
	var batch map[string][]sample
	if o.runsWorkload("batch") {
		if batch, err = runRedisWorkload(ctx, o, "batch handlers", batchImpls(nFF)); err != nil {
			return nil, err
		}
	}
	var batches map[string][]sample
	if o.runsWorkload("batches") {
		if batches, err = runRedisWorkload(ctx, o, "batches", batchesImpls(nFF)); err != nil {
			return nil, err
		}
	}
	var streamed map[string][]sample
	nStream := nRR1 / 10
	if o.runsWorkload("stream") {
		if streamed, err = runRedisWorkload(ctx, o, "streamed requests", streamImpls(nStream)); err != nil {
			return nil, err
		}
	}
	var tables []Table
	if ff != nil {
		tables = append(tables, ffTable(ff, nFF, pe))
	}
	if ff256 != nil {
		tables = append(tables, ffManyTable(ff256, nMany))
	}
	if rr1 != nil || rr32 != nil {
		tables = append(tables, rrTable(rr1, rr32, nRR1, nRR32, pe))
	}
	if ff != nil || ff256 != nil || rr1 != nil || rr32 != nil {
		var rows []workRow
		add := func(workload string, res map[string][]sample, ims []redisImpl) {
			for _, im := range ims {
				rows = append(rows, workRow{workload, im.name, res[im.name]})
			}
		}
		add("fire-and-forget", ff, ffAllImpls(pe, nFF))
		add(fmt.Sprintf("fire-and-forget p=%d", ffManyProducers), ff256, ffManyImpls(nMany))
		add("request/reply r=1", rr1, rrAllImpls(pe, nRR1, 1))
		add("request/reply r=32", rr32, rrAllImpls(pe, nRR32, 32))
		tables = append(tables, workTable(rows))
	}
	if ff != nil && rr1 != nil && rr32 != nil {
		tables = append(tables, targetsTable(ff, ff256, rr1, rr32), cpuTable(ff, rr1, rr32))
	}
	if dd != nil {
		tables = append(tables, dedupTable(dd, nDedup))
	}
	if lim != nil {
		tables = append(tables, limitsTable(lim, nLim))
	}
	if delayed != nil {
		tables = append(tables, delayedTable(delayed, nDelayed))
	}
	if groups != nil {
		tables = append(tables, groupsTable(groups, nGroups))
	}
	if batch != nil {
		tables = append(tables, batchTable(batch, nFF))
	}
	if retained != nil {
		tables = append(tables, retentionTable(retained, nFF))
	}
	if batches != nil {
		tables = append(tables, batchesTable(batches, nFF))
	}
	if streamed != nil {
		tables = append(tables, streamTable(streamed, nStream))
	}
	return tables, nil
}

// ffTable renders the fire-and-forget workload, Disker's rows and then the
// peers' that ran.
func ffTable(ff map[string][]sample, nFF int, pe *peers) Table {
	ffT := Table{
		Title: fmt.Sprintf("Disker over Redis: fire-and-forget, %d producers, %d handlers, %s no-op messages",
			ffProducers, ffHandlers, thousands(int64(nFF))),
		Notes: []string{"Timed from the first send until the last message was handled. " +
			"\"× Disker time\" is the peer's time over Disker's (above 1 means Disker is faster). " +
			"The bare list queue (LPUSH/BRPOP) delivers at most once and keeps no state; asynq runs with " +
			"TaskCheckInterval 10 ms (default 1 s) so that its idle poll at the start is not counted.",
			"The last three rows before the peers' are not the targets' workload. In two, the producers send 100 messages per call " +
				"(Disker's SendBatch, with a worker that prefetches 32 messages beyond its 32 handler slots; one LPUSH " +
				"of 100 elements, popped one at a time by BRPOP); asynq has no batch enqueue. The ceiling row queues " +
				"nothing: its 8 producers each wait for one PING per message, the most that producers who wait for " +
				"Redis to take each message can do on this machine.",
			"The peers (BENCHMARKS.md says how each is configured): BullMQ in two node processes (a producer, a worker) " +
				"on the same redis-server; NATS JetStream on a nats-server of its own (a work-queue stream, a durable pull " +
				"consumer with explicit acks); River on a private PostgreSQL. \"server CPU\" is the CPU of the row's server " +
				"(redis-server, nats-server, or PostgreSQL's processes), \"client CPU\" that of the clients (this process, " +
				"both sides; BullMQ's two node processes)."},
		Header: []string{"implementation", "msgs/s, median (min–max)", "wall s", "× Disker time", "server CPU µs/msg", "client CPU µs/msg"},
	}
	ffT.Notes = append(ffT.Notes, pe.notes(ffPeerNames...)...)
	ref := series(ff[nameDisker], opsPerSec).med
	for _, im := range ffAllImpls(pe, nFF) {
		if len(ff[im.name]) == 0 {
			continue // a peer that did not run; a note says why
		}
		tp := series(ff[im.name], opsPerSec)
		ffT.Rows = append(ffT.Rows, []string{im.name, fmtStat(tp),
			fmt.Sprintf("%.2f", series(ff[im.name], wallMS).med/1e3), fmtRatio(ref, tp.med),
			fmtNum(series(ff[im.name], serverCPUPerOp).med), fmtNum(series(ff[im.name], clientCPUPerOp).med)})
	}
	return ffT
}

// ffPeerNames are the peers' rows of fire-and-forget.
var ffPeerNames = []string{nameBullMQ, nameJetStreamMem, nameJetStreamFile, nameRiver}

// ffAllImpls are the contenders of fire-and-forget: Disker's and the bare
// floors (ffImpls), then the peers.
func ffAllImpls(pe *peers, n int) []redisImpl {
	ims := append(ffImpls(n), bullmqImpl(pe, n))
	ims = append(ims, natsImpls(pe, n)...)
	return append(ims, riverImpl(pe, n))
}

// rrAllImpls are the contenders of request/reply from r requesters:
// Disker's and the bare floors (rrImpls), then NATS request/reply.
func rrAllImpls(pe *peers, n, r int) []redisImpl {
	return append(rrImpls(n, r), natsRequestImpl(pe, n, r))
}

// rrTable renders the request/reply workloads that ran (nil results did not).
func rrTable(rr1, rr32 map[string][]sample, nRR1, nRR32 int, pe *peers) Table {
	rrT := Table{
		Title: "Disker over Redis: request/reply with a 5 s timeout, 32 handlers",
		Notes: []string{fmt.Sprintf("%s round trips per run with 1 requester, %s with 32 requesters. "+
			"Latency is per round trip (send to reply received); p50 and p99 are the medians over the runs "+
			"of each run's percentile. \"× Disker time\" is the peer's time over Disker's (above 1 means "+
			"Disker is faster). The bare request/reply pushes \"replyKey|content\" to a request list; a "+
			"worker BRPOPs it and LPUSHes the reply to the unique reply key, which the requester BRPOPs "+
			"with the timeout.", thousands(int64(nRR1)), thousands(int64(nRR32))),
			"NATS request/reply is core NATS on a nats-server of its own (no JetStream): requests to 32 subscribers of one " +
				"queue group, which reply with the content. It promises less than the other rows: a request is delivered " +
				"at most once, to a subscriber connected at that moment (none connected: it fails at once; a subscriber that " +
				"dies holding it: lost, the requester times out); nothing is kept, and a reply after the requester's timeout " +
				"is dropped without telling the replier. \"server CPU\" is the row's server's (redis-server or nats-server), " +
				"\"client CPU\" this process's (both sides)."},
		Header: []string{"requesters", "implementation", "round trips/s, median (min–max)", "× Disker time", "p50 µs", "p99 µs",
			"server CPU µs/rt", "client CPU µs/rt"},
	}
	rrT.Notes = append(rrT.Notes, pe.notes(nameNATSRequest)...)
	for _, w := range []struct {
		r   int
		res map[string][]sample
		ims []redisImpl
	}{{1, rr1, rrAllImpls(pe, nRR1, 1)}, {32, rr32, rrAllImpls(pe, nRR32, 32)}} {
		if w.res == nil {
			continue
		}
		ref := series(w.res[nameDisker], opsPerSec).med
		for _, im := range w.ims {
			ss := w.res[im.name]
			if len(ss) == 0 {
				continue // a peer that did not run; a note says why
			}
			tp := series(ss, opsPerSec)
			rrT.Rows = append(rrT.Rows, []string{fmt.Sprint(w.r), im.name, fmtStat(tp), fmtRatio(ref, tp.med),
				fmtNum(series(ss, p50).med), fmtNum(series(ss, p99).med),
				fmtNum(series(ss, serverCPUPerOp).med), fmtNum(series(ss, clientCPUPerOp).med)})
		}
	}
	return rrT
}

// runRedisWorkload starts a fresh redis-server for the workload and runs its
// implementations round robin, with FLUSHALL before every run. Each run
// measures the CPU and counts the work of the clients and of the server:
// the redis-server's, or for a row with a server of its own (a peer's),
// that server's. A peer's run that fails (its process ends, its server
// gives up under the load) leaves its row out, with the reason (see
// peers.failed); any other failure ends the workload.
func runRedisWorkload(ctx context.Context, o Options, workload string, ims []redisImpl) (map[string][]sample, error) {
	srv, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	var impls []impl
	for _, im := range ims {
		impls = append(impls, impl{name: im.name, run: func(ctx context.Context) (sample, error) {
			s, err := runMeasured(ctx, o, workload, srv, im)
			if err != nil && im.peers != nil && ctx.Err() == nil && !errors.Is(err, errNotRun) {
				return s, im.peers.failed(im.name, workload, err)
			}
			return s, err
		}})
	}
	return runAlternating(ctx, o, workload, impls)
}

// runMeasured performs one run of im on srv (or on im's own server) and
// adds to its sample the CPU and the work of its clients and server.
func runMeasured(ctx context.Context, o Options, workload string, srv *redisServer, im redisImpl) (sample, error) {
	if err := srv.flushAll(); err != nil {
		return sample{}, err
	}
	if _, err := srv.do("CONFIG RESETSTAT", "+OK"); err != nil {
		return sample{}, err
	}
	var server serverProbe = srv
	if im.server != nil {
		p, err := im.server()
		if err != nil {
			return sample{}, err
		}
		server = p
	}
	s0, err := server.cpu()
	if err != nil {
		return sample{}, err
	}
	// The system calls are read after the server's CPU (an INFO command
	// for redis-server) and before it again, so that they count the run's
	// alone.
	sio0, sioOK0 := server.ioCalls()
	cio0, cioOK0 := readIOCalls("self")
	g0 := readGoCounters()
	p0 := processCPU()
	s, err := im.run(ctx, srv)
	if err != nil {
		return s, err
	}
	p1 := processCPU()
	g1 := readGoCounters()
	cio1, cioOK1 := readIOCalls("self")
	sio1, sioOK1 := server.ioCalls()
	s1, err := server.cpu()
	if err != nil {
		return s, err
	}
	s.serverCPU = s1 - s0 - s.setupServerCPU
	s.work.goCounts = g1.sub(g0)
	if !s.work.clientExternal {
		s.clientCPU = p1 - p0 - s.setupClientCPU
		s.work.clientIO, s.work.clientIOOK = cio1.sub(cio0), cioOK0 && cioOK1
	}
	s.work.serverIO, s.work.serverIOOK = sio1.sub(sio0), sioOK0 && sioOK1
	s.work.commands = -1
	if server == serverProbe(srv) {
		if s.work.commands, err = srv.commandCount(); err != nil {
			return s, err
		}
	}
	if o.CommandStats {
		calls := s.work.callsPerOp(s.ops)
		if server != serverProbe(srv) {
			o.progressf("  %s / %s: system calls per op: %s", workload, im.name, calls)
			return s, nil
		}
		stats, err := srv.commandStats(s.ops)
		if err != nil {
			return s, err
		}
		if calls != "" {
			stats += "; system calls per op: " + calls
		}
		o.progressf("  %s / %s: redis commands per op: %s", workload, im.name, stats)
	}
	return s, nil
}

// targetsTable checks the current speed targets for Disker over Redis
// that these workloads measure (BENCHMARKS.md lists all targets).
// ff256, the 256-producer workload, adds its row when it ran.
func targetsTable(ff, ff256, rr1, rr32 map[string][]sample) Table {
	t := Table{
		Title: "Targets for Disker over Redis",
		Notes: []string{"Medians of the runs above. \"Margin\" is Disker's figure over the target's, or the target's over Disker's " +
			"where lower is better (at least 1 means met). The ceiling is the fire-and-forget table's last row: 8 producers " +
			"that each wait for one PING per message, the most that producers who wait for Redis to take each message can do here."},
		Header: []string{"target", "Disker", "target value", "margin", "met"},
	}
	row := func(name, unit string, got, want float64, higherIsBetter bool) {
		margin := got / want
		if !higherIsBetter {
			margin = want / got
		}
		met := "yes"
		if math.IsNaN(margin) || margin < 1 {
			met = "**no**"
		}
		t.Rows = append(t.Rows, []string{name, fmtNum(got) + " " + unit, fmtNum(want) + " " + unit,
			fmt.Sprintf("%.2f (%+.1f%%)", margin, 100*(margin-1)), met})
	}
	tp := func(res map[string][]sample, name string) float64 { return series(res[name], opsPerSec).med }
	lat := func(res map[string][]sample, name string, pct func(sample) float64) float64 {
		return series(res[name], pct).med
	}
	cpu := func(res map[string][]sample, name string) float64 {
		return series(res[name], func(s sample) float64 { return serverCPUPerOp(s) + clientCPUPerOp(s) }).med
	}
	const ffFloor, rrFloor = "bare list, rueidis", "bare lists, rueidis"

	row("fire-and-forget, 8 producers ≥ 1.3× bare rueidis", "msgs/s", tp(ff, nameDisker), 1.3*tp(ff, ffFloor), true)
	row("fire-and-forget ≥ 0.70 of the PING ceiling", "msgs/s", tp(ff, nameDisker), 0.7*tp(ff, namePingCeiling), true)
	row("fire-and-forget, CPU per message ≤ 0.6× bare rueidis", "µs", cpu(ff, nameDisker), 0.6*cpu(ff, ffFloor), false)
	if ff256 != nil {
		row(fmt.Sprintf("fire-and-forget, %d producers ≥ 2× bare rueidis", ffManyProducers), "msgs/s",
			tp(ff256, nameDisker), 2*tp(ff256, ffFloor), true)
	}
	row("request/reply, 32 requesters ≥ 1.5× bare rueidis", "rt/s", tp(rr32, nameDisker), 1.5*tp(rr32, rrFloor), true)
	floor50 := math.Min(lat(rr1, "bare lists, go-redis", p50), lat(rr1, rrFloor, p50))
	floor99 := math.Min(lat(rr1, "bare lists, go-redis", p99), lat(rr1, rrFloor, p99))
	row("request/reply, 1 requester: p50 ≤ 1.15× the lower bare p50", "µs", lat(rr1, nameDisker, p50), 1.15*floor50, false)
	row("request/reply, 1 requester: p99 ≤ 1.3× the lower bare p99", "µs", lat(rr1, nameDisker, p99), 1.3*floor99, false)
	row("request/reply, 1 requester, CPU per round trip ≤ 1.0× bare rueidis", "µs", cpu(rr1, nameDisker), cpu(rr1, rrFloor), false)
	row("request/reply, 32 requesters, CPU per round trip ≤ 0.6× bare rueidis", "µs", cpu(rr32, nameDisker), 0.6*cpu(rr32, rrFloor), false)
	return t
}

// cpuTable compares the CPU each workload's operation costs Disker with what
// it costs the bare rueidis floor: not a target, but a measure that depends
// less than throughput and latency on how the machine schedules wake-ups.
func cpuTable(ff, rr1, rr32 map[string][]sample) Table {
	t := Table{
		Title:  "CPU per operation, Disker against the bare rueidis floor",
		Notes:  []string{"Not a target. Redis CPU plus Go CPU per message or round trip, medians of the runs above; \"ratio\" is Disker's over the floor's (below 1 means Disker spends less)."},
		Header: []string{"workload", "Disker µs/op", "bare rueidis µs/op", "ratio"},
	}
	cpu := func(ss []sample) float64 {
		return series(ss, func(s sample) float64 { return serverCPUPerOp(s) + clientCPUPerOp(s) }).med
	}
	for _, w := range []struct {
		name, floor string
		res         map[string][]sample
	}{
		{"fire-and-forget", "bare list, rueidis", ff},
		{"request/reply, 1 requester", "bare lists, rueidis", rr1},
		{"request/reply, 32 requesters", "bare lists, rueidis", rr32},
	} {
		got, floor := cpu(w.res[nameDisker]), cpu(w.res[w.floor])
		t.Rows = append(t.Rows, []string{w.name, fmtNum(got), fmtNum(floor), fmt.Sprintf("%.2f", got/floor)})
	}
	return t
}

// rateRow is a table row of a Disker workload: name, the throughput of
// its samples ss (median, min–max), ratio, and their Redis and Go CPU per
// operation.
func rateRow(name string, ss []sample, ratio string) []string {
	return []string{name, fmtStat(series(ss, opsPerSec)), ratio,
		fmtNum(series(ss, serverCPUPerOp).med), fmtNum(series(ss, clientCPUPerOp).med)}
}

// processCPU returns the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ffManyProducers is how many producers the many-producers workload runs,
// each sending one message per call.
const ffManyProducers = 256

// ffManyImpls are the contenders of fire-and-forget with ffManyProducers
// producers: Disker, the bare list queue over rueidis (whose concurrent
// calls share one pipelined connection), and the PING ceiling with as many
// producers, the most that pipelined callers get out of the server here.
func ffManyImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameDisker, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return ffDiskerWith(ctx, s, n, 1, ffManyProducers)
		}},
		{name: "bare list, rueidis", run: func(ctx context.Context, s *redisServer) (sample, error) {
			return ffRueidisWith(ctx, s, n, 1, ffManyProducers)
		}},
		{name: namePingCeiling, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return ffPingCeilingBy(ctx, s, n, ffManyProducers)
		}},
	}
}

// ffManyTable renders fire-and-forget with ffManyProducers producers.
func ffManyTable(ff map[string][]sample, nFF int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: fire-and-forget, %d producers, %d handlers, %s no-op messages",
			ffManyProducers, ffHandlers, thousands(int64(nFF))),
		Notes: []string{fmt.Sprintf("The first table's workload with %d producers, each sending one message per call "+
			"(Send; one LPUSH). rueidis pipelines the concurrent calls of all producers on its connections "+
			"(auto-pipelining), so this is where a queue can approach the pipelined limit of the server; the "+
			"ceiling row is %d producers each waiting for one PING per message. \"× Disker time\" is the peer's "+
			"time over Disker's (above 1 means Disker is faster).", ffManyProducers, ffManyProducers)},
		Header: []string{"implementation", "msgs/s, median (min–max)", "wall s", "× Disker time", "redis CPU µs/msg", "Go CPU µs/msg"},
	}
	ref := series(ff[nameDisker], opsPerSec).med
	for _, im := range ffManyImpls(nFF) {
		tp := series(ff[im.name], opsPerSec)
		t.Rows = append(t.Rows, []string{im.name, fmtStat(tp),
			fmt.Sprintf("%.2f", series(ff[im.name], wallMS).med/1e3), fmtRatio(ref, tp.med),
			fmtNum(series(ff[im.name], serverCPUPerOp).med), fmtNum(series(ff[im.name], clientCPUPerOp).med)})
	}
	return t
}
