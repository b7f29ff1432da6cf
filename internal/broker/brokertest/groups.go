package brokertest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// configureGroups sets r's groups, failing on an error.
func configureGroups(t *testing.T, b broker.Broker, c broker.GroupConfig) {
	t.Helper()
	if err := b.ConfigureGroups(ctxT(t), &c); err != nil {
		t.Fatalf("ConfigureGroups %+v: %v", c, err)
	}
}

// sendKeyed sends n messages of key to r, contents "<key>-<i>", and
// returns them in order.
func sendKeyed(t *testing.T, b broker.Broker, r, key string, n int) []*broker.Envelope {
	t.Helper()
	out := make([]*broker.Envelope, n)
	for i := range out {
		out[i] = newEnv(r, fmt.Sprintf("%s-%d", key, i))
		sendP(t, b, broker.SendParams{Env: *out[i], GroupKey: key})
	}
	return out
}

// contents returns the contents of ds, in order.
func contents(ds []broker.Delivery) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = string(d.Env.Content)
	}
	return out
}

// fetchAll fetches without blocking what r has for consumer (up to 100).
func fetchAll(t *testing.T, b broker.Broker, r, consumer string, lease time.Duration) []broker.Delivery {
	t.Helper()
	return fetch(t, b, broker.FetchParams{Receiver: r, Consumer: consumer, Max: 100, Lease: lease, MaxAttempts: 10})
}

