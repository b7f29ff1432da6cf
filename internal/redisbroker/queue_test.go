package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
	"github.com/diskerhq/disker/internal/wire"
)

func env(id, receiver string) *broker.Envelope {
	return &broker.Envelope{ID: id, Sender: "s-" + receiver, Receiver: receiver, Content: []byte("content of " + id),
		Headers: map[string]string{"h": "v"}}
}

// fetch1 fetches up to 10 deliveries (p.Max) without blocking (p.Block).
func fetch1(t *testing.T, b *Broker, p broker.FetchParams) []broker.Delivery {
	t.Helper()
	p.Max, p.Block = 10, 0
	ds, err := b.Fetch(ctxT(t), &p)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return ds
}

func TestSendFetchAck(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	want := env("m1", "orders")
	deadline, err := b.Send(ctx, want)
	if err != nil || !deadline.IsZero() {
		t.Fatalf("Send = %v, %v; want zero deadline, nil", deadline, err)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "c1", Lease: time.Minute, MaxAttempts: 5})
	if len(ds) != 1 {
		t.Fatalf("Fetch returned %d deliveries, want 1", len(ds))
	}
	d := ds[0]
	if !reflect.DeepEqual(d.Env, *want) || d.Attempt != 1 || !d.Deadline.IsZero() || d.Ref == "" {
		t.Fatalf("delivery = %+v, want %+v attempt 1, no deadline", d, *want)
	}
	if again := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "c2", Lease: time.Minute, MaxAttempts: 5}); len(again) != 0 {
		t.Fatalf("a leased message was delivered again: %+v", again)
	}
	st, err := b.Stats(ctx, "orders")
	if err != nil {
		t.Fatal(err)
	}
	if want := (broker.ReceiverStats{Receiver: "orders", Length: 1, Pending: 1}); st != want {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
	if err := b.Ack(ctx, "orders", d.Ref, "not-a-ref", "1-1"); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	st, _ = b.Stats(ctx, "orders")
	if want := (broker.ReceiverStats{Receiver: "orders"}); st != want {
		t.Fatalf("Stats after Ack = %+v, want %+v", st, want)
	}
}

func TestFetchOrderAndMax(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	for _, id := range []string{"a", "b", "c"} {
		if _, err := b.Send(ctx, env(id, "r")); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 2, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != 2 || ds[0].Env.ID != "a" || ds[1].Env.ID != "b" {
		t.Fatalf("Fetch max 2 = %+v, %v; want a, b", ds, err)
	}
	ds, err = b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 2, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != 1 || ds[0].Env.ID != "c" {
		t.Fatalf("second Fetch = %+v, %v; want c", ds, err)
	}
	ds, err = b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 2, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || ds == nil || len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue = %#v, %v; want an empty slice", ds, err)
	}
}

func TestSendTimedSetsDeadline(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	before, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := env("m1", "orders")
	e.Timeout = time.Hour
	deadline, err := b.Send(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := b.Now(ctx)
	if deadline.Before(before.Add(time.Hour).Truncate(time.Millisecond)) || deadline.After(after.Add(time.Hour)) {
		t.Fatalf("deadline %v not within [%v, %v] + 1h", deadline, before, after)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 1 || !ds[0].Deadline.Equal(deadline) || ds[0].Env.Timeout != time.Hour {
		t.Fatalf("delivery %+v, want deadline %v", ds, deadline)
	}
}

func TestSendValidation(t *testing.T) {
	t.Parallel()
	b := newBrokerOn(t, srv, Config{MaxMessageSize: 10})
	ctx := ctxT(t)
	tests := map[string]struct {
		env  *broker.Envelope
		want string
	}{
		"nil":         {nil, "envelope is nil"},
		"no receiver": {&broker.Envelope{ID: "x"}, "Envelope.Receiver"},
		"no id":       {&broker.Envelope{Receiver: "r"}, "Envelope.ID"},
		"too big":     {&broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 11)}, "MaxMessageSize"},
		"negative":    {&broker.Envelope{ID: "x", Receiver: "r", Timeout: -1}, "Envelope.Timeout"},
		"no sender":   {&broker.Envelope{ID: "x", Receiver: "r", Timeout: time.Second}, "Envelope.Sender"},
	}
	for name, tc := range tests {
		if _, err := b.Send(ctx, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "redisbroker: ") {
			t.Errorf("%s: Send = %v; want an error about %s", name, err, tc.want)
		}
	}
	if _, err := b.Send(ctx, &broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 10)}); err != nil {
		t.Fatalf("Send at the size limit: %v", err)
	}
}

