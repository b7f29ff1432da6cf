package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker"
)

// The footprint of idle receivers and reply senders: one instance serves
// n receivers, or has a ReplyHandler for n senders, or both, against a
// private redis-server, with nothing sent. It reports what they cost at
// rest: connections to Redis, Go heap and goroutines, Redis memory, and the
// Redis commands per second the instance issues while idle.

// footprintIdleWindow is how long the idle command rate is measured.
const footprintIdleWindow = 3 * time.Second

// footprintSettle is how long the connection count must stay the same
// before the instance counts as settled.
const footprintSettle = 3 * time.Second

// footprint is what one idle configuration measured.
type footprint struct {
	name       string
	items      int           // receivers plus reply senders
	conns      int           // connections of the instance (CLIENT LIST)
	baseConns  int           // connections of the same instance before any was added
	heap       float64       // Go heap bytes per item
	rss        float64       // resident memory of the process, bytes per item
	goroutines float64       // goroutines per item
	redisMem   float64       // Redis used_memory bytes per item
	idleCmds   float64       // Redis commands per second while idle
	idleTop    string        // the most frequent of them, per second
	idleCPU    float64       // redis-server CPU while idle, share of one core
	closeTime  time.Duration // Close of the instance
	setupTime  time.Duration // from the first Handle/OnReply until settled
	// handleTime: from the first of one message sent to each receiver,
	// one by one, until each was handled (0: not measured).
	handleTime time.Duration
}

// FootprintSuite measures one instance with 1,000 idle receivers, one with
// 1,000 ReplyHandlers (reply senders), one with both, and one with 10,000
// receivers that then handles a message sent to each (fewer with Quick
// or Tiny), each once, against a private redis-server.
func FootprintSuite(ctx context.Context, o Options) ([]Table, error) {
	n := 1000
	switch {
	case o.Tiny:
		n = 20
	case o.Quick:
		n = 200
	}
	srv, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	var fps []footprint
	cases := []struct {
		name               string
		receivers, senders int
		send               bool // then one message to each receiver
	}{
		{fmt.Sprintf("%s receivers", thousands(int64(n))), n, 0, false},
		{fmt.Sprintf("%s reply senders", thousands(int64(n))), 0, n, false},
		{fmt.Sprintf("%s receivers + %s reply senders", thousands(int64(n)), thousands(int64(n))), n, n, false},
	}
	// Ten times as many receivers, then a message to each (issue 16).
	cases = append(cases, struct {
		name               string
		receivers, senders int
		send               bool
	}{fmt.Sprintf("%s receivers, then a message to each", thousands(int64(10*n))), 10 * n, 0, true})
	for _, c := range cases {
		fp, err := measureFootprint(ctx, srv, c.name, c.receivers, c.senders, c.send)
		if err != nil {
			return nil, fmt.Errorf("footprint / %s: %w", c.name, err)
		}
		o.progressf("  footprint %-40s %d connections, %.1f KiB Go heap per item", c.name, fp.conns, fp.heap/1024)
		fps = append(fps, fp)
	}
	return []Table{footprintTable(fps, n)}, nil
}