// checkContents fails unless ds have the contents want, in order.
func checkContents(t *testing.T, what string, ds []broker.Delivery, want ...string) {
	t.Helper()
	if got := contents(ds); !slices.Equal(got, want) {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
}

// next acknowledges d and fetches what r has then, which must be want.
func next(t *testing.T, b broker.Broker, r string, d broker.Delivery, want ...string) []broker.Delivery {
	t.Helper()
	ack(t, b, r, d.Ref)
	ds := fetchAll(t, b, r, "w", longLease)
	checkContents(t, "after the ack of "+string(d.Env.Content), ds, want...)
	return ds
}

// checkGroupStats fails unless r's stats count waiting keyed messages in
// keys, and BusiestGroups lists busiest.
func checkGroupStats(t *testing.T, b broker.Broker, r string, waiting, keys int64, busiest ...broker.GroupLoad) {
	t.Helper()
	if st := stats(t, b, r); st.GroupWaiting != waiting || st.GroupKeys != keys {
		t.Fatalf("Stats: %d keyed messages waiting in %d keys, want %d in %d", st.GroupWaiting, st.GroupKeys, waiting, keys)
	}
	got, err := b.BusiestGroups(ctxT(t), r, broker.MaxBusiestGroups)
	if err != nil || !slices.Equal(got, busiest) && len(got)+len(busiest) > 0 {
		t.Fatalf("BusiestGroups: got %v, %v; want %v", got, err, busiest)
	}
}

// testGroupsOrder shows that a key has one message out at a time (by
// default), the next queued when it is acknowledged, while other keys and
// plain messages go on; that a delivery carries its key; and the stats.
func testGroupsOrder(t *testing.T, b broker.Broker) {
	r := name("recv")
	sendKeyed(t, b, r, "a", 4)
	sendKeyed(t, b, r, "b", 2)
	send(t, b, newEnv(r, "plain"))
	checkGroupStats(t, b, r, 4, 2, broker.GroupLoad{Key: "a", Waiting: 3}, broker.GroupLoad{Key: "b", Waiting: 1})
	if st := stats(t, b, r); st.Queued != 3 {
		t.Fatalf("Stats: %d queued, want the heads of a and b and the plain message", st.Queued)
	}
	ds := fetchAll(t, b, r, "w", longLease)
	checkContents(t, "first fetch", ds, "a-0", "b-0", "plain")
	if ds[0].GroupKey != "a" || ds[1].GroupKey != "b" || ds[2].GroupKey != "" {
		t.Fatalf("GroupKey of the deliveries: %q, %q, %q", ds[0].GroupKey, ds[1].GroupKey, ds[2].GroupKey)
	}
	if more := fetchAll(t, b, r, "w", longLease); len(more) != 0 {
		t.Fatalf("fetch while the keys' heads are out: got %q", contents(more))
	}
	ack(t, b, r, ds[2].Ref)
	a := next(t, b, r, ds[0], "a-1")
	ack(t, b, r, ds[0].Ref) // again: counted once
	if more := fetchAll(t, b, r, "w", longLease); len(more) != 0 {
		t.Fatalf("fetch after a second ack of a-0: got %q", contents(more))
	}
	bs := next(t, b, r, ds[1], "b-1")
	next(t, b, r, bs[0])
	checkGroupStats(t, b, r, 2, 1, broker.GroupLoad{Key: "a", Waiting: 2})
	a = next(t, b, r, a[0], "a-2")
	a = next(t, b, r, a[0], "a-3")
	next(t, b, r, a[0])
	checkGroupStats(t, b, r, 0, 0)
}

// drainGroups acknowledges refs, then fetches and acknowledges what r
// has until nothing is left, and purges its dead letters.
func drainGroups(t *testing.T, b broker.Broker, r string, refs ...string) {
	t.Helper()
	if len(refs) > 0 {
		ack(t, b, r, refs...)
	}
	eventually(t, "the queue of "+r+" drained", func() bool {
		for _, d := range fetchAll(t, b, r, "drain", longLease) {
			ack(t, b, r, d.Ref)
		}
		st := stats(t, b, r)
		return st.Length == 0 && st.GroupWaiting == 0 && st.Deferred == 0
	})
	purgeAll(t, b, r)
}

// testGroupsConcurrency shows GroupConfig.Concurrency: n out per key.
func testGroupsConcurrency(t *testing.T, b broker.Broker) {
	r := name("recv")
	configureGroups(t, b, broker.GroupConfig{Receiver: r, Concurrency: 3})
	sendKeyed(t, b, r, "k", 5)
	ds := fetchAll(t, b, r, "w", longLease)
	checkContents(t, "first fetch", ds, "k-0", "k-1", "k-2")
	more := next(t, b, r, ds[1], "k-3")
	more = next(t, b, r, more[0], "k-4")
	checkGroupStats(t, b, r, 0, 0)
	// A lower concurrency holds the key until it has fewer out.
	configureGroups(t, b, broker.GroupConfig{Receiver: r, Concurrency: 1})
	sendKeyed(t, b, r, "k", 1)
	next(t, b, r, ds[0])
	next(t, b, r, ds[2])
	if st := stats(t, b, r); st.GroupWaiting != 1 {
		t.Fatalf("Stats: %d waiting, want k-0 behind k-4", st.GroupWaiting)
	}
	drainGroups(t, b, r, more[0].Ref)
}

// testGroupsRetry shows both failure modes: by default a retried message
// holds its key until it succeeds; with SkipRetries its key goes on.
func testGroupsRetry(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	sendKeyed(t, b, r, "k", 2)
	d := fetchOne(t, b, r, "w", longLease)
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "w", Ref: d.Ref, Delay: 0, Lease: longLease}); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	again := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Lease: longLease, MaxAttempts: 10})
	checkContents(t, "after the retry", again, "k-0")
	if again[0].Attempt != 2 || again[0].GroupKey != "k" {
		t.Fatalf("the retried delivery: attempt %d, key %q", again[0].Attempt, again[0].GroupKey)
	}
	k1 := next(t, b, r, again[0], "k-1")
	drainGroups(t, b, r, k1[0].Ref)

	s := name("recv")
	configureGroups(t, b, broker.GroupConfig{Receiver: s, Concurrency: 1, SkipRetries: true})
	sendKeyed(t, b, s, "k", 3)
	d = fetchOne(t, b, s, "w", longLease)
	for range 2 { // a second retry does not settle it again
		if err := b.Retry(ctx, &broker.RetryParams{Receiver: s, Consumer: "w", Ref: d.Ref, Delay: time.Hour, Lease: longLease}); err != nil {
			t.Fatalf("Retry: %v", err)
		}
	}
	k1 = fetchAll(t, b, s, "w", longLease)
	checkContents(t, "after the retry, skipped", k1, "k-1")
	// The retried one's ack does not count off the key again: k-2 waits.
	ack(t, b, s, d.Ref)
	if more := fetchAll(t, b, s, "w", longLease); len(more) != 0 {
		t.Fatalf("fetch after the ack of the retried message: got %q", contents(more))
	}
	k2 := next(t, b, s, k1[0], "k-2")
	drainGroups(t, b, s, k2[0].Ref)
}

