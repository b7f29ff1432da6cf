package disker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/pool"
)

// markStart records in Redis, in one step, that a handler started: it
// counts it running, raises the highest count seen, and appends the Redis
// time (µs) to the list of starts. KEYS: running, max, starts.
var markStart = rueidis.NewLuaScript(`
local n = redis.call('INCR', KEYS[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
local t = redis.call('TIME')
redis.call('RPUSH', KEYS[3], t[1] * 1000000 + t[2])
return n
`)

// limitKeys are the test's own keys of the running count, the highest
// count seen, the list of starts, and the count of handled messages.
func limitKeys(prefix string) (running, highest, starts, done string) {
	return prefix + ":test:running", prefix + ":test:max", prefix + ":test:starts", prefix + ":test:done"
}

// runLimitedChild serves DISKER_TEST_RECEIVER with WithConcurrency(16) and
// the limits DISKER_TEST_GLOBAL (global concurrency) and DISKER_TEST_RATE
// (rate/burst) from the environment, with a lease of DISKER_TEST_LEASE. Its
// handler records each start (markStart), prints "started ID" and blocks
// for good for content "hold", else works for DISKER_TEST_WORK and counts
// itself done.
func runLimitedChild(d *disker.Disker) int {
	prefix := os.Getenv("DISKER_TEST_PREFIX")
	rc, err := rueidis.NewClient(rueidis.MustParseURL(os.Getenv("DISKER_TEST_URL")))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	running, highest, starts, done := limitKeys(prefix)
	work, _ := time.ParseDuration(os.Getenv("DISKER_TEST_WORK"))
	lease, _ := time.ParseDuration(os.Getenv("DISKER_TEST_LEASE"))
	opts := []disker.HandleOption{disker.WithConcurrency(16), disker.WithLease(lease)}
	if g := os.Getenv("DISKER_TEST_GLOBAL"); g != "" {
		n, _ := strconv.Atoi(g)
		opts = append(opts, disker.WithGlobalConcurrency(n))
	}
	if r := os.Getenv("DISKER_TEST_RATE"); r != "" {
		var rate float64
		var burst int
		fmt.Sscanf(r, "%g/%d", &rate, &burst)
		opts = append(opts, disker.WithRateLimit(rate, burst))
	}
	block := make(chan struct{})
	err = d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if err := markStart.Exec(ctx, rc, []string{running, highest, starts}, nil).Error(); err != nil {
			return nil, err
		}
		if string(m.Content) == "hold" {
			fmt.Printf("started %s\n", m.ID)
			<-block
		}
		time.Sleep(work)
		rc.Do(ctx, rc.B().Decr().Key(running).Build())
		rc.Do(ctx, rc.B().Incr().Key(done).Build())
		return nil, nil
	}), opts...)
	return childServes(err)
}

// startLimited starts n "limited" children for receiver with the extra
// environment env, and waits for them to be ready.
func startLimited(t *testing.T, e *env, n int, receiver string, env ...string) []*child {
	t.Helper()
	var cs []*child
	for range n {
		c := startChild(t, e, "limited", receiver, "", env...)
		if l := recv(t, c.lines, 30*time.Second, "a child to be ready"); l != "ready" {
			t.Fatalf("child said %q, want ready", l)
		}
		cs = append(cs, c)
	}
	return cs
}

func getInt(t *testing.T, rc rueidis.Client, key string) int64 {
	t.Helper()
	n, err := rc.Do(context.Background(), rc.B().Get().Key(key).Build()).AsInt64()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	return n
}