// measureFootprint opens one instance, waits for its connections to
// settle, adds the receivers and ReplyHandlers, waits again, and measures.
func measureFootprint(ctx context.Context, srv *redisServer, name string, receivers, senders int, send bool) (fp footprint, err error) {
	fp = footprint{name: name, items: receivers + senders}
	if err := srv.flushAll(); err != nil {
		return fp, err
	}
	if _, err := settledClients(ctx, srv, func(n int) bool { return n == 0 }); err != nil {
		return fp, err
	}
	d, err := disker.New(ctx, disker.Config{RedisURL: srv.url()})
	if err != nil {
		return fp, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = closeDiskers(d)
		}
	}()
	if fp.baseConns, err = settledClients(ctx, srv, nil); err != nil {
		return fp, err
	}
	// Give the memory of earlier configurations back to the system, so
	// that the growth of the resident memory is this one's.
	debug.FreeOSMemory()
	heap0, g0, rss0 := goHeap(), runtime.NumGoroutine(), residentBytes()
	mem0, err := srv.infoInt("memory", "used_memory")
	if err != nil {
		return fp, err
	}

	t0 := time.Now()
	var handled atomic.Int64
	h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		handled.Add(1)
		return nil, nil
	})
	for i := range receivers {
		if err := d.Handle(fmt.Sprintf("idle-r%d", i), h); err != nil {
			return fp, err
		}
	}
	rh := disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})
	for i := range senders {
		if err := d.OnReply(fmt.Sprintf("idle-s%d", i), rh); err != nil {
			return fp, err
		}
	}
	if fp.conns, err = settledClients(ctx, srv, nil); err != nil {
		return fp, err
	}
	fp.setupTime = max(0, time.Since(t0)-footprintSettle)

	heap1, g1, rss1 := goHeap(), runtime.NumGoroutine(), residentBytes()
	mem1, err := srv.infoInt("memory", "used_memory")
	if err != nil {
		return fp, err
	}
	per := float64(fp.items)
	fp.heap = float64(int64(heap1)-int64(heap0)) / per
	fp.goroutines = float64(g1-g0) / per
	fp.rss = float64(rss1-rss0) / per
	fp.redisMem = float64(mem1-mem0) / per

	if _, err := srv.do("CONFIG RESETSTAT", "+OK"); err != nil {
		return fp, err
	}
	cpu0, err := srv.cpu()
	if err != nil {
		return fp, err
	}
	c0, err := srv.infoInt("stats", "total_commands_processed")
	if err != nil {
		return fp, err
	}
	w0 := time.Now()
	select {
	case <-time.After(footprintIdleWindow):
	case <-ctx.Done():
		return fp, ctx.Err()
	}
	c1, err := srv.infoInt("stats", "total_commands_processed")
	if err != nil {
		return fp, err
	}
	cpu1, err := srv.cpu()
	if err != nil {
		return fp, err
	}
	// The INFO that read c0 counts among the commands after it.
	window := time.Since(w0).Seconds()
	fp.idleCPU = (cpu1 - cpu0).Seconds() / window
	// Blocking reads give their connections back between reads, so the
	// count can still grow under load: keep the most seen.
	after, err := srv.clients()
	if err != nil {
		return fp, err
	}
	fp.conns = max(fp.conns, after)
	fp.idleCmds = float64(c1-c0-1) / window
	if fp.idleTop, err = srv.topCommands(window, 3); err != nil {
		return fp, err
	}

	if send {
		ts := time.Now()
		for i := range receivers {
			if _, err := d.Send(ctx, disker.Message{Receiver: fmt.Sprintf("idle-r%d", i), Content: []byte("x")}); err != nil {
				return fp, err
			}
		}
		for handled.Load() < int64(receivers) {
			select {
			case <-time.After(10 * time.Millisecond):
			case <-ctx.Done():
				return fp, ctx.Err()
			}
		}
		fp.handleTime = time.Since(ts)
	}

	t1 := time.Now()
	closed = true
	if err := closeDiskers(d); err != nil {
		return fp, err
	}
	fp.closeTime = time.Since(t1)
	return fp, nil
}

// residentBytes returns the resident memory of this process (VmRSS), or 0
// where /proc does not tell.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// topCommands renders the k most frequent commands since the last CONFIG
// RESETSTAT as calls per second over window seconds, leaving out INFO and
// CONFIG (the harness's own).
func (s *redisServer) topCommands(window float64, k int) (string, error) {
	info, err := s.do("INFO commandstats", "$")
	if err != nil {
		return "", err
	}
	type stat struct {
		cmd   string
		calls int
	}
	var stats []stat
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		if name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		n, err := strconv.Atoi(calls)
		if err != nil {
			return "", fmt.Errorf("bench: INFO commandstats: %q: %w", l, err)
		}
		stats = append(stats, stat{name, n})
	}
	sort.Slice(stats, func(i, j int) bool { return stats[i].calls > stats[j].calls })
	var parts []string
	for _, st := range stats[:min(k, len(stats))] {
		parts = append(parts, fmt.Sprintf("%s %s", st.cmd, fmtNum(float64(st.calls)/window)))
	}
	return strings.Join(parts, ", "), nil
}

