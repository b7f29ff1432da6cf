package membroker

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// fakeClock is a clock that moves only when told.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func (c *fakeClock) Add(d time.Duration) { c.Set(c.Now().Add(d)) }

func newClocked(t *testing.T) (*Broker, *fakeClock) {
	clk := newFakeClock()
	b := New(Options{Now: clk.Now})
	t.Cleanup(func() { _ = b.Close() })
	return b, clk
}

// result holds a call's value and error, for must.
type result[T any] struct {
	v   T
	err error
}

func of[T any](v T, err error) result[T] { return result[T]{v, err} }

// must returns the value, failing t on an error.
func (r result[T]) must(t *testing.T) T {
	t.Helper()
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r.v
}

func noErr(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestTimeoutAtDeadline pins the decision point: a reply is accepted up to
// the last instant before the deadline; from the deadline on it is late and
// the timeout is due.
func TestTimeoutAtDeadline(t *testing.T) {
	b, clk := newClocked(t)
	ctx := context.Background()
	m1 := &broker.Envelope{ID: "m1", Sender: "s", Receiver: "r", Timeout: time.Second, Route: broker.RouteSender}
	m2 := &broker.Envelope{ID: "m2", Sender: "s", Receiver: "r", Timeout: time.Second, Route: broker.RouteSender}
	deadline := of(sendEnv(ctx, b, m1)).must(t)
	if want := clk.Now().Add(time.Second); !deadline.Equal(want) {
		t.Fatalf("deadline: got %v, want %v", deadline, want)
	}
	of(sendEnv(ctx, b, m2)).must(t)

	clk.Set(deadline.Add(-time.Nanosecond))
	if n := of(b.ExpireTimeouts(ctx, "s", 10)).must(t); n != 0 {
		t.Fatalf("ExpireTimeouts just before the deadline: settled %d", n)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r1", Receiver: "s", InReplyTo: "m1"}, broker.ReplyTimed); err != nil {
		t.Fatalf("Reply just before the deadline: %v", err)
	}

	clk.Set(deadline)
	if err := b.Reply(ctx, &broker.Envelope{ID: "r2", Receiver: "s", InReplyTo: "m2"}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply at the deadline: got %v, want ErrLate", err)
	}
	if n := of(b.ExpireTimeouts(ctx, "s", 10)).must(t); n != 1 {
		t.Fatalf("ExpireTimeouts at the deadline: settled %d, want 1", n)
	}
	rs := of(b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "s", Consumer: "c", Max: 10, Block: 0, Lease: time.Minute})).must(t)
	if len(rs) != 2 || rs[0].Kind != broker.KindReply || rs[0].RequestID != "m1" || rs[1].Kind != broker.KindTimeout || rs[1].RequestID != "m2" {
		t.Fatalf("reply stream: got %+v, want the reply to m1 then the notice of m2", rs)
	}
}

