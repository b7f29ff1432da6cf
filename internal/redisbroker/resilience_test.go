package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

func TestFetchContextDeadline(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: time.Hour, Lease: time.Minute, MaxAttempts: 0})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Fetch past its context's deadline = %v; want DeadlineExceeded", err)
	}
}

// TestRedisRestart kills Redis (AOF on): calls fail fast with
// ErrUnavailable while it is down, and work again, with the data, after.
func TestRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	s := redistest.Start(t, redistest.WithAOF())
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	req := env("m1", "orders")
	req.Sender = "web"
	req.Timeout = time.Hour
	if _, err := sendEnv(ctx, b, req); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, b, env("m2", "orders")); err != nil {
		t.Fatal(err)
	}
	leased := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "A", Lease: time.Hour, MaxAttempts: 0})
	if len(leased) != 2 {
		t.Fatalf("Fetch = %+v", leased)
	}
	// Leave a dedicated connection in the pool of blocking reads.
	if ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "empty", Consumer: "A", Max: 1, Block: 10 * time.Millisecond, Lease: time.Hour, MaxAttempts: 0}); err != nil || len(ds) != 0 {
		t.Fatalf("blocking Fetch = %+v, %v", ds, err)
	}
	if _, err := sendEnv(ctx, b, env("m3", "orders")); err != nil {
		t.Fatal(err)
	}

	s.Kill()
	calls := map[string]func() error{
		"Send": func() error { _, err := sendEnv(ctx, b, env("x", "orders")); return err },
		"Fetch": func() error {
			_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "orders", Consumer: "A", Max: 10, Block: time.Second, Lease: time.Hour, MaxAttempts: 0})
			return err
		},
		"Reply": func() error {
			return b.Reply(ctx, &broker.Envelope{ID: "r", Receiver: "web", InReplyTo: "m1"}, broker.ReplyTimed)
		},
		"Stats": func() error { _, err := b.Stats(ctx, "orders"); return err },
		"Now":   func() error { _, err := b.Now(ctx); return err },
	}
	for name, call := range calls {
		err := call()
		if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "Redis at "+s.Addr()+" is unreachable") {
			t.Errorf("%s while Redis is down = %v; want ErrUnavailable naming %s", name, err, s.Addr())
		}
	}

	s.Restart()
	var st broker.ReceiverStats
	eventually(t, "the broker to reconnect", func() bool {
		var err error
		st, err = b.Stats(ctx, "orders")
		return err == nil
	})
	if want := (broker.ReceiverStats{Receiver: "orders", Queued: 1, Pending: 2, Length: 3, OldestQueued: st.OldestQueued}); st != want || st.OldestQueued.IsZero() {
		t.Fatalf("Stats after restart = %+v, want %+v", st, want)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r", Receiver: "web", InReplyTo: "m1"}, broker.ReplyTimed); err != nil {
		t.Fatalf("timed Reply after restart: %v", err)
	}
	if ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "empty", Consumer: "A", Max: 1, Block: 10 * time.Millisecond, Lease: time.Hour, MaxAttempts: 0}); err != nil || len(ds) != 0 {
		t.Fatalf("blocking Fetch after restart = %+v, %v", ds, err)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "A", Lease: time.Hour, MaxAttempts: 0})
	if len(ds) != 1 || ds[0].Env.ID != "m3" {
		t.Fatalf("Fetch after restart = %+v; want m3", ds)
	}
	refs := []string{ds[0].Ref}
	for _, d := range leased {
		refs = append(refs, d.Ref)
	}
	if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "orders", Consumer: "A", Refs: refs, Lease: time.Hour}); err != nil || len(lost) != 0 {
		t.Fatalf("Extend after restart: lost %v, %v", lost, err)
	}
	if err := b.Ack(ctx, "orders", refs...); err != nil {
		t.Fatal(err)
	}
	rs := readAll(t, b, "web", "c")
	if len(rs) != 1 || rs[0].RequestID != "m1" {
		t.Fatalf("replies after restart = %+v", rs)
	}
}

