package redisbroker

import (
	"slices"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// fetchBlocked fetches r for consumer with a short block time.
func fetchBlocked(t *testing.T, b *Broker, r, consumer string) []broker.Delivery {
	t.Helper()
	ds, err := b.Fetch(ctxT(t), &broker.FetchParams{Receiver: r, Consumer: consumer, Max: 10, Block: 20 * time.Millisecond, Lease: time.Minute})
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return ds
}

// fetchWithin fetches r for consumer, calling before first each time,
// until it delivers something or within passes.
func fetchWithin(t *testing.T, b *Broker, r, consumer string, within time.Duration, before func()) []broker.Delivery {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		before()
		if ds := fetchBlocked(t, b, r, consumer); len(ds) > 0 {
			return ds
		}
	}
	t.Fatalf("nothing delivered within %v", within)
	return nil
}

// A stream whose fetch found nothing is quiet: its next fetches run no
// fetch script until its lease's period; a delivery makes it busy again
// (reclaim every reclaimEvery), and once acknowledged it is quiet again.
func TestQuietStream(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	st := b.queueState("r")
	if ds := fetchBlocked(t, b, "r", "c"); len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue = %v", ds)
	}
	if !st.quiet.Load() || time.Until(time.Unix(0, st.reclaimAt.Load())) < 10*time.Second {
		t.Fatalf("after an empty fetch: quiet %v, next reclaim in %v; want quiet, in about a lease", st.quiet.Load(), time.Until(time.Unix(0, st.reclaimAt.Load())))
	}
	if planFetch(st.snapshot(), fetchInputs{now: time.Now(), block: 20 * time.Millisecond, lease: time.Minute, every: b.reclaimEvery}).reclaim {
		t.Fatal("a quiet stream's reclaim is due at its next fetch")
	}
	if _, err := sendEnv(ctx, b, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	ds := fetchBlocked(t, b, "r", "c")
	if len(ds) != 1 {
		t.Fatalf("Fetch = %v, want m1", ds)
	}
	if st.quiet.Load() || time.Until(time.Unix(0, st.reclaimAt.Load())) > b.reclaimEvery {
		t.Fatal("a stream with a delivery stays quiet")
	}
	if err := b.Ack(ctx, "r", ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stream to be quiet again", func() bool {
		if ds := fetchBlocked(t, b, "r", "c"); len(ds) != 0 {
			t.Fatalf("Fetch = %v, want nothing", ds)
		}
		return st.quiet.Load()
	})
}

// A message sent at another priority level, through another broker, to a
// receiver whose stream is quiet reaches it after the receiver's broker's
// next heartbeat (the reclaim epoch), not at the end of its quiet period.
func TestQuietStreamFindsPrioritySend(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	sender := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	w := broker.WorkerInfo{ID: "w", Receivers: []string{"r"}}
	beat := func() {
		if err := b.Heartbeat(ctx, w, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	if ds := fetchBlocked(t, b, "r", "w"); len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue = %v", ds)
	}
	e := env("high", "r")
	e.Priority = broker.PriorityHigh
	if _, err := sendEnv(ctx, sender, e); err != nil {
		t.Fatal(err)
	}
	if ds := fetchWithin(t, b, "r", "w", 5*time.Second, beat); ds[0].Env.ID != "high" {
		t.Fatalf("Fetch = %+v, want the high priority message", ds)
	}
}

// A sender stopped between its enqueue and its bump of the reclaim epoch
// (levelsChanged) loses nothing: the first message at an empty level
// wakes a fetch blocked on the normal stream, whose next fetch runs the
// script and serves the level, even where the stream is quiet until
// something forces the script (a lease of at least the heartbeat's ttl).
// The test undoes the sender's INCR as a stop before it would have, for a
// plain and a keyed message.
func TestQuietStreamFindsPrioritySendWithoutEpoch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level int
		key   string
	}{{broker.PriorityHigh, ""}, {broker.PriorityLow, ""}, {broker.PriorityHigh, "k"}} {
		b := newBroker(t)
		sender := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
		ctx := ctxT(t)
		beat := func() { heartbeat(t, b, "w", 5*time.Second, "r") }
		beat()
		if ds := fetchBlocked(t, b, "r", "w"); len(ds) != 0 {
			t.Fatalf("Fetch of an empty queue = %v", ds)
		}
		e := env("m", "r")
		e.Priority = c.level
		if _, err := broker.SendOne(ctx, sender, broker.SendParams{Env: *e, GroupKey: c.key}); err != nil {
			t.Fatal(err)
		}
		if err := b.client.Do(ctx, b.client.B().Decr().Key(b.keys.reclaimEpoch()).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if ds := fetchWithin(t, b, "r", "w", 15*time.Second, beat); ds[0].Env.ID != "m" {
			t.Fatalf("Fetch at level %d, key %q = %+v, want the message", c.level, c.key, ds)
		}
	}
}