// TestGlobalConcurrencyProcesses: three processes serve a receiver with
// WithConcurrency(16) and WithGlobalConcurrency(5): the handlers running at
// once, counted in Redis by the handlers themselves, never exceed 5. Then
// five handlers block for good; one process holding some is killed with
// SIGKILL, and the survivors start the killed one's messages, on its slots,
// once its lease has run out.
func TestGlobalConcurrencyProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a multi-process test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	const lease = 2 * time.Second
	cs := startLimited(t, e, 3, "limited", "DISKER_TEST_GLOBAL=5", "DISKER_TEST_LEASE="+lease.String(), "DISKER_TEST_WORK=5ms")
	d := e.open()
	rc := rawRedis(t, e)
	_, highest, _, done := limitKeys(e.base.KeyPrefix)
	const n = 600
	msgs := make([]disker.Message, n)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "limited", Content: []byte("work")}
	}
	if _, err := d.SendBatch(ctxTimeout(t, 10*time.Second), msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "every message handled", func() bool { return getInt(t, rc, done) == n })
	top := getInt(t, rc, highest)
	t.Logf("most handlers running at once across 3 processes: %d (limit 5)", top)
	if top > 5 || top < 2 {
		t.Fatalf("most handlers running at once: %d, want at most 5 (and more than 1)", top)
	}

	// Five messages that block for good take every slot.
	holds := make([]disker.Message, 5)
	for i := range holds {
		holds[i] = disker.Message{Receiver: "limited", Content: []byte("hold")}
	}
	if _, err := d.SendBatch(ctxTimeout(t, 10*time.Second), holds); err != nil {
		t.Fatal(err)
	}
	started := make([]chan string, len(cs))
	count := make([]int, len(cs))
	for i, c := range cs {
		started[i] = make(chan string, 10)
		go func() {
			for l := range c.lines {
				started[i] <- l
			}
			close(started[i])
		}()
	}
	total := func() int {
		s := 0
		for i := range cs {
		drain:
			for {
				select {
				case _, ok := <-started[i]:
					if !ok {
						break drain
					}
					count[i]++
				default:
					break drain
				}
			}
			s += count[i]
		}
		return s
	}
	waitFor(t, 30*time.Second, "five held messages started", func() bool { return total() == 5 })
	victim := slices.IndexFunc(count, func(c int) bool { return c > 0 })
	lost := count[victim]
	cs[victim].kill(t)
	killed := time.Now()
	survivors := func() int {
		total()
		s := 0
		for i, c := range count {
			if i != victim {
				s += c
			}
		}
		return s
	}
	waitFor(t, lease+20*time.Second, "the survivors to start the killed process's messages", func() bool { return survivors() == 5 })
	t.Logf("the killed process held %d slots; the survivors had them %v after the kill (lease %v)", lost, time.Since(killed).Round(time.Millisecond), lease)
	if top := getInt(t, rc, highest); top > int64(5+lost) {
		t.Fatalf("running at once: %d", top)
	}
}