// TestRedisRestartWithoutData: the groups are gone with the data; the
// broker creates them again.
func TestRedisRestartWithoutData(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	d := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: time.Hour, MaxAttempts: 0})
	s.Restart()
	eventually(t, "the broker to reconnect", func() bool {
		_, err := b.Now(ctx)
		return err == nil
	})
	if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "A", Refs: []string{d[0].Ref}, Lease: time.Hour}); err != nil || len(lost) != 1 {
		t.Fatalf("Extend of a lost queue = %v, %v; want the ref lost", lost, err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: d[0].Ref, Delay: 0, Lease: time.Hour}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry on a lost queue = %v; want ErrLeaseLost", err)
	}
	if _, err := sendEnv(ctx, b, env("m2", "r")); err != nil {
		t.Fatal(err)
	}
	got := make(chan []broker.Delivery, 1)
	go func() {
		ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "A", Max: 10, Block: 10 * time.Second, Lease: time.Hour, MaxAttempts: 0})
		got <- ds
	}()
	if ds := <-got; len(ds) != 1 || ds[0].Env.ID != "m2" {
		t.Fatalf("Fetch after restart = %+v", ds)
	}
}

// TestBlockedFetchesDoNotStarveSends: 500 Fetch calls blocked in Redis
// (through one read of the consumer's hub),
// then sends must still go through, also when the blocking connections are
// fewer than the blocked calls.
func TestBlockedFetchesDoNotStarveSends(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	t.Parallel()
	for _, maxBlocking := range []int{0, 8} {
		t.Run(fmt.Sprint("MaxBlockingConnections=", maxBlocking), func(t *testing.T) {
			s := redistest.Start(t)
			b := newBrokerOn(t, s, Config{MaxConnectionPoolSize: 1, MaxBlockingConnections: maxBlocking})
			ctx := ctxT(t)
			const fetchers = 500
			var wg sync.WaitGroup
			got := make(chan string, fetchers)
			for i := range fetchers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: fmt.Sprint("r", i), Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute, MaxAttempts: 0})
					if err != nil {
						t.Error(err)
						return
					}
					for _, d := range ds {
						got <- d.Env.ID
					}
				}()
			}
			// directReads of the reads wait on connections of their own,
			// the others in the consumer's hub, which blocks in Redis with
			// one read of all their streams.
			raw := rawClient(t, s)
			eventually(t, "500 reads in the direct reads and one blocked read", func() bool {
				n, _ := do(t, raw, "INFO", "clients").ToString()
				return len(b.direct) == directReads && b.hubWaiters() == fetchers-directReads &&
					strings.Contains(n, fmt.Sprintf("blocked_clients:%d\r", 1+directReads))
			})
			sendCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			for i := range fetchers {
				if _, err := sendEnv(sendCtx, b, env(fmt.Sprint("m", i), fmt.Sprint("r", i))); err != nil {
					t.Fatalf("Send %d with %d blocked fetches: %v", i, fetchers, err)
				}
			}
			wg.Wait()
			close(got)
			n := 0
			for range got {
				n++
			}
			if n != fetchers {
				t.Fatalf("%d of %d fetchers got their message", n, fetchers)
			}
		})
	}
}

