package membroker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

const patience = 15 * time.Second

type fetched struct {
	ds  []broker.Delivery
	err error
}

// goFetch runs a Fetch that blocks up to a minute, so that only an event,
// not the end of its block, can end it within patience.
func goFetch(b *Broker, receiver, consumer string, lease time.Duration) <-chan fetched {
	ch := make(chan fetched, 1)
	go func() {
		ds, err := b.Fetch(context.Background(), &broker.FetchParams{Receiver: receiver, Consumer: consumer, Max: 10, Block: time.Minute, Lease: lease, MaxAttempts: 0})
		ch <- fetched{ds, err}
	}()
	return ch
}

func await(t *testing.T, what string, ch <-chan fetched) fetched {
	t.Helper()
	select {
	case f := <-ch:
		if f.err != nil {
			t.Fatalf("%s: %v", what, f.err)
		}
		return f
	case <-time.After(patience):
		t.Fatalf("%s: still blocked after %v", what, patience)
		panic("unreachable")
	}
}

// waitWaiters polls until n readers block on receiver's queue.
func waitWaiters(t *testing.T, b *Broker, receiver string, n int) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		b.c.mu.Lock()
		got := 0
		if s := b.c.queues[receiver]; s != nil {
			got = s.waiters
		}
		b.c.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d readers blocked on %s, want %d", got, receiver, n)
		}
		<-time.After(time.Millisecond)
	}
}

func sendOne(t *testing.T, b *Broker, receiver string) {
	t.Helper()
	if _, err := sendEnv(context.Background(), b, &broker.Envelope{ID: "m", Receiver: receiver}); err != nil {
		t.Fatal(err)
	}
}

// TestFetchWakesWhenLeaseExpires: a blocked Fetch takes a message whose
// lease expires while it waits, without waiting for a new message.
func TestFetchWakesWhenLeaseExpires(t *testing.T) {
	t.Parallel()
	b := New(Options{})
	defer b.Close()
	const lease = 100 * time.Millisecond
	sendOne(t, b, "r")
	if ds, err := b.Fetch(context.Background(), &broker.FetchParams{Receiver: "r", Consumer: "a", Max: 1, Block: 0, Lease: lease, MaxAttempts: 0}); err != nil || len(ds) != 1 {
		t.Fatalf("Fetch: %v, %v", ds, err)
	}
	f := await(t, "Fetch blocked on an expiring lease", goFetch(b, "r", "b", lease))
	if len(f.ds) != 1 || f.ds[0].Attempt != 2 {
		t.Fatalf("got %+v, want the redelivery", f.ds)
	}
}

// TestFetchWakesOnRetry: a Retry with no delay wakes a blocked Fetch.
func TestFetchWakesOnRetry(t *testing.T) {
	t.Parallel()
	b := New(Options{})
	defer b.Close()
	sendOne(t, b, "r")
	ds, err := b.Fetch(context.Background(), &broker.FetchParams{Receiver: "r", Consumer: "a", Max: 1, Block: 0, Lease: time.Hour, MaxAttempts: 0})
	if err != nil || len(ds) != 1 {
		t.Fatalf("Fetch: %v, %v", ds, err)
	}
	ch := goFetch(b, "r", "b", time.Hour)
	waitWaiters(t, b, "r", 1)
	if err := b.Retry(context.Background(), &broker.RetryParams{Receiver: "r", Consumer: "a", Ref: ds[0].Ref, Delay: 0, Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if f := await(t, "Fetch blocked during a Retry", ch); len(f.ds) != 1 || f.ds[0].Attempt != 2 {
		t.Fatalf("got %+v, want the retried message", f.ds)
	}
}

// TestBlockedFetchLearnsOfNewLeases: of two blocked readers, the one that
// does not get a new message still takes it when its lease expires.
func TestBlockedFetchLearnsOfNewLeases(t *testing.T) {
	t.Parallel()
	b := New(Options{})
	defer b.Close()
	const lease = 100 * time.Millisecond
	ch1, ch2 := goFetch(b, "r", "a", lease), goFetch(b, "r", "b", lease)
	waitWaiters(t, b, "r", 2)
	sendOne(t, b, "r")
	var first, second fetched
	select {
	case first = <-ch1:
		second = await(t, "the other blocked Fetch", ch2)
	case first = <-ch2:
		second = await(t, "the other blocked Fetch", ch1)
	case <-time.After(patience):
		t.Fatal("no blocked Fetch got the message")
	}
	if first.err != nil || len(first.ds) != 1 || first.ds[0].Attempt != 1 || len(second.ds) != 1 || second.ds[0].Attempt != 2 {
		t.Fatalf("got %+v then %+v, want attempt 1 then 2", first, second)
	}
}

// TestFetchBlockEnds: a blocked Fetch with nothing to take returns empty
// when its block is over, and leaves nothing behind.
func TestFetchBlockEnds(t *testing.T) {
	t.Parallel()
	b := New(Options{})
	defer b.Close()
	ds, err := b.Fetch(context.Background(), &broker.FetchParams{Receiver: "r", Consumer: "a", Max: 1, Block: 10 * time.Millisecond, Lease: time.Second, MaxAttempts: 0})
	if err != nil || len(ds) != 0 {
		t.Fatalf("got %+v, %v; want nothing", ds, err)
	}
	checkEmpty(t, b)
}

func TestShared(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Shared brokers outlive tests: the name must be new to each run.
	name := fmt.Sprint("TestShared-", time.Now().UnixNano())
	a, b := Shared(name, Options{}), Shared(name, Options{})
	other := Shared(name+"-other", Options{})
	defer b.Close()
	defer other.Close()

	sendOne(t, a, "r")
	if st, _ := other.Stats(ctx, "r"); st.Length != 0 {
		t.Fatalf("another name's broker sees %+v", st)
	}
	ch := goFetch(b, "r2", "c", time.Minute)
	waitWaiters(t, b, "r2", 1)

	// Closing one handle closes only that handle.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, a, &broker.Envelope{ID: "x", Receiver: "r"}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Send on a closed handle: got %v, want ErrClosed", err)
	}
	ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != 1 {
		t.Fatalf("Fetch on the other handle: got %+v, %v; want the message sent on the first", ds, err)
	}
	sendOne(t, b, "r2")
	if f := await(t, "Fetch blocked on a handle while another closed", ch); len(f.ds) != 1 {
		t.Fatalf("got %+v, want the message", f.ds)
	}

	// The broker outlives its handles: a new handle finds the pending
	// message.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c := Shared(name, Options{})
	defer c.Close()
	if st, err := c.Stats(ctx, "r"); err != nil || st.Pending != 1 {
		t.Fatalf("Stats on a new handle: got %+v, %v; want the pending message", st, err)
	}
}
