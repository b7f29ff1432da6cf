package disker_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/membroker"
	"github.com/diskerhq/disker/internal/redisbroker"
	"github.com/diskerhq/disker/internal/redistest"
)

func TestRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		if err := d.Handle("echo", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		// Handlers of untimed messages wait for the test's end.
		release := make(chan struct{})
		t.Cleanup(func() { close(release) }) // before Close
		if err := d.Handle("sleepy", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-release:
				return nil, nil
			}
		})); err != nil {
			t.Fatal(err)
		}
		if err := d.Handle("silent", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}

		t.Run("round trip", func(t *testing.T) {
			r, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo", Content: []byte("ping"), Headers: map[string]string{"h": "1"}})
			if err != nil || string(r.Content) != "echo:ping" || r.Sender != "echo" || r.InReplyTo == "" {
				t.Fatalf("Request = %+v, %v; want echo:ping from echo", r, err)
			}
		})
		t.Run("nil response is an empty reply", func(t *testing.T) {
			r, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "silent", Content: []byte("x")})
			if err != nil || len(r.Content) != 0 {
				t.Fatalf("Request = %+v, %v; want an empty reply", r, err)
			}
		})
		t.Run("no timeout without a deadline", func(t *testing.T) {
			r, err := d.Request(context.Background(), disker.Message{Receiver: "echo", Content: []byte("x")})
			if err != nil || string(r.Content) != "echo:x" {
				t.Fatalf("Request = %+v, %v", r, err)
			}
		})
		for _, receiver := range []string{"sleepy", "nobody"} {
			t.Run("timeout "+receiver, func(t *testing.T) {
				_, err := d.Request(ctxTimeout(t, 100*time.Millisecond), disker.Message{Receiver: receiver})
				if !errors.Is(err, disker.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Request = %v, want ErrTimeout and DeadlineExceeded", err)
				}
			})
		}
		t.Run("WithTimeout", func(t *testing.T) {
			_, err := d.Request(context.Background(), disker.Message{Receiver: "sleepy"}, disker.WithTimeout(50*time.Millisecond))
			if !errors.Is(err, disker.ErrTimeout) {
				t.Fatalf("Request = %v, want ErrTimeout", err)
			}
		})
		t.Run("cancelled", func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(50*time.Millisecond, cancel)
			_, err := d.Request(ctx, disker.Message{Receiver: "sleepy"})
			if !errors.Is(err, context.Canceled) || errors.Is(err, disker.ErrTimeout) {
				t.Fatalf("Request = %v, want context.Canceled", err)
			}
		})
		t.Run("ended before", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 0)
			defer cancel()
			if _, err := d.Request(ctx, disker.Message{Receiver: "echo"}); !errors.Is(err, disker.ErrTimeout) {
				t.Fatalf("Request = %v, want ErrTimeout", err)
			}
		})
	})
}

func TestRequestGetsRemoteErrorOnDeadLetter(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		if err := d.Handle("failing", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			return nil, errors.New("no luck")
		}), disker.WithMaxAttempts(2), disker.WithBackoff(func(int) time.Duration { return time.Millisecond })); err != nil {
			t.Fatal(err)
		}
		// The error reply comes as soon as the last attempt fails, well
		// before the minute is over.
		_, err := d.Request(ctxTimeout(t, time.Minute), disker.Message{Receiver: "failing"})
		var re *disker.RemoteError
		if !errors.As(err, &re) || re.Code != disker.CodeDeadLetter || re.Text != "no luck" {
			t.Fatalf("Request = %v, want RemoteError dead_letter: no luck", err)
		}
	})
}