// inboxRoundTrips sends two timed requests to receiver from an inbox,
// answers one and gives up the other, reads and acknowledges the inbox,
// and deletes it.
func inboxRoundTrips(t *testing.T, b *Broker, receiver string) {
	t.Helper()
	ctx := ctxT(t)
	const inbox = "_inbox.left"
	if err := b.KeepInbox(ctx, inbox, time.Hour); err != nil {
		t.Fatal(err)
	}
	var deadline time.Time
	for _, id := range []string{"i1", "i2"} {
		e := env(id, receiver)
		e.Sender, e.Timeout = inbox, time.Hour
		dl, err := sendRequest(ctx, b, e)
		if err != nil {
			t.Fatal(err)
		}
		if deadline.IsZero() {
			deadline = dl
		}
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: receiver, Consumer: "A", Lease: time.Hour, MaxAttempts: 0})
	if len(ds) != 2 {
		t.Fatalf("Fetch = %+v", ds)
	}
	if err := b.ReplyInbox(ctx, &broker.Envelope{ID: "ri1", Receiver: inbox, InReplyTo: "i1"}, deadline); err != nil {
		t.Fatal(err)
	}
	if _, err := b.GiveUp(ctx, inbox, "i2"); err != nil {
		t.Fatal(err)
	}
	if err := b.Ack(ctx, receiver, ds[0].Ref, ds[1].Ref); err != nil {
		t.Fatal(err)
	}
	rs := readInbox(t, b, inbox)
	if len(rs) != 2 {
		t.Fatalf("inbox entries = %+v", rs)
	}
	if err := b.AckInbox(ctx, inbox, rs[1].Ref); err != nil {
		t.Fatal(err)
	}
	if err := b.CloseInbox(ctx, inbox); err != nil {
		t.Fatal(err)
	}
}

// TestNoKeysLeftBehind runs every kind of message to its end and checks
// that only the streams (empty) remain.
func TestNoKeysLeftBehind(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	// A request answered in time, one that times out, another answered, a
	// fire-and-forget, a retried one (short and long delay) and a
	// dead-lettered one that is purged; then requests from an inbox.
	for i, timeout := range []time.Duration{time.Hour, time.Millisecond, time.Hour, 0, 0, 0, 0} {
		e := env(fmt.Sprint("m", i), "orders")
		e.Sender = "web"
		e.Timeout = timeout
		if _, err := sendEnv(ctx, b, e); err != nil {
			t.Fatal(err)
		}
	}
	const lease = time.Hour
	ds := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "A", Lease: lease, MaxAttempts: 0})
	if len(ds) != 7 {
		t.Fatalf("Fetch = %d deliveries", len(ds))
	}
	for _, m := range []string{"m0", "m2"} {
		if err := b.Reply(ctx, &broker.Envelope{ID: "r-" + m, Receiver: "web", InReplyTo: m}, broker.ReplyTimed); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "orders", Consumer: "A", Ref: ds[4].Ref, Delay: 0, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "orders", Consumer: "A", Ref: ds[5].Ref, Delay: 2 * lease, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	if err := b.DeadLetter(ctx, "orders", ds[6], "no"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.PurgeDeadLetters(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	again := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "B", Lease: lease, MaxAttempts: 0})
	if len(again) != 1 || again[0].Env.ID != "m4" {
		t.Fatalf("retried = %+v", again)
	}
	refs := []string{ds[0].Ref, ds[1].Ref, ds[2].Ref, ds[3].Ref, ds[4].Ref, ds[5].Ref}
	if err := b.Ack(ctx, "orders", refs...); err != nil {
		t.Fatal(err)
	}
	eventually(t, "m1 to time out", func() bool {
		n, err := b.ExpireTimeouts(ctx, "web", 10)
		return err == nil && n == 1
	})
	rs := readAll(t, b, "web", "c")
	if len(rs) != 3 {
		t.Fatalf("replies = %+v", rs)
	}
	if err := b.AckReplies(ctx, "web", rs[0].Ref, rs[1].Ref, rs[2].Ref); err != nil {
		t.Fatal(err)
	}
	inboxRoundTrips(t, b, "orders")
	if ok, err := b.Acquire(ctx, "orders", "A", time.Hour); err != nil || !ok {
		t.Fatal("Acquire", ok, err)
	}
	if err := b.Release(ctx, "orders", "A"); err != nil {
		t.Fatal(err)
	}
	if err := b.Heartbeat(ctx, broker.WorkerInfo{ID: "A", Receivers: []string{"orders"}}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(ctx, "A"); err != nil {
		t.Fatal(err)
	}
	got := keysOf(t, raw, b.keys.prefix)
	// The holders hashes keep the leases of the consumers that fetched
	// (c and A; Deregister removed A's entries, not c's); the departed
	// workers keep A for departedFor; the reclaim epoch counts A leaving.
	want := []string{":{orders}:hold hash", ":{orders}:q stream", ":{web}:r stream", ":{workers}:departed zset", ":{workers}:reclaim string"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("keys left = %q; want only %q", got, want)
	}
	for _, k := range []string{b.keys.queue("orders"), b.keys.replies("web")} {
		if n, _ := do(t, raw, "XLEN", k).AsInt64(); n != 0 {
			t.Errorf("%s holds %d entries", k, n)
		}
		if p, _ := do(t, raw, "XPENDING", k, "g").ToArray(); len(p) == 0 {
			t.Errorf("XPENDING %s answered nothing", k)
		} else if n, _ := p[0].AsInt64(); n != 0 {
			t.Errorf("%s has %d pending entries", k, n)
		}
	}
}

// TestIdleConsumersArePruned: consumers that hold nothing and were idle
// long enough are deleted from the group, so that instances that come and
// go do not pile up in Redis.
func TestIdleConsumersArePruned(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.pruneIdle, b.pruneEvery = 10*time.Millisecond, 0
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	for _, id := range []string{"m1", "m2"} {
		if _, err := sendEnv(ctx, b, env(id, "r")); err != nil {
			t.Fatal(err)
		}
	}
	if ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "gone", Max: 1, Block: 0, Lease: time.Hour, MaxAttempts: 0}); len(ds) != 1 {
		t.Fatal("gone got nothing")
	} else if err := b.Ack(ctx, "r", ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	if ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "holder", Max: 1, Block: 0, Lease: time.Hour, MaxAttempts: 0}); len(ds) != 1 {
		t.Fatal("holder got nothing")
	}
	consumers := func() string {
		cs, err := do(t, raw, "XINFO", "CONSUMERS", b.keys.queue("r"), "g").ToArray()
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range cs {
			m, _ := c.AsStrMap()
			names = append(names, m["name"])
		}
		return strings.Join(names, ",")
	}
	eventually(t, "gone to be pruned", func() bool {
		if _, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "new", Max: 1, Block: 0, Lease: time.Hour, MaxAttempts: 0}); err != nil {
			t.Fatal(err)
		}
		return consumers() == "holder"
	})
}

