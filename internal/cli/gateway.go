package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/cli/metrics"
	"github.com/diskerhq/disker/internal/httpmsg"
)

// maxHeaderBytes bounds the request line and headers the gateway accepts.
const maxHeaderBytes = 32 << 10

type gatewayOptions struct {
	conn     connFlags
	adm      adminFlags
	listen   string
	receiver string
	timeout  time.Duration
	maxBody  byteSize
	readTime time.Duration
	// asyncRetention is --async-retention: 0 serves no asynchronous
	// requests (gatewayasync.go).
	asyncRetention time.Duration
}

func (a *app) gatewayCommand() *cobra.Command {
	o := &gatewayOptions{maxBody: 1 << 20}
	cmd := &cobra.Command{
		Use:         "gateway --listen ADDR --receiver NAME",
		Annotations: map[string]string{longRunning: "true"},
		Short:       "Serve HTTP: each request becomes a message, the reply its response",
		Long: long(`Run an HTTP server in front of the workers of a receiver. Each HTTP request
(method, path, query, headers, body) becomes a message to NAME; the reply of
the worker that handled it ("disker worker --http") becomes the response:
status, headers and body.

  504 Gateway Timeout        no reply within --timeout
  413 Content Too Large      a request body over --max-body
  408 Request Timeout        the request (headers and body) not received
                             within --read-timeout; the connection is closed
  431                        request line and headers over 32 KiB
  503 Service Unavailable    Redis cannot be reached, or the gateway is stopping
  503 also                   Redis refused the gateway's credentials
  502 Bad Gateway            the message failed on every attempt and was
                             dead-lettered, or the reply is not an HTTP response;
                             the body gives a request id, the log the reason
                             (the dead letter carries the id in its
                             "request-id" header: "disker dlq list --json")

A request with an Idempotency-Key header is sent with that key: requests with
the same key, through any gateway, within 24 hours of the first, share one run
of the worker and get its one response (the first's, waiting for it if it is
still running). A client may so retry a POST safely.

A request with "Accept: text/event-stream" gets the worker's partial replies
("disker worker --stream") as server-sent events as they come ("partial"), and
a Go handler's progress ("progress"), then one final event, "reply" or "error".

Run several gateways and several workers on different machines, all on the
same Redis, and you have a distributed HTTP tier. Hop-by-hop headers
(Connection, Transfer-Encoding, ...) are not forwarded; X-Forwarded-For,
X-Forwarded-Host and X-Forwarded-Proto are added.

On SIGTERM or SIGINT the gateway stops accepting connections, lets requests in
progress finish for up to --shutdown-timeout, and exits 0. A second signal
exits at once.`),
		Example: `  disker gateway --listen :8080 --receiver web --timeout 10s
  disker worker --receiver web --http http://127.0.0.1:8000
  curl -i http://localhost:8080/hello?name=you`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runGateway(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.listen, "listen", ":8080", "address to serve HTTP on")
	fs.StringVar(&o.receiver, "receiver", "", "name of the receiver whose workers handle the requests (required)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for a worker's reply before answering 504")
	fs.Var(&o.maxBody, "max-body", "largest request body accepted; a larger one gets 413")
	fs.DurationVar(&o.readTime, "read-timeout", time.Minute, "time a client has to send the whole request, body included; a slower one gets 408 and its connection is closed")
	fs.DurationVar(&o.asyncRetention, "async-retention", 0, `answer a request with "Prefer: respond-async" at once (202, its status URL in Location) and keep its result this long (0: no asynchronous requests; at most 720h)`)
	o.conn.register(fs)
	o.adm.register(fs)
	return cmd
}

func (a *app) runGateway(ctx context.Context, o *gatewayOptions) error {
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	if err := o.adm.check(); err != nil {
		return err
	}
	if err := checkAddr("listen", o.listen); err != nil {
		return err
	}
	switch {
	case o.timeout <= 0:
		return usagef("invalid --timeout %v: must be > 0", o.timeout)
	case o.readTime <= 0:
		return usagef("invalid --read-timeout %v: must be > 0", o.readTime)
	case o.asyncRetention < 0 || o.asyncRetention > 0 && o.asyncRetention < time.Millisecond || o.asyncRetention > disker.MaxRetention:
		return usagef("invalid --async-retention %v: must be from 1ms to %v (0: none)", o.asyncRetention, disker.MaxRetention)
	case o.maxBody < 1 || int(o.maxBody)+headRoom > disker.MaxMessageSizeLimit:
		return usagef("invalid --max-body %v: must be in 1..%d", &o.maxBody, disker.MaxMessageSizeLimit-headRoom)
	}
	stopTracing, err := a.startTracing(ctx, "gateway")
	if err != nil {
		return err
	}
	defer stopTracing()
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
		c.MaxMessageSize = int(o.maxBody) + headRoom
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
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		_ = closeDisker(d, o.adm.shutdownTimeout)
		return listenError("listen", o.listen, err)
	}
	g := &gateway{d: d, receiver: o.receiver, timeout: o.timeout, maxBody: int64(o.maxBody), log: a.log, m: m, tracer: a.tracer,
		asyncRetention: o.asyncRetention}
	srv := &http.Server{
		Handler:           a.traceHTTP(g),
		ReadHeaderTimeout: min(10*time.Second, o.readTime),
		// The whole request, body included: a client that sends its body
		// a byte at a time cannot hold a connection and a goroutine for
		// ever. (Reading the response's end does not count: the server
		// lifts the deadline once the body is read.)
		ReadTimeout: o.readTime,
		IdleTimeout: 120 * time.Second,
		// Headers fit in the room a message keeps beside the body; larger
		// ones get 431.
		MaxHeaderBytes: maxHeaderBytes,
		ErrorLog:       slog.NewLogLogger(a.log.Handler(), slog.LevelDebug),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	attrs := []any{"listen", ln.Addr().String(), "receiver", o.receiver, "timeout", o.timeout,
		"read_timeout", o.readTime, "redis", redact(o.conn.redisURL)}
	if admin != nil {
		attrs = append(attrs, "admin", admin.Addr())
	}
	a.log.Info("gateway started", attrs...)

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	if admin != nil {
		admin.SetStopping()
	}
	a.log.Info("stopping: no new connections; waiting for requests in progress", "shutdown_timeout", o.adm.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), o.adm.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		a.log.Warn("requests still in progress at the end of --shutdown-timeout were cut off", "err", err)
		_ = srv.Close()
	}
	if serveErr == nil {
		serveErr = <-served
	}
	if err := d.Close(sctx); err != nil {
		a.log.Warn("close", "err", err)
	}
	if serveErr != nil && !errors.Is(serveErr, http.ErrServerClosed) {
		return fmt.Errorf("gateway: %w", serveErr)
	}
	a.log.Info("gateway stopped")
	return nil
}

