//go:build !race

package disker_test

// The tests of 10,000 receivers and senders in one instance. They run
// without the race detector, which limits a process to 8,128 live
// goroutines (an instance runs one per receiver and one per sender):
// `make test` runs them in a `go test` without -race of their own.

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// tenKConfig is the configuration of the 10,000-receiver tests: the
// defaults' heartbeat and monitor periods (the test env's shorter ones
// are for a few receivers: a heartbeat writes an entry per receiver, and
// a monitor pass makes a call per sender it sent timed messages as), and
// the default block time.
func tenKConfig(c *disker.Config) {
	c.ReceiverBlockTimeout = disker.DefaultReceiverBlockTimeout
	c.HeartbeatInterval = disker.DefaultHeartbeatInterval
	c.TimeoutMonitorFrequency = disker.DefaultTimeoutMonitorFrequency
}

// TestTenThousandReceiversFewConnections: one instance with 10,000
// receivers handles a message to each, while its connections to Redis
// stay within maxConnections.
func TestTenThousandReceiversFewConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	// Not parallel: its load would slow the tests beside it.
	crowd{n: 10_000, sendConcurrency: 32, within: 2 * time.Minute}.run(t, tenKConfig)
}

// TestTenThousandSendersTimedReplies: one instance with 10,000 receivers
// and 10,000 senders, each sender with a reply and a timeout handler and
// one message WithTimeout to its receiver; the receivers reply to 90% of
// them. Every sender gets exactly one outcome: the reply when the broker
// accepted it, else the timeout notice, which the 10% not replied to all
// get; the connections stay within maxConnections.
func TestTenThousandSendersTimedReplies(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	// Not parallel: its load would slow the tests beside it.
	crowd{n: 10_000, senders: true, timeout: 10 * time.Second, silentEvery: 10, sendConcurrency: 32, within: 2 * time.Minute}.run(t, tenKConfig)
}

// TestTenThousandIdleReceiversCommandRate: an instance that serves
// 10,000 idle receivers makes at most 20 Redis commands a second on
// average over 65 s once their first fetches are over, counted by a proxy
// between it and Redis (Redis's own counts, logged too, add the commands
// its scripts run): its heartbeat is one script for the instance, not a
// write per receiver, an idle stream costs no poll of its own, and no
// work per receiver comes back by time (no reclaim of an idle queue per
// lease, no read of every pause flag), which an average over more than
// two 30 s periods would show. The receivers hold at most 0.01 goroutines each (an idle
// receiver's fetch waits in the broker without one) and, generously, at
// most 6 KiB of Go heap each (the figure aimed at is 4 KiB: see
// docs/sizing.md).
func TestTenThousandIdleReceiversCommandRate(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	srv := redistest.Start(t)
	proxy := redistest.StartCountProxy(t, srv.Addr())
	e := newEnv(t, true, proxy.URL())
	rc := rawRedis(t, newEnv(t, true, srv.URL()))
	d := e.open(tenKConfig)
	const n = 10_000
	heap0, g0 := liveHeap(), runtime.NumGoroutine()
	for i := range n {
		if err := d.Handle("idle-"+strconv.Itoa(i), disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
	}
	// Settle: every receiver's first fetches (at most 1,024 at a time,
	// which a loaded host takes seconds over), and a few heartbeats.
	time.Sleep(5 * disker.DefaultHeartbeatInterval)
	perReceiver := func() float64 { return float64(runtime.NumGoroutine()-g0) / n }
	settled := time.Now().Add(time.Minute)
	for perReceiver() > 0.01 && time.Now().Before(settled) {
		time.Sleep(100 * time.Millisecond)
	}
	// The first fetches are over when 5 s in a row pass with no second of
	// more commands than the bound: on a loaded host they trickle on after
	// the goroutines have ended, with lulls.
	for quiet := 0; quiet < 5 && time.Now().Before(settled.Add(30*time.Second)); {
		before := proxy.Commands()
		time.Sleep(time.Second)
		if proxy.Commands()-before <= 20 {
			quiet++
		} else {
			quiet = 0
		}
	}
	heap, g := float64(liveHeap()-heap0)/n, perReceiver()
	t.Logf("%d idle receivers: %.4f goroutines and %.0f bytes of Go heap each", n, g, heap)
	if g > 0.01 {
		t.Fatalf("%d idle receivers: %.4f goroutines each, want at most 0.01", n, g)
	}
	if heap > 6<<10 {
		t.Fatalf("%d idle receivers: %.0f bytes of Go heap each, want at most 6 KiB", n, heap)
	}
	// The window spans more than two periods of 30 s (the default lease,
	// 120 pause polls): work per receiver that came back by time, such as
	// a reclaim per lease or a read of every pause flag, would show in its
	// average.
	window := idleWindow(t)
	const slice = 5 * time.Second
	var made, most float64 // the commands/s over the window, and over its busiest slice
	var calls, usec int64
	var per string
	for at := time.Duration(0); at < window; at += slice {
		before := proxy.Commands()
		c, u, p := commandsOver(t, rc, slice, nil)
		got := float64(proxy.Commands()-before) / slice.Seconds()
		made += got * slice.Seconds()
		most = max(most, got)
		calls, usec = calls+c, usec+u
		if got > 20 {
			t.Logf("%v-%v: %.1f commands/s made (Redis ran %s)", at, at+slice, got, p)
		}
		per = p
	}
	made /= window.Seconds()
	t.Logf("%d idle receivers over %v: %.1f commands/s made by the instance (%.1f/s in its busiest %v); Redis ran %.1f/s with its scripts' (the last %v: %s), %.0f µs of its CPU/s",
		n, window, made, most, slice, float64(calls)/window.Seconds(), slice, per, float64(usec)/window.Seconds())
	if made > 20 {
		t.Fatalf("%d idle receivers: the instance made %.1f Redis commands/s over %v, want at most 20", n, made, window)
	}
}

// idleWindow is how long TestTenThousandIdleReceiversCommandRate counts
// the commands of the idle instance: 65 s, or the duration that
// DISKER_TEST_IDLE_WINDOW holds (a longer look), rounded up to 5 s.
func idleWindow(t *testing.T) time.Duration {
	w := 65 * time.Second
	if s := os.Getenv("DISKER_TEST_IDLE_WINDOW"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			t.Fatalf("DISKER_TEST_IDLE_WINDOW=%q: want a positive duration", s)
		}
		w = d
	}
	return (w + 5*time.Second - 1) / (5 * time.Second) * (5 * time.Second)
}

// liveHeap returns the bytes of the Go heap in use after a collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