func TestDeadLetterAdmin(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		var healthy atomic.Bool
		handled := make(chan string, 3)
		if err := d.Handle("dlq", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if !healthy.Load() {
				return nil, disker.NoRetry(errors.New("down"))
			}
			handled <- string(m.Content)
			return nil, nil
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 30*time.Second)
		for _, c := range []string{"a", "b", "c"} {
			if _, err := d.Send(ctx, disker.Message{Receiver: "dlq", Content: []byte(c)}); err != nil {
				t.Fatal(err)
			}
		}
		var dls []disker.DeadLetter
		waitFor(t, 10*time.Second, "three dead letters", func() bool {
			var err error
			dls, err = d.DeadLetters(ctx, "dlq", 10)
			return err == nil && len(dls) == 3
		})
		for i, want := range []string{"a", "b", "c"} {
			if string(dls[i].Message.Content) != want || dls[i].Attempts != 1 || !strings.Contains(dls[i].Reason, "down") || dls[i].At.IsZero() {
				t.Fatalf("dead letter %d = %+v, want %s", i, dls[i], want)
			}
		}
		if s, err := d.Stats(ctx, "dlq"); err != nil || s.DeadLetters != 3 || s.Length != 0 {
			t.Fatalf("Stats = %+v, %v; want 3 dead letters and an empty queue", s, err)
		}
		if rs, err := d.Receivers(ctx); err != nil || !slices.Contains(rs, "dlq") {
			t.Fatalf("Receivers = %v, %v; want dlq among them", rs, err)
		}
		healthy.Store(true)
		if n, err := d.RetryDeadLetters(ctx, "dlq", dls[1].ID); err != nil || n != 1 {
			t.Fatalf("RetryDeadLetters = %d, %v; want 1", n, err)
		}
		if got := recv(t, handled, 10*time.Second, "the retried message"); got != "b" {
			t.Fatalf("handled %q, want b", got)
		}
		if n, err := d.PurgeDeadLetters(ctx, "dlq", dls[0].ID); err != nil || n != 1 {
			t.Fatalf("PurgeDeadLetters(a) = %d, %v; want 1", n, err)
		}
		left, err := d.DeadLetters(ctx, "dlq", 10)
		if err != nil || len(left) != 1 || string(left[0].Message.Content) != "c" {
			t.Fatalf("DeadLetters = %+v, %v; want only c", left, err)
		}
		if n, err := d.PurgeDeadLetters(ctx, "dlq"); err != nil || n != 1 {
			t.Fatalf("PurgeDeadLetters() = %d, %v; want 1", n, err)
		}
		if n, err := d.RetryDeadLetters(ctx, "dlq"); err != nil || n != 0 {
			t.Fatalf("RetryDeadLetters() on none = %d, %v; want 0", n, err)
		}
	})
}

// rawInjector is implemented by both brokers, for tests.
type rawInjector interface {
	InjectRaw(ctx context.Context, receiver string, raw []byte) error
}

func TestUndecodableEntryIsDeadLettered(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		var inj rawInjector
		if e.redis {
			b, err := redisbroker.New(redisbroker.Config{URL: e.url, KeyPrefix: e.base.KeyPrefix})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			inj = b
		} else {
			b := membroker.Shared(strings.TrimPrefix(e.url, "mem://"), membroker.Options{})
			defer b.Close()
			inj = b
		}
		handled := make(chan string, 2)
		if err := d.Handle("mixed", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			handled <- string(m.Content)
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 10*time.Second)
		garbage := []byte("\xffnot a message")
		if err := inj.InjectRaw(ctx, "mixed", garbage); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "mixed", Content: []byte("fine")}); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, handled, 10*time.Second, "the good message"); got != "fine" {
			t.Fatalf("handled %q, want fine", got)
		}
		dls, err := d.DeadLetters(ctx, "mixed", 10)
		if err != nil || len(dls) != 1 {
			t.Fatalf("DeadLetters = %+v, %v; want one", dls, err)
		}
		if dls[0].Message.ID != "" || !bytes.Equal(dls[0].Raw, garbage) || dls[0].Reason == "" {
			t.Fatalf("dead letter = %+v, want the raw entry with a reason", dls[0])
		}
		// It stays put on a retry: it cannot be decoded.
		if n, err := d.RetryDeadLetters(ctx, "mixed"); err != nil || n != 0 {
			t.Fatalf("RetryDeadLetters = %d, %v; want 0", n, err)
		}
	})
}

