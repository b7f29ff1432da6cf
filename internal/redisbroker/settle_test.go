package redisbroker

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

func TestRetry(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.reclaimEvery = 0 // every Fetch reclaims: this tests the scripts' arithmetic
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	const lease = time.Hour
	d := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 0})[0]
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "B", Ref: d.Ref, Delay: 0, Lease: lease}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry by a non-holder = %v; want ErrLeaseLost", err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: "bogus", Delay: 0, Lease: lease}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry of a bogus ref = %v; want ErrLeaseLost", err)
	}
	// A delay shorter than the lease ages the entry: idle = lease - delay.
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: d.Ref, Delay: 30 * time.Minute, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	if got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 0}); len(got) != 0 {
		t.Fatalf("redelivered before the delay: %+v", got)
	}
	// The holder's lease decides, not the fetcher's: a shorter one does not
	// bring the message back before the delay.
	if got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: 30 * time.Minute, MaxAttempts: 0}); len(got) != 0 {
		t.Fatalf("Fetch with lease = lease-delay: %+v; want nothing (A's lease decides)", got)
	}
	// Delay 0: at once.
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: d.Ref, Delay: 0, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "C", Lease: lease, MaxAttempts: 0})
	if len(got) != 1 || got[0].Attempt != 2 || got[0].Env.ID != "m1" {
		t.Fatalf("after Retry(0): %+v; want attempt 2", got)
	}
}

func TestRetryLongerThanLease(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.reclaimEvery = 0 // every Fetch reclaims: this tests the scripts' arithmetic
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	lease := 20 * time.Millisecond
	d := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 0})[0]
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: d.Ref, Delay: time.Hour, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	// Many leases pass; the entry stays parked with its holder.
	now, _ := b.Now(ctx)
	for i := 0; i < 3; i++ {
		eventually(t, "a lease to pass", func() bool {
			n, _ := b.Now(ctx)
			return n.Sub(now) > lease
		})
		now, _ = b.Now(ctx)
		if got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 0}); len(got) != 0 {
			t.Fatalf("redelivered before the delay: %+v", got)
		}
	}
	if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "A", Refs: []string{d.Ref}, Lease: lease}); err != nil || len(lost) != 0 {
		t.Fatalf("holder lost a parked entry: %v, %v", lost, err)
	}
	// Bring the due time to now: the next Fetch takes it.
	if err := do(t, raw, "ZADD", b.keys.retries("r"), "0", d.Ref).Error(); err != nil {
		t.Fatal(err)
	}
	got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 0})
	if len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("after the delay: %+v; want attempt 2", got)
	}
	if n, _ := do(t, raw, "EXISTS", b.keys.retries("r")).AsInt64(); n != 0 {
		t.Fatal("the delayed zset outlived its entry")
	}
}

func TestDeadLetterAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	e := env("m1", "r")
	e.Timeout = time.Hour
	deadline, err := sendEnv(ctx, b, e)
	if err != nil {
		t.Fatal(err)
	}
	const lease = time.Hour
	for attempt := 1; attempt <= 2; attempt++ {
		ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 2})
		if len(ds) != 1 || ds[0].Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, ds)
		}
		if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: ds[0].Ref, Delay: 0, Lease: lease}); err != nil {
			t.Fatal(err)
		}
	}
	if ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 2}); len(ds) != 0 {
		t.Fatalf("delivered beyond max attempts: %+v", ds)
	}
	dls, err := b.DeadLetters(ctx, "r", 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters = %+v, %v", dls, err)
	}
	dl := dls[0]
	if dl.Env.ID != "m1" || dl.Attempts != 2 || !strings.Contains(dl.Reason, "2 deliveries") || dl.Raw != nil || dl.At.IsZero() {
		t.Fatalf("dead letter = %+v", dl)
	}
	st, _ := b.Stats(ctx, "r")
	if want := (broker.ReceiverStats{Receiver: "r", DeadLetters: 1}); st != want {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
	// Retried, it starts again at attempt 1, keeping its deadline.
	if n, err := b.RetryDeadLetters(ctx, "r"); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters = %d, %v", n, err)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 2})
	if len(ds) != 1 || ds[0].Attempt != 1 || ds[0].Env.ID != "m1" || !ds[0].Deadline.Equal(deadline) {
		t.Fatalf("after RetryDeadLetters: %+v; want m1 attempt 1 deadline %v", ds, deadline)
	}
}

