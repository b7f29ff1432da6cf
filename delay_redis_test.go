package disker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestDelayedSurvivesRestart: messages scheduled before Redis is killed
// (AOF on) and restarted, by an instance that is gone by then, are
// delivered to a worker started after the restart, none before its due
// time.
func TestDelayedSurvivesRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	sender, err := disker.New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 60*time.Second)
	const n = 20
	due := map[string]time.Time{}
	for i := range n {
		delay := 1500*time.Millisecond + time.Duration(i)*50*time.Millisecond
		sent := time.Now()
		if _, err := sender.Send(ctx, disker.Message{Receiver: "later", Content: []byte(strconv.Itoa(i))}, disker.WithDelay(delay)); err != nil {
			t.Fatal(err)
		}
		due[strconv.Itoa(i)] = sent.Add(delay)
	}
	if err := sender.Close(ctx); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	srv.Restart()
	worker := e.open()
	type got struct {
		content string
		at      time.Time
	}
	seen := make(chan got, n)
	if err := worker.Handle("later", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		seen <- got{string(m.Content), time.Now()}
		return nil, nil
	})); err != nil {
		t.Fatal(err)
	}
	left := maps(due)
	for range n {
		g := recv(t, seen, 30*time.Second, "a message scheduled before the restart")
		if early := due[g.content].Add(-2 * time.Millisecond).Sub(g.at); early > 0 {
			t.Fatalf("message %s handled %v before its due time", g.content, early)
		}
		if !left[g.content] {
			t.Fatalf("message %s handled twice", g.content)
		}
		delete(left, g.content)
	}
}

func maps(m map[string]time.Time) map[string]bool {
	out := make(map[string]bool, len(m))
	for k := range m {
		out[k] = true
	}
	return out
}