func TestExclusiveReceiver(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		sender := e.open()
		var mu sync.Mutex
		by := map[string]string{} // message id -> instance
		instances := make([]*disker.Disker, 2)
		// The lock lives 3s and is renewed every second: a slow machine
		// does not let it lapse.
		slow := func(c *disker.Config) { c.HeartbeatInterval = time.Second }
		for i := range instances {
			d, err := disker.New(context.Background(), e.config(slow))
			if err != nil {
				t.Fatal(err)
			}
			instances[i] = d
			name := d.ID()
			if err := d.Handle("solo", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
				mu.Lock()
				by[m.ID] = name
				mu.Unlock()
				return nil, nil
			}), disker.WithExclusive(), disker.WithConcurrency(4)); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() {
			for _, d := range instances {
				_ = d.Close(context.Background())
			}
		})
		ctx := ctxTimeout(t, 30*time.Second)
		sendBatch := func() []string {
			var ids []string
			for range 20 {
				id, err := sender.Send(ctx, disker.Message{Receiver: "solo"})
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			waitFor(t, 20*time.Second, "the batch handled", func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, id := range ids {
					if by[id] == "" {
						return false
					}
				}
				return true
			})
			return ids
		}
		servedBy := func(ids []string) string {
			mu.Lock()
			defer mu.Unlock()
			first := by[ids[0]]
			for _, id := range ids {
				if by[id] != first {
					t.Fatalf("the batch was served by %s and %s", first, by[id])
				}
			}
			return first
		}
		holder := servedBy(sendBatch())
		var first, second *disker.Disker
		for _, d := range instances {
			if d.ID() == holder {
				first = d
			} else {
				second = d
			}
		}
		if !first.LocalStats().Receivers["solo"].HoldsLock || second.LocalStats().Receivers["solo"].HoldsLock {
			t.Fatalf("lock: holder %v, other %v", first.LocalStats().Receivers["solo"], second.LocalStats().Receivers["solo"])
		}
		if err := first.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if got := servedBy(sendBatch()); got != second.ID() {
			t.Fatalf("after the holder closed, served by %s, want %s", got, second.ID())
		}
	})
}

func TestWorkersRegistry(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		a := e.open(func(c *disker.Config) { c.InstanceID = "worker-a" })
		b, err := disker.New(context.Background(), e.config(func(c *disker.Config) { c.InstanceID = "worker-b" }))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Handle("jobs", disker.HandlerFunc(echo), disker.WithConcurrency(3)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 10*time.Second)
		var ws []disker.WorkerInfo
		waitFor(t, 5*time.Second, "both workers, a serving jobs", func() bool {
			ws, err = a.Workers(ctx)
			return err == nil && len(ws) == 2 && ws[0].ID == "worker-a" && slices.Equal(ws[0].Receivers, []string{"jobs"})
		})
		host, _ := os.Hostname()
		if w := ws[0]; w.PID != os.Getpid() || w.Host != host || w.Concurrency["jobs"] != 3 || w.StartedAt.IsZero() || w.LastSeen.IsZero() {
			t.Fatalf("worker-a = %+v", w)
		}
		if ws[1].ID != "worker-b" || len(ws[1].Receivers) != 0 {
			t.Fatalf("worker-b = %+v", ws[1])
		}
		if err := b.Close(ctx); err != nil {
			t.Fatal(err)
		}
		ws, err = a.Workers(ctx)
		if err != nil || len(ws) != 1 || ws[0].ID != "worker-a" {
			t.Fatalf("Workers after b closed = %+v, %v; want only worker-a", ws, err)
		}
		if _, err := b.Workers(ctx); !errors.Is(err, disker.ErrClosed) {
			t.Fatalf("Workers after Close = %v, want ErrClosed", err)
		}
	})
}