// goHeap returns the bytes of live heap objects after a full collection.
func goHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// settledClients polls the number of clients connected to srv (besides
// the one asking) until it has stayed the same for footprintSettle and,
// if ok is not nil, ok accepts it; it returns that number.
func settledClients(ctx context.Context, srv *redisServer, ok func(int) bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	last, since := -1, time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := srv.clients()
		if err != nil {
			return 0, err
		}
		if n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= footprintSettle && (ok == nil || ok(n)) {
			return n, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return 0, fmt.Errorf("bench: %d clients connected, not settled: %w", last, ctx.Err())
		}
	}
}

// clients returns the number of clients connected to the server, from
// CLIENT LIST, leaving out the connection that asks.
func (s *redisServer) clients() (int, error) {
	list, err := s.do("CLIENT LIST", "$")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, l := range strings.Split(list, "\n") {
		if strings.TrimSpace(l) != "" {
			n++
		}
	}
	return n - 1, nil
}

// infoInt returns the integer field of the INFO section.
func (s *redisServer) infoInt(section, field string) (int64, error) {
	info, err := s.do("INFO "+section, "$")
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(l), ":"); ok && k == field {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("bench: INFO %s has no %s", section, field)
}

// footprintTable renders the footprints.
func footprintTable(fps []footprint, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: footprint of %s idle receivers and reply senders in one instance", thousands(int64(n))),
		Notes: []string{"One instance (default Config) against a private redis-server, nothing sent; each " +
			"configuration measured once. \"Connections\" counts the instance's clients in CLIENT LIST, the " +
			"higher of two counts: once the count has stayed the same for 3 s, and after the idle window below; " +
			"in parentheses, the same instance's before the receivers and ReplyHandlers (OnReply) were added. " +
			"\"Per item\" divides the growth by the number of receivers plus reply senders: Go heap (HeapAlloc " +
			"after two collections), the process's resident memory (VmRSS), goroutines, and Redis used_memory " +
			"(which counts each client connection's buffers). \"Idle commands/s\" is the rate of Redis commands " +
			"(total_commands_processed) over 3 s with nothing sent, beside the three most frequent of them " +
			"(INFO commandstats, which counts the commands scripts run); \"idle Redis CPU\" is redis-server's " +
			"CPU time over the same window (INFO cpu). \"Setup s\" is from the first Handle until the " +
			"connection count settled, less the 3 s of settling. \"Handle s\" (the last row only) is from the " +
			"first of one message sent to each receiver, one Send after the other, until each was handled."},
		Header: []string{"configuration", "connections", "Go heap KiB/item", "RSS KiB/item", "goroutines/item",
			"Redis memory KiB/item", "idle commands/s", "most frequent, per s", "idle Redis CPU, % of a core", "setup s", "Close s", "handle s"},
	}
	for _, fp := range fps {
		handleS := "-"
		if fp.handleTime > 0 {
			handleS = fmt.Sprintf("%.2f", fp.handleTime.Seconds())
		}
		t.Rows = append(t.Rows, []string{fp.name, fmt.Sprintf("%d (%d)", fp.conns, fp.baseConns),
			fmtNum(fp.heap / 1024), fmtNum(fp.rss / 1024), fmtNum(fp.goroutines), fmtNum(fp.redisMem / 1024),
			fmtNum(fp.idleCmds), fp.idleTop, fmt.Sprintf("%.1f", 100*fp.idleCPU),
			fmt.Sprintf("%.2f", fp.setupTime.Seconds()), fmt.Sprintf("%.2f", fp.closeTime.Seconds()), handleS})
	}
	return t
}
