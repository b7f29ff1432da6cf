package disker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestRequestReturnsByDeadlineDuringOutage: a Request in flight when Redis
// is paused (CLIENT PAUSE, sockets open, no answers) or killed returns by
// its deadline plus RequestGrace, with a timeout, instead of when Redis
// answers again. The bound checked has a second of slack for a loaded
// machine; the pause lasts far longer than it.
func TestRequestReturnsByDeadlineDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	for _, fault := range []string{"pause", "kill"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			e := newEnv(t, true, srv.URL())
			client := e.open()
			// No worker: the request waits for its deadline.
			const timeout = 2 * time.Second
			res := make(chan error, 1)
			start := time.Now()
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				_, err := client.Request(ctx, disker.Message{Receiver: "nobody", Content: []byte("x")})
				res <- err
			}()
			waitFor(t, 10*time.Second, "the request to be queued", func() bool {
				s, err := client.Stats(context.Background(), "nobody")
				return err == nil && s.Queued == 1
			})
			switch fault {
			case "pause":
				pauseRedis(t, srv)
			case "kill":
				srv.Kill()
			}
			err := recv(t, res, time.Minute, "the Request to return")
			took := time.Since(start)
			// Settled as a timeout when the give-up marker got through, else
			// returned with its outcome unknown: either by the bound.
			if !errors.Is(err, disker.ErrTimeout) && !errors.Is(err, disker.ErrOutcomeUnknown) {
				t.Fatalf("Request during a Redis %s: %v, want ErrTimeout or ErrOutcomeUnknown", fault, err)
			}
			if limit := timeout + disker.RequestGrace + time.Second; took > limit {
				t.Fatalf("Request during a Redis %s returned after %v, want by %v (its timeout + RequestGrace, and slack)", fault, took, limit)
			}
			if fault == "pause" {
				srv.Kill() // so that Close does not wait for the pause
			}
		})
	}
}

// pauseRedis pauses srv for 20s (CLIENT PAUSE ALL: sockets stay open, no
// command is answered).
func pauseRedis(t *testing.T, srv *redistest.Server) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Arbitrary("CLIENT", "PAUSE").Args("20000", "ALL").Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

// TestRequestSendReturnsByDeadlineDuringPause: a Request made while Redis
// is paused (CLIENT PAUSE: its send is written and never answered) returns
// by its deadline plus RequestGrace with its outcome unknown, though the
// send runs on the Request's own goroutine; a second one made meanwhile,
// whose send is merged behind the first's, returns by its own bound.
func TestRequestSendReturnsByDeadlineDuringPause(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, true, srv.URL())
	client := e.open()
	// A first Request, cancelled, opens the inbox past the deadlines of
	// the ones below, so that they need not renew it and block in their
	// sends.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	time.AfterFunc(100*time.Millisecond, cancel)
	if _, err := client.Request(ctx, disker.Message{Receiver: "nobody", Content: []byte("x")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Request to nobody, cancelled: %v, want context.Canceled", err)
	}
	pauseRedis(t, srv)
	defer srv.Kill() // so that Close does not wait for the pause
	timeouts := []time.Duration{time.Second, 2 * time.Second}
	type result struct {
		err  error
		took time.Duration
	}
	res := make([]chan result, len(timeouts))
	for i, timeout := range timeouts {
		res[i] = make(chan result, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			_, err := client.Request(ctx, disker.Message{Receiver: "nobody", Content: []byte("x")})
			res[i] <- result{err, time.Since(start)}
		}()
		time.Sleep(50 * time.Millisecond) // the second send queues behind the first
	}
	for i, timeout := range timeouts {
		r := recv(t, res[i], time.Minute, "the Request to return")
		if !errors.Is(r.err, disker.ErrOutcomeUnknown) {
			t.Errorf("Request %d (timeout %v) during a pause: %v, want ErrOutcomeUnknown", i, timeout, r.err)
		}
		if limit := timeout + disker.RequestGrace + time.Second; r.took > limit {
			t.Errorf("Request %d during a pause returned after %v, want by %v (its timeout + RequestGrace, and slack)", i, r.took, limit)
		}
	}
}

// TestFastReturnAfterOutage: after Redis was down long enough for the
// retry loops to back off as far as they go, a Request made once it
// accepts connections again is answered within a second (and slack for a
// loaded machine): the loops wait at most 500ms between tries.
func TestFastReturnAfterOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	worker, client := e.open(), e.open()
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo", Content: []byte("warm-up")}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	// The outage itself: long enough for a backoff to grow to its cap.
	time.Sleep(8 * time.Second)
	srv.Restart()
	start := time.Now()
	m, err := client.Request(ctxTimeout(t, 20*time.Second), disker.Message{Receiver: "echo", Content: []byte("x")})
	took := time.Since(start)
	if err != nil || string(m.Content) != "echo:x" {
		t.Fatalf("Request after the outage = %v, %v", m, err)
	}
	if took > 2*time.Second {
		t.Fatalf("the first Request after Redis came back took %v, want within 1s (and slack)", took)
	}
}

