package brokertest

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func extend(t *testing.T, b broker.Broker, receiver, consumer string, refs ...string) []string {
	t.Helper()
	lost, err := b.Extend(ctxT(t), &broker.ExtendParams{Receiver: receiver, Consumer: consumer, Refs: refs, Lease: longLease})
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	return lost
}

// cancel runs Cancel of id, reading the whole queue.
func cancel(t *testing.T, b broker.Broker, receiver, id string) broker.Cancelled {
	t.Helper()
	c, err := b.Cancel(ctxT(t), &broker.CancelParams{Receiver: receiver, ID: id, MaxScan: 1000})
	if err != nil {
		t.Fatalf("Cancel %s: %v", id, err)
	}
	return c
}

// testDeferred shows that a message sent with a Delay is delivered no
// earlier than its due time by the broker's clock, counts as deferred
// until then, and that a timed one's deadline is its due time plus its
// timeout.
func testDeferred(t *testing.T, b broker.Broker) {
	r := name("recv")
	const delay = 300 * time.Millisecond
	before := brokerNow(t, b).Truncate(time.Millisecond) // the broker's precision
	env := newEnv(r, "later")
	if res := sendP(t, b, broker.SendParams{Env: *env, Delay: delay}); !res.Deadline.IsZero() || res.Outcome != broker.Deferred {
		t.Fatalf("Send of an untimed deferred message: %+v, want deferred with no deadline", res)
	}
	timed := timedEnv(inboxName(), r, "later, timed", time.Minute)
	timed.Route = broker.RouteInbox
	deadline := sendP(t, b, broker.SendParams{Env: *timed, Delay: delay}).Deadline
	if min := before.Add(delay + time.Minute).Truncate(time.Millisecond); deadline.Before(min) {
		t.Fatalf("deadline of a timed deferred message: got %v, want at least due + timeout %v", deadline, min)
	}
	if st := stats(t, b, r); st.Deferred != 2 || st.Queued != 0 || st.Length != 0 || !st.OldestQueued.IsZero() {
		t.Fatalf("Stats before the due time: got %+v, want 2 deferred and nothing queued", st)
	}
	if !receivers(t, b)[r] {
		t.Fatalf("Receivers does not list %s, which has deferred messages", r)
	}
	var got []broker.Delivery
	eventually(t, "the deferred messages", func() bool {
		ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: pollBlock, Lease: longLease})
		if len(ds) > 0 {
			if now := brokerNow(t, b); now.Before(before.Add(delay)) {
				t.Fatalf("delivered at %v, before the due time %v", now, before.Add(delay))
			}
		}
		got = append(got, ds...)
		return len(got) == 2
	})
	for _, d := range got {
		switch d.Env.ID {
		case env.ID:
			checkEnv(t, "deferred", d.Env, env)
		case timed.ID:
			if !d.Deadline.Equal(deadline) {
				t.Fatalf("delivered deadline %v, want %v", d.Deadline, deadline)
			}
		default:
			t.Fatalf("unexpected delivery %+v", d)
		}
		ack(t, b, r, d.Ref)
	}
	if st := stats(t, b, r); st.Deferred != 0 || st.Length != 0 {
		t.Fatalf("Stats after delivery: got %+v", st)
	}
}