func TestFetchBlocksUntilSend(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	got := make(chan []broker.Delivery, 1)
	errc := make(chan error, 1)
	go func() {
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: 20 * time.Second, Lease: time.Minute, MaxAttempts: 0})
		got <- ds
		errc <- err
	}()
	if _, err := b.Send(ctx, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	ds := <-got
	if err := <-errc; err != nil || len(ds) != 1 || ds[0].Env.ID != "m1" {
		t.Fatalf("blocked Fetch = %+v, %v; want m1", ds, err)
	}
}

func TestFetchBlockEndsEmpty(t *testing.T) {
	t.Parallel()
	// IOTimeout shorter than the block time must not break blocking reads.
	b := newBrokerOn(t, srv, Config{IOTimeout: 50 * time.Millisecond})
	ds, err := b.Fetch(ctxT(t), &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: 300 * time.Millisecond, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || ds == nil || len(ds) != 0 {
		t.Fatalf("Fetch on an empty queue = %#v, %v; want an empty slice", ds, err)
	}
}

func TestFetchContextCancel(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx, cancel := context.WithCancel(ctxT(t))
	errc := make(chan error, 1)
	go func() {
		_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: time.Minute, Lease: time.Minute, MaxAttempts: 0})
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Fetch after cancel = %v; want context.Canceled", err)
	}
	// The broker still works.
	if _, err := b.Send(ctxT(t), env("m", "r")); err != nil {
		t.Fatal(err)
	}
}

func TestReclaimAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	if _, err := b.Send(ctx, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	lease := 50 * time.Millisecond
	first := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 5})
	if len(first) != 1 || first[0].Attempt != 1 {
		t.Fatalf("first Fetch = %+v", first)
	}
	var second []broker.Delivery
	eventually(t, "the message to be reclaimed", func() bool {
		second = fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 5})
		return len(second) > 0
	})
	if len(second) != 1 || second[0].Attempt != 2 || second[0].Ref != first[0].Ref || second[0].Env.ID != "m1" {
		t.Fatalf("reclaimed = %+v; want m1 at attempt 2", second)
	}
	lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "A", Refs: []string{first[0].Ref}, Lease: lease})
	if err != nil || !reflect.DeepEqual(lost, []string{first[0].Ref}) {
		t.Fatalf("Extend by the old holder = %v, %v; want the ref lost", lost, err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: first[0].Ref, Delay: 0, Lease: lease}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry by the old holder = %v; want ErrLeaseLost", err)
	}
}

func TestExtendResetsLease(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	const lease = time.Hour
	for _, id := range []string{"extended", "control"} {
		if _, err := b.Send(ctx, env(id, "r")); err != nil {
			t.Fatal(err)
		}
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Lease: lease, MaxAttempts: 0})
	if len(ds) != 2 {
		t.Fatalf("Fetch = %+v", ds)
	}
	// Retry with no delay makes both reclaimable at once (idle = lease)...
	for _, d := range ds {
		if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "A", Ref: d.Ref, Delay: 0, Lease: lease}); err != nil {
			t.Fatal(err)
		}
	}
	// ...and Extend renews the first: idle 0 again.
	lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "A", Refs: []string{ds[0].Ref, "bogus", "1-1"}, Lease: lease})
	if err != nil || !reflect.DeepEqual(lost, []string{"bogus", "1-1"}) {
		t.Fatalf("Extend = %v, %v; want only the unknown refs lost", lost, err)
	}
	got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 0})
	if len(got) != 1 || got[0].Env.ID != "control" || got[0].Attempt != 2 {
		t.Fatalf("Fetch by B = %+v; want only control, attempt 2", got)
	}
}

func TestRetry(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.reclaimEvery = 0 // every Fetch reclaims: this tests the scripts' arithmetic
	ctx := ctxT(t)
	if _, err := b.Send(ctx, env("m1", "r")); err != nil {
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
	if _, err := b.Send(ctx, env("m1", "r")); err != nil {
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
	if err := do(t, raw, "ZADD", b.keys.delayed("r"), "0", d.Ref).Error(); err != nil {
		t.Fatal(err)
	}
	got := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease, MaxAttempts: 0})
	if len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("after the delay: %+v; want attempt 2", got)
	}
	if n, _ := do(t, raw, "EXISTS", b.keys.delayed("r")).AsInt64(); n != 0 {
		t.Fatal("the delayed zset outlived its entry")
	}
}

func TestDeadLetterAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	e := env("m1", "r")
	e.Timeout = time.Hour
	deadline, err := b.Send(ctx, e)
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
	if _, err := b.Send(ctx, env("good", "r")); err != nil {
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
		if _, err := b.Send(ctx, env(id, "r")); err != nil {
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
			if _, err := b.Send(ctx, env("m", "r")); err != nil {
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

// TestSendBatchPartialFailure makes one receiver's queue key a string, so
// that Redis refuses its XADD (WRONGTYPE) and its send_timed: the batch
// reports those two messages in a *BatchError and sends the others, in
// order, in one pipeline per run.
func TestSendBatchPartialFailure(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rc := rawClient(t, srv)
	if err := do(t, rc, "SET", b.keys.queue("broken"), "not a stream").Error(); err != nil {
		t.Fatal(err)
	}
	timed := env("m4", "broken")
	timed.Timeout = time.Minute
	envs := []*broker.Envelope{env("m1", "fine"), env("m2", "broken"), env("m3", "fine"), timed}
	deadlines, err := b.SendBatch(ctx, envs)
	var be *broker.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 4 || be.Errs[0] != nil || be.Errs[2] != nil ||
		!strings.Contains(fmt.Sprint(be.Errs[1]), "WRONGTYPE") || !strings.Contains(fmt.Sprint(be.Errs[3]), "WRONGTYPE") {
		t.Fatalf("SendBatch = %v; want a *BatchError with WRONGTYPE for messages 1 and 3 only", err)
	}
	if len(deadlines) != 4 || !deadlines[3].IsZero() {
		t.Fatalf("deadlines = %v; want 4, the failed timed one zero", deadlines)
	}
	if !strings.Contains(err.Error(), "2 of 4 messages not sent; message 1") {
		t.Fatalf("error text %q does not say what failed", err)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "fine", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 2 || ds[0].Env.ID != "m1" || ds[1].Env.ID != "m3" {
		t.Fatalf("Fetch fine = %+v; want m1 then m3", ds)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r4", Receiver: timed.Sender, InReplyTo: timed.ID}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply to the failed timed message = %v; want ErrLate, nothing pending (the script wrote nothing)", err)
	}
}

// TestSendFromInboxUnknownOutcome: a send from an inbox whose answer was
// lost (the connection broke after the write) returns, with its error, the
// deadline the message carries, and the message is queued; a send that
// could not connect returns no deadline.
func TestSendFromInboxUnknownOutcome(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	proxy := redistest.StartCutProxy(t, s.Addr())
	prefix := redistest.Prefix(t)
	open := func(url string) *Broker {
		// One pipelined connection, which the first send opens.
		b, err := New(Config{URL: url, KeyPrefix: prefix, MaxConnectionPoolSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	viaProxy, direct := open(proxy.URL()), open(s.URL())
	ctx := ctxT(t)
	req := env("m1", "orders")
	req.Sender, req.Timeout = "_inbox.x", time.Minute
	// A first send sets the clock a send from an inbox uses, and the
	// connection it goes on.
	if _, err := viaProxy.SendRequest(ctx, req); err != nil {
		t.Fatal(err)
	}
	req.ID = "m2"
	proxy.SetCut(true)
	dl, err := viaProxy.SendRequest(ctx, req)
	if !errors.Is(err, broker.ErrUnavailable) || dl.IsZero() {
		t.Fatalf("send with its answer lost = %v, %v; want ErrUnavailable with the deadline", dl, err)
	}
	if n, _ := do(t, rawClient(t, s), "XLEN", direct.keys.queue("orders")).AsInt64(); n != 2 {
		t.Fatalf("%d messages queued, want 2: the first and the one whose answer was lost", n)
	}
	s.Kill()
	req.ID = "m3"
	dl, err = direct.SendRequest(ctx, req)
	if !errors.Is(err, broker.ErrUnavailable) || !dl.IsZero() {
		t.Fatalf("send to a server that is down = %v, %v; want ErrUnavailable and no deadline", dl, err)
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