// TestCallsReturnByTheirBoundDuringStall: through a proxy that holds every
// byte for 25s (it accepts connections and keeps every socket open, and
// delivers nothing: the connection stalls, is given up, and every new one
// stalls too), Requests and Sends made every 250ms fail and return by
// their bounds: a Request by its ctx's end plus RequestGrace, whether ctx
// had a deadline or was cancelled; Send and SendBatch by ctx's deadline,
// or, without one, Send by SendTimeout with an error wrapping
// ErrUnavailable. Each bound is checked with half a second of slack for a
// loaded machine.
func TestCallsReturnByTheirBoundDuringStall(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartStallProxy(t, srv.Addr())
	e := newEnv(t, true, proxy.URL())
	worker, client := e.open(), e.open()
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	if _, err := client.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo", Content: []byte("warm-up")}); err != nil {
		t.Fatal(err)
	}
	const slack = 500 * time.Millisecond
	type call struct {
		name  string
		bound time.Duration // from the call's start
		run   func() error
	}
	msg := disker.Message{Receiver: "echo", Content: []byte("x")}
	calls := []call{
		{"Request, 1s deadline", time.Second + disker.RequestGrace, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := client.Request(ctx, msg)
			return err
		}},
		{"Request, cancelled after 300ms", 300*time.Millisecond + disker.RequestGrace, func() error {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			_, err := client.Request(ctx, msg)
			return err
		}},
		{"Send, 1s deadline", time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := client.Send(ctx, msg)
			return err
		}},
		{"Send, no deadline", disker.SendTimeout, func() error {
			_, err := client.Send(context.Background(), msg)
			if err != nil && !errors.Is(err, disker.ErrUnavailable) {
				return fmt.Errorf("%w, want an error wrapping ErrUnavailable", err)
			}
			return err
		}},
		{"SendBatch, 1s deadline", time.Second, func() error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := client.SendBatch(ctx, []disker.Message{msg, msg})
			return err
		}},
	}
	proxy.Stall()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var over []string
	start := time.Now()
	for time.Since(start) < 25*time.Second {
		for _, c := range calls {
			wg.Go(func() {
				t0 := time.Now()
				err := c.run()
				took := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					over = append(over, fmt.Sprintf("%s at +%v: succeeded during the stall", c.name, t0.Sub(start).Round(time.Millisecond)))
				case took > c.bound+slack:
					over = append(over, fmt.Sprintf("%s at +%v: returned after %v (%v), want by %v", c.name, t0.Sub(start).Round(time.Millisecond), took.Round(time.Millisecond), err, c.bound))
				}
			})
		}
		time.Sleep(250 * time.Millisecond)
	}
	wg.Wait()
	proxy.Resume()
	for _, o := range over {
		t.Error(o)
	}
	waitFor(t, 30*time.Second, "a Request to succeed after the stall", func() bool {
		_, err := client.Request(ctxTimeout(t, time.Second), msg)
		return err == nil
	})
}

// TestTimedSendOutcomeAfterLostRead: the reply to a timed Send is
// accepted while the sender's read of its reply stream loses its answer
// (Redis served the read, then the connection broke before the entries
// reached the sender). Each time, the sender gets the reply, soon (within
// half the lease an unread reply-stream entry waits before another read
// may take it), and nothing else: no timeout notice, no second reply.
func TestTimedSendOutcomeAfterLostRead(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartCutProxy(t, srv.Addr())
	e := newEnv(t, true, proxy.URL())
	client := e.open()
	direct := e.config()
	direct.RedisURL = srv.URL()
	worker, err := disker.New(context.Background(), direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { worker.Close(context.Background()) })
	rc, err := rueidis.NewClient(rueidis.MustParseURL(srv.URL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	const sender = "web"
	replies := e.base.KeyPrefix + ":{" + sender + "}:r"

	var mu sync.Mutex
	got := map[string][]string{} // message id -> its outcomes
	outcome := make(chan string, 100)
	record := func(id, what string) {
		mu.Lock()
		got[id] = append(got[id], what)
		mu.Unlock()
		outcome <- id
	}
	if err := client.OnReply(sender, disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) {
		record(m.InReplyTo, "reply")
	})); err != nil {
		t.Fatal(err)
	}
	if err := client.OnTimeout(sender, disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
		record(m.ID, "timeout")
	})); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	release := make(chan struct{})
	if err := worker.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		started <- struct{}{}
		<-release
		return m.Content, nil
	})); err != nil {
		t.Fatal(err)
	}
	pending := func() int64 {
		a, err := rc.Do(context.Background(), rc.B().Xpending().Key(replies).Group("g").Build()).ToArray()
		if err != nil || len(a) == 0 {
			return 0
		}
		n, _ := a[0].AsInt64()
		return n
	}
	const rounds = 20
	token := func(i int) string { return fmt.Sprintf("lost-answer-%03d", i) }
	for i := range rounds {
		id, err := client.Send(ctxTimeout(t, 10*time.Second), disker.Message{Sender: sender, Receiver: "slow", Content: []byte(token(i))},
			disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatalf("round %d: Send: %v", i, err)
		}
		recv(t, started, 10*time.Second, "the handler to start")
		// The first answer to the sender that holds the reply is lost;
		// the worker's reply goes straight to Redis and is accepted.
		proxy.CutAnswerWith(token(i))
		release <- struct{}{}
		waitFor(t, 10*time.Second, "a read of the sender to take the reply", func() bool { return pending() == 1 })
		if got := recv(t, outcome, 15*time.Second, "the reply (an unread entry waits 30s)"); got != id {
			t.Fatalf("round %d: outcome for %s, want %s", i, got, id)
		}
	}
	waitFor(t, 10*time.Second, "the reply stream to be acknowledged", func() bool {
		n, err := rc.Do(context.Background(), rc.B().Xlen().Key(replies).Build()).AsInt64()
		return err == nil && n == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(got) != rounds {
		t.Errorf("%d messages had an outcome, want %d", len(got), rounds)
	}
	for id, o := range got {
		if len(o) != 1 || o[0] != "reply" {
			t.Errorf("message %s: outcomes %v, want one reply", id, o)
		}
	}
}
