package chaos

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/childproc"
	"github.com/diskerhq/disker/internal/redistest"
)

// Topologies of Redis the harness runs on.
const (
	TopologyStandalone = "standalone"
	TopologyCluster    = "cluster"
	TopologySentinel   = "sentinel"
)

// Options configure a run of the harness.
type Options struct {
	// Topology is standalone (one redis-server with AOF and appendfsync
	// always, behind a proxy that resets, stalls and cuts connections),
	// cluster (three masters) or sentinel (a master, a replica, a
	// sentinel).
	Topology string
	// Duration is how long faults are injected.
	Duration time.Duration
	// Seed seeds the choice and timing of the faults and the producers'
	// operations.
	Seed uint64
	// FaultEvery is the mean time between the starts of two faults.
	FaultEvery time.Duration
	// Workers and Producers are how many processes of each run.
	Workers, Producers int
	// Dir is the run directory: histories, logs, report.json.
	Dir string
	// Exe is the binary that runs workers and producers (cmd/chaos).
	Exe string
	// SettleTimeout bounds the wait for the system to settle after the
	// faults stopped.
	SettleTimeout time.Duration
}

// harnessProc is the harness's name in the history.
const harnessProc = "harness"

// backend is the Redis that a run uses, and the faults it allows.
type backend struct {
	url      string          // for workers and producers
	adminURL string          // for the harness: straight to Redis
	pauseAt  func() []string // the servers CLIENT PAUSE may pause
	proxy    *proxy
	server   *redistest.Server
	sentinel *sentinelBackend
	stop     func()
}

func startBackend(topology, dir string) (*backend, error) {
	switch topology {
	case TopologyStandalone:
		srv, stop := redistest.MustStart(redistest.WithAOF())
		px, err := startProxy(srv.Addr())
		if err != nil {
			stop()
			return nil, err
		}
		return &backend{url: px.URL(), adminURL: srv.URL(), pauseAt: func() []string { return []string{srv.Addr()} }, proxy: px, server: srv,
			stop: func() { px.close(); stop() }}, nil
	case TopologyCluster:
		c, stop := redistest.MustStartCluster(3)
		return &backend{url: c.URL(), adminURL: c.URL(), pauseAt: c.Addrs, stop: stop}, nil
	case TopologySentinel:
		s, err := startSentinelBackend(dir)
		if err != nil {
			return nil, err
		}
		return &backend{url: s.s.URL(), adminURL: s.s.URL(), pauseAt: s.master, sentinel: s, stop: s.stop}, nil
	}
	return nil, fmt.Errorf("chaos: Options.Topology: %q is not standalone, cluster or sentinel", topology)
}

// slot is one worker or producer position: its process changes
// generation when it is killed and started again.
type slot struct {
	role  string // "worker" or "producer"
	index int
	gen   int
	cmd   *exec.Cmd
	done  chan struct{}
	busy  bool // under a fault
	name  string
}

type harness struct {
	opts Options
	be   *backend
	rec  *Recorder
	rng  *rand.Rand

	mu      sync.Mutex
	slots   []*slot
	broken  error      // a fault that failed
	redisMu sync.Mutex // one Redis fault at a time
}