// TestRateLimitProcesses: three processes serve a receiver limited to
// 200/s with bursts of 20: of 5,000 messages, at most 1,020 start in any
// five seconds (by Redis time), the achieved rate is near 200/s, and none
// is dead-lettered.
//
// The bucket bounds when tokens are granted; a handler records its start
// a fetch and a round trip later, and on a loaded machine that lag varies
// by tens of milliseconds, which can move a few more starts into a window
// (at 200/s, 5 per 25ms of spread): over one second that is a large part
// of the 220 allowed, over five a small part of the 1,020, and the check
// allows 2%. A limit applied per process instead of across them would
// start 3,000 in five seconds.
func TestRateLimitProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a multi-process test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	startLimited(t, e, 3, "rated", "DISKER_TEST_RATE=200/20", "DISKER_TEST_LEASE=10s", "DISKER_TEST_WORK=1ms")
	d := e.open()
	rc := rawRedis(t, e)
	_, _, starts, done := limitKeys(e.base.KeyPrefix)
	const n = 5000
	msgs := make([]disker.Message, n)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "rated", Content: []byte("work")}
	}
	if _, err := d.SendBatch(ctxTimeout(t, 20*time.Second), msgs); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 120*time.Second, "every message handled", func() bool { return getInt(t, rc, done) == n })
	at, err := rc.Do(context.Background(), rc.B().Lrange().Key(starts).Start(0).Stop(-1).Build()).AsIntSlice()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(at)
	if len(at) != n {
		t.Fatalf("%d starts recorded, want %d (one per message: none retried)", len(at), n)
	}
	// At most the burst and rate × T start in any window of T; the check
	// is made over 5s windows, where the lag of recording a start (tens
	// of milliseconds on a loaded machine) moves few starts across a
	// window's edge against the 1,020 allowed.
	most1, most5 := mostWithin(at, time.Second), mostWithin(at, 5*time.Second)
	rate := float64(n-1) / (float64(at[n-1]-at[0]) / 1e6)
	t.Logf("3 processes, limit 200/s burst 20, %d messages: at most %d started in any 1s window, %d in any 5s window; achieved %.1f/s", n, most1, most5, rate)
	if most5 > 1040 {
		t.Errorf("%d messages started within five seconds, want at most 1,020 (200/s × 5s + a burst of 20), with 2%% for the lag of recording starts", most5)
	}
	if rate < 190 {
		t.Errorf("achieved rate %.1f/s, want at least 190/s of the 200/s allowed", rate)
	}
	s, err := d.Stats(context.Background(), "rated")
	if err != nil {
		t.Fatal(err)
	}
	if s.DeadLetters != 0 {
		t.Fatalf("%d dead letters, want none", s.DeadLetters)
	}
}

