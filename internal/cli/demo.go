package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type demoOptions struct {
	conn        connFlags
	messages    int
	workers     int
	concurrency int
	rate        float64
	duration    time.Duration
	work        time.Duration
	timeout     time.Duration
}

func (a *app) demoCommand() *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:         "demo",
		Annotations: map[string]string{longRunning: "true"},
		Short:       "See Disker work: a dispatcher and a pool of workers, no setup",
		Long: long(`Run a dispatcher and a pool of workers in this process and watch them work.

With no flags it runs on the embedded in-memory broker: nothing to install.
The dispatcher sends a stream of --messages messages to the receiver "demo",
served by --workers Disker instances that each handle --concurrency at a time:
  - most are requests: the dispatcher waits for the reply (Request);
  - some are fire-and-forget: nobody waits, the workers just do them;
  - some are slow on purpose: their work outlasts their --timeout, so the
    dispatcher gets a timeout instead, and the worker's context ends with it.
A live view shows the progress, throughput, replies, timeouts and what each
worker did (redrawn in place on a terminal, one line per second otherwise),
then a summary. It ends by itself in a few seconds; exit status 0 means every
message got exactly the outcome it should.

With --redis-url URL (or DISKER_REDIS_URL) the same runs through Redis. Start
workers in other terminals ("disker worker --key-prefix disker-demo") to go
across processes and machines. At the end the demo deletes the keys of its
receiver "demo" from Redis.

"disker demo pool" shows the in-process pool (package pool) instead.`),
		Example: `  disker demo
  disker demo --messages 1000 --workers 5 --concurrency 8 --rate 500
  disker demo --redis-url redis://127.0.0.1:6379/0
  disker demo pool`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runDemo(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	o.conn.register(fs)
	// The demo runs on the embedded broker unless told otherwise, and keeps
	// its keys apart from a real deployment's.
	o.conn.redisURL, o.conn.keyPrefix = "", "disker-demo"
	fs.Lookup("redis-url").DefValue = ""
	fs.Lookup("redis-url").Usage = "run through this Redis (redis://host:port/db) instead of the embedded broker"
	fs.Lookup("key-prefix").DefValue = "disker-demo"
	fs.Lookup("key-prefix").Usage = "with --redis-url, the prefix of the demo's keys"
	fs.IntVar(&o.messages, "messages", 300, "how many messages to send")
	fs.IntVar(&o.workers, "workers", 3, "how many worker instances serve the receiver")
	fs.IntVar(&o.concurrency, "concurrency", 4, "messages each worker handles at a time")
	fs.Float64Var(&o.rate, "rate", 150, "messages sent per second (0: as fast as possible)")
	fs.DurationVar(&o.duration, "duration", 15*time.Second, "stop sending after this long even if not all messages are sent")
	fs.DurationVar(&o.work, "work", 20*time.Millisecond, "average time a worker spends on a message")
	fs.DurationVar(&o.timeout, "timeout", 300*time.Millisecond, "timeout of the slow messages (the others get 5s)")
	needs(cmd, "key-prefix", "redis-url")
	cmd.AddCommand(a.demoPoolCommand())
	return cmd
}

// Kinds of demo message, in the "kind" header.
const (
	kindRequest = "request"
	kindFire    = "fire-and-forget"
	kindSlow    = "slow"
)

// demoWorker is one worker instance of the demo and what it did.
type demoWorker struct {
	name    string
	d       *disker.Disker
	handled atomic.Int64
	fired   atomic.Int64
	gaveUp  atomic.Int64
}

// demoCounts are the dispatcher's counters.
type demoCounts struct {
	sent, requests, fired, slow atomic.Int64
	replies, timeouts, errors   atomic.Int64
	mu                          sync.Mutex
	latencies                   []time.Duration
	firstErr                    error
}