// Run runs the harness: it starts Redis, the workers and the producers,
// injects faults for opts.Duration, lets the system settle, checks the
// history and returns the report. The error is for a harness that could
// not run; a broken invariant is in the report (Report.OK).
func Run(opts Options) (*Report, error) {
	if opts.Workers < 1 || opts.Producers < 1 {
		return nil, errors.New("chaos: Options.Workers and Options.Producers must be at least 1")
	}
	if err := os.MkdirAll(filepath.Join(opts.Dir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("chaos: Options.Dir: %w", err)
	}
	be, err := startBackend(opts.Topology, opts.Dir)
	if err != nil {
		return nil, err
	}
	defer be.stop()
	rec, err := NewRecorder(opts.Dir, harnessProc)
	if err != nil {
		return nil, err
	}
	defer rec.Close()
	rec.WatchDelays()
	stopRedisProbe := background(func(ctx context.Context) { watchRedis(ctx, rec, be.pauseAt) })
	defer stopRedisProbe()
	h := &harness{opts: opts, be: be, rec: rec, rng: rand.New(rand.NewPCG(opts.Seed, 0x6368616f73))}
	for i := range opts.Workers {
		h.slots = append(h.slots, &slot{role: "worker", index: i})
	}
	for i := range opts.Producers {
		h.slots = append(h.slots, &slot{role: "producer", index: i})
	}
	for _, s := range h.slots {
		if err := h.spawn(s); err != nil {
			h.killAll()
			return nil, err
		}
	}
	defer h.killAll()
	stopSupervisor := h.superviseWorkers()
	defer stopSupervisor()
	stopPauser := h.startPauser()
	defer stopPauser()

	h.injectFaults()
	stopPauser()
	if h.broken != nil {
		return nil, h.broken
	}
	rec.Record(Event{Kind: KindSettle})
	settled, pending, left, err := h.settle()
	if err != nil {
		return nil, err
	}
	result := ResultNotSettled
	if settled {
		result = ResultSettled
	}
	rec.Record(Event{Kind: KindFinal, N: pending, Result: result, Err: left})
	stopRedisProbe()
	stopSupervisor()
	h.stopAll()

	events, err := ReadHistory(opts.Dir)
	if err != nil {
		return nil, err
	}
	r := Check(events, CheckOptions{FailoverLoss: opts.Topology == TopologySentinel})
	b, _ := json.MarshalIndent(r, "", "  ")
	if err := os.WriteFile(filepath.Join(opts.Dir, "report.json"), b, 0o644); err != nil {
		return nil, fmt.Errorf("chaos: report: %w", err)
	}
	return r, nil
}

// spawn starts slot s's next generation.
func (h *harness) spawn(s *slot) error {
	s.gen++
	s.name = fmt.Sprintf("%s%d.g%d", s.role[:1], s.index, s.gen)
	seed := h.opts.Seed ^ uint64(s.index)<<32 ^ uint64(s.gen)<<48
	cmd := exec.Command(h.opts.Exe, s.role, "-name", s.name, "-redis", h.be.url, "-dir", h.opts.Dir,
		"-seed", strconv.FormatUint(seed, 10))
	log, err := os.Create(filepath.Join(h.opts.Dir, "logs", s.name+".log"))
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	childproc.Tie(cmd)
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("chaos: start %s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(done)
	}()
	s.cmd, s.done = cmd, done
	return nil
}

// injectFaults starts a fault at random times (exponential gaps of mean
// FaultEvery) until Duration has passed, then waits for the faults under
// way to end. Faults overlap: a process fault takes a process that is not
// under one, and Redis faults take turns.
func (h *harness) injectFaults() {
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.Duration)
	defer cancel()
	var wg sync.WaitGroup
	for {
		gap := time.Duration(h.rng.ExpFloat64() * float64(h.opts.FaultEvery))
		t := time.NewTimer(gap)
		select {
		case <-ctx.Done():
			t.Stop()
			wg.Wait()
			return
		case <-t.C:
		}
		f := h.pick()
		wg.Go(func() {
			defer h.recoverFault()
			f(ctx)
		})
	}
}

// recoverFault turns a panic in a fault (Redis that does not come back)
// into the run's error, so that Run still stops what it started.
func (h *harness) recoverFault() {
	if v := recover(); v != nil {
		h.mu.Lock()
		h.broken = fmt.Errorf("chaos: a fault failed: %v", v)
		h.mu.Unlock()
	}
}