// TestPoolBackpressure: of two instances serving a receiver with
// HandleWithPool, one has a pool whose constructor fails for 5s (the pool
// is degraded): that instance fetches nothing meanwhile, the other handles
// every message, none is dead-lettered (with one attempt each), and the
// first resumes once its constructor works again.
func TestPoolBackpressure(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		var failing atomic.Bool
		failing.Store(true)
		bad, err := pool.New(pool.Config[int]{Size: 2, MaxRestarts: 1, Period: time.Minute,
			RestartBackoff: 20 * time.Millisecond, MaxRestartBackoff: 100 * time.Millisecond,
			New: func(context.Context) (int, error) {
				if failing.Load() {
					return 0, errors.New("the service is down")
				}
				return 1, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bad.Close(context.Background()) })
		waitFor(t, 10*time.Second, "the failing pool to be degraded", func() bool {
			l, err := bad.Checkout(ctx)
			if err == nil {
				l.Release()
			}
			return errors.Is(err, pool.ErrDegraded)
		})
		good, err := pool.New(pool.Config[int]{Size: 4, New: func(context.Context) (int, error) { return 2, nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = good.Close(context.Background()) })

		a, b := e.open(), e.open()
		var ranA, ranB atomic.Int64
		work := func(ran *atomic.Int64) func(context.Context, int, *disker.Message) ([]byte, error) {
			return func(_ context.Context, _ int, m *disker.Message) ([]byte, error) {
				ran.Add(1)
				time.Sleep(time.Millisecond)
				return nil, nil
			}
		}
		if err := disker.HandleWithPool(a, "pooled", bad, work(&ranA), disker.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
		if err := disker.HandleWithPool(b, "pooled", good, work(&ranB), disker.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
		const n = 300
		failUntil := time.Now().Add(5 * time.Second)
		for i := range n {
			if _, err := b.Send(ctx, disker.Message{Receiver: "pooled", Content: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond) // messages arrive over the failing spell
		}
		waitFor(t, 30*time.Second, "the healthy instance to handle every message", func() bool { return ranB.Load() == n })
		for time.Now().Before(failUntil) {
			touched := a.LocalStats().Receivers["pooled"]
			if ranA.Load() != 0 || touched.GivenBack != 0 || touched.Failed != 0 {
				t.Fatalf("the instance with a degraded pool took messages: ran %d, given back %d, failed %d", ranA.Load(), touched.GivenBack, touched.Failed)
			}
			time.Sleep(10 * time.Millisecond)
		}
		failing.Store(false)
		waitFor(t, 30*time.Second, "the recovered instance to handle messages again", func() bool {
			if _, err := b.Send(ctx, disker.Message{Receiver: "pooled", Content: []byte("after")}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
			return ranA.Load() > 0
		})
		s, err := b.Stats(ctx, "pooled")
		if err != nil {
			t.Fatal(err)
		}
		if s.DeadLetters != 0 {
			t.Fatalf("%d dead letters, want none", s.DeadLetters)
		}
	})
}

// TestPoolBrokenGivenBack: a message whose worker the handler reports
// broken (pool.Broken) is given back at once and handled again with the
// same attempt, so a receiver with one attempt loses nothing to it.
func TestPoolBrokenGivenBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		var made atomic.Int64
		p, err := pool.New(pool.Config[int64]{Size: 1, New: func(context.Context) (int64, error) { return made.Add(1), nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		d := e.open()
		got := make(chan int, 2)
		if err := disker.HandleWithPool(d, "fragile", p, func(_ context.Context, w int64, m *disker.Message) ([]byte, error) {
			if w == 1 {
				return nil, pool.Broken(errors.New("the connection dropped"))
			}
			got <- m.Attempt
			return nil, nil
		}, disker.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "fragile", Content: []byte("x")}); err != nil {
			t.Fatal(err)
		}
		if attempt := recv(t, got, 30*time.Second, "the message on a new worker"); attempt != 1 {
			t.Fatalf("handled again as attempt %d, want 1 (the broken worker's try does not count)", attempt)
		}
		st := d.LocalStats().Receivers["fragile"]
		if st.GivenBack != 1 || st.DeadLettered != 0 || st.Failed != 0 {
			t.Fatalf("stats: given back %d, dead-lettered %d, failed %d; want 1, 0, 0", st.GivenBack, st.DeadLettered, st.Failed)
		}
	})
}

// TestGlobalConcurrencyInstances: on every broker, three instances in one
// process serve a receiver with WithConcurrency(8) and
// WithGlobalConcurrency(3): never more than 3 handlers run at once, and
// every message is handled; once they stop, every slot was given back.
func TestGlobalConcurrencyInstances(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		var running, top, done atomic.Int64
		const n = 150
		h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			now := running.Add(1)
			for {
				if old := top.Load(); now <= old || top.CompareAndSwap(old, now) {
					break
				}
			}
			time.Sleep(2 * time.Millisecond)
			running.Add(-1)
			done.Add(1)
			return nil, nil
		})
		var ds []*disker.Disker
		for range 3 {
			d := e.open()
			if err := d.Handle("capped", h, disker.WithConcurrency(8), disker.WithGlobalConcurrency(3)); err != nil {
				t.Fatal(err)
			}
			ds = append(ds, d)
		}
		msgs := make([]disker.Message, n)
		for i := range msgs {
			msgs[i] = disker.Message{Receiver: "capped", Content: []byte("x")}
		}
		if _, err := ds[0].SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "every message handled", func() bool { return done.Load() == n })
		if top.Load() > 3 {
			t.Fatalf("%d handlers ran at once, want at most 3", top.Load())
		}
		for _, d := range ds {
			if err := d.Unhandle(ctx, "capped"); err != nil {
				t.Fatal(err)
			}
		}
		if e.redis {
			// Every slot was given back: the holders' keys are gone.
			rc := rawRedis(t, e)
			if keys := scanKeys(t, rc, e.base.KeyPrefix+":{capped}:slot*"); len(keys) != 0 {
				t.Fatalf("after Unhandle, slot keys remain: %v", keys)
			}
		}
	})
}