// testGroupsSettle shows that every way a message leaves settles it for
// its key: DeadLetter, Drop, Cancel in flight, and a dead letter at max
// attempts; that Cancel of a waiting message takes it out; and that a
// dead letter retried goes behind its key.
func testGroupsSettle(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	envs := sendKeyed(t, b, r, "k", 6)
	d := fetchOne(t, b, r, "w", longLease)
	if err := b.DeadLetter(ctx, r, d, "test"); err != nil {
		t.Fatalf("DeadLetter: %v", err)
	}
	d = fetchOne(t, b, r, "w", longLease)
	checkEnv(t, "after the dead letter", d.Env, envs[1])
	if err := b.Drop(ctx, r, d.Ref); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	d = fetchOne(t, b, r, "w", longLease)
	checkEnv(t, "after the drop", d.Env, envs[2])
	if c := cancel(t, b, r, envs[4].ID); c.State != broker.CancelQueued || c.Env.ID != envs[4].ID {
		t.Fatalf("Cancel of a waiting message: got %+v", c)
	}
	if c := cancel(t, b, r, envs[2].ID); c.State != broker.CancelInFlight {
		t.Fatalf("Cancel of the key's head: got %+v", c)
	}
	d = fetchOne(t, b, r, "w", shortLease)
	checkEnv(t, "after the cancels", d.Env, envs[3])
	if n, err := b.RetryDeadLetters(ctx, r); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters: %d, %v", n, err)
	}
	// k-3 is out: its lease ends, and it is dead-lettered at max attempts
	// by a fetch, which queues k-5.
	var got []broker.Delivery
	eventually(t, "k-3 dead-lettered at max attempts", func() bool {
		got = fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w2", Max: 10, Block: pollBlock, Lease: longLease, MaxAttempts: 1})
		return len(got) > 0
	})
	checkContents(t, "after k-3 gave up", got, "k-5")
	k0 := next(t, b, r, got[0], "k-0") // the dead letter retried, at the tail
	if dls := deadLetters(t, b, r); len(dls) != 1 || dls[0].Env.ID != envs[3].ID {
		t.Fatalf("dead letters: %+v, want k-3", dls)
	}
	drainGroups(t, b, r, k0[0].Ref)
}

// testGroupsDeferred shows a keyed message sent for later joins its key
// when due, behind the key's messages then.
func testGroupsDeferred(t *testing.T, b broker.Broker) {
	r := name("recv")
	later := newEnv(r, "later")
	sendP(t, b, broker.SendParams{Env: *later, GroupKey: "k", Delay: shortLease})
	sendKeyed(t, b, r, "k", 1)
	d := fetchOne(t, b, r, "w", longLease)
	checkContents(t, "first", []broker.Delivery{d}, "k-0")
	waitBrokerTime(t, b, brokerNow(t, b).Add(shortLease))
	eventually(t, "the deferred message behind its key", func() bool {
		fetchAll(t, b, r, "w", longLease) // queues what is due
		return stats(t, b, r).GroupWaiting == 1
	})
	if more := fetchAll(t, b, r, "w", longLease); len(more) != 0 {
		t.Fatalf("fetch while k-0 is out: got %q", contents(more))
	}
	later2 := next(t, b, r, d, "later")
	drainGroups(t, b, r, later2[0].Ref)
}

// testGroupsLease shows a lease that ends gives the key's head again, not
// its next.
func testGroupsLease(t *testing.T, b broker.Broker) {
	r := name("recv")
	sendKeyed(t, b, r, "k", 2)
	fetchOne(t, b, r, "dies", shortLease)
	got := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Lease: longLease, MaxAttempts: 10})
	checkContents(t, "after the lease", got, "k-0")
	if got[0].Attempt != 2 {
		t.Fatalf("redelivery: attempt %d, want 2", got[0].Attempt)
	}
	if lost := extend(t, b, r, "w", got[0].Ref); len(lost) != 0 {
		t.Fatalf("Extend of the held keyed delivery: lost %v", lost)
	}
	if lost := extend(t, b, r, "dies", got[0].Ref); len(lost) != 1 || lost[0] != got[0].Ref {
		t.Fatalf("Extend by the consumer that lost it: lost %v, want [%s]", lost, got[0].Ref)
	}
	k1 := next(t, b, r, got[0], "k-1")
	drainGroups(t, b, r, k1[0].Ref)
}

