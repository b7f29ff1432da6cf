package redisbroker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// hubWaiters returns the number of reads waiting in b's hubs (for tests).
func (b *Broker) hubWaiters() int {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	n := 0
	for _, h := range b.hubs {
		h.mu.Lock()
		n += len(h.waiters)
		h.mu.Unlock()
	}
	return n
}

// hubCovers reports whether the read in progress of consumer's hub covers
// stream.
func (b *Broker) hubCovers(consumer, stream string) bool {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	h, ok := b.hubs[hubKey{consumer: consumer}]
	if !ok {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok = h.readSet[stream]
	return h.reading && ok
}

// TestHubGivesBackWhatItReadForAWaiterThatLeft: a fetch waiting in the
// hub leaves (its context ends) while the hub's read, kept up by another
// fetch, still covers its queue; a message sent to that queue then is read
// by the hub and given back at once, so the next fetch gets it as attempt
// 1, not after a lease and not as a retry.
func TestHubGivesBackWhatItReadForAWaiterThatLeft(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	fetch := func(ctx context.Context, receiver string) error {
		_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
		return err
	}
	ctxB, cancelB := context.WithCancel(ctx)
	doneB := make(chan error, 1)
	go func() { doneB <- fetch(ctxB, "b") }()
	ctxA, cancelA := context.WithCancel(ctx)
	doneA := make(chan error, 1)
	go func() { doneA <- fetch(ctxA, "a") }()
	eventually(t, "a read covering both queues", func() bool {
		return b.hubCovers("c", b.keys.queue("a")) && b.hubCovers("c", b.keys.queue("b"))
	})
	cancelA()
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Fatalf("the fetch that left = %v; want context.Canceled", err)
	}
	if !b.hubCovers("c", b.keys.queue("a")) {
		t.Fatal("the read ended when a waiter left")
	}
	if _, err := b.Send(ctx, env("m1", "a")); err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, srv)
	eventually(t, "the entry read and given back", func() bool {
		p, err := raw.Do(ctx, raw.B().Xpending().Key(b.keys.queue("a")).Group("g").Start("-").End("+").Count(10).Build()).ToArray()
		if err != nil || len(p) != 1 {
			return false
		}
		e, _ := p[0].ToArray()
		n, _ := e[3].AsInt64()
		return n == 0
	})
	ds := fetch1(t, b, broker.FetchParams{Receiver: "a", Consumer: "d", Lease: time.Minute})
	if len(ds) != 1 || ds[0].Env.ID != "m1" || ds[0].Attempt != 1 {
		t.Fatalf("Fetch after the give-back = %+v; want m1 as attempt 1", ds)
	}
	cancelB()
	if err := <-doneB; !errors.Is(err, context.Canceled) {
		t.Fatalf("the other fetch = %v; want context.Canceled", err)
	}
}

// TestHubWithoutClientUnblock: for a Redis user whose ACL refuses CLIENT
// UNBLOCK, a fetch that joins the hub while its read is blocked still
// gets its message without waiting for the block time: the read is
// aborted (its connection replaced) instead.
func TestHubWithoutClientUnblock(t *testing.T) {
	t.Parallel()
	raw := rawClient(t, srv)
	user := "nounblock-" + strings.ReplaceAll(redistest.Prefix(t), ":", "-")
	if err := do(t, raw, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-client|unblock").Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { do(t, raw, "ACL", "DELUSER", user) })
	b, err := New(Config{URL: "redis://" + user + ":pw@" + srv.Addr(), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := ctxT(t)
	fetch := func(receiver string) chan []broker.Delivery {
		got := make(chan []broker.Delivery, 1)
		go func() {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
			if err != nil && !errors.Is(err, broker.ErrClosed) {
				t.Error(err)
			}
			got <- ds
		}()
		return got
	}
	gotA := fetch("a")
	eventually(t, "a blocked read", func() bool { return b.hubCovers("c", b.keys.queue("a")) })
	got := fetch("b")
	if _, err := b.Send(ctx, env("m1", "b")); err != nil {
		t.Fatal(err)
	}
	select {
	case ds := <-got:
		if len(ds) != 1 || ds[0].Env.ID != "m1" {
			t.Fatalf("Fetch of b = %+v; want m1", ds)
		}
	case <-time.After(10 * time.Second): // half the block time
		t.Fatal("the fetch that joined waited for the block time")
	}
	b.Close()
	<-gotA // Close ended it
}