// pick chooses the next fault and its parameters, from the harness's
// seeded generator (so that the schedule depends only on the seed).
func (h *harness) pick() func(ctx context.Context) {
	kinds := []string{FaultKillWorker, FaultStopWorker, FaultKillProducer, FaultStopProducer, FaultClientPause}
	switch {
	case h.be.proxy != nil:
		kinds = append(kinds, FaultKillRedis, FaultResetConns, FaultStallConns, FaultCutAnswers)
	case h.be.sentinel != nil:
		kinds = append(kinds, FaultSentinelFailover)
	}
	kind := kinds[h.rng.IntN(len(kinds))]
	d := time.Duration(300+h.rng.IntN(4700)) * time.Millisecond // 0.3s to 5s
	idx := h.rng.IntN(1 << 30)
	switch kind {
	case FaultKillWorker, FaultKillProducer, FaultStopWorker, FaultStopProducer:
		role := "worker"
		if kind == FaultKillProducer || kind == FaultStopProducer {
			role = "producer"
		}
		kill := kind == FaultKillWorker || kind == FaultKillProducer
		return func(ctx context.Context) { h.processFault(ctx, kind, role, idx, kill, d) }
	case FaultKillRedis:
		d = d / 2
		return func(ctx context.Context) {
			h.redisFault(kind, "redis", func() {
				h.be.server.Kill()
				sleepCtx(ctx, d)
				h.be.server.Restart()
			})
		}
	case FaultResetConns:
		return func(context.Context) { h.redisFault(kind, "proxy", h.be.proxy.reset) }
	case FaultStallConns:
		d = d / 2
		return func(ctx context.Context) {
			h.redisFault(kind, "proxy", func() {
				resume := h.be.proxy.stall()
				sleepCtx(ctx, d)
				resume()
			})
		}
	case FaultCutAnswers:
		d = d / 5
		return func(ctx context.Context) {
			h.redisFault(kind, "proxy", func() {
				h.be.proxy.setCut(true)
				sleepCtx(ctx, d)
				h.be.proxy.setCut(false)
			})
		}
	case FaultClientPause:
		d = d / 2
		return func(ctx context.Context) {
			addrs := h.be.pauseAt()
			if len(addrs) == 0 {
				return
			}
			addr := addrs[idx%len(addrs)]
			h.redisFault(kind, addr, func() {
				if err := redisCommand(addr, "CLIENT", "PAUSE", strconv.FormatInt(d.Milliseconds(), 10), "ALL"); err != nil {
					fmt.Fprintf(os.Stderr, "chaos: CLIENT PAUSE: %v\n", err)
				}
				sleepCtx(ctx, d)
			})
		}
	case FaultSentinelFailover:
		return func(context.Context) {
			h.redisFault(kind, "sentinel", func() {
				if err := h.be.sentinel.failover(); err != nil {
					// The sentinel found no replica fit to promote: the
					// fault is still recorded (it paused nothing, but
					// the clients saw the attempt).
					fmt.Fprintf(os.Stderr, "chaos: failover did not complete: %.300s\n", err)
				}
			})
		}
	}
	panic("chaos: unknown fault " + kind)
}

// redisFault runs f as a Redis fault and records it from its start to its
// end.
func (h *harness) redisFault(kind, target string, f func()) {
	h.redisMu.Lock()
	defer h.redisMu.Unlock()
	begin := time.Now().UnixNano()
	f()
	h.rec.Record(Event{T: begin, Kind: KindFault, Fault: kind, Target: target, End: time.Now().UnixNano()})
}

// processFault kills a process of role (and starts its next generation
// after d/5) or stops it for d. The first producer is never killed: it
// keeps the shared sender alive, to settle the timeouts.
func (h *harness) processFault(ctx context.Context, kind, role string, idx int, kill bool, d time.Duration) {
	h.mu.Lock()
	var free []*slot
	for _, s := range h.slots {
		if s.role == role && !s.busy && !(kill && role == "producer" && s.index == 0) {
			free = append(free, s)
		}
	}
	if len(free) == 0 {
		h.mu.Unlock()
		return
	}
	s := free[idx%len(free)]
	s.busy = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		s.busy = false
		h.mu.Unlock()
	}()
	name := s.name
	begin := time.Now().UnixNano()
	if kill {
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
		h.rec.Record(Event{T: begin, Kind: KindFault, Fault: kind, Target: name, End: begin})
		sleepCtx(ctx, d/5)
		if err := h.spawn(s); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: restart %s: %v\n", name, err)
		}
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	sleepCtx(ctx, d)
	_ = s.cmd.Process.Signal(syscall.SIGCONT)
	h.rec.Record(Event{T: begin, Kind: KindFault, Fault: kind, Target: name, End: time.Now().UnixNano()})
}

