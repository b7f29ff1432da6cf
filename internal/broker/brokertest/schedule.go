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

// testScheduled shows that a message sent with a Delay is delivered no
// earlier than its due time by the broker's clock, counts as scheduled
// until then, and that a timed one's deadline is its due time plus its
// timeout.
func testScheduled(t *testing.T, b broker.Broker) {
	r := name("recv")
	const delay = 300 * time.Millisecond
	before := brokerNow(t, b).Truncate(time.Millisecond) // the broker's precision
	env := newEnv(r, "later")
	env.Delay = delay
	if dl := send(t, b, env); !dl.IsZero() {
		t.Fatalf("Send of an untimed scheduled message: deadline %v, want none", dl)
	}
	timed := timedEnv(inboxName(), r, "later, timed", time.Minute)
	timed.Delay = delay
	deadline := sendRequest(t, b, timed)
	if min := before.Add(delay + time.Minute).Truncate(time.Millisecond); deadline.Before(min) {
		t.Fatalf("deadline of a timed scheduled message: got %v, want at least due + timeout %v", deadline, min)
	}
	if st := stats(t, b, r); st.Scheduled != 2 || st.Queued != 0 || st.Length != 0 || !st.OldestQueued.IsZero() {
		t.Fatalf("Stats before the due time: got %+v, want 2 scheduled and nothing queued", st)
	}
	if !receivers(t, b)[r] {
		t.Fatalf("Receivers does not list %s, which has scheduled messages", r)
	}
	var got []broker.Delivery
	eventually(t, "the scheduled messages", func() bool {
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
			checkEnv(t, "scheduled", d.Env, &broker.Envelope{ID: env.ID, Sender: env.Sender, Receiver: r, Content: env.Content, Headers: env.Headers})
		case timed.ID:
			if !d.Deadline.Equal(deadline) {
				t.Fatalf("delivered deadline %v, want %v", d.Deadline, deadline)
			}
		default:
			t.Fatalf("unexpected delivery %+v", d)
		}
		ack(t, b, r, d.Ref)
	}
	if st := stats(t, b, r); st.Scheduled != 0 || st.Length != 0 {
		t.Fatalf("Stats after delivery: got %+v", st)
	}
}

// testScheduledPast shows that a DeliverAt that has passed queues the
// message at once, with its deadline counted from now, and that a
// scheduled batch is delivered in full.
func testScheduledPast(t *testing.T, b broker.Broker) {
	r := name("recv")
	now := brokerNow(t, b)
	env := timedEnv(inboxName(), r, "past", time.Minute)
	env.DeliverAt = now.Add(-time.Hour)
	deadline := sendRequest(t, b, env)
	if deadline.Before(now.Add(time.Minute).Truncate(time.Millisecond)) {
		t.Fatalf("deadline of a message due in the past: %v, want now + timeout (after %v)", deadline, now.Add(time.Minute))
	}
	d := fetchOne(t, b, r, "w", longLease)
	if d.Env.ID != env.ID {
		t.Fatalf("got %s, want %s", d.Env.ID, env.ID)
	}
	ack(t, b, r, d.Ref)

	var envs []*broker.Envelope
	for i := range 20 {
		e := newEnv(r, "batch")
		if i%2 == 0 {
			e.Delay = time.Duration(1+i*10) * time.Millisecond
		} else {
			e.DeliverAt = now.Add(time.Duration(i*10) * time.Millisecond)
		}
		envs = append(envs, e)
	}
	if _, err := b.SendBatch(ctxT(t), envs); err != nil {
		t.Fatalf("SendBatch: %v", err)
	}
	seen := map[string]bool{}
	eventually(t, "the scheduled batch", func() bool {
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

// testScheduledValidation shows that bad delays are refused before
// anything is sent.
func testScheduledValidation(t *testing.T, b broker.Broker) {
	r := name("recv")
	for _, env := range []*broker.Envelope{
		{ID: "a", Receiver: r, Delay: -time.Second},
		{ID: "b", Receiver: r, Delay: broker.MaxDelay + time.Hour},
		{ID: "c", Receiver: r, Delay: time.Second, DeliverAt: time.Now()},
		{ID: "d", Receiver: r, DeliverAt: time.Date(12000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if _, err := b.Send(ctxT(t), env); err == nil {
			t.Fatalf("Send %+v: got no error", env)
		}
	}
	if st := stats(t, b, r); st.Scheduled != 0 || st.Length != 0 {
		t.Fatalf("Stats after refused sends: %+v", st)
	}
}

// testCancel shows what Cancel does to a scheduled, a queued, an in-flight
// and an unknown message, and that the holder of the in-flight one finds
// its mark.
func testCancel(t *testing.T, b broker.Broker) {
	r := name("recv")
	since := brokerNow(t, b).Add(-time.Second)
	sched := timedEnv(inboxName(), r, "scheduled", time.Minute)
	sched.Delay = time.Hour
	sdl := sendRequest(t, b, sched)
	c := cancel(t, b, r, sched.ID)
	if c.State != broker.CancelScheduled || c.Env.ID != sched.ID || !c.Deadline.Equal(sdl) {
		t.Fatalf("Cancel of a scheduled message: got %+v, want scheduled with deadline %v", c, sdl)
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
	if st := stats(t, b, r); st.Scheduled != 0 || st.Length != 0 || st.Pending != 0 {
		t.Fatalf("Stats after the cancels: %+v", st)
	}
}