func TestUndecodableEntriesGoToDeadLetters(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	q := b.keys.queue("r")
	if err := do(t, raw, "XADD", q, "*", "m", "garbage").Error(); err != nil {
		t.Fatal(err)
	}
	if err := do(t, raw, "XADD", q, "*", "foo", "bar").Error(); err != nil {
		t.Fatal(err)
	}
	if err := b.InjectRaw(ctx, "r", []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, b, env("good", "r")); err != nil {
		t.Fatal(err)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 5})
	if len(ds) != 1 || ds[0].Env.ID != "good" {
		t.Fatalf("Fetch = %+v; want only the good message", ds)
	}
	dls, err := b.DeadLetters(ctx, "r", 10)
	if err != nil || len(dls) != 3 {
		t.Fatalf("DeadLetters = %+v, %v; want 3", dls, err)
	}
	wantRaw := []string{"garbage", `["foo","bar"]`, "\x01\x02\x03"}
	for i, dl := range dls {
		if string(dl.Raw) != wantRaw[i] || dl.Env.ID != "" || !strings.Contains(dl.Reason, "undecodable") || dl.Attempts != 1 {
			t.Errorf("dead letter %d = %+v (raw %q); want raw %q", i, dl, dl.Raw, wantRaw[i])
		}
	}
	if n, err := b.RetryDeadLetters(ctx, "r"); err != nil || n != 0 {
		t.Fatalf("RetryDeadLetters of undecodable entries = %d, %v; want 0", n, err)
	}
	// The blocking read path dead-letters too.
	done := make(chan []broker.Delivery, 1)
	go func() {
		ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: 10 * time.Second, Lease: time.Minute, MaxAttempts: 5})
		done <- ds
	}()
	eventually(t, "the fetch to block", func() bool {
		n, _ := do(t, raw, "CLIENT", "LIST").ToString()
		return strings.Contains(n, "cmd=xreadgroup")
	})
	if err := do(t, raw, "XADD", q, "*", "m", "more garbage").Error(); err != nil {
		t.Fatal(err)
	}
	if got := <-done; len(got) != 0 {
		t.Fatalf("blocking Fetch returned %+v for garbage", got)
	}
	if dls, _ := b.DeadLetters(ctx, "r", 10); len(dls) != 4 || string(dls[3].Raw) != "more garbage" {
		t.Fatalf("DeadLetters after blocking fetch = %+v", dls)
	}
}

func TestDeadLetterRetryPurge(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := sendEnv(ctx, b, env(id, "r")); err != nil {
			t.Fatal(err)
		}
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	for _, d := range ds {
		if err := b.DeadLetter(ctx, "r", d, "failed: "+d.Env.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.DeadLetter(ctx, "r", ds[0], "again"); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("DeadLetter of a gone entry = %v; want ErrLeaseLost", err)
	}
	dls, err := b.DeadLetters(ctx, "r", 2)
	if err != nil || len(dls) != 2 || dls[0].Env.ID != "a" || dls[0].Reason != "failed: a" || dls[0].Attempts != 1 || dls[1].Env.ID != "b" {
		t.Fatalf("DeadLetters(2) = %+v, %v", dls, err)
	}
	if n, err := b.RetryDeadLetters(ctx, "r", dls[1].Ref, "bogus", "1-1"); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters(b) = %d, %v", n, err)
	}
	if got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0}); len(got) != 1 || got[0].Env.ID != "b" {
		t.Fatalf("after retry: %+v", got)
	}
	if n, err := b.PurgeDeadLetters(ctx, "r", dls[0].Ref, "bogus"); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters(a) = %d, %v", n, err)
	}
	if n, err := b.PurgeDeadLetters(ctx, "r"); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters() = %d, %v; want c", n, err)
	}
	if dls, _ := b.DeadLetters(ctx, "r", 10); len(dls) != 0 {
		t.Fatalf("dead letters left: %+v", dls)
	}
}

func TestRetryAllDeadLettersInChunks(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	dlq := b.keys.deadLetters("r")
	const n = maxBatch + 5
	for i := 0; i < n; i++ {
		m := string(encodeForTest(env("m", "r")))
		if i%100 == 0 {
			if err := do(t, raw, "XADD", dlq, "*", "m", "junk", "reason", "x", "attempts", "1", "at", "0", "bad", "1").Error(); err != nil {
				t.Fatal(err)
			}
		}
		if err := do(t, raw, "XADD", dlq, "*", "m", m, "reason", "x", "attempts", "1", "at", "0", "bad", "0").Error(); err != nil {
			t.Fatal(err)
		}
	}
	moved, err := b.RetryDeadLetters(ctx, "r")
	if err != nil || moved != n {
		t.Fatalf("RetryDeadLetters = %d, %v; want %d", moved, err, n)
	}
	st, _ := b.Stats(ctx, "r")
	if st.Queued != n || st.DeadLetters != (n+99)/100 {
		t.Fatalf("Stats = %+v", st)
	}
}

func TestConcurrentAckManyRefs(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	const n = 2500
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := sendEnv(ctx, b, env("m", "r")); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: n, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != n {
		t.Fatalf("Fetch = %d, %v", len(ds), err)
	}
	refs := make([]string, len(ds))
	for i, d := range ds {
		refs[i] = d.Ref
	}
	if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "c", Refs: refs, Lease: time.Minute}); err != nil || len(lost) != 0 {
		t.Fatalf("Extend of %d refs: lost %d, %v", n, len(lost), err)
	}
	if err := b.Ack(ctx, "r", refs...); err != nil {
		t.Fatal(err)
	}
	if st, _ := b.Stats(ctx, "r"); st.Length != 0 {
		t.Fatalf("Stats after Ack = %+v", st)
	}
}

// TestBadDeadlineIsUndecodable: a queue entry whose message decodes but
// whose deadline field does not parse is dead-lettered with the reason,
// not delivered as a message without a deadline.
func TestBadDeadlineIsUndecodable(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	data := string(wire.Encode(env("bad-deadline", "r")))
	if err := do(t, raw, "XADD", b.keys.queue("r"), "*", "m", data, "d", "soon").Error(); err != nil {
		t.Fatal(err)
	}
	if ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Lease: time.Minute, MaxAttempts: 5}); err != nil || len(ds) != 0 {
		t.Fatalf("Fetch = %+v, %v; want nothing", ds, err)
	}
	dls, err := b.DeadLetters(ctx, "r", 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters = %+v, %v; want 1", dls, err)
	}
	if r := dls[0].Reason; !strings.Contains(r, "undecodable") || !strings.Contains(r, `deadline (field d) "soon"`) {
		t.Fatalf("dead letter reason %q, want it undecodable for its deadline", r)
	}
}