// TestNoKeysLeftBehind runs every kind of traffic to its end and checks that
// Redis keeps only (empty) streams and their groups, and the namespace's
// reclaim epoch (one counter).
func TestNoKeysLeftBehind(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	worker, err := disker.New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	client, err := disker.New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	if err := worker.Handle("flaky", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if m.Attempt < 2 {
			return nil, errors.New("first time fails")
		}
		return []byte("ok"), nil
	}), disker.WithBackoff(func(int) time.Duration { return time.Millisecond })); err != nil {
		t.Fatal(err)
	}
	if err := worker.Handle("solo", disker.HandlerFunc(echo), disker.WithExclusive()); err != nil {
		t.Fatal(err)
	}
	var replies, timeouts atomic.Int64
	if err := client.OnReply("client", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) { replies.Add(1) })); err != nil {
		t.Fatal(err)
	}
	if err := client.OnTimeout("client", disker.TimeoutHandlerFunc(func(context.Context, *disker.Message) { timeouts.Add(1) })); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, time.Minute)
	for i := range 50 {
		send := func(m disker.Message, opts ...disker.SendOption) {
			if _, err := client.Send(ctx, m, opts...); err != nil {
				t.Fatal(err)
			}
		}
		send(disker.Message{Sender: "client", Receiver: "echo"})
		send(disker.Message{Sender: "client", Receiver: "echo"}, disker.WithTimeout(10*time.Second))
		send(disker.Message{Sender: "client", Receiver: "nobody"}, disker.WithTimeout(10*time.Millisecond))
		send(disker.Message{Receiver: "solo"})
		if _, err := client.Request(ctx, disker.Message{Receiver: "flaky"}); err != nil {
			t.Fatalf("Request %d: %v", i, err)
		}
	}
	waitFor(t, time.Minute, "every reply and timeout", func() bool { return replies.Load() == 100 && timeouts.Load() == 50 })
	// "nobody" holds the 50 expired messages that nobody served: serve it
	// so that the worker drops them.
	if err := worker.Handle("nobody", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "the expired messages dropped", func() bool {
		return worker.LocalStats().Receivers["nobody"].Expired == 50
	})
	waitFor(t, 30*time.Second, "empty queues", func() bool {
		for _, r := range []string{"echo", "flaky", "solo", "nobody"} {
			if s, err := client.Stats(ctx, r); err != nil || s.Length != 0 || s.Pending != 0 {
				return false
			}
		}
		return true
	})
	for _, d := range []*disker.Disker{worker, client} {
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}

	rc, err := rueidis.NewClient(rueidis.MustParseURL(e.url))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var cursor uint64
	var keys []string
	for {
		entry, err := rc.Do(ctx, rc.B().Scan().Cursor(cursor).Match(e.base.KeyPrefix+":*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, entry.Elements...)
		if cursor = entry.Cursor; cursor == 0 {
			break
		}
	}
	if len(keys) == 0 {
		t.Fatal("no keys at all: the scan is wrong")
	}
	for _, k := range keys {
		typ, err := rc.Do(ctx, rc.B().Type().Key(k).Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case k == e.base.KeyPrefix+":{workers}:reclaim" && typ == "string":
			continue // the namespace's reclaim epoch: one counter, which stays
		case k == e.base.KeyPrefix+":{workers}:departed" && typ == "zset":
			continue // the instances that left, forgotten by the heartbeats of those running a while later
		case k == e.base.KeyPrefix+":{nobody}:expired" && typ == "string":
			continue // the count of a receiver's expired messages (ReceiverStats.Expired), which stays
		}
		if typ != "stream" {
			t.Errorf("key %s of type %s left behind", k, typ)
			continue
		}
		if n, err := rc.Do(ctx, rc.B().Xlen().Key(k).Build()).AsInt64(); err != nil || n != 0 {
			t.Errorf("stream %s holds %d entries (%v)", k, n, err)
		}
	}
	t.Logf("%d keys left, all empty streams: %v", len(keys), keys)
}

// TestRedisRestart restarts Redis (AOF on) in the middle of a stream of
// sends: every accepted message is handled, and the consumers resume by
// themselves.
func TestRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	var events sync.Map
	onEvent := func(c *disker.Config) {
		c.OnEvent = func(ev disker.Event) {
			if ev.Kind == disker.EventUnavailable || ev.Kind == disker.EventAvailable {
				events.Store(ev.Kind, true)
			}
		}
	}
	worker := e.open(onEvent)
	sender := e.open()
	handled := newHandledSet()
	if err := worker.Handle("steady", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		handled.add(m.ID)
		return nil, nil
	}), disker.WithLease(500*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	const n = 600
	var (
		mu       sync.Mutex
		accepted []string
		failures int
	)
	done := make(chan struct{})
	sendUntil := time.Now().Add(3 * time.Minute)
	go func() {
		defer close(done)
		for len(accepted) < n {
			if time.Now().After(sendUntil) {
				t.Errorf("%d of %d sends accepted within 3 minutes", len(accepted), n)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			id, err := sender.Send(ctx, disker.Message{Receiver: "steady"})
			cancel()
			mu.Lock()
			if err != nil {
				failures++
			} else {
				accepted = append(accepted, id)
			}
			mu.Unlock()
			if err != nil {
				time.Sleep(10 * time.Millisecond) // pace the retries while Redis is down
			}
		}
	}()
	waitFor(t, time.Minute, "a third of the sends", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(accepted) >= n/3
	})
	srv.Restart()
	recv(t, done, 4*time.Minute, "the sends to end")
	waitFor(t, 2*time.Minute, "every accepted message handled", func() bool {
		return handled.missing(accepted) == 0
	})
	_, outage := events.Load(disker.EventUnavailable)
	_, back := events.Load(disker.EventAvailable)
	t.Logf("%d accepted, %d sends failed during the restart; the worker saw the outage: %v, its end: %v", len(accepted), failures, outage, back)
	if outage != back {
		t.Fatalf("the worker saw the outage (%v) but not its end (%v), or the other way round", outage, back)
	}
}

