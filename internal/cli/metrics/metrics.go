// Package metrics exposes a disker instance to Prometheus and to health
// checks.
//
// [Metrics] holds a [diskerprom.Collector] (the counters, histograms and
// gauges of the instance, the same a library user registers), the Go
// runtime and process collectors, and the gateway's HTTP metrics, on a
// registry of its own. [Server] is the admin HTTP server of the
// long-running commands: /metrics, /healthz (liveness) and /readyz
// (readiness: the broker is reachable and the process is not stopping).
package metrics

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/diskerhq/disker/diskerprom"
)

// Namespace starts the name of every metric.
const Namespace = diskerprom.Namespace

// Metrics holds the collectors of one disker instance. Its methods are safe
// for concurrent use.
type Metrics struct {
	*diskerprom.Collector

	reg          *prometheus.Registry
	httpRequests *prometheus.CounterVec
	httpSeconds  *prometheus.HistogramVec
}

// New returns Metrics on a registry of its own, which also holds the Go
// runtime and process collectors. Its Observe goes in
// disker.Config.OnEvent, and Watch takes the instance.
func New() *Metrics {
	m := &Metrics{
		Collector: diskerprom.New(diskerprom.Options{}),
		reg:       prometheus.NewRegistry(),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "gateway_requests_total",
			Help: "HTTP requests the gateway answered, by status code.",
		}, []string{"code"}),
		httpSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "gateway_request_duration_seconds",
			Help:    "How long the gateway took to answer HTTP requests, by status code.",
			Buckets: prometheus.DefBuckets,
		}, []string{"code"}),
	}
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.Collector, m.httpRequests, m.httpSeconds,
	)
	return m
}

// Registry returns the registry that holds the collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveHTTP records one HTTP request answered by a gateway.
func (m *Metrics) ObserveHTTP(code int, took time.Duration) {
	c := strconv.Itoa(code)
	m.httpRequests.WithLabelValues(c).Inc()
	m.httpSeconds.WithLabelValues(c).Observe(took.Seconds())
}