// Entries held by a worker of another broker whose heartbeat lapsed are
// reclaimed from a stream that was quiet, after the next heartbeat that
// dropped it from the registry (the reclaim epoch), not at the end of the
// quiet period.
func TestQuietStreamReclaimsLapsedWorker(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	other := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	live := broker.WorkerInfo{ID: "live", Receivers: []string{"r"}}
	beat := func() {
		if err := b.Heartbeat(ctx, live, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	if ds := fetchBlocked(t, b, "r", "live"); len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue = %v", ds)
	}
	if err := other.Heartbeat(ctx, broker.WorkerInfo{ID: "dead", Receivers: []string{"r"}}, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, other, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	if ds := fetchBlocked(t, other, "r", "dead"); len(ds) != 1 {
		t.Fatalf("Fetch of the other worker = %v, want m1", ds)
	}
	ds := fetchWithin(t, b, "r", "live", 5*time.Second, beat)
	if ds[0].Env.ID != "m1" || ds[0].Attempt != 2 {
		t.Fatalf("Fetch = %+v, want m1 reclaimed (attempt 2)", ds)
	}
}

// A worker whose heartbeat lapsed and that comes back (its process was
// stopped, or its connection stalled, past its heartbeat) is taken out of
// the departed workers by its next heartbeat, which moves the reclaim
// epoch: the other brokers read the departed workers again at their next
// heartbeat and no longer reclaim its deliveries at once.
func TestReturnedWorkerKeepsItsDeliveries(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	other := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	beat := func(br *Broker, id string, ttl time.Duration) { heartbeat(t, br, id, ttl, "r") }
	beat(b, "live", time.Hour)
	beat(other, "back", 10*time.Millisecond)
	eventually(t, "the lapsed worker to be departed", func() bool {
		beat(b, "live", time.Hour)
		return slices.Contains(b.departedWorkers(), "back")
	})
	beat(other, "back", time.Hour)
	beat(b, "live", time.Hour)
	if ws := b.departedWorkers(); slices.Contains(ws, "back") {
		t.Fatalf("departed workers after the worker came back: %v", ws)
	}
	if _, err := sendEnv(ctx, other, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	if ds := fetchBlocked(t, other, "r", "back"); len(ds) != 1 {
		t.Fatalf("Fetch of the returned worker = %v, want m1", ds)
	}
	if ds := fetchBlocked(t, b, "r", "live"); len(ds) != 0 {
		t.Fatalf("Fetch of another worker = %+v: it reclaimed the returned worker's delivery", ds)
	}
}

// A departed worker's deliveries from before it left are reclaimed at
// once; one it fetched after it left (it is back, and no heartbeat has
// told the others yet) stays with it for its lease.
func TestDepartedWorkerKeepsLaterDeliveries(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	other := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	beat := func(br *Broker, id string, ttl time.Duration) { heartbeat(t, br, id, ttl, "r") }
	beat(b, "live", time.Hour)
	beat(other, "back", 10*time.Millisecond)
	for _, id := range []string{"m1", "m2"} {
		if _, err := sendEnv(ctx, other, env(id, "r")); err != nil {
			t.Fatal(err)
		}
		if id == "m2" {
			eventually(t, "the lapsed worker to be departed", func() bool {
				beat(b, "live", time.Hour)
				return slices.Contains(b.departedWorkers(), "back")
			})
		}
		if ds, err := other.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "back", Max: 1, Lease: time.Minute}); err != nil || len(ds) != 1 || ds[0].Env.ID != id {
			t.Fatalf("Fetch of the worker = %+v, %v, want %s", ds, err, id)
		}
	}
	ds := fetchBlocked(t, b, "r", "live")
	if len(ds) != 1 || ds[0].Env.ID != "m1" || ds[0].Attempt != 2 {
		t.Fatalf("Fetch of another worker = %+v, want m1 reclaimed (attempt 2), not m2", ds)
	}
}

// A departed worker that fetched after it left and then died without a
// heartbeat (the others still count it departed) does not keep that
// delivery for good: it is reclaimed once its lease has passed, as any
// holder's.
func TestDepartedWorkerLaterDeliveryReclaimedAfterLease(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	other := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	beat := func(br *Broker, id string, ttl time.Duration) { heartbeat(t, br, id, ttl, "r") }
	beat(b, "live", time.Hour)
	beat(other, "gone", 10*time.Millisecond)
	eventually(t, "the lapsed worker to be departed", func() bool {
		beat(b, "live", time.Hour)
		return slices.Contains(b.departedWorkers(), "gone")
	})
	if _, err := sendEnv(ctx, other, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	// It fetches after it left, then dies before any heartbeat.
	if ds, err := other.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "gone", Max: 1, Lease: 300 * time.Millisecond}); err != nil || len(ds) != 1 {
		t.Fatalf("Fetch of the departed worker = %+v, %v, want m1", ds, err)
	}
	var got []broker.Delivery
	eventually(t, "the delivery to be reclaimed after its lease", func() bool {
		beat(b, "live", time.Hour)
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "live", Max: 1, Block: 50 * time.Millisecond, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		got = ds
		return len(ds) == 1
	})
	if got[0].Env.ID != "m1" || got[0].Attempt != 2 {
		t.Fatalf("the reclaim = %+v, want m1 as attempt 2", got)
	}
	if !slices.Contains(b.departedWorkers(), "gone") {
		t.Fatal("the dead worker is no longer counted departed: the test no longer shows its case")
	}
}