func TestQueueDeletedUnderTheBroker(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	if ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0}); len(ds) != 0 {
		t.Fatal(ds)
	}
	if err := do(t, raw, "DEL", b.keys.queue("r")).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, b, env("m", "r")); err != nil {
		t.Fatal(err)
	}
	if ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0}); len(ds) != 1 {
		t.Fatalf("Fetch after the queue was deleted = %+v", ds)
	}
}

// TestCredentialErrorIsUnavailable: a permission revoked under a running
// broker (NOPERM; WRONGPASS and NOAUTH likewise) makes its calls fail with
// an error wrapping broker.ErrUnavailable, as the gateway answers 503.
func TestCredentialErrorIsUnavailable(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	if err := do(t, rawClient(t, s), "ACL", "SETUSER", "default", "-xadd").Error(); err != nil {
		t.Fatal(err)
	}
	_, err := sendEnv(ctx, b, env("m2", "r"))
	if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("Send without the permission = %v, want an error wrapping ErrUnavailable that quotes NOPERM", err)
	}
}

// TestSkipVerifyRefused: the URL parameter skip_verify, which rueidis
// honours by turning TLS verification off without a word, is refused with
// an error that names it and the way to choose that.
func TestSkipVerifyRefused(t *testing.T) {
	t.Parallel()
	_, err := New(Config{URL: "rediss://127.0.0.1:6380?skip_verify=true"})
	if err == nil || !strings.Contains(err.Error(), "skip_verify") || !strings.Contains(err.Error(), "InsecureSkipVerify") {
		t.Fatalf("New with ?skip_verify = %v, want an error that refuses it", err)
	}
}
