// Package diskerprom exposes a disker instance to Prometheus: a [Collector]
// that a program registers on its own registry. The disker command's
// /metrics serves the same metrics, under the same names.
//
// The counters and the handler-latency histogram come from the events of
// disker.Config.OnEvent (pass [Collector.Observe]); the gauges are read at
// scrape time from the instance given to [Collector.Watch]: in flight and
// concurrency from LocalStats (no I/O), and the queue depth of each receiver
// from Stats (one round trip to the broker per receiver):
//
//	c := diskerprom.New(diskerprom.Options{})
//	d, err := disker.New(ctx, disker.Config{RedisURL: url, OnEvent: c.Observe})
//	...
//	c.Watch(d)
//	reg := prometheus.NewRegistry()
//	reg.MustRegister(c)
//	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
//
// The metrics, all prefixed "disker_":
//
//	messages_sent_total{receiver}            counter   messages this instance sent
//	messages_handled_total{receiver}         counter   messages handled successfully
//	messages_failed_total{receiver}          counter   handler calls that failed
//	messages_retried_total{receiver}         counter   failed deliveries given back for a retry
//	messages_dead_lettered_total{receiver}   counter   messages moved to the dead-letter stream
//	messages_expired_total{receiver}         counter   deliveries this instance dropped past their deadline or expiry
//	messages_timed_out_total{sender}         counter   timeouts received by this instance's senders
//	replies_total{receiver}                  counter   replies the broker accepted from this instance
//	replies_late_total{receiver}             counter   replies dropped, their request already settled
//	handler_duration_seconds{receiver,outcome} histogram  handler run time (handled, failed)
//	broker_up                                gauge     1 while the broker is reachable
//	in_flight{receiver}                      gauge     messages being handled now
//	concurrency{receiver}                    gauge     handler concurrency
//	queue_queued{receiver}                   gauge     messages waiting for a worker
//	queue_pending{receiver}                  gauge     messages delivered, not yet acknowledged
//	queue_dead_letters{receiver}             gauge     messages in the dead-letter stream
//	queue_paused{receiver}                   gauge     1 while the receiver is paused (Pause)
//	queue_deferred{receiver}                 gauge     messages sent for later, not due yet
//	queue_expired_total{receiver}            counter   messages dropped past their deadline or expiry, by every instance
//	queue_stats_errors_total                 counter   scrapes that could not read a queue's depth
package diskerprom

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/diskerhq/disker"
)

// Namespace starts the name of every metric.
const Namespace = "disker"

// DefaultStatsTimeout bounds the broker reads of one scrape unless
// Options.StatsTimeout says otherwise.
const DefaultStatsTimeout = 5 * time.Second

// Options configure a Collector.
type Options struct {
	// Receivers are receivers whose queue depth is reported besides those
	// the watched instance serves, such as the receivers a producer sends
	// to. Empty means only those served.
	Receivers []string
	// AllReceivers reports the queue depth of every receiver the broker
	// knows (Disker.Receivers), instead of those served and Receivers:
	// one more round trip per scrape. Use it in one place, such as a
	// program that only watches, not in every worker.
	AllReceivers bool
	// StatsTimeout bounds the broker reads of one scrape; 0 means
	// DefaultStatsTimeout.
	StatsTimeout time.Duration
}

// Source is what a Collector reads at scrape time: a *disker.Disker.
type Source interface {
	LocalStats() disker.LocalStats
	Receivers(ctx context.Context) ([]string, error)
	Stats(ctx context.Context, receiver string) (disker.ReceiverStats, error)
}

// Collector is a prometheus.Collector of one disker instance. Register it
// on as many registries as you like. Its methods are safe for concurrent
// use.
type Collector struct {
	opts Options

	sent, handled, failed, retried, deadLettered, expired *prometheus.CounterVec
	timedOut, replied, late                               *prometheus.CounterVec
	handlerSeconds                                        *prometheus.HistogramVec
	brokerUp                                              prometheus.Gauge
	statsErrors                                           prometheus.Counter
	vecs                                                  []prometheus.Collector

	available atomic.Bool

	mu  sync.Mutex
	src Source
}

// New returns a Collector. Call Watch to add the gauges read from an
// instance.
func New(opts Options) *Collector {
	if opts.StatsTimeout <= 0 {
		opts.StatsTimeout = DefaultStatsTimeout
	}
	opts.Receivers = slices.Clone(opts.Receivers)
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
	}
	c := &Collector{
		opts:         opts,
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
		statsErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace, Name: "queue_stats_errors_total",
			Help: "Scrapes that could not read the queue depth of a receiver from the broker.",
		}),
	}
	c.vecs = []prometheus.Collector{
		c.sent, c.handled, c.failed, c.retried, c.deadLettered, c.expired,
		c.timedOut, c.replied, c.late, c.handlerSeconds, c.brokerUp, c.statsErrors,
	}
	c.available.Store(true)
	c.brokerUp.Set(1)
	return c
}

// Watch makes scrapes read the gauges from src, typically the
// *disker.Disker whose events Observe sees. Until it is called they are
// absent.
func (c *Collector) Watch(src Source) {
	c.mu.Lock()
	c.src = src
	c.mu.Unlock()
}