// A quiet queue of a broker that heartbeats, fetched with a lease at
// least its heartbeat's ttl, runs no fetch script when its lease's period
// passes; the entries of a holder that dies are reclaimed from it after
// the heartbeat that saw the holder leave the registry.
func TestQuietWatchedQueueReclaimsOnDeparture(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	other := newBrokerOn(t, srv, Config{KeyPrefix: b.keys.prefix})
	ctx := ctxT(t)
	const lease = 300 * time.Millisecond
	fetch := func(br *Broker, consumer string) []broker.Delivery {
		t.Helper()
		ds, err := br.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: consumer, Max: 10, Block: 20 * time.Millisecond, Lease: lease})
		if err != nil {
			t.Fatalf("Fetch: %v", err)
		}
		return ds
	}
	beat := func() {
		if err := b.Heartbeat(ctx, broker.WorkerInfo{ID: "live", Receivers: []string{"r"}}, lease); err != nil {
			t.Fatal(err)
		}
	}
	beat()
	st := b.queueState("r")
	if ds := fetch(b, "live"); len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue = %v", ds)
	}
	due := st.reclaimAt.Load()
	if !st.quiet.Load() {
		t.Fatal("the queue is not quiet after an empty fetch")
	}
	for time.Now().UnixNano() <= due+int64(lease) {
		beat()
		fetch(b, "live")
	}
	if got := st.reclaimAt.Load(); got != due {
		t.Fatalf("the quiet queue's reclaim moved from %d to %d: a fetch ran the script by time", due, got)
	}
	if err := other.Heartbeat(ctx, broker.WorkerInfo{ID: "dead", Receivers: []string{"r"}}, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, other, env("m1", "r")); err != nil {
		t.Fatal(err)
	}
	if ds := fetch(other, "dead"); len(ds) != 1 {
		t.Fatalf("Fetch of the other worker = %v, want m1", ds)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		beat()
		if ds := fetch(b, "live"); len(ds) > 0 {
			if ds[0].Env.ID != "m1" || ds[0].Attempt != 2 {
				t.Fatalf("Fetch = %+v, want m1 reclaimed (attempt 2)", ds)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the departed holder's message was not reclaimed within 10s")
		}
	}
}

// heartbeat sends br's heartbeat as worker id serving receivers, with ttl,
// and fails t on an error.
func heartbeat(t *testing.T, br *Broker, id string, ttl time.Duration, receivers ...string) {
	t.Helper()
	if err := br.Heartbeat(ctxT(t), broker.WorkerInfo{ID: id, Receivers: receivers}, ttl); err != nil {
		t.Fatal(err)
	}
}