// TestRateLimitInstances: on every broker, two instances serve a receiver
// limited to 50/s with bursts of 5: 60 queued messages take about a second
// (55 beyond the burst at 50/s), not less.
func TestRateLimitInstances(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		const n = 60
		var done atomic.Int64
		h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			done.Add(1)
			return nil, nil
		})
		sender := e.open()
		msgs := make([]disker.Message, n)
		for i := range msgs {
			msgs[i] = disker.Message{Receiver: "paced", Content: []byte("x")}
		}
		if _, err := sender.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for range 2 {
			if err := e.open().Handle("paced", h, disker.WithRateLimit(50, 5)); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 30*time.Second, "every message handled", func() bool { return done.Load() == n })
		took := time.Since(start)
		t.Logf("%d messages at 50/s, burst 5, two instances: %v", n, took.Round(time.Millisecond))
		if took < 900*time.Millisecond {
			t.Fatalf("%d messages took %v: faster than 50/s after a burst of 5 allows (1.1s)", n, took)
		}
	})
}

// mostWithin returns the most of the sorted times at (unix µs) that fall
// within any window of length w.
func mostWithin(at []int64, w time.Duration) int {
	most, j := 0, 0
	for i := range at {
		for at[i]-at[j] >= w.Microseconds() {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// gatedHandler is a handler for each of several instances that counts
// what each runs, the most running at once across all, and holds every
// message until release is closed.
type gatedHandler struct {
	running, top, done atomic.Int64
	per                []atomic.Int64 // messages started, by instance
	release            chan struct{}
	free               func() // closes release, once
}

// newGatedHandler returns the handler of instances instances; open them
// before, so that release is closed before they are (a test that fails
// leaves no handler waiting).
func newGatedHandler(t *testing.T, instances int) *gatedHandler {
	g := &gatedHandler{per: make([]atomic.Int64, instances), release: make(chan struct{})}
	g.free = sync.OnceFunc(func() { close(g.release) })
	t.Cleanup(g.free)
	return g
}

// of returns the handler of instance i.
func (g *gatedHandler) of(i int) disker.Handler {
	return disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		now := g.running.Add(1)
		for old := g.top.Load(); now > old && !g.top.CompareAndSwap(old, now); old = g.top.Load() {
		}
		g.per[i].Add(1)
		<-g.release
		g.running.Add(-1)
		g.done.Add(1)
		return nil, nil
	})
}

// TestGlobalConcurrencySlotsStay shows what WithGlobalConcurrency's doc
// says of how the slots are shared, on every broker. An instance that may
// run n handlers takes every slot while it keeps finding messages, and
// one started after it gets none: it handles nothing of a backlog. Each
// instance capped below n (WithConcurrency(2) of n = 5, three instances)
// holds no more slots than it may run, so all three run messages, never
// more than n at once.
func TestGlobalConcurrencySlotsStay(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		// A lease that does not run out while the machine is slow: the
		// slots then stay where they are.
		lease := disker.WithLease(time.Minute)

		ds := []*disker.Disker{e.open(), e.open(), e.open(), e.open(), e.open()}
		g := newGatedHandler(t, 2)
		if err := ds[0].Handle("sticky", g.of(0), disker.WithConcurrency(5), disker.WithGlobalConcurrency(5), lease); err != nil {
			t.Fatal(err)
		}
		sendN(t, ds[0], "sticky", "m", 30)
		waitFor(t, 30*time.Second, "the first instance to run 5", func() bool { return g.per[0].Load() == 5 })
		if err := ds[1].Handle("sticky", g.of(1), disker.WithConcurrency(5), disker.WithGlobalConcurrency(5), lease); err != nil {
			t.Fatal(err)
		}
		g.free()
		waitFor(t, 30*time.Second, "every message handled", func() bool { return g.done.Load() == 30 })
		if g.per[1].Load() != 0 || g.top.Load() > 5 {
			t.Fatalf("the second instance ran %d messages of the backlog, the most at once %d: want 0 and at most 5", g.per[1].Load(), g.top.Load())
		}

		g = newGatedHandler(t, 3)
		for i, d := range ds[2:] {
			if err := d.Handle("capped", g.of(i), disker.WithConcurrency(2), disker.WithGlobalConcurrency(5), lease); err != nil {
				t.Fatal(err)
			}
		}
		sendN(t, ds[0], "capped", "m", 30)
		waitFor(t, 30*time.Second, "5 handlers to run", func() bool { return g.running.Load() == 5 })
		for i := range g.per {
			if n := g.per[i].Load(); n == 0 || n > 2 {
				t.Fatalf("instance %d runs %d messages, want 1 or 2 (capped at 2, 5 at once among 3)", i, n)
			}
		}
		g.free()
		waitFor(t, 30*time.Second, "every message handled", func() bool { return g.done.Load() == 30 })
		if g.top.Load() > 5 {
			t.Fatalf("%d handlers ran at once, want at most 5", g.top.Load())
		}
	})
}