func (a *app) runDemo(ctx context.Context, o *demoOptions) error {
	switch {
	case o.messages < 1:
		return usagef("invalid --messages %d: must be >= 1", o.messages)
	case o.workers < 1:
		return usagef("invalid --workers %d: must be >= 1", o.workers)
	case o.concurrency < 1:
		return usagef("invalid --concurrency %d: must be >= 1", o.concurrency)
	case o.rate < 0:
		return usagef("invalid --rate %v: must be >= 0", o.rate)
	case o.duration <= 0:
		return usagef("invalid --duration %v: must be > 0", o.duration)
	case o.work < 0:
		return usagef("invalid --work %v: must be >= 0", o.work)
	case o.timeout < 10*time.Millisecond:
		return usagef("invalid --timeout %v: must be >= 10ms", o.timeout)
	}
	suffix := randomHex(4)
	onRedis := o.conn.redisURL != ""
	where := "the embedded in-memory broker"
	if !onRedis {
		o.conn.redisURL = "mem://demo-" + suffix
	} else {
		where = "Redis at " + redact(o.conn.redisURL)
	}
	cfg, u, err := a.brokerConfig(ctx, &o.conn)
	if err != nil {
		return err
	}
	// The instances log only errors, so that the live view stays readable.
	quiet, err := newLogger(a.stderr, a.logFormat, "error")
	if err != nil {
		return err
	}
	if a.log.Enabled(ctx, slog.LevelDebug) {
		quiet = a.log
	}
	cfg.Logger = quiet
	const receiver = "demo"

	// Runs last, once every instance is closed: whether to delete the
	// demo's keys is decided below.
	clean := false
	defer func() {
		if clean {
			a.demoCleanup(cfg)
		}
	}()
	workers := make([]*demoWorker, o.workers)
	defer func() {
		for _, w := range workers {
			if w != nil {
				_ = closeDisker(w.d, 5*time.Second)
			}
		}
	}()
	for i := range workers {
		w := &demoWorker{name: fmt.Sprintf("worker-%d", i+1)}
		c := cfg
		c.InstanceID = "demo-" + suffix + "-" + w.name
		if w.d, err = openDisker(ctx, c, u); err != nil {
			return err
		}
		workers[i] = w
		if err := w.d.Handle(receiver, disker.HandlerFunc(w.handle(o.work)), disker.WithConcurrency(o.concurrency)); err != nil {
			return err
		}
	}
	c := cfg
	c.InstanceID = "demo-" + suffix + "-dispatcher"
	dispatcher, err := openDisker(ctx, c, u)
	if err != nil {
		return err
	}
	defer closeDisker(dispatcher, 5*time.Second)
	if onRedis {
		names, err := dispatcher.Receivers(ctx)
		if err != nil {
			return err
		}
		clean = !slices.ContainsFunc(names, func(n string) bool { return n != receiver })
		if !clean {
			a.log.Warn("other receivers live under --key-prefix: the demo will leave its keys in place", "key_prefix", cfg.KeyPrefix, "receivers", names)
		}
	}

	fmt.Fprintf(a.stdout, "disker demo: a dispatcher sends %d messages to %q, served by %d workers × %d at a time, on %s.\n\n",
		o.messages, receiver, o.workers, o.concurrency, where)

	counts := &demoCounts{}
	view := newDemoView(a.stdout, o, workers, counts)
	start := time.Now()
	viewDone := make(chan struct{})
	stopView := make(chan struct{})
	go func() {
		defer close(viewDone)
		view.run(stopView)
	}()

	a.dispatch(ctx, dispatcher, receiver, o, counts)
	// Wait (briefly) for the workers to finish the fire-and-forget messages:
	// nobody waits for them, but the summary counts them.
	fired := counts.fired.Load()
	deadline := time.Now().Add(5 * time.Second)
	for ctx.Err() == nil && time.Now().Before(deadline) && sumFired(workers) < fired {
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)
	close(stopView)
	<-viewDone
	a.demoSummary(o, workers, counts, elapsed)
	if err := ctx.Err(); err != nil {
		return errors.New("demo: interrupted")
	}
	if n := counts.errors.Load(); n > 0 {
		return fmt.Errorf("demo: %d messages failed; first: %w", n, counts.firstErr)
	}
	if sumFired(workers) < fired {
		return fmt.Errorf("demo: only %d of %d fire-and-forget messages were handled", sumFired(workers), fired)
	}
	return nil
}

// randomHex returns n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func sumFired(ws []*demoWorker) int64 {
	var n int64
	for _, w := range ws {
		n += w.fired.Load()
	}
	return n
}

// handle is the demo's handler: it "works" for about work (or, for a slow
// message, until its deadline) and replies with the content upper-cased.
func (w *demoWorker) handle(work time.Duration) func(ctx context.Context, m *disker.Message) ([]byte, error) {
	return func(ctx context.Context, m *disker.Message) ([]byte, error) {
		d := work/2 + time.Duration(mrand.Int64N(int64(work)+1))
		if m.Headers["kind"] == kindSlow {
			d = time.Hour // stops when the message's deadline ends ctx
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			w.gaveUp.Add(1)
			return nil, ctx.Err()
		}
		w.handled.Add(1)
		if !m.ExpectsReply() {
			w.fired.Add(1)
		}
		return append([]byte(w.name+": "), bytes.ToUpper(m.Content)...), nil
	}
}

