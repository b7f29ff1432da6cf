package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Server is the admin HTTP server of a long-running command:
//
//   - /metrics: the Prometheus metrics of a [Metrics];
//   - /healthz: liveness, 200 "ok" while the process runs, 503 "stopping" once
//     it has begun a graceful stop;
//   - /readyz: readiness, 200 "ready" while it takes work and the broker is
//     reachable, 503 otherwise with the reason.
type Server struct {
	srv      *http.Server
	mux      *http.ServeMux
	ln       net.Listener
	m        *Metrics
	stopping atomic.Bool
	done     chan struct{}
	err      error
	once     sync.Once
}

// Listen binds addr (such as ":9090" or "127.0.0.1:0") and starts serving
// in a goroutine that Close waits for. The error names a bad or busy address.
func Listen(addr string, m *Metrics, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: admin server: %w", err)
	}
	mux := http.NewServeMux()
	s := &Server{ln: ln, m: m, mux: mux, done: make(chan struct{})}
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry(), promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelError),
	}))
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	s.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go func() {
		defer close(s.done)
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.err = err
		}
	}()
	return s, nil
}

// Handle serves h for pattern (as http.ServeMux.Handle) beside the admin
// endpoints, such as the dashboard under "/dashboard/".
func (s *Server) Handle(pattern string, h http.Handler) { s.mux.Handle(pattern, h) }

// Addr returns the address the server listens on.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// SetStopping makes /healthz and /readyz answer 503: the process is
// stopping and takes no new work.
func (s *Server) SetStopping() { s.stopping.Store(true) }

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if s.stopping.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "stopping")
		return
	}
	fmt.Fprintln(w, "ok")
}

func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch {
	case s.stopping.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "stopping")
	case !s.m.BrokerAvailable():
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "broker unavailable")
	default:
		fmt.Fprintln(w, "ready")
	}
}

// Close stops the server, letting scrapes in progress finish until ctx
// ends, and waits for its goroutine. It is safe to call more than once.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.once.Do(func() {
		s.stopping.Store(true)
		if err = s.srv.Shutdown(ctx); err != nil {
			err = errors.Join(err, s.srv.Close())
		}
		<-s.done
		if s.err != nil {
			err = errors.Join(err, s.err)
		}
		if err != nil {
			err = fmt.Errorf("metrics: admin server: %w", err)
		}
	})
	return err
}