// TestScheduledLateness schedules 10,000 messages with random due times
// over 10s, one Send each, to a worker that keeps up: each is handled
// once, none before its due time, and it logs the lateness (p50, p99,
// max), measured from the start of its Send plus its delay (so it counts
// the Send's round trip too).
func TestScheduledLateness(t *testing.T) {
	if testing.Short() {
		t.Skip("a 10-second measurement: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, true, srv.URL())
	d := e.open(func(c *disker.Config) { c.ReceiverBlockTimeout = disker.DefaultReceiverBlockTimeout })
	const n = 10000
	const span = 10 * time.Second
	var mu sync.Mutex
	handled := make(map[int]time.Time, n)
	dups := 0
	all := make(chan struct{})
	if err := d.Handle("later", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		at := time.Now()
		i, _ := strconv.Atoi(string(m.Content))
		mu.Lock()
		defer mu.Unlock()
		if _, dup := handled[i]; dup {
			dups++
		}
		handled[i] = at
		if len(handled) == n {
			close(all)
		}
		return nil, nil
	}), disker.WithConcurrency(64)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 2*time.Minute)
	due := make([]time.Time, n)
	var wg sync.WaitGroup
	next := make(chan int)
	for range 16 {
		wg.Go(func() {
			for i := range next {
				delay := time.Duration(rand.Int64N(int64(span))) + time.Millisecond
				sent := time.Now()
				if _, err := d.Send(ctx, disker.Message{Receiver: "later", Content: []byte(strconv.Itoa(i))}, disker.WithDelay(delay)); err != nil {
					t.Error(err)
				}
				due[i] = sent.Add(delay)
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	select {
	case <-all:
	case <-time.After(span + time.Minute):
		t.Fatalf("only %d of %d handled", len(handled), n)
	}
	mu.Lock()
	defer mu.Unlock()
	if dups > 0 {
		t.Fatalf("%d messages handled twice", dups)
	}
	late := make([]time.Duration, 0, n)
	for i, at := range handled {
		// The broker decides to the millisecond by its clock, which is
		// this machine's.
		if at.Before(due[i].Add(-2 * time.Millisecond)) {
			t.Fatalf("message %d handled %v before its due time", i, due[i].Sub(at))
		}
		late = append(late, at.Sub(due[i]))
	}
	slices.Sort(late)
	t.Logf("10,000 scheduled over %v: lateness p50 %v, p99 %v, max %v", span, late[n/2], late[n*99/100], late[n-1])
}

// TestScheduledIdleCost: with 100,000 messages scheduled a year ahead, an
// idle worker costs Redis about what it costs with none (no scan of the
// set per fetch). It logs the commands per second of both from INFO
// commandstats.
func TestScheduledIdleCost(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement of several seconds: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, true, srv.URL())
	rc := rawRedis(t, e)
	ctx := ctxTimeout(t, 2*time.Minute)
	measure := func(what string) (float64, float64) {
		d := e.open(func(c *disker.Config) {
			c.ReceiverBlockTimeout = disker.DefaultReceiverBlockTimeout
			c.HeartbeatInterval = disker.DefaultHeartbeatInterval
		})
		if err := d.Handle("idle", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // settle: the first fetches, the first heartbeat
		const window = 6 * time.Second
		calls, usec, per := commandsOver(t, rc, window, nil) // an idle worker for a while
		_ = d.Close(ctx)
		perSec := float64(calls) / window.Seconds()
		usecPerSec := float64(usec) / window.Seconds()
		t.Logf("%s: %.1f Redis commands/s, %.0f µs of Redis CPU/s, at idle (calls in %v: %s)", what, perSec, usecPerSec, window, per)
		return perSec, usecPerSec
	}
	base, baseUsec := measure("no scheduled message")
	sender, err := disker.New(ctx, e.config())
	if err != nil {
		t.Fatal(err)
	}
	msgs := make([]disker.Message, 1000)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "idle", Content: []byte("far")}
	}
	for range 100 {
		if _, err := sender.SendBatch(ctx, msgs, disker.WithDelay(365*24*time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if st, err := sender.Stats(ctx, "idle"); err != nil || st.Scheduled != 100000 {
		t.Fatalf("Stats: %+v, %v; want 100,000 scheduled", st, err)
	}
	if err := sender.Close(ctx); err != nil { // its heartbeats are not the worker's cost
		t.Fatal(err)
	}
	with, withUsec := measure("100,000 scheduled a year ahead")
	if with > 2*base+5 || withUsec > 4*baseUsec+2000 {
		t.Fatalf("idle cost with 100,000 scheduled: %.1f commands/s, %.0f µs/s; without: %.1f, %.0f", with, withUsec, base, baseUsec)
	}
}

// commandsOver waits for window and returns the Redis commands run
// meanwhile (INFO commandstats), but those skip names (e.g.
// "cmdstat_hset"): their count, the µs of all of them, and the count of
// each command counted, as text.
func commandsOver(t *testing.T, rc rueidis.Client, window time.Duration, skip func(name string) bool) (calls, usec int64, per string) {
	t.Helper()
	_, usec0, by0 := commandStats(t, rc)
	time.Sleep(window)
	_, usec1, by1 := commandStats(t, rc)
	var names []string
	for name, n := range by1 {
		if n <= by0[name] || (skip != nil && skip(name)) {
			continue
		}
		calls += n - by0[name]
		names = append(names, fmt.Sprintf("%s %d", strings.TrimPrefix(name, "cmdstat_"), n-by0[name]))
	}
	slices.Sort(names)
	return calls, usec1 - usec0, strings.Join(names, ", ")
}

// commandStats returns the calls and µs of every command from INFO
// commandstats, leaving out INFO itself.
func commandStats(t *testing.T, rc rueidis.Client) (calls, usec int64, by map[string]int64) {
	by = map[string]int64{}
	t.Helper()
	info, err := rc.Do(context.Background(), rc.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				calls += n
				by[name] = n
			case "usec":
				usec += n
			}
		}
	}
	return calls, usec, by
}
