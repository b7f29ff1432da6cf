package redisbroker

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// wakeHeldBy schedules a message of receiver r for later, which queues a
// wake entry, and reads that entry as consumer, as a fetch that stops
// before dropping it would. It returns the entry's id.
func wakeHeldBy(t *testing.T, b *Broker, r, consumer string) string {
	t.Helper()
	ctx := ctxT(t)
	fetch1(t, b, broker.FetchParams{Receiver: r, Consumer: "setup", Lease: time.Minute}) // creates the group
	if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: *env("later", r), Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s := b.queueState(r).keys
	raw := rawClient(t, srv)
	read, err := raw.Do(ctx, raw.B().Xreadgroup().Group("g", consumer).Count(10).Streams().Key(s.stream).Id(">").Build()).AsXRead()
	if err != nil || len(read[s.stream]) != 1 || read[s.stream][0].FieldValues["w"] != "1" {
		t.Fatalf("reading the wake entry = %v, %v", read, err)
	}
	return read[s.stream][0].ID
}

// wakeCount is the count of wake entries the holders hash of r keeps.
func wakeCount(t *testing.T, b *Broker, r string) string {
	t.Helper()
	n, _ := do(t, rawClient(t, srv), "HGET", b.queueState(r).keys.holders, "wakes").ToString()
	return n
}

// A wake entry read by a consumer whose lease then ended is dropped by the
// consumer that reclaims it and then by the first: it comes off the count
// once, and Stats counts no message that is not there.
func TestWakeDroppedTwiceCountsOnce(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	id := wakeHeldBy(t, b, "r", "A")
	lease := 50 * time.Millisecond
	time.Sleep(2 * lease)
	eventually(t, "B to reclaim and drop the wake entry", func() bool {
		if ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "B", Lease: lease}); len(ds) != 0 {
			t.Fatalf("Fetch delivered %v, want nothing", ds)
		}
		return wakeCount(t, b, "r") == "0"
	})
	s := b.queueState("r").keys
	if err := scriptDropWakes.Exec(ctx, b.client, []string{s.stream, s.holders}, []string{id}).Error(); err != nil {
		t.Fatal(err)
	}
	if n := wakeCount(t, b, "r"); n != "0" {
		t.Fatalf("wakes after the second drop = %q, want 0", n)
	}
	st, err := b.Stats(ctx, "r")
	if err != nil || st.Length != 0 || st.Pending != 0 || st.Deferred != 1 {
		t.Fatalf("Stats = %+v, %v; want length 0, pending 0, scheduled 1", st, err)
	}
}

// A wake entry delivered as often as the attempts allow is dropped, not
// dead-lettered.
func TestWakeAtMaxAttemptsIsDropped(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	wakeHeldBy(t, b, "r", "A")
	lease := 50 * time.Millisecond
	time.Sleep(2 * lease)
	eventually(t, "the wake entry to be dropped", func() bool {
		p := broker.FetchParams{Receiver: "r", Consumer: "B", Max: 10, Lease: lease, MaxAttempts: 1}
		if ds, err := b.Fetch(ctx, &p); err != nil || len(ds) != 0 {
			t.Fatalf("Fetch = %v, %v; want nothing", ds, err)
		}
		return wakeCount(t, b, "r") == "0"
	})
	st, err := b.Stats(ctx, "r")
	if err != nil || st.Length != 0 || st.DeadLetters != 0 || st.Deferred != 1 {
		t.Fatalf("Stats = %+v, %v; want length 0, no dead letters, scheduled 1", st, err)
	}
}