// testGroupsPriority shows a key's order is its send order across
// priority levels, each message queued at its level.
func testGroupsPriority(t *testing.T, b broker.Broker) {
	r := name("recv")
	low, high := newEnv(r, "low"), newEnv(r, "high")
	low.Priority, high.Priority = broker.PriorityLow, broker.PriorityHigh
	sendP(t, b, broker.SendParams{Env: *low, GroupKey: "k"})
	sendP(t, b, broker.SendParams{Env: *high, GroupKey: "k"})
	send(t, b, newEnv(r, "normal"))
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Lease: longLease, MaxAttempts: 10})
	checkContents(t, "first fetch", ds, "normal", "low")
	ack(t, b, r, ds[0].Ref)
	if more := fetchAll(t, b, r, "w", longLease); len(more) != 0 {
		t.Fatalf("fetch while low is out: got %q", contents(more))
	}
	ack(t, b, r, ds[1].Ref)
	got := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Lease: longLease, MaxAttempts: 10})
	checkContents(t, "after low's ack", got, "high")
	if got[0].Env.Priority != broker.PriorityHigh {
		t.Fatalf("high's priority: %d", got[0].Env.Priority)
	}
	ack(t, b, r, got[0].Ref)
}

// testGroupsRate shows GroupConfig.Rate: a key's messages are queued no
// faster than its token bucket allows (a burst, then one per 1/rate), and
// a fetch blocked meanwhile wakes for the next token (it may answer
// nothing then: the next one queues the message).
func testGroupsRate(t *testing.T, b broker.Broker) {
	r := name("recv")
	const rate, burst, n = 5, 2, 5
	configureGroups(t, b, broker.GroupConfig{Receiver: r, Concurrency: 100, Rate: rate, Burst: burst})
	start := brokerNow(t, b)
	sendKeyed(t, b, r, "k", n)
	sendKeyed(t, b, r, "other", 1)
	ds := fetchAll(t, b, r, "w", longLease)
	checkContents(t, "the burst", ds, "k-0", "k-1", "other-0")
	var after []broker.Delivery
	eventually(t, "the messages after the burst", func() bool {
		more := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: Patience, Lease: longLease, MaxAttempts: 10})
		after = append(after, more...)
		return len(after) >= n-burst
	})
	if got, want := contents(after), []string{"k-2", "k-3", "k-4"}; !slices.Equal(got, want) {
		t.Fatalf("after the burst: got %q, want %q", got, want)
	}
	// The last was queued no sooner than its token: (n-burst)/rate.
	if now, least := brokerNow(t, b), start.Add((n-burst)*time.Second/rate-time.Millisecond); now.Before(least) {
		t.Fatalf("%d messages of a key queued by %v, sooner than rate %d burst %d allow", n, now.Sub(start), rate, burst)
	}
	for _, d := range append(ds, after...) {
		ack(t, b, r, d.Ref)
	}
	drainGroups(t, b, r)
	// A drained key's bucket is kept until it is full, then forgotten.
	waitBrokerTime(t, b, brokerNow(t, b).Add(burst*time.Second/rate+10*time.Millisecond))
	fetchAll(t, b, r, "w", longLease)
}

// testGroupsInvalid shows the validation of the groups' calls.
func testGroupsInvalid(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	for _, c := range []broker.GroupConfig{
		{Concurrency: 1},
		{Receiver: r},
		{Receiver: r, Concurrency: broker.MaxGroupConcurrency + 1},
		{Receiver: r, Concurrency: 1, Rate: -1},
		{Receiver: r, Concurrency: 1, Rate: 1},
	} {
		if err := b.ConfigureGroups(ctx, &c); err == nil {
			t.Errorf("ConfigureGroups %+v: no error", c)
		}
	}
	for _, n := range []int{0, -1, broker.MaxBusiestGroups + 1} {
		if _, err := b.BusiestGroups(ctx, r, n); err == nil {
			t.Errorf("BusiestGroups n=%d: no error", n)
		}
	}
	if _, err := b.BusiestGroups(ctx, "", 1); err == nil {
		t.Error("BusiestGroups of no receiver: no error")
	}
	long := broker.SendParams{Env: *newEnv(r, "x"), GroupKey: strings.Repeat("k", broker.MaxKeyLen+1)}
	if err := sendErr(ctx, b, long); err == nil {
		t.Error("Send with a group key over MaxKeyLen: no error")
	}
}