// TestRedisDownFailsFastAndResumes stops Redis: calls fail with
// ErrUnavailable, the outage is reported once, and when Redis is back the
// worker resumes by itself.
func TestRedisDownFailsFastAndResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	var mu sync.Mutex
	var kinds []disker.EventKind
	d := e.open(func(c *disker.Config) {
		c.OnEvent = func(ev disker.Event) {
			if ev.Kind == disker.EventUnavailable || ev.Kind == disker.EventAvailable {
				mu.Lock()
				kinds = append(kinds, ev.Kind)
				mu.Unlock()
			}
		}
	})
	handled := make(chan string, 4)
	if err := d.Handle("resilient", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		handled <- string(m.Content)
		return nil, nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, time.Minute)
	if _, err := d.Send(ctx, disker.Message{Receiver: "resilient", Content: []byte("before")}); err != nil {
		t.Fatal(err)
	}
	recv(t, handled, 10*time.Second, "the first message")

	srv.Kill()
	_, err := d.Send(ctx, disker.Message{Receiver: "resilient", Content: []byte("lost")})
	if !errors.Is(err, disker.ErrUnavailable) || !strings.HasPrefix(err.Error(), "disker: ") {
		t.Fatalf("Send with Redis down = %v, want an error wrapping ErrUnavailable", err)
	}
	// The consumer's blocking read fails too, and backs off; let it fail
	// a few times before Redis comes back.
	waitFor(t, 10*time.Second, "the outage to be reported", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(kinds) > 0
	})
	srv.Restart()
	waitFor(t, 30*time.Second, "a send to go through", func() bool {
		_, err := d.Send(ctx, disker.Message{Receiver: "resilient", Content: []byte("after")})
		return err == nil
	})
	if got := recv(t, handled, 30*time.Second, "the message sent after the restart"); got != "after" {
		t.Fatalf("handled %q, want after", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// One report per change of state: unavailable, available (connections
	// broken by the restart may flap once more).
	if len(kinds) < 2 || len(kinds)%2 != 0 {
		t.Fatalf("events %v, want unavailable and available in turn", kinds)
	}
	for i, k := range kinds {
		if want := []disker.EventKind{disker.EventUnavailable, disker.EventAvailable}[i%2]; k != want {
			t.Fatalf("events %v, want unavailable and available in turn", kinds)
		}
	}
}

// TestRequestSettledAcrossRedisOutage kills Redis (AOF on) while a Request
// waits, and restarts it after the Request's deadline: the Request returns
// a timeout by its deadline plus RequestGrace, without waiting for Redis,
// and the reply that comes once Redis is back is late.
func TestRequestSettledAcrossRedisOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	worker, client := e.open(), e.open()
	got := make(chan *disker.Message, 1)
	release := make(chan struct{})
	releaseOnce := sync.OnceFunc(func() { close(release) })
	t.Cleanup(releaseOnce) // before Close, should the test fail
	if err := worker.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		got <- m
		<-release
		return []byte("too late"), nil
	})); err != nil {
		t.Fatal(err)
	}
	type result struct {
		m   *disker.Message
		err error
	}
	res := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		m, err := client.Request(ctx, disker.Message{Receiver: "slow"})
		res <- result{m, err}
	}()
	m := recv(t, got, 30*time.Second, "the request")
	srv.Kill()
	r := recv(t, res, time.Minute, "the Request to return")
	if !errors.Is(r.err, disker.ErrOutcomeUnknown) || !errors.Is(r.err, disker.ErrUnavailable) || errors.Is(r.err, disker.ErrTimeout) {
		t.Fatalf("Request = %v, %v; want ErrOutcomeUnknown (and ErrUnavailable), not ErrTimeout", r.m, r.err)
	}
	if late := time.Since(m.Deadline); late > disker.RequestGrace+time.Second {
		t.Fatalf("Request returned %v after its deadline while Redis was down, want by RequestGrace (%v, and slack)", late, disker.RequestGrace)
	}
	srv.Restart()
	if n := client.LocalStats().TimedOut; n != 1 {
		t.Fatalf("the requester counted %d timeouts, want 1", n)
	}
	releaseOnce()
	waitFor(t, 30*time.Second, "the late reply to be refused", func() bool {
		return worker.LocalStats().Late == 1
	})
	if s := worker.LocalStats(); s.Replied != 0 {
		t.Fatalf("the worker had %d replies accepted, want 0", s.Replied)
	}
}

