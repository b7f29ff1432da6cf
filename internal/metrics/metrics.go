// Package metrics exposes a disker instance to Prometheus and to health
// checks.
//
// [Metrics] turns the events of [disker.Config.OnEvent] into counters and
// handler-latency histograms, and reads [disker.Disker.LocalStats] at scrape
// time for the gauges (in-flight messages, concurrency). [Server] is the
// admin HTTP server of the long-running commands: /metrics, /healthz
// (liveness) and /readyz (readiness: the broker is reachable and the process
// is not stopping).
package metrics

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/diskerhq/disker"
)

// Namespace starts the name of every metric.
const Namespace = "disker"

// Metrics holds the collectors of one disker instance. Its methods are safe
// for concurrent use.
type Metrics struct {
	reg *prometheus.Registry

	sent, handled, failed, retried, deadLettered, expired *prometheus.CounterVec
	timedOut, replied, late                               *prometheus.CounterVec
	handlerSeconds                                        *prometheus.HistogramVec
	brokerUp                                              prometheus.Gauge
	httpRequests                                          *prometheus.CounterVec
	httpSeconds                                           *prometheus.HistogramVec

	available atomic.Bool

	mu    sync.Mutex
	stats func() disker.LocalStats
}

// New returns Metrics on a registry of its own, which also holds the Go
// runtime and process collectors.
func New() *Metrics {
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	m := &Metrics{
		reg:          prometheus.NewRegistry(),
		sent:         counter("messages_sent_total", "Messages this instance sent, by receiver.", "receiver"),
		handled:      counter("messages_handled_total", "Messages handled successfully, by receiver.", "receiver"),
		failed:       counter("messages_failed_total", "Handler calls that failed (errors and panics), by receiver.", "receiver"),
		retried:      counter("messages_retried_total", "Failed deliveries given back for another attempt, by receiver.", "receiver"),
		deadLettered: counter("messages_dead_lettered_total", "Messages moved to the dead-letter stream, by receiver.", "receiver"),
		expired:      counter("messages_expired_total", "Deliveries dropped because their deadline had passed, by receiver.", "receiver"),
		timedOut:     counter("messages_timed_out_total", "Timeout notices received for this instance's senders, by sender.", "sender"),
		replied:      counter("replies_total", "Replies the broker accepted from this instance, by the receiver that replied.", "receiver"),
		late:         counter("replies_late_total", "Replies dropped because their request was already settled, by the receiver that replied.", "receiver"),
		handlerSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "handler_duration_seconds",
			Help:    "How long handlers ran, by receiver and outcome (handled or failed).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"receiver", "outcome"}),
		brokerUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace, Name: "broker_up",
			Help: "1 while the broker (Redis) is reachable, 0 while it is not.",
		}),
		httpRequests: counter("gateway_requests_total", "HTTP requests the gateway answered, by status code.", "code"),
		httpSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "gateway_request_duration_seconds",
			Help:    "How long the gateway took to answer HTTP requests, by status code.",
			Buckets: prometheus.DefBuckets,
		}, []string{"code"}),
	}
	m.available.Store(true)
	m.brokerUp.Set(1)
	m.reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.sent, m.handled, m.failed, m.retried, m.deadLettered, m.expired,
		m.timedOut, m.replied, m.late, m.handlerSeconds, m.brokerUp,
		m.httpRequests, m.httpSeconds,
		&localCollector{m: m},
	)
	return m
}

// Registry returns the registry that holds the collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Observe records an event. Pass it as disker.Config.OnEvent.
func (m *Metrics) Observe(e disker.Event) {
	switch e.Kind {
	case disker.EventSent:
		m.sent.WithLabelValues(e.Receiver).Inc()
	case disker.EventHandled:
		m.handled.WithLabelValues(e.Receiver).Inc()
		m.handlerSeconds.WithLabelValues(e.Receiver, "handled").Observe(e.Duration.Seconds())
	case disker.EventFailed:
		m.failed.WithLabelValues(e.Receiver).Inc()
		m.handlerSeconds.WithLabelValues(e.Receiver, "failed").Observe(e.Duration.Seconds())
	case disker.EventRetried:
		m.retried.WithLabelValues(e.Receiver).Inc()
	case disker.EventDeadLettered:
		m.deadLettered.WithLabelValues(e.Receiver).Inc()
	case disker.EventExpired:
		m.expired.WithLabelValues(e.Receiver).Inc()
	case disker.EventTimedOut:
		m.timedOut.WithLabelValues(senderLabel(e.Sender)).Inc()
	case disker.EventReplied:
		m.replied.WithLabelValues(e.Receiver).Inc()
	case disker.EventLate:
		m.late.WithLabelValues(e.Receiver).Inc()
	case disker.EventUnavailable:
		m.available.Store(false)
		m.brokerUp.Set(0)
	case disker.EventAvailable:
		m.available.Store(true)
		m.brokerUp.Set(1)
	}
}

// BrokerAvailable reports whether the last word from the instance was that
// the broker is reachable.
func (m *Metrics) BrokerAvailable() bool { return m.available.Load() }

// ObserveHTTP records one HTTP request answered by a gateway.
func (m *Metrics) ObserveHTTP(code int, took time.Duration) {
	c := strconv.Itoa(code)
	m.httpRequests.WithLabelValues(c).Inc()
	m.httpSeconds.WithLabelValues(c).Observe(took.Seconds())
}

// WatchLocalStats makes scrapes read the gauges from stats, typically
// (*disker.Disker).LocalStats. Until it is called they are absent.
func (m *Metrics) WatchLocalStats(stats func() disker.LocalStats) {
	m.mu.Lock()
	m.stats = stats
	m.mu.Unlock()
}

// senderLabel keeps the private reply addresses of Request ("_inbox.ID",
// one per instance) from making a new series for every process.
func senderLabel(s string) string {
	if strings.HasPrefix(s, "_inbox.") {
		return "_inbox"
	}
	return s
}

var (
	inFlightDesc = prometheus.NewDesc(Namespace+"_in_flight",
		"Messages being handled now, by receiver.", []string{"receiver"}, nil)
	concurrencyDesc = prometheus.NewDesc(Namespace+"_concurrency",
		"Handler concurrency, by receiver.", []string{"receiver"}, nil)
)

// localCollector reads LocalStats at scrape time.
type localCollector struct{ m *Metrics }

func (c *localCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- inFlightDesc
	ch <- concurrencyDesc
}

func (c *localCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	stats := c.m.stats
	c.m.mu.Unlock()
	if stats == nil {
		return
	}
	for name, r := range stats().Receivers {
		ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(r.InFlight), name)
		ch <- prometheus.MustNewConstMetric(concurrencyDesc, prometheus.GaugeValue, float64(r.Concurrency), name)
	}
}