// sleepCtx waits for d or until ctx ends: the length of a fault.
func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// settle tells the producers to stop sending, then waits until the queues
// are empty, the producers idle, and every acknowledged message handled,
// dead-lettered or settled at its sender. It records the dead letters it
// finds, and returns whether it settled, how many messages were still
// queued, and, when it did not settle, what the queues still held.
func (h *harness) settle() (bool, int64, string, error) {
	for _, s := range h.slots {
		if s.role == "producer" {
			_ = s.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.opts.SettleTimeout)
	defer cancel()
	admin, err := disker.New(ctx, disker.Config{RedisURL: h.be.adminURL, InstanceID: "chaos-harness"})
	if err != nil {
		return false, 0, "", fmt.Errorf("chaos: admin connection: %w", err)
	}
	defer admin.Close(context.Background())
	seen := map[string]bool{}
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	empty := 0 // settle rounds in a row whose queues read empty
	for {
		var pending int64
		var left []string
		known := true // every receiver's length was read
		for _, r := range settledReceivers() {
			st, err := admin.Stats(ctx, r)
			if err != nil {
				known = false
				left = append(left, fmt.Sprintf("%s: %v", r, err))
			} else {
				pending += st.Length
				if st.Length > 0 || st.Deferred > 0 {
					left = append(left, fmt.Sprintf("%s: length %d, pending %d, deferred %d", r, st.Length, st.Pending, st.Deferred))
				}
			}
			dls, err := admin.DeadLetters(ctx, r, 1<<20)
			if err == nil {
				for _, dl := range dls {
					// Entry ids are unique within one stream only.
					if key := r + "/" + dl.ID; !seen[key] {
						seen[key] = true
						h.rec.Record(Event{Kind: KindDeadLetter, Op: string(dl.Message.Content), ID: dl.Message.ID, Attempt: dl.Attempts})
					}
				}
			}
		}
		// quiet reads and checks the whole history, which takes longer
		// than the settle's timeout on a long run: it is asked only once
		// the queues have read empty twice in a row (the producers' last
		// records written), and once more when its "no" came after the
		// timeout, since what it read may predate them.
		quiet := false
		if pending == 0 && known {
			empty++
		} else {
			empty = 0
		}
		if empty >= 2 {
			if quiet = h.quiet(); quiet {
				return true, 0, "", nil
			}
			if ctx.Err() != nil {
				if quiet = h.quiet(); quiet {
					return true, 0, "", nil
				}
			}
		}
		select {
		case <-ctx.Done():
			if pending == 0 && known && !quiet {
				left = append(left, "a producer is not idle or a message is still open")
			}
			return false, pending, strings.Join(left, "; "), nil
		case <-tick.C:
		}
	}
}

// quiet reports whether every producer is idle and the history shows no
// message still open, nor a batch or a chain waiting for its next
// message.
func (h *harness) quiet() bool {
	events, err := ReadHistory(h.opts.Dir)
	if err != nil {
		return false
	}
	idle := map[string]bool{}
	for _, e := range events {
		if e.Kind == KindIdle {
			idle[e.Proc] = true
		}
	}
	for _, s := range h.slots {
		if s.role == "producer" && !idle[s.name] {
			return false
		}
	}
	r := Check(events, CheckOptions{FailoverLoss: h.opts.Topology == TopologySentinel})
	return r.Lost == 0 && r.NoOutcome == 0 && r.Features.Broken[brokeBatchMissing] == 0 && r.Features.Broken[brokeChainStalled] == 0
}

// stopAll stops every process gracefully (SIGINT), and kills what has not
// exited after 20 seconds.
func (h *harness) stopAll() {
	for _, s := range h.slots {
		_ = s.cmd.Process.Signal(syscall.SIGINT)
	}
	deadline := time.After(20 * time.Second)
	for _, s := range h.slots {
		select {
		case <-s.done:
		case <-deadline:
			_ = s.cmd.Process.Signal(syscall.SIGKILL)
			<-s.done
		}
	}
}

func (h *harness) killAll() {
	for _, s := range h.slots {
		if s.cmd != nil {
			_ = s.cmd.Process.Signal(syscall.SIGCONT)
			_ = s.cmd.Process.Signal(syscall.SIGKILL)
			<-s.done
		}
	}
}

// redisCommand sends one command to the Redis at addr and fails on an
// error reply.
func redisCommand(addr string, args ...string) error {
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if strings.HasPrefix(line, "-") {
		return errors.New(strings.TrimSpace(line[1:]))
	}
	return nil
}

// CPUModel returns the host's CPU model and count, from /proc/cpuinfo.
func CPUModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "cpu unknown"
	}
	model, n := "", 0
	for line := range strings.Lines(string(b)) {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name":
			model = strings.TrimSpace(v)
		case "processor":
			n++
		}
	}
	return fmt.Sprintf("%d × %s", n, model)
}
