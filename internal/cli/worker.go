package cli

import (
	"context"
	"fmt"
	"math"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/cli/metrics"
)

// headRoom is what an encoded HTTP message may add to its body: the head
// with the method, URL and headers.
const headRoom = 64 << 10

type workerOptions struct {
	conn        connFlags
	adm         adminFlags
	receiver    string
	execCmd     string
	shell       bool
	execTimeout time.Duration
	httpURL     string
	maxBody     byteSize
	concurrency int
	prefetch    int
	maxAttempts int
	lease       time.Duration
	exclusive   bool
	maxMsgSize  byteSize
	execEnv     []string
	stream      bool
	global      int
	rate        float64
	burst       int
	// The receiver's groups (disker send --group).
	groupConc        int
	groupRate        float64
	groupBurst       int
	groupSkipRetries bool
}

func (a *app) workerCommand() *cobra.Command {
	o := &workerOptions{maxBody: 1 << 20, maxMsgSize: disker.DefaultMaxMessageSize}
	cmd := &cobra.Command{
		Use:         "worker --receiver NAME (--exec CMD | --http URL)",
		Annotations: map[string]string{longRunning: "true"},
		Short:       "Serve a receiver with a command or a local HTTP service",
		Long: long(`Serve the receiver NAME: fetch its messages, handle up to --concurrency at a
time, and reply. Run as many workers as you like, on any machines: each
message goes to one of them at a time.

With --exec, each message runs the command: the message's content is its
stdin and its stdout is the reply. A non-zero exit is an error that carries
the tail of stderr. The command line is split into words like a shell does
for quotes ('...', "...", \) but runs without a shell: no variables, globs or
pipes. Use --shell to run it with "sh -c" instead. The command also finds
DISKER_MESSAGE_ID, DISKER_RECEIVER, DISKER_SENDER and DISKER_ATTEMPT in its
environment. It does not inherit Disker's own variables (DISKER_REDIS_URL,
with its password, and every other DISKER_*): name those it needs with
--exec-env. --exec-timeout kills it (and its children) after that long.

With --http, each message must be an HTTP request from "disker gateway". It is
forwarded to the service at URL (the request's path is appended to URL's path)
and the service's response, whatever its status, is the reply. Only a failure
to get a response (connection refused, the message's deadline) is an error.
The request carries X-Forwarded-For, X-Forwarded-Host, X-Disker-Message-Id and
X-Disker-Attempt.

With --stream, a message from a streaming caller (the gateway's requests that
accept text/event-stream, or RequestStream in Go) gets its reply in pieces as
they come: with --exec each line of the command's stdout, without its line
break, is a partial reply, and the final reply is empty; with --http each
chunk of the service's response body as it arrives is one, and the final
reply is the response with its status and headers and an empty body. Other
callers get the whole reply as without --stream.

--global-concurrency N limits the messages of the receiver handled at once
across every worker that serves it (give each the same N); --rate R limits
how many start per second across them all, with bursts of up to --burst
after a quiet spell. A message over a limit waits in the queue: it is not
fetched and uses no attempt. Both are kept in Redis, on Redis's clock; the
slots of a worker that dies come back after its --lease.

The messages sent with a group key (disker send --group KEY) are handled
one at a time per key, in the order sent, across every worker;
--group-concurrency N lets N of a key run at once, --group-rate R (with
bursts of --group-burst) limits how many of a key start per second, and
--group-skip-retries lets a key go on while one of its messages waits for a
retry. These are the receiver's settings, in Redis, set by each worker as
it starts: give every worker of the receiver the same ones.

An error is retried with backoff; after --max-attempts deliveries the message
moves to the dead-letter stream (see "disker dlq"). If a worker dies, its
messages go to another worker once their --lease runs out.

On SIGTERM or SIGINT the worker stops taking messages, lets those in flight
finish for up to --shutdown-timeout, leaves the rest to be redelivered, and
exits 0. A second signal exits at once.`),
		Example: `  # Upper-case every message's content
  disker worker --receiver upper --exec 'tr a-z A-Z'

  # A script run through sh, four at a time, killed after 10s
  disker worker --receiver thumbs --concurrency 4 --shell --exec-timeout 10s \
    --exec 'convert - -resize 128x128 png:-'

  # At most 5 at once and 200 per second across every worker of "mail"
  disker worker --receiver mail --global-concurrency 5 --rate 200 --burst 20 \
    --exec ./send-mail

  # Each customer's orders one at a time, in order, at most 2 per second
  disker worker --receiver orders --group-rate 2 --exec ./process-order

  # Serve HTTP requests from "disker gateway" with a local service
  disker worker --receiver web --http http://127.0.0.1:8000 --admin :9090`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runWorker(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.receiver, "receiver", "", "name of the receiver to serve (required)")
	fs.StringVar(&o.execCmd, "exec", "", "command to run for each message: content on stdin, reply from stdout")
	fs.BoolVar(&o.shell, "shell", false, `run the --exec command with "sh -c" (pipes, variables) instead of splitting it into words`)
	fs.StringArrayVar(&o.execEnv, "exec-env", nil, "pass this DISKER_ variable of the worker's environment on to the --exec command (repeatable; by default none is)")
	fs.DurationVar(&o.execTimeout, "exec-timeout", 0, "kill an --exec command that runs longer than this (0: only the message's own deadline)")
	fs.StringVar(&o.httpURL, "http", "", "URL of the local HTTP service to forward each request to")
	fs.BoolVar(&o.stream, "stream", false, "send a streaming caller the --exec command's stdout line by line, or the --http service's response body chunk by chunk, as partial replies")
	fs.Var(&o.maxBody, "max-body", "with --http, the largest response body passed back; a larger one gets 502")
	fs.IntVar(&o.concurrency, "concurrency", disker.DefaultConcurrency(), "how many messages to handle at a time")
	fs.IntVar(&o.prefetch, "prefetch", 0, "messages to fetch ahead of free handler slots, waiting in line here (for many short jobs)")
	fs.IntVar(&o.maxAttempts, "max-attempts", disker.DefaultMaxAttempts, "deliveries of a message before it is dead-lettered (1: no retry)")
	fs.DurationVar(&o.lease, "lease", disker.DefaultLease, "how long a message stays with this worker if it stops renewing (crash) before another worker gets it")
	fs.BoolVar(&o.exclusive, "exclusive", false, "let one worker at a time serve the receiver (the others stand by)")
	fs.Var(&o.maxMsgSize, "max-message-size", "largest message or reply content (with --exec, the largest stdout)")
	fs.IntVar(&o.global, "global-concurrency", 0, "handle at most this many messages of the receiver at once across all its workers (0: no such limit)")
	fs.Float64Var(&o.rate, "rate", 0, "start at most this many messages of the receiver per second across all its workers (0: no limit)")
	fs.IntVar(&o.burst, "burst", 1, "with --rate, how many may start at once after a quiet spell")
	fs.IntVar(&o.groupConc, "group-concurrency", 1, fmt.Sprintf("how many messages of one group key (send --group) may be out at once across all the receiver's workers, 1 to %d (1: in order)", disker.MaxGroupConcurrency))
	fs.Float64Var(&o.groupRate, "group-rate", 0, "start at most this many messages of one group key per second across all the receiver's workers (0: no limit)")
	fs.IntVar(&o.groupBurst, "group-burst", 1, "with --group-rate, how many of a key may start at once after a quiet spell")
	fs.BoolVar(&o.groupSkipRetries, "group-skip-retries", false, "let a group key go on while one of its messages waits for a retry (default: the key waits for it)")
	needs(cmd, "shell", "exec")
	needs(cmd, "exec-timeout", "exec")
	needs(cmd, "exec-env", "exec")
	needs(cmd, "max-body", "http")
	needs(cmd, "burst", "rate")
	needs(cmd, "group-burst", "group-rate")
	o.conn.register(fs)
	o.adm.register(fs)
	return cmd
}

func (a *app) runWorker(ctx context.Context, o *workerOptions) error {
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	if err := o.adm.check(); err != nil {
		return err
	}
	switch {
	case o.execCmd == "" && o.httpURL == "":
		return usagef("one of --exec or --http is required")
	case o.execCmd != "" && o.httpURL != "":
		return usagef("--exec and --http cannot be used together")
	case o.concurrency < 1:
		return usagef("invalid --concurrency %d: must be >= 1", o.concurrency)
	case o.prefetch < 0:
		return usagef("invalid --prefetch %d: must be >= 0", o.prefetch)
	case o.maxAttempts < 1:
		return usagef("invalid --max-attempts %d: must be >= 1", o.maxAttempts)
	case o.lease < time.Second:
		return usagef("invalid --lease %v: must be >= 1s", o.lease)
	case o.execTimeout < 0:
		return usagef("invalid --exec-timeout %v: must be >= 0", o.execTimeout)
	case o.maxBody < 1:
		return usagef("invalid --max-body %v: must be > 0", &o.maxBody)
	case o.maxMsgSize < 1 || o.maxMsgSize > disker.MaxMessageSizeLimit:
		return usagef("invalid --max-message-size %v: must be in 1..%d", &o.maxMsgSize, disker.MaxMessageSizeLimit)
	case o.global < 0 || o.global == 0 && a.set("global-concurrency"):
		return usagef("invalid --global-concurrency %d: must be >= 1", o.global)
	case !(o.rate >= 0) || math.IsInf(o.rate, 1) || o.rate == 0 && a.set("rate"):
		return usagef("invalid --rate %v: must be > 0", o.rate)
	case o.burst < 1:
		return usagef("invalid --burst %d: must be >= 1", o.burst)
	case o.groupConc < 1 || o.groupConc > disker.MaxGroupConcurrency:
		return usagef("invalid --group-concurrency %d: must be in 1..%d", o.groupConc, disker.MaxGroupConcurrency)
	case !(o.groupRate >= 0) || math.IsInf(o.groupRate, 1) || o.groupRate == 0 && a.set("group-rate"):
		return usagef("invalid --group-rate %v: must be > 0", o.groupRate)
	case o.groupBurst < 1:
		return usagef("invalid --group-burst %d: must be >= 1", o.groupBurst)
	}
	maxMsg := int(o.maxMsgSize)
	stopTracing, err := a.startTracing(ctx, "worker")
	if err != nil {
		return err
	}
	defer stopTracing()
	var (
		h    disker.Handler
		mode string
	)
	if o.execCmd != "" {
		argv := []string{"sh", "-c", o.execCmd}
		if !o.shell {
			var err error
			if argv, err = splitArgs(o.execCmd); err != nil {
				return usagef("invalid --exec %q: %v", o.execCmd, err)
			}
			if len(argv) == 0 {
				return usagef("invalid --exec: no command")
			}
		}
		for _, name := range o.execEnv {
			if !strings.HasPrefix(name, EnvPrefix) || strings.Contains(name, "=") {
				return usagef("invalid --exec-env %q: want the name of a %s variable, such as DISKER_KEY_PREFIX", name, EnvPrefix)
			}
		}
		h = &execHandler{argv: argv, timeout: o.execTimeout, maxReply: maxMsg, env: childEnv(os.Environ(), o.execEnv), stream: o.stream}
		mode = "exec"
	} else {
		base, err := url.Parse(o.httpURL)
		if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
			return usagef("invalid --http %q: want a URL such as http://127.0.0.1:8000", o.httpURL)
		}
		maxMsg = max(maxMsg, int(o.maxBody)+headRoom)
		hh := newHTTPHandler(base, o.concurrency, int64(o.maxBody))
		hh.stream = o.stream
		hh.client.Transport = a.traceTransport(hh.client.Transport)
		defer hh.client.CloseIdleConnections()
		h, mode = hh, "http"
	}

	m := metrics.New()
	var admin *metrics.Server
	if o.adm.admin != "" {
		if admin, err = metrics.Listen(o.adm.admin, m, a.log); err != nil {
			return listenError("admin", o.adm.admin, err)
		}
		defer admin.Close(context.Background())
	}
	d, err := a.connect(ctx, &o.conn, func(c *disker.Config) {
		c.OnEvent = a.observe(m.Observe)
		c.MaxMessageSize = maxMsg
	})
	if err != nil {
		return err
	}
	m.Watch(d)
	if o.adm.dashboard {
		stop, err := a.adminDashboard(admin, d)
		if err != nil {
			_ = closeDisker(d, o.adm.shutdownTimeout)
			return err
		}
		defer stop()
	}
	opts := []disker.HandleOption{
		disker.WithConcurrency(o.concurrency),
		disker.WithPrefetch(o.prefetch),
		disker.WithMaxAttempts(o.maxAttempts),
		disker.WithLease(o.lease),
	}
	if o.exclusive {
		opts = append(opts, disker.WithExclusive())
	}
	if o.global > 0 {
		opts = append(opts, disker.WithGlobalConcurrency(o.global))
	}
	if o.rate > 0 {
		opts = append(opts, disker.WithRateLimit(o.rate, o.burst))
	}
	opts = append(opts, disker.WithGroupConcurrency(o.groupConc))
	if o.groupRate > 0 {
		opts = append(opts, disker.WithGroupRate(o.groupRate, o.groupBurst))
	}
	if o.groupSkipRetries {
		opts = append(opts, disker.WithGroupSkipRetries())
	}
	if err := d.Handle(o.receiver, a.traceHandler(h), opts...); err != nil {
		_ = closeDisker(d, o.adm.shutdownTimeout)
		return err
	}
	if !a.waitVisible(ctx, d, o.receiver) {
		a.log.Warn("the registry of workers does not list this worker yet; senders may report no live worker", "receiver", o.receiver)
	}
	attrs := []any{"receiver", o.receiver, "mode", mode, "concurrency", o.concurrency, "global_concurrency", o.global, "rate", o.rate,
		"redis", redact(o.conn.redisURL), "instance", d.ID()}
	if admin != nil {
		attrs = append(attrs, "admin", admin.Addr())
	}
	a.log.Info("worker started", attrs...)

	<-ctx.Done()
	inFlight := d.LocalStats().Receivers[o.receiver].InFlight
	a.log.Info("stopping: no new messages; waiting for those in flight",
		"in_flight", inFlight, "shutdown_timeout", o.adm.shutdownTimeout)
	if admin != nil {
		admin.SetStopping()
	}
	start := time.Now()
	if err := closeDisker(d, o.adm.shutdownTimeout); err != nil {
		// What did not finish is redelivered after its lease: not a failure
		// of the stop.
		a.log.Warn("stopped before all in-flight messages finished; they will be redelivered",
			"err", err, "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	s := d.LocalStats().Receivers[o.receiver]
	a.log.Info("worker stopped", "took", time.Since(start).Round(time.Millisecond),
		"processed", s.Processed, "failed", s.Failed)
	return nil
}

// waitVisible waits until the registry of workers lists d as serving
// receiver (at d's next heartbeat), so that once the worker says it
// started, "disker send" and "disker stats" see it. It gives up after
// three heartbeat intervals or when ctx ends, and reports whether it saw it.
func (a *app) waitVisible(ctx context.Context, d *disker.Disker, receiver string) bool {
	deadline := time.Now().Add(3 * disker.DefaultHeartbeatInterval)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		ws, err := d.Workers(ctx)
		if err == nil && slices.ContainsFunc(ws, func(w disker.WorkerInfo) bool {
			return w.ID == d.ID() && slices.Contains(w.Receivers, receiver)
		}) {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return false
}

// closeDisker closes d, letting in-flight work finish for up to timeout.
func closeDisker(d *disker.Disker, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := d.Close(ctx); err != nil {
		return fmt.Errorf("close: %w", err)
	}
	return nil
}