// dispatch sends the demo's messages at o.rate and waits for the outcomes.
func (a *app) dispatch(ctx context.Context, d *disker.Disker, receiver string, o *demoOptions, c *demoCounts) {
	ctx, cancel := context.WithTimeout(ctx, o.duration)
	defer cancel()
	var tick <-chan time.Time
	if o.rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / o.rate))
		defer t.Stop()
		tick = t.C
	}
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	defer wg.Wait()
	for i := range o.messages {
		if tick != nil {
			select {
			case <-tick:
			case <-ctx.Done():
				return
			}
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		kind := kindRequest
		switch r := mrand.IntN(20); {
		case r >= 17:
			kind = kindSlow
		case r >= 12:
			kind = kindFire
		}
		content := fmt.Appendf(nil, "message %d", i+1)
		wg.Go(func() {
			defer func() { <-sem }()
			c.send(ctx, d, receiver, kind, content, o.timeout)
		})
	}
}

func (c *demoCounts) send(ctx context.Context, d *disker.Disker, receiver, kind string, content []byte, slowTimeout time.Duration) {
	if kind == kindFire {
		_, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: content, Headers: map[string]string{"kind": kind}})
		c.sent.Add(1)
		if err != nil {
			c.fail(err)
			return
		}
		c.fired.Add(1)
		return
	}
	timeout := 5 * time.Second
	if kind == kindSlow {
		timeout = slowTimeout
		c.slow.Add(1)
	} else {
		c.requests.Add(1)
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	start := time.Now()
	c.sent.Add(1)
	_, err := d.Request(rctx, disker.Message{Receiver: receiver, Content: content, Headers: map[string]string{"kind": kind}})
	switch {
	case err == nil && kind == kindSlow:
		c.fail(errors.New("a slow message got a reply before its timeout"))
	case err == nil:
		c.replies.Add(1)
		c.mu.Lock()
		c.latencies = append(c.latencies, time.Since(start))
		c.mu.Unlock()
	case errors.Is(err, disker.ErrTimeout) && kind == kindSlow:
		c.timeouts.Add(1)
	default:
		c.fail(err)
	}
}

func (c *demoCounts) fail(err error) {
	c.errors.Add(1)
	c.mu.Lock()
	if c.firstErr == nil {
		c.firstErr = err
	}
	c.mu.Unlock()
}

// demoView draws the live view.
type demoView struct {
	w       io.Writer
	term    bool
	o       *demoOptions
	workers []*demoWorker
	c       *demoCounts
	start   time.Time
	lines   int
}

func newDemoView(w io.Writer, o *demoOptions, workers []*demoWorker, c *demoCounts) *demoView {
	return &demoView{w: w, term: isTerminal(w), o: o, workers: workers, c: c, start: time.Now()}
}

func (v *demoView) run(stop <-chan struct{}) {
	period := time.Second
	if v.term {
		period = 100 * time.Millisecond
	}
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-stop:
			if v.term {
				v.draw()
			}
			return
		case <-t.C:
			v.draw()
		}
	}
}

func (v *demoView) draw() {
	el := time.Since(v.start)
	sent := v.c.sent.Load()
	var handled int64
	for _, w := range v.workers {
		handled += w.handled.Load()
	}
	rate := float64(handled) / max(el.Seconds(), 1e-3)
	if !v.term {
		var per []string
		for _, w := range v.workers {
			per = append(per, fmt.Sprintf("%s=%d", w.name, w.handled.Load()))
		}
		fmt.Fprintf(v.w, "[%5.1fs] sent %d/%d  replies %d  fire-and-forget %d  timeouts %d  errors %d  %.0f msg/s  %s\n",
			el.Seconds(), sent, v.o.messages, v.c.replies.Load(), sumFired(v.workers), v.c.timeouts.Load(),
			v.c.errors.Load(), rate, strings.Join(per, " "))
		return
	}
	var b strings.Builder
	if v.lines > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", v.lines)
	}
	line := func(format string, args ...any) {
		b.WriteString("\r\x1b[2K")
		fmt.Fprintf(&b, format, args...)
		b.WriteByte('\n')
	}
	line("  progress    %s %d/%d sent   %.1fs", bar(int(sent), v.o.messages, 30), sent, v.o.messages, el.Seconds())
	line("  throughput  %.0f messages handled/s", rate)
	line("  replies     %-6d fire-and-forget %-6d timeouts %-6d errors %d",
		v.c.replies.Load(), sumFired(v.workers), v.c.timeouts.Load(), v.c.errors.Load())
	var most int64 = 1
	for _, w := range v.workers {
		most = max(most, w.handled.Load())
	}
	for _, w := range v.workers {
		n := w.handled.Load()
		line("  %-10s  %s %d", w.name, bar(int(n), int(most), 20), n)
	}
	v.lines = 3 + len(v.workers)
	io.WriteString(v.w, b.String())
}