// gateway turns HTTP requests into requests to a receiver.
type gateway struct {
	d        *disker.Disker
	receiver string
	timeout  time.Duration
	maxBody  int64
	log      *slog.Logger
	m        *metrics.Metrics
	tracer   Tracer // nil: no tracing
	// asyncRetention is how long the results of asynchronous requests
	// are kept; 0: none are served (gatewayasync.go).
	asyncRetention time.Duration
}

func (g *gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	code := g.serve(w, r)
	took := time.Since(start)
	g.m.ObserveHTTP(code, took)
	g.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", code,
		"took", took.Round(time.Microsecond), "remote", r.RemoteAddr)
}

// serve answers r and returns the status code it sent.
func (g *gateway) serve(w http.ResponseWriter, r *http.Request) int {
	if g.asyncRetention > 0 && strings.HasPrefix(r.URL.Path, resultsPath) {
		return g.serveResult(w, r)
	}
	if r.ContentLength > g.maxBody {
		return g.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over the limit of %d", r.ContentLength, g.maxBody), nil)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.maxBody))
	if err != nil {
		var (
			mbe *http.MaxBytesError
			ne  net.Error
		)
		if errors.As(err, &mbe) {
			return g.fail(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is over the limit of %d bytes", g.maxBody), nil)
		}
		if errors.As(err, &ne) && ne.Timeout() {
			w.Header().Set("Connection", "close")
			return g.fail(w, r, http.StatusRequestTimeout, "the request body did not arrive within --read-timeout", nil)
		}
		return g.fail(w, r, http.StatusBadRequest, "cannot read the request body", err)
	}
	in := httpmsg.NewRequest(r, body)
	in.Header = r.Header.Clone()
	if in.Header == nil {
		in.Header = http.Header{}
	}
	proto := "http"
	if r.TLS != nil {
		proto = "https"
	}
	if in.Header.Get("X-Forwarded-Proto") == "" {
		in.Header.Set("X-Forwarded-Proto", proto)
	}
	content, err := httpmsg.EncodeRequest(in)
	if err != nil {
		return g.fail(w, r, http.StatusBadRequest, "the request cannot be forwarded", err)
	}
	ctx, cancel := context.WithTimeout(r.Context(), g.timeout)
	defer cancel()
	// The request's id, in its message's "request-id" header: what a 502
	// answer quotes and the log and the dead letter carry.
	reqID := randomHex(8)
	var opts []disker.SendOption
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		// Requests with the key share one run of the handler and its
		// reply (see disker.WithIdempotencyKey).
		if len(key) > disker.MaxKeyLen {
			return g.fail(w, r, http.StatusBadRequest, fmt.Sprintf("the Idempotency-Key header is over %d bytes", disker.MaxKeyLen), nil)
		}
		opts = append(opts, disker.WithIdempotencyKey(key))
	}
	if key, ok := r.Header[groupHeader]; ok {
		// Requests with the key run one at a time, in order (see
		// disker.WithGroup).
		switch {
		case len(key) != 1 || key[0] == "":
			return g.fail(w, r, http.StatusBadRequest, "the "+groupHeader+" header must be given once, not empty", nil)
		case len(key[0]) > disker.MaxKeyLen:
			return g.fail(w, r, http.StatusBadRequest, fmt.Sprintf("the %s header is over %d bytes", groupHeader, disker.MaxKeyLen), nil)
		}
		opts = append(opts, disker.WithGroup(key[0]))
	}
	msg := disker.Message{Receiver: g.receiver, Content: content, Headers: map[string]string{"request-id": reqID}}
	if wantsEvents(r) {
		if r.Header.Get("Idempotency-Key") != "" {
			return g.fail(w, r, http.StatusBadRequest, "the Idempotency-Key header does not go with Accept: text/event-stream: requests with one key share one reply, not one stream", nil)
		}
		return g.serveEvents(ctx, w, r, msg, opts, reqID)
	}
	var reply *disker.Message
	if g.asyncRetention > 0 && wantsAsync(r) {
		var code int
		if code, err = g.sendAsync(ctx, w, msg, opts); err == nil {
			return code
		}
	} else {
		reply, err = g.request(ctx, msg, opts...)
	}
	if err != nil {
		if r.Context().Err() != nil {
			// The client went away: nobody reads an answer.
			g.log.Debug("client gone before the reply", "path", r.URL.Path)
			return 499
		}
		code, text, cause := g.failure(err, reqID)
		return g.fail(w, r, code, text, cause)
	}
	resp, err := httpmsg.DecodeResponse(reply.Content)
	if err != nil {
		return g.fail(w, r, http.StatusBadGateway, "the worker's reply is not an HTTP response (request id "+reqID+")",
			fmt.Errorf("%w (is the worker \"disker worker --http\"?)", err))
	}
	h := w.Header()
	for k, vs := range resp.Header {
		h[k] = vs
	}
	switch {
	case r.Method == http.MethodHead || resp.Status == http.StatusNotModified:
		// The length, if any, is that of the body a GET would get: kept.
	case resp.Status == http.StatusNoContent || resp.Status < 200:
		h.Del("Content-Length")
	default:
		// The body is known in full: its length, whatever its size (net/http
		// sets one itself only for a body that fits its first buffer, and
		// chunks a larger one).
		h.Set("Content-Length", strconv.Itoa(len(resp.Body)))
	}
	w.WriteHeader(resp.Status)
	if _, err := w.Write(resp.Body); err != nil {
		g.log.Debug("write response", "err", err)
	}
	return resp.Status
}

// failure returns the status, the client's text and the error to log
// (nil: none) of a request that failed with err; reqID is its id.
func (g *gateway) failure(err error, reqID string) (int, string, error) {
	var (
		re *disker.RemoteError
		ve *disker.ValidationError
	)
	switch {
	case errors.Is(err, disker.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, fmt.Sprintf("no reply from a worker of %q within %v", g.receiver, g.timeout), nil
	case isAuthError(err.Error()):
		// Refused before it was queued: like an unreachable broker
		// (the library says ErrUnavailable too), and the gateway's
		// operator must act.
		return http.StatusServiceUnavailable, "the message broker refused the gateway's credentials", err
	case errors.Is(err, disker.ErrUnavailable):
		return http.StatusServiceUnavailable, "the message broker cannot be reached", err
	case errors.Is(err, disker.ErrClosed):
		return http.StatusServiceUnavailable, "the gateway is stopping", nil
	case errors.Is(err, disker.ErrCancelled):
		// Cancelled by someone else (disker cancel) before a worker
		// answered.
		return http.StatusServiceUnavailable, "the request was cancelled (disker cancel) before a worker answered", nil
	case errors.As(err, &re):
		// The reason may name internal addresses: it goes to the log,
		// the client gets the id to quote.
		return http.StatusBadGateway, "the request failed in the worker (request id " + reqID + ")", fmt.Errorf("%s (request id %s)", re.Text, reqID)
	case errors.As(err, &ve):
		return http.StatusRequestEntityTooLarge, "the request cannot be sent: " + ve.Reason, nil
	default:
		return http.StatusInternalServerError, "the request could not be sent", err
	}
}

// groupHeader is the header whose value is the request's group key
// (disker.WithGroup): the requests of one key run one at a time, in the
// order the gateway sent them.
const groupHeader = "Disker-Group"

// fail answers with a plain-text error and logs it.
func (g *gateway) fail(w http.ResponseWriter, r *http.Request, code int, text string, err error) int {
	g.logFailure(r, code, text, err)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	fmt.Fprintf(w, "disker gateway: %s\n", strings.TrimSpace(text))
	return code
}