// testDeferredPast shows that a DeliverAt that has passed queues the
// message at once, with its deadline counted from now, and that a
// deferred batch is delivered in full.
func testDeferredPast(t *testing.T, b broker.Broker) {
	r := name("recv")
	now := brokerNow(t, b)
	env := timedEnv(inboxName(), r, "past", time.Minute)
	env.Route = broker.RouteInbox
	res := sendP(t, b, broker.SendParams{Env: *env, DeliverAt: now.Add(-time.Hour)})
	deadline := res.Deadline
	if res.Outcome != broker.Queued {
		t.Fatalf("a message due in the past: outcome %v, want queued", res.Outcome)
	}
	if deadline.Before(now.Add(time.Minute).Truncate(time.Millisecond)) {
		t.Fatalf("deadline of a message due in the past: %v, want now + timeout (after %v)", deadline, now.Add(time.Minute))
	}
	d := fetchOne(t, b, r, "w", longLease)
	if d.Env.ID != env.ID {
		t.Fatalf("got %s, want %s", d.Env.ID, env.ID)
	}
	ack(t, b, r, d.Ref)

	var envs []broker.SendParams
	for i := range 20 {
		p := broker.SendParams{Env: *newEnv(r, "batch")}
		if i%2 == 0 {
			p.Delay = time.Duration(1+i*10) * time.Millisecond
		} else {
			p.DeliverAt = now.Add(time.Duration(i*10) * time.Millisecond)
		}
		envs = append(envs, p)
	}
	if err := b.Send(ctxT(t), envs); err != nil {
		t.Fatalf("Send: %v", err)
	}
	seen := map[string]bool{}
	eventually(t, "the deferred batch", func() bool {
		for _, d := range fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 100, Block: pollBlock, Lease: longLease}) {
			if seen[d.Env.ID] {
				t.Fatalf("%s delivered twice", d.Env.ID)
			}
			seen[d.Env.ID] = true
			ack(t, b, r, d.Ref)
		}
		return len(seen) == len(envs)
	})
}

// testDeferredNeverEarly sends messages deferred to times that are not
// whole milliseconds, and to a delay from a time that is not, and polls
// for them without blocking: none is delivered before its due time by the
// broker's clock, which a broker that rounds a due time down would do
// within its last millisecond.
func testDeferredNeverEarly(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	for i := range 20 {
		now := brokerNow(t, b)
		at := now.Truncate(time.Millisecond).Add(30*time.Millisecond + 999*time.Microsecond)
		p := broker.SendParams{Env: *newEnv(r, "at"), DeliverAt: at}
		if i%2 == 1 {
			// Due 30ms after the broker accepts it, whenever within its
			// millisecond that is.
			p.DeliverAt, p.Delay = time.Time{}, 30*time.Millisecond
		}
		sendP(t, b, p)
		for {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "w", Max: 1, Lease: longLease})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if len(ds) == 0 {
				continue
			}
			got := brokerNow(t, b)
			due := at
			if p.Delay > 0 {
				due = now.Add(p.Delay)
			}
			if got.Before(due) {
				t.Fatalf("message %d delivered at %v, before its due time %v", i, got, due)
			}
			ack(t, b, r, ds[0].Ref)
			break
		}
	}
}