// TestGlobalConcurrencySlotsLapsed: an instance whose slots the broker no
// longer counts (taken from it as a lapsed lease would be, and held by
// another holder) reports it (EventSlotsLapsed) and starts no delivery on
// them: the one it prefetched is given back without starting, while its
// running handler runs on, and it is handled once the other holder gives
// the slots back.
func TestGlobalConcurrencySlotsLapsed(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		lapses := make(chan disker.Event, 8)
		d := e.open(func(c *disker.Config) {
			c.OnEvent = func(ev disker.Event) {
				if ev.Kind == disker.EventSlotsLapsed {
					select {
					case lapses <- ev:
					default:
					}
				}
			}
		})
		started := make(chan string, 8)
		release := make(chan struct{})
		h := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			started <- string(m.Content)
			if string(m.Content) == "first" {
				<-release
			}
			return nil, nil
		})
		const receiver = "lapsing"
		if err := d.Handle(receiver, h, disker.WithConcurrency(1), disker.WithPrefetch(1),
			disker.WithGlobalConcurrency(2), disker.WithLease(600*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		send := func(content string) {
			t.Helper()
			if _, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(content)}); err != nil {
				t.Fatal(err)
			}
		}
		send("first")
		if got := <-started; got != "first" {
			t.Fatalf("started %q, want first", got)
		}
		send("second")
		waitFor(t, 10*time.Second, "the second message prefetched on the second slot", func() bool {
			st := d.LocalStats().Receivers[receiver]
			return st.InFlight == 2 && st.HeldSlots == 2
		})

		// The broker stops counting the instance's slots, and another
		// holder takes them, as when the instance's lease lapses in a stall.
		b := rawBroker(t, e)
		sp := &broker.SlotsParams{Receiver: receiver, Holder: d.ID(), Delta: -2, Limit: 2, Lease: time.Minute}
		if _, _, err := b.Slots(ctx, sp); err != nil {
			t.Fatal(err)
		}
		sp.Holder, sp.Delta = "other", 2
		if n, _, err := b.Slots(ctx, sp); err != nil || n != 2 {
			t.Fatalf("the other holder takes both slots: holds %d, %v", n, err)
		}
		select {
		case ev := <-lapses:
			if ev.Receiver != receiver {
				t.Fatalf("EventSlotsLapsed of %q, want %q", ev.Receiver, receiver)
			}
		case <-ctx.Done():
			t.Fatal("no EventSlotsLapsed after the broker stopped counting the slots")
		}

		close(release) // the first ends: the second may not start on a slot held by "other"
		waitFor(t, 10*time.Second, "the second message given back", func() bool {
			return d.LocalStats().Receivers[receiver].GivenBack >= 1
		})
		select {
		case got := <-started:
			t.Fatalf("%q started while another holder held every slot", got)
		default:
		}

		sp.Delta = -2
		if _, _, err := b.Slots(ctx, sp); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-started:
			if got != "second" {
				t.Fatalf("started %q, want second", got)
			}
		case <-ctx.Done():
			t.Fatal("the second message did not start once the slots were free")
		}
	})
}
