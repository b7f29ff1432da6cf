package brokertest

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// testStatsMany shows that StatsMany answers, in the order asked, what
// Stats answers for each receiver, and refuses an empty name.
func testStatsMany(t *testing.T, b broker.Broker) {
	busy, empty, dead := name("recv"), name("recv"), name("recv")
	for range 3 {
		send(t, b, newEnv(busy, "x"))
	}
	send(t, b, newEnv(dead, "y"))
	send(t, b, newEnv(dead, "z"))
	ds := fetch(t, b, broker.FetchParams{Receiver: dead, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	deadLetter(t, b, dead, ds[0], "no")
	asked := []string{busy, empty, dead, busy}
	got, err := b.StatsMany(ctxT(t), asked)
	if err != nil {
		t.Fatalf("StatsMany: %v", err)
	}
	if len(got) != len(asked) {
		t.Fatalf("StatsMany of %d receivers: got %d", len(asked), len(got))
	}
	for i, r := range asked {
		if want := stats(t, b, r); got[i] != want {
			t.Errorf("StatsMany[%d]: got %+v, Stats says %+v", i, got[i], want)
		}
	}
	if got[0].Queued != 3 || got[1].Length != 0 || got[2].DeadLetters != 1 || got[2].Queued != 1 {
		t.Errorf("StatsMany: got %+v", got)
	}
	if none, err := b.StatsMany(ctxT(t), nil); err != nil || len(none) != 0 {
		t.Errorf("StatsMany of no receiver: got %v, %v; want none, nil", none, err)
	}
	if _, err := b.StatsMany(ctxT(t), []string{busy, ""}); err == nil {
		t.Errorf("StatsMany with an empty name: got no error")
	}
	drainQueue(t, b, busy)
	drainQueue(t, b, dead)
	purgeAll(t, b, dead)
}

func purgeAll(t *testing.T, b broker.Broker, receiver string) {
	t.Helper()
	if _, err := b.PurgeDeadLetters(ctxT(t), receiver); err != nil {
		t.Fatalf("PurgeDeadLetters %s: %v", receiver, err)
	}
}

// testOldestQueued shows that OldestQueued is the broker time the oldest
// message not yet delivered was queued: zero with none, then that of the
// first one sent, then that of the next once the first is delivered.
func testOldestQueued(t *testing.T, b broker.Broker) {
	r := name("recv")
	if st := stats(t, b, r); !st.OldestQueued.IsZero() {
		t.Fatalf("OldestQueued of an empty queue: got %v, want zero", st.OldestQueued)
	}
	before := brokerNow(t, b).Truncate(time.Millisecond)
	send(t, b, newEnv(r, "first"))
	first := stats(t, b, r).OldestQueued
	mid := brokerNow(t, b)
	if first.Before(before) || first.After(mid) {
		t.Fatalf("OldestQueued: got %v, want between %v and %v", first, before, mid)
	}
	waitBrokerTime(t, b, mid.Add(2*time.Millisecond))
	send(t, b, newEnv(r, "second"))
	if got := stats(t, b, r).OldestQueued; !got.Equal(first) {
		t.Fatalf("OldestQueued after a second send: got %v, want the first's %v", got, first)
	}
	a := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	second := stats(t, b, r).OldestQueued
	if !second.After(mid) {
		t.Fatalf("OldestQueued once the first is delivered: got %v, want the second's (after %v)", second, mid)
	}
	c := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	if got := stats(t, b, r).OldestQueued; !got.IsZero() {
		t.Fatalf("OldestQueued with every message delivered: got %v, want zero", got)
	}
	ack(t, b, r, a[0].Ref, c[0].Ref)
}