// testDeferredValidation shows that bad delays are refused before
// anything is sent.
func testDeferredValidation(t *testing.T, b broker.Broker) {
	r := name("recv")
	for _, p := range []broker.SendParams{
		{Env: broker.Envelope{ID: "a", Receiver: r}, Delay: -time.Second},
		{Env: broker.Envelope{ID: "b", Receiver: r}, Delay: broker.MaxDelay + time.Hour},
		{Env: broker.Envelope{ID: "c", Receiver: r}, Delay: time.Second, DeliverAt: time.Now()},
		{Env: broker.Envelope{ID: "d", Receiver: r}, DeliverAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if err := sendErr(ctxT(t), b, p); err == nil {
			t.Fatalf("Send %+v: got no error", p)
		}
	}
	if st := stats(t, b, r); st.Deferred != 0 || st.Length != 0 {
		t.Fatalf("Stats after refused sends: %+v", st)
	}
}

// testCancel shows what Cancel does to a deferred, a queued, an in-flight
// and an unknown message, and that the holder of the in-flight one finds
// its mark.
func testCancel(t *testing.T, b broker.Broker) {
	r := name("recv")
	since := brokerNow(t, b).Add(-time.Second)
	sched := timedEnv(inboxName(), r, "deferred", time.Minute)
	sched.Route = broker.RouteInbox
	sdl := sendP(t, b, broker.SendParams{Env: *sched, Delay: time.Hour}).Deadline
	c := cancel(t, b, r, sched.ID)
	if c.State != broker.CancelDeferred || c.Env.ID != sched.ID || !c.Deadline.Equal(sdl) {
		t.Fatalf("Cancel of a deferred message: got %+v, want deferred with deadline %v", c, sdl)
	}
	held := newEnv(r, "held")
	send(t, b, held)
	d := fetchOne(t, b, r, "w", longLease)
	queued := newEnv(r, "queued")
	send(t, b, queued)
	if c := cancel(t, b, r, queued.ID); c.State != broker.CancelQueued || c.Env.ID != queued.ID {
		t.Fatalf("Cancel of a queued message: got %+v", c)
	}
	for _, prio := range []int{broker.PriorityHigh, broker.PriorityLow} {
		at := newEnv(r, "at a level")
		at.Priority = prio
		send(t, b, at)
		if c := cancel(t, b, r, at.ID); c.State != broker.CancelQueued || c.Env.ID != at.ID {
			t.Fatalf("Cancel of a message queued at priority %d: got %+v", prio, c)
		}
	}
	if c := cancel(t, b, r, held.ID); c.State != broker.CancelInFlight || c.Env.ID != held.ID {
		t.Fatalf("Cancel of a held message: got %+v", c)
	}
	for _, id := range []string{held.ID, queued.ID, sched.ID, "unknown"} {
		if c := cancel(t, b, r, id); c.State != broker.CancelNotFound {
			t.Fatalf("Cancel of %s again: got %+v, want not found", id, c)
		}
	}
	ids, latest, err := b.CancelMarks(ctxT(t), r, since)
	if err != nil || len(ids) != 1 || ids[0] != held.ID || latest.Before(since) {
		t.Fatalf("CancelMarks: got %v, %v, %v; want [%s]", ids, latest, err, held.ID)
	}
	if ids, _, err := b.CancelMarks(ctxT(t), r, latest.Add(time.Millisecond)); err != nil || len(ids) != 0 {
		t.Fatalf("CancelMarks after the latest: got %v, %v", ids, err)
	}
	if lost := extend(t, b, r, "w", d.Ref); len(lost) != 1 {
		t.Fatalf("Extend of the cancelled delivery: lost %v, want it lost", lost)
	}
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w2", Max: 10, Lease: time.Millisecond}); len(ds) != 0 {
		t.Fatalf("Fetch after the cancels: got %+v", ds)
	}
	if st := stats(t, b, r); st.Deferred != 0 || st.Length != 0 || st.Pending != 0 {
		t.Fatalf("Stats after the cancels: %+v", st)
	}
}

// testExpiry shows that a message carries its expiry to its delivery
// (SendParams.Expiry after its due time, or ExpireAt), through a dead
// letter and its retry too, and that Drop removes deliveries for good and
// counts them in ReceiverStats.Expired, each once.
func testExpiry(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	start := brokerNow(t, b)
	at := start.Add(time.Hour).Truncate(time.Millisecond)
	rel := sendP(t, b, broker.SendParams{Env: *newEnv(r, "relative"), Expiry: time.Minute})
	abs := sendP(t, b, broker.SendParams{Env: *newEnv(r, "absolute"), ExpireAt: at})
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Lease: longLease, MaxAttempts: 1})
	if len(ds) != 2 || ds[0].Env.ID != rel.ID || ds[1].Env.ID != abs.ID {
		t.Fatalf("deliveries: %+v", ds)
	}
	if e := ds[0].Expiry; e.Before(start.Add(time.Minute).Truncate(time.Millisecond)) || e.After(brokerNow(t, b).Add(time.Minute)) {
		t.Fatalf("relative expiry %v, want about %v", e, start.Add(time.Minute))
	}
	if !ds[1].Expiry.Equal(at) {
		t.Fatalf("absolute expiry %v, want %v", ds[1].Expiry, at)
	}
	// Through a dead letter and back.
	if err := b.DeadLetter(ctx, r, ds[1], "test"); err != nil {
		t.Fatal(err)
	}
	if n, err := b.RetryDeadLetters(ctx, r); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters: %d, %v", n, err)
	}
	back := fetchOne(t, b, r, "w", longLease)
	if back.Env.ID != abs.ID || !back.Expiry.Equal(at) {
		t.Fatalf("retried dead letter: %+v, want expiry %v", back, at)
	}
	if err := b.Drop(ctx, r, ds[0].Ref, back.Ref); err != nil {
		t.Fatal(err)
	}
	if err := b.Drop(ctx, r, ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	if st := stats(t, b, r); st.Expired != 2 || st.Length != 0 {
		t.Fatalf("stats after the drops: %+v, want 2 expired and nothing left", st)
	}
}