// Observe records an event. Pass it as disker.Config.OnEvent, or call it
// from yours.
func (c *Collector) Observe(e disker.Event) {
	switch e.Kind {
	case disker.EventSent:
		c.sent.WithLabelValues(e.Receiver).Inc()
	case disker.EventHandled:
		c.handled.WithLabelValues(e.Receiver).Inc()
		c.handlerSeconds.WithLabelValues(e.Receiver, "handled").Observe(e.Duration.Seconds())
	case disker.EventFailed:
		c.failed.WithLabelValues(e.Receiver).Inc()
		c.handlerSeconds.WithLabelValues(e.Receiver, "failed").Observe(e.Duration.Seconds())
	case disker.EventRetried:
		c.retried.WithLabelValues(e.Receiver).Inc()
	case disker.EventDeadLettered:
		c.deadLettered.WithLabelValues(e.Receiver).Inc()
	case disker.EventExpired:
		c.expired.WithLabelValues(e.Receiver).Inc()
	case disker.EventTimedOut:
		c.timedOut.WithLabelValues(senderLabel(e.Sender)).Inc()
	case disker.EventReplied:
		c.replied.WithLabelValues(e.Receiver).Inc()
	case disker.EventLate:
		c.late.WithLabelValues(e.Receiver).Inc()
	case disker.EventUnavailable:
		c.available.Store(false)
		c.brokerUp.Set(0)
	case disker.EventAvailable:
		c.available.Store(true)
		c.brokerUp.Set(1)
	}
}

// BrokerAvailable reports whether the last word from the instance was that
// the broker is reachable.
func (c *Collector) BrokerAvailable() bool { return c.available.Load() }

// senderLabel keeps Disker's own names (those a user cannot choose, which
// start with '_', such as the private reply address of each instance's
// Requests) from making a new series for every process: they share one.
func senderLabel(s string) string {
	if strings.HasPrefix(s, "_") {
		return "_disker"
	}
	return s
}

var (
	inFlightDesc = prometheus.NewDesc(Namespace+"_in_flight",
		"Messages being handled now, by receiver.", []string{"receiver"}, nil)
	concurrencyDesc = prometheus.NewDesc(Namespace+"_concurrency",
		"Handler concurrency, by receiver.", []string{"receiver"}, nil)
	queuedDesc = prometheus.NewDesc(Namespace+"_queue_queued",
		"Messages waiting in the receiver's queue for a worker.", []string{"receiver"}, nil)
	pendingDesc = prometheus.NewDesc(Namespace+"_queue_pending",
		"Messages of the receiver delivered and not yet acknowledged: in flight, or waiting for a retry or a redelivery.", []string{"receiver"}, nil)
	deadLettersDesc = prometheus.NewDesc(Namespace+"_queue_dead_letters",
		"Messages in the receiver's dead-letter stream.", []string{"receiver"}, nil)
	pausedDesc = prometheus.NewDesc(Namespace+"_queue_paused",
		"1 while the receiver is paused: its messages queue and no instance starts them.", []string{"receiver"}, nil)
	deferredDesc = prometheus.NewDesc(Namespace+"_queue_deferred",
		"Messages of the receiver sent for later (WithDelay, WithDeliverAt) that are not due yet.", []string{"receiver"}, nil)
	expiredDesc = prometheus.NewDesc(Namespace+"_queue_expired_total",
		"Messages of the receiver dropped because their deadline or expiry had passed, by every instance.", []string{"receiver"}, nil)
)

// Describe sends the descriptions of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, v := range c.vecs {
		v.Describe(ch)
	}
	for _, d := range []*prometheus.Desc{inFlightDesc, concurrencyDesc, queuedDesc, pendingDesc, deadLettersDesc, pausedDesc, deferredDesc, expiredDesc} {
		ch <- d
	}
}

// Collect sends the metrics, reading the gauges from the watched instance.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, v := range c.vecs[:len(c.vecs)-1] { // statsErrors last, after the reads
		v.Collect(ch)
	}
	c.mu.Lock()
	src := c.src
	c.mu.Unlock()
	if src != nil {
		local := src.LocalStats()
		for name, r := range local.Receivers {
			ch <- prometheus.MustNewConstMetric(inFlightDesc, prometheus.GaugeValue, float64(r.InFlight), name)
			ch <- prometheus.MustNewConstMetric(concurrencyDesc, prometheus.GaugeValue, float64(r.Concurrency), name)
		}
		c.collectQueues(ch, src, local)
	}
	c.statsErrors.Collect(ch)
}

// collectQueues sends the queue depth of the receivers to report.
func (c *Collector) collectQueues(ch chan<- prometheus.Metric, src Source, local disker.LocalStats) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.StatsTimeout)
	defer cancel()
	var names []string
	if c.opts.AllReceivers {
		var err error
		if names, err = src.Receivers(ctx); err != nil {
			c.statsErrors.Inc()
			return
		}
	} else {
		names = slices.Clone(c.opts.Receivers)
		for name := range local.Receivers {
			names = append(names, name)
		}
		slices.Sort(names)
		names = slices.Compact(names)
	}
	for _, name := range names {
		s, err := src.Stats(ctx, name)
		if err != nil {
			c.statsErrors.Inc()
			continue
		}
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(s.Queued), name)
		ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(s.Pending), name)
		ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, float64(s.DeadLetters), name)
		paused := 0.0
		if s.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(pausedDesc, prometheus.GaugeValue, paused, name)
		ch <- prometheus.MustNewConstMetric(deferredDesc, prometheus.GaugeValue, float64(s.Deferred), name)
		ch <- prometheus.MustNewConstMetric(expiredDesc, prometheus.CounterValue, float64(s.Expired), name)
	}
}