// TestLeaseAndRetryEdges pins when a pending entry becomes reclaimable: at
// exactly lease after its delivery or renewal, and after a retry delay,
// including one longer than the lease.
func TestLeaseAndRetryEdges(t *testing.T) {
	b, clk := newClocked(t)
	ctx := context.Background()
	const lease = 10 * time.Second
	of(sendEnv(ctx, b, &broker.Envelope{ID: "m", Receiver: "r"})).must(t)
	d := of(b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "a", Max: 1, Block: 0, Lease: lease, MaxAttempts: 0})).must(t)[0]
	fetchB := func() []broker.Delivery {
		return of(b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "b", Max: 1, Block: 0, Lease: lease, MaxAttempts: 0})).must(t)
	}

	clk.Add(lease / 2)
	if lost := of(b.Extend(ctx, &broker.ExtendParams{Receiver: "r", Consumer: "a", Refs: []string{d.Ref}, Lease: lease})).must(t); len(lost) != 0 {
		t.Fatalf("Extend: lost %v", lost)
	}
	clk.Add(lease - time.Nanosecond)
	if got := fetchB(); len(got) != 0 {
		t.Fatalf("Fetch a nanosecond before the extended lease ends: got %+v", got)
	}
	clk.Add(time.Nanosecond)
	got := fetchB()
	if len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("Fetch when the extended lease ends: got %+v, want attempt 2", got)
	}

	// b retries after three leases: the delay, not the lease, decides.
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: "r", Consumer: "b", Ref: d.Ref, Delay: 3 * lease, Lease: lease}); err != nil {
		t.Fatal(err)
	}
	clk.Add(3*lease - time.Nanosecond)
	if got := of(b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 1, Block: 0, Lease: lease, MaxAttempts: 0})).must(t); len(got) != 0 {
		t.Fatalf("Fetch before the retry delay: got %+v", got)
	}
	clk.Add(time.Nanosecond)
	got = of(b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 1, Block: 0, Lease: lease, MaxAttempts: 3})).must(t)
	if len(got) != 1 || got[0].Attempt != 3 {
		t.Fatalf("Fetch at the retry delay: got %+v, want attempt 3", got)
	}

	// At maxAttempts 3, the next expiry dead-letters it.
	clk.Add(lease)
	if got := of(b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "d", Max: 1, Block: 0, Lease: lease, MaxAttempts: 3})).must(t); len(got) != 0 {
		t.Fatalf("Fetch beyond maxAttempts: got %+v", got)
	}
	dls := of(b.DeadLetters(ctx, "r", 10)).must(t)
	if len(dls) != 1 || dls[0].Attempts != 3 || !dls[0].At.Equal(clk.Now()) {
		t.Fatalf("dead letters: got %+v, want one with 3 attempts at %v", dls, clk.Now())
	}
}

func TestLockAndWorkerExpiry(t *testing.T) {
	b, clk := newClocked(t)
	ctx := context.Background()
	if !of(b.Acquire(ctx, "r", "a", time.Second)).must(t) {
		t.Fatal("Acquire of a free lock failed")
	}
	noErr(t, b.Heartbeat(ctx, broker.WorkerInfo{ID: "w", Receivers: []string{"r"}}, time.Second))
	seen := clk.Now()

	clk.Add(time.Second - time.Nanosecond)
	if of(b.Acquire(ctx, "r", "b", time.Second)).must(t) {
		t.Fatal("Acquire a nanosecond before the lock expires succeeded")
	}
	ws := of(b.Workers(ctx)).must(t)
	if len(ws) != 1 || !ws[0].LastSeen.Equal(seen) {
		t.Fatalf("Workers before expiry: got %+v, want w last seen at %v", ws, seen)
	}

	clk.Add(time.Nanosecond)
	if !of(b.Acquire(ctx, "r", "b", time.Second)).must(t) {
		t.Fatal("Acquire when the lock expires failed")
	}
	if ws := of(b.Workers(ctx)).must(t); len(ws) != 0 {
		t.Fatalf("Workers after expiry: got %+v", ws)
	}
	if rs := of(b.Receivers(ctx)).must(t); len(rs) != 0 {
		t.Fatalf("Receivers after the only worker expired: got %v", rs)
	}
	// Expired entries are forgotten, not just hidden.
	noErr(t, b.Release(ctx, "r", "b"))
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	if len(b.c.workers) != 0 || len(b.c.locks) != 0 {
		t.Fatalf("left behind: %d workers, %d locks", len(b.c.workers), len(b.c.locks))
	}
}

// TestLocalOnItsOwnClock: on a clock of its own, Local puts a broker time
// as far from the local now as it is from the broker's, however the clock
// moves and however long it stands still.
func TestLocalOnItsOwnClock(t *testing.T) {
	b, clk := newClocked(t)
	if got := b.Local(time.Time{}); !got.IsZero() {
		t.Fatalf("Local of the zero time: got %v", got)
	}
	for _, move := range []time.Duration{0, time.Hour, 24 * time.Hour} {
		clk.Add(move)
		due := clk.Now().Add(5 * time.Second)
		before := time.Now()
		got := b.Local(due)
		after := time.Now()
		if got.Before(before.Add(5*time.Second)) || got.After(after.Add(5*time.Second)) {
			t.Fatalf("after moving %v: Local(now+5s) is %v, want 5s after the local now (%v..%v)", move, got, before, after)
		}
	}
}
