package redisbroker

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func env(id, receiver string) *broker.Envelope {
	return &broker.Envelope{ID: id, Sender: "s-" + receiver, Receiver: receiver, Content: []byte("content of " + id),
		Headers: map[string]string{"h": "v"}, Route: broker.RouteSender}
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
	deadline, err := sendEnv(ctx, b, want)
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
		if _, err := sendEnv(ctx, b, env(id, "r")); err != nil {
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
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
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
	if _, err := sendEnv(ctxT(t), b, env("m", "r")); err != nil {
		t.Fatal(err)
	}
}

func TestReclaimAfterLeaseExpiry(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
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
		if _, err := sendEnv(ctx, b, env(id, "r")); err != nil {
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
