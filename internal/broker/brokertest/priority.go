package brokertest

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// testPriorities: a fetch takes every waiting message of a higher level
// before any of a lower one, in order within a level; the level travels
// with the delivery, and survives a retry, a dead letter and its retry;
// stats count the levels; a level out of range is refused.
func testPriorities(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	at := func(content string, prio int) *broker.Envelope {
		env := newEnv(r, content)
		env.Priority = prio
		return env
	}
	low1, norm1, high1 := at("low1", broker.PriorityLow), at("norm1", broker.PriorityNormal), at("high1", broker.PriorityHigh)
	low2, high2, norm2 := at("low2", broker.PriorityLow), at("high2", broker.PriorityHigh), at("norm2", broker.PriorityNormal)
	for _, env := range []*broker.Envelope{low1, norm1, high1, low2, high2, norm2} {
		send(t, b, env)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 6, QueuedHigh: 2, QueuedLow: 2})
	for _, env := range []*broker.Envelope{high1, low2} {
		if f, err := b.Fate(ctx, &broker.FateParams{Receiver: r, ID: env.ID, MaxScan: 100}); err != nil || f.State != broker.StateQueued {
			t.Fatalf("Fate of %s at level %d: %+v, %v; want queued", env.Content, env.Priority, f, err)
		}
	}
	if err := sendErr(ctx, b, broker.SendParams{Env: *at("bad", 2)}); err == nil {
		t.Fatal("Send with Priority 2: no error")
	}
	if err := sendErr(ctx, b, broker.SendParams{Env: *at("bad", -2)}); err == nil {
		t.Fatal("Send with Priority -2: no error")
	}

	one := func(consumer string) broker.Delivery {
		t.Helper()
		for {
			ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: consumer, Max: 1, Block: pollBlock, Lease: longLease, MaxAttempts: 10})
			if len(ds) > 1 {
				t.Fatalf("Fetch of 1 returned %d", len(ds))
			}
			if len(ds) == 1 {
				return ds[0]
			}
		}
	}
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 2, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("first fetch of 2: got %d", len(ds))
	}
	checkEnv(t, "first high", ds[0].Env, high1)
	checkEnv(t, "second high", ds[1].Env, high2)
	lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: r, Consumer: "c1", Refs: []string{ds[0].Ref, ds[1].Ref}, Lease: longLease})
	if err != nil || len(lost) != 0 {
		t.Fatalf("Extend of high deliveries: lost %v, %v", lost, err)
	}
	// A retried high message comes back before any normal one.
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "c1", Ref: ds[0].Ref, Lease: longLease}); err != nil {
		t.Fatal(err)
	}
	again := one("c2")
	checkEnv(t, "retried high", again.Env, high1)
	if again.Attempt != 2 {
		t.Fatalf("retried high: attempt %d, want 2", again.Attempt)
	}
	ack(t, b, r, ds[1].Ref)
	// Dead-lettered and retried, it goes back to its level.
	deadLetter(t, b, r, again, "test")
	dls := deadLetters(t, b, r)
	if len(dls) != 1 || dls[0].Env.Priority != broker.PriorityHigh {
		t.Fatalf("dead letters: %+v, want high1 at PriorityHigh", dls)
	}
	if n, err := b.RetryDeadLetters(ctx, r, dls[0].Ref); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters: %d, %v", n, err)
	}
	back := one("c2")
	checkEnv(t, "high after its dead letter's retry", back.Env, high1)
	rest := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c3", Max: 10, Lease: longLease, MaxAttempts: 10})
	want := []*broker.Envelope{norm1, norm2, low1, low2}
	if len(rest) != len(want) {
		t.Fatalf("the rest: got %d deliveries, want %d", len(rest), len(want))
	}
	refs := []string{back.Ref}
	for i, d := range rest {
		checkEnv(t, "the rest", d.Env, want[i])
		refs = append(refs, d.Ref)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Pending: 5})
	ack(t, b, r, refs...)
	checkStats(t, b, broker.ReceiverStats{Receiver: r})
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c3", Max: 10, Lease: longLease, MaxAttempts: 10}); len(ds) != 0 {
		t.Fatalf("after acking all: fetched %+v", ds)
	}
}

// testPriorityReclaim: a high message whose holder's lease ran out comes
// back, at its level, before the normal messages waiting.
func testPriorityReclaim(t *testing.T, b broker.Broker) {
	r := name("recv")
	norm := newEnv(r, "normal")
	high := newEnv(r, "high")
	high.Priority = broker.PriorityHigh
	send(t, b, norm)
	send(t, b, high)
	start, err := b.Now(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	d1 := fetchOne1(t, b, r, "dies", shortLease)
	checkEnv(t, "first delivery", d1.Env, high)
	// Its holder stops renewing: once the lease has run out, the high
	// message is waiting again, and comes before the normal one.
	waitBrokerTime(t, b, start.Add(shortLease+50*time.Millisecond))
	d2 := fetchOne1(t, b, r, "lives", longLease)
	checkEnv(t, "after the lease ran out", d2.Env, high)
	if d2.Attempt != 2 || d2.Env.Priority != broker.PriorityHigh {
		t.Fatalf("reclaimed high message: attempt %d, priority %d; want 2 and high", d2.Attempt, d2.Env.Priority)
	}
	ack(t, b, r, d2.Ref)
	d3 := fetchOne1(t, b, r, "lives", longLease)
	checkEnv(t, "then", d3.Env, norm)
	ack(t, b, r, d3.Ref)
}

// fetchOne1 fetches one message with Max 1, polling until one comes.
func fetchOne1(t *testing.T, b broker.Broker, r, consumer string, lease time.Duration) broker.Delivery {
	t.Helper()
	deadline := time.Now().Add(Patience)
	for time.Now().Before(deadline) {
		ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: consumer, Max: 1, Block: pollBlock, Lease: lease, MaxAttempts: 10})
		if len(ds) == 1 {
			return ds[0]
		}
	}
	t.Fatalf("no delivery within %v", Patience)
	return broker.Delivery{}
}