// bar draws a bar of width cells, n of total filled.
func bar(n, total, width int) string {
	filled := 0
	if total > 0 {
		filled = min(width, n*width/total)
	}
	return "[" + strings.Repeat("#", filled) + strings.Repeat(".", width-filled) + "]"
}

func (a *app) demoSummary(o *demoOptions, workers []*demoWorker, c *demoCounts, elapsed time.Duration) {
	c.mu.Lock()
	lat := slices.Clone(c.latencies)
	c.mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(math.Ceil(p*float64(len(lat))))-1)].Round(100 * time.Microsecond)
	}
	var handled int64
	var per []string
	for _, w := range workers {
		handled += w.handled.Load()
		per = append(per, fmt.Sprintf("%s %d", w.name, w.handled.Load()))
	}
	w := a.stdout
	fmt.Fprintf(w, "\nSummary\n")
	fmt.Fprintf(w, "  sent             %d of %d messages in %.2fs; workers handled %d (%.0f/s)\n",
		c.sent.Load(), o.messages, elapsed.Seconds(), handled, float64(handled)/max(elapsed.Seconds(), 1e-3))
	fmt.Fprintf(w, "  replies          %d of %d requests (latency p50 %v, p99 %v)\n", c.replies.Load(), c.requests.Load(), pct(0.50), pct(0.99))
	fmt.Fprintf(w, "  fire-and-forget  %d of %d handled, no reply expected\n", sumFired(workers), c.fired.Load())
	var gaveUp int64
	for _, wk := range workers {
		gaveUp += wk.gaveUp.Load()
	}
	fmt.Fprintf(w, "  timeouts         %d of %d slow messages timed out after %v; the workers stopped %d at the deadline\n",
		c.timeouts.Load(), c.slow.Load(), o.timeout, gaveUp)
	fmt.Fprintf(w, "  errors           %d\n", c.errors.Load())
	fmt.Fprintf(w, "  per worker       %s\n", strings.Join(per, ", "))
	if strings.HasPrefix(o.conn.redisURL, "mem://") {
		fmt.Fprintf(w, "\nNext: run it through Redis with \"disker demo --redis-url redis://127.0.0.1:6379/0\",\nor see the pool story with \"disker demo pool\".\n")
	}
}

// demoCleanup deletes every key under the demo's key prefix from the Redis
// of cfg (its own keys: runDemo checked that no other receiver uses the
// prefix).
func (a *app) demoCleanup(cfg disker.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := deleteKeys(ctx, cfg.RedisURL, cfg.TLSConfig, cfg.KeyPrefix+":*")
	if err != nil {
		a.log.Warn("could not delete the demo's keys", "key_prefix", cfg.KeyPrefix, "deleted", n, "err", err)
		return
	}
	a.log.Info("deleted the demo's keys", "key_prefix", cfg.KeyPrefix, "deleted", n)
}

// deleteKeys deletes the keys that match pattern on every node of the
// Redis at rawURL and returns how many it deleted.
func deleteKeys(ctx context.Context, rawURL string, tc *tls.Config, pattern string) (int, error) {
	opt, err := rueidis.ParseURL(rawURL)
	if err != nil {
		return 0, err
	}
	if tc != nil {
		opt.TLSConfig = tc
	}
	opt.DisableCache = true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return 0, err
	}
	defer client.Close()
	n := 0
	for _, node := range client.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				return n, err
			}
			for _, k := range e.Elements {
				// One key at a time: in a cluster, keys of a batch may
				// hash to different slots.
				if err := node.Do(ctx, node.B().Unlink().Key(k).Build()).Error(); err != nil {
					return n, err
				}
				n++
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	return n, nil
}