// TestRequestSettledWhenItsSendAnswerIsLost: a Request whose send went
// through but whose answer was lost (the connection broke after the write)
// does not return the send's error: the message may have been queued, so
// Request settles it, and returns the reply that the worker had accepted
// for it (or, had the write not gone through, times out). The requester
// goes through a proxy that drops answers while it cuts; the worker talks
// to Redis directly. Which answer the cut hits first is not certain, so it
// tries up to five times to see the send fail with its reply accepted.
func TestRequestSettledWhenItsSendAnswerIsLost(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartCutProxy(t, srv.Addr())
	e := newEnv(t, true, srv.URL())
	worker := e.open()
	client := e.open(func(c *disker.Config) { c.RedisURL, c.MaxConnectionPoolSize = proxy.URL(), 1 })
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := client.Request(ctx, disker.Message{Receiver: "echo", Content: []byte("warm-up")}); err != nil {
		t.Fatal(err)
	}
	for try := range 5 {
		replied := worker.LocalStats().Replied
		proxy.SetCut(true)
		res := make(chan error, 1)
		var got *disker.Message
		go func() {
			rctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			var err error
			got, err = client.Request(rctx, disker.Message{Receiver: "echo", Content: []byte("x")})
			res <- err
		}()
		deadline := time.Now().Add(time.Second)
		for worker.LocalStats().Replied == replied && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		proxy.SetCut(false)
		err := recv(t, res, time.Minute, "the Request to return")
		switch {
		case err == nil && string(got.Content) == "echo:x":
			return // the reply the worker had accepted
		case errors.Is(err, disker.ErrTimeout) && strings.Contains(err.Error(), "its send failed"):
			t.Logf("try %d: the write did not go through; settled as timed out", try)
		default:
			t.Fatalf("Request = %v, %v; want the reply, or a timeout settled after the failed send", got, err)
		}
	}
	t.Fatal("in five tries the send never failed with its message queued")
}
