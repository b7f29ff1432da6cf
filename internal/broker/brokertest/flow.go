package brokertest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// testDedup shows that a second send with a dedup key queues nothing and
// returns the first message's id, for that receiver only, until the key's
// window ends; concurrent sends with one key queue exactly one message.
func testDedup(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r, other := name("recv"), name("recv")
	const ttl = 400 * time.Millisecond
	sendDedup := func(env *broker.Envelope, key string, ttl time.Duration) (string, bool) {
		t.Helper()
		res := sendP(t, b, broker.SendParams{Env: *env, DedupKey: key, DedupTTL: ttl})
		return res.ID, res.Outcome == broker.Duplicate
	}
	first := newEnv(r, "first")
	if id, dup := sendDedup(first, "k", ttl); id != first.ID || dup {
		t.Fatalf("first send: got %s dup %v, want %s, not a duplicate", id, dup, first.ID)
	}
	sent := brokerNow(t, b)
	second := newEnv(r, "second")
	if id, dup := sendDedup(second, "k", ttl); id != first.ID || !dup {
		t.Fatalf("second send: got %s dup %v, want the first's id %s, a duplicate", id, dup, first.ID)
	}
	// Another receiver, and another key, are not duplicates.
	o := newEnv(other, "other")
	if id, dup := sendDedup(o, "k", ttl); id != o.ID || dup {
		t.Fatalf("same key, other receiver: got %s dup %v", id, dup)
	}
	k2 := newEnv(r, "k2")
	if _, dup := sendDedup(k2, "k2", time.Minute); dup {
		t.Fatal("another key: a duplicate")
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 2})
	d := fetchOne(t, b, other, "c", longLease)
	checkEnv(t, "other receiver's message", d.Env, o)
	ack(t, b, other, d.Ref)
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Lease: longLease})
	if len(ds) != 2 {
		t.Fatalf("got %d deliveries, want 2", len(ds))
	}
	checkEnv(t, "first", ds[0].Env, first)
	checkEnv(t, "k2", ds[1].Env, k2)
	ack(t, b, r, ds[0].Ref, ds[1].Ref)

	// Handled or not, the key stays taken for its window, then frees.
	if _, dup := sendDedup(newEnv(r, "again"), "k", ttl); !dup {
		t.Fatal("a send within the window after the first was handled: not a duplicate")
	}
	waitBrokerTime(t, b, sent.Add(ttl+10*time.Millisecond))
	third := newEnv(r, "third")
	if id, dup := sendDedup(third, "k", ttl); id != third.ID || dup {
		t.Fatalf("after the window: got %s dup %v, want %s queued", id, dup, third.ID)
	}
	ack(t, b, r, fetchOne(t, b, r, "c", longLease).Ref)

	// Concurrent sends with one key: one is queued, every caller gets its id.
	const n = 50
	ids := make([]string, n)
	dups := make([]bool, n)
	var wg sync.WaitGroup
	var errs errorList
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := broker.SendOne(ctx, b, broker.SendParams{Env: *newEnv(r, "race"), DedupKey: "race", DedupTTL: time.Minute})
			if err != nil {
				errs.add(err)
			}
			ids[i], dups[i] = res.ID, res.Outcome == broker.Duplicate
		}()
	}
	wg.Wait()
	errs.check(t)
	queued := 0
	for i := range n {
		if ids[i] != ids[0] {
			t.Fatalf("racing sends got ids %s and %s", ids[0], ids[i])
		}
		if !dups[i] {
			queued++
		}
	}
	if queued != 1 {
		t.Fatalf("%d racing sends were queued, want 1", queued)
	}
	d = fetchOne(t, b, r, "c", longLease)
	if d.Env.ID != ids[0] {
		t.Fatalf("queued %s, want %s", d.Env.ID, ids[0])
	}
	ack(t, b, r, d.Ref)
}

// testPause shows that Pause and Resume set a receiver's flag, which
// Paused and Stats report, for that receiver only, and change the pause
// epoch each time; messages still queue.
func testPause(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r, other := name("recv"), name("recv")
	paused := func() []bool {
		t.Helper()
		ps, err := b.Paused(ctx, []string{r, other})
		if err != nil {
			t.Fatalf("Paused: %v", err)
		}
		return ps
	}
	epoch := func() string {
		t.Helper()
		e, err := b.PauseEpoch(ctx)
		if err != nil {
			t.Fatalf("PauseEpoch: %v", err)
		}
		return e
	}
	if ps := paused(); ps[0] || ps[1] {
		t.Fatalf("before Pause: %v", ps)
	}
	e0 := epoch()
	if e := epoch(); e != e0 {
		t.Fatalf("PauseEpoch changed with no Pause: %q, then %q", e0, e)
	}
	for range 2 { // twice: Pause is idempotent
		if err := b.Pause(ctx, r); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		// Every Pause (and Resume) changes the epoch, even one that
		// changes no flag.
		if e := epoch(); e == e0 {
			t.Fatalf("PauseEpoch after Pause: still %q", e)
		} else {
			e0 = e
		}
	}
	if ps := paused(); !ps[0] || ps[1] {
		t.Fatalf("after Pause of the first: %v", ps)
	}
	send(t, b, newEnv(r, "still queues"))
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1, Paused: true})
	sts, err := b.StatsMany(ctx, []string{r, other})
	if err != nil || !sts[0].Paused || sts[1].Paused {
		t.Fatalf("StatsMany: %+v, %v", sts, err)
	}
	for range 2 {
		if err := b.Resume(ctx, r); err != nil {
			t.Fatalf("Resume: %v", err)
		}
		if e := epoch(); e == e0 {
			t.Fatalf("PauseEpoch after Resume: still %q", e)
		} else {
			e0 = e
		}
	}
	if ps := paused(); ps[0] || ps[1] {
		t.Fatalf("after Resume: %v", ps)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1})
	ack(t, b, r, fetchOne(t, b, r, "c", longLease).Ref)
	if ps, err := b.Paused(ctx, nil); err != nil || len(ps) != 0 {
		t.Fatalf("Paused of none: %v, %v", ps, err)
	}
	for _, call := range []func() error{
		func() error { return b.Pause(ctx, "") },
		func() error { return b.Resume(ctx, "") },
		func() error { _, err := b.Paused(ctx, []string{r, ""}); return err },
	} {
		if call() == nil {
			t.Fatal("an empty receiver name was accepted")
		}
	}
}

// testIdempotency shows the life of an idempotency key: the first request
// queues its message, carrying the key; later ones queue nothing and wait;
// the first stored reply is the key's, returned with every waiter and,
// after that, to every request at once; the key ends with its window.
func testIdempotency(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	const ttl = 500 * time.Millisecond
	ib1, ib2 := inboxName(), inboxName()
	begin := func(env *broker.Envelope) (time.Time, *broker.Envelope) {
		t.Helper()
		env.Route, env.IdempotencyKey = broker.RouteInbox, "k"
		res := sendP(t, b, broker.SendParams{Env: *env, IdemTTL: ttl})
		if want := broker.Joined; res.Outcome != want && res.Outcome != broker.Queued {
			t.Fatalf("idempotent send: outcome %v", res.Outcome)
		}
		if res.Outcome == broker.Joined && res.ID == env.ID {
			t.Fatalf("idempotent send: joined its own message %s", res.ID)
		}
		return res.Deadline, res.Reply
	}
	first := timedEnv(ib1, r, "req", longLease)
	start := brokerNow(t, b)
	dl1, rep := begin(first)
	if rep != nil || dl1.Before(start.Add(longLease-time.Second)) {
		t.Fatalf("first request: deadline %v, stored reply %+v", dl1, rep)
	}
	second := newEnv(r, "req again") // untimed
	second.Sender = ib2
	if dl, rep := begin(second); rep != nil || !dl.IsZero() {
		t.Fatalf("second request: deadline %v, stored reply %+v", dl, rep)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1})
	d := fetchOne(t, b, r, "w", longLease)
	if d.Env.ID != first.ID || d.Env.IdempotencyKey != "k" || d.Env.Route != broker.RouteInbox {
		t.Fatalf("queued message: %+v", d.Env)
	}
	if d.Deadline.Before(start.Add(ttl-50*time.Millisecond)) || d.Deadline.After(start.Add(ttl+5*time.Second)) {
		t.Fatalf("the message's deadline %v is not the key's window end, about %v", d.Deadline, start.Add(ttl))
	}

	// The first reply stored wins; the waiters come with it.
	rep1, rep2 := replyTo(first, "one"), replyTo(first, "two")
	for i, rp := range []*broker.Envelope{rep1, rep2} {
		stored, ws, found, err := b.SettleIdempotent(ctx, r, "k", rp)
		if err != nil || !found {
			t.Fatalf("SettleIdempotent %d: found %v, %v", i, found, err)
		}
		checkEnv(t, "stored reply", stored, rep1)
		if len(ws) != 2 {
			t.Fatalf("waiters: %+v, want two", ws)
		}
		got := map[string]broker.IdempotentWaiter{}
		for _, w := range ws {
			got[w.RequestID] = w
		}
		if w := got[first.ID]; w.Inbox != ib1 || !w.Deadline.Equal(dl1) {
			t.Fatalf("first waiter: %+v, want inbox %s deadline %v", w, ib1, dl1)
		}
		if w := got[second.ID]; w.Inbox != ib2 || !w.Deadline.IsZero() {
			t.Fatalf("second waiter: %+v", w)
		}
	}
	ack(t, b, r, d.Ref)
	// Later requests get the stored reply at once, and queue nothing.
	third := timedEnv(ib2, r, "late", longLease)
	if _, rep := begin(third); rep == nil || string(rep.Content) != "one" {
		t.Fatalf("a request after the reply: stored reply %+v, want %q", rep, "one")
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r})
	// The window ends (the queued message's deadline is its end, counted
	// from when the first request began, which a loaded machine may put
	// well after start): the key is gone, and a request starts afresh.
	waitBrokerTime(t, b, d.Deadline.Add(10*time.Millisecond))
	if _, _, found, err := b.SettleIdempotent(ctx, r, "k", rep2); err != nil || found {
		t.Fatalf("SettleIdempotent after the window: found %v, %v", found, err)
	}
	fourth := timedEnv(ib1, r, "afresh", longLease)
	if _, rep := begin(fourth); rep != nil {
		t.Fatalf("after the window: stored reply %+v", rep)
	}
	d = fetchOne(t, b, r, "w", longLease)
	if d.Env.ID != fourth.ID {
		t.Fatalf("after the window: queued %s, want %s", d.Env.ID, fourth.ID)
	}
	ack(t, b, r, d.Ref)
}

// testIdempotencyLateRun shows that only the key's own message stores
// the key's reply: a run of a message whose window passed while it ran
// replies after a later send took the key for a message of its own; that
// reply is not stored under the key, nor given to the later message's
// callers, and the later message's own reply is the key's.
func testIdempotencyLateRun(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	const ttl = 300 * time.Millisecond
	send := func(env *broker.Envelope) broker.SendResult {
		t.Helper()
		env.Route, env.IdempotencyKey = broker.RouteInbox, "k"
		return sendP(t, b, broker.SendParams{Env: *env, IdemTTL: ttl})
	}
	first := timedEnv(inboxName(), r, "first", longLease)
	if res := send(first); res.Outcome != broker.Queued {
		t.Fatalf("first send: outcome %v", res.Outcome)
	}
	d1 := fetchOne(t, b, r, "w1", longLease)
	if d1.Env.ID != first.ID {
		t.Fatalf("fetched %s, want %s", d1.Env.ID, first.ID)
	}
	// The run outlives the key's window, and a later send takes the key.
	waitBrokerTime(t, b, d1.Deadline.Add(10*time.Millisecond))
	second := timedEnv(inboxName(), r, "second", longLease)
	if res := send(second); res.Outcome != broker.Queued || res.ID != second.ID {
		t.Fatalf("send after the window: outcome %v, id %s; want queued %s", res.Outcome, res.ID, second.ID)
	}
	// The late run replies: the key is another message's now.
	if stored, ws, found, err := b.SettleIdempotent(ctx, r, "k", replyTo(first, "late")); err != nil || found {
		t.Fatalf("the late run's SettleIdempotent: found %v (stored %q, waiters %+v), %v; want not found", found, stored.Content, ws, err)
	}
	third := timedEnv(inboxName(), r, "third", longLease)
	res := send(third)
	if res.Outcome != broker.Joined || res.ID != second.ID {
		t.Fatalf("a send joining the second: outcome %v, id %s; want joined %s", res.Outcome, res.ID, second.ID)
	}
	if res.Reply != nil {
		t.Fatalf("a send joining the second got the stored reply %q of message %s", res.Reply.Content, res.Reply.InReplyTo)
	}
	d2 := fetchOne(t, b, r, "w2", longLease)
	if d2.Env.ID != second.ID {
		t.Fatalf("fetched %s, want %s", d2.Env.ID, second.ID)
	}
	own := replyTo(second, "own")
	stored, ws, found, err := b.SettleIdempotent(ctx, r, "k", own)
	if err != nil || !found {
		t.Fatalf("the second's SettleIdempotent: found %v, %v", found, err)
	}
	checkEnv(t, "stored reply", stored, own)
	got := map[string]bool{}
	for _, w := range ws {
		got[w.RequestID] = true
	}
	if len(ws) != 2 || !got[second.ID] || !got[third.ID] {
		t.Fatalf("waiters %+v, want the second's and the third's", ws)
	}
	ack(t, b, r, d1.Ref)
	ack(t, b, r, d2.Ref)
}

// testDedupUntilSettled shows a dedup key held until its message is
// settled: it travels with the message, a send with it is a duplicate
// while the message waits and while it is handled, and ReleaseDedup frees
// it only for the message that holds it.
func testDedupUntilSettled(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	sendKey := func(content string) broker.SendResult {
		t.Helper()
		return sendP(t, b, broker.SendParams{Env: *newEnv(r, content), DedupKey: "k", DedupTTL: time.Hour, DedupUntilSettled: true})
	}
	first := sendKey("first")
	if first.Outcome != broker.Queued {
		t.Fatalf("first send: %+v", first)
	}
	if again := sendKey("again"); again.Outcome != broker.Duplicate || again.ID != first.ID {
		t.Fatalf("a send while the first waits: %+v, want a duplicate of %s", again, first.ID)
	}
	d := fetchOne(t, b, r, "w", longLease)
	if d.Env.DedupKey != "k" {
		t.Fatalf("delivered without its dedup key: %+v", d.Env)
	}
	if again := sendKey("during"); again.Outcome != broker.Duplicate {
		t.Fatalf("a send while the first is handled: %+v, want a duplicate", again)
	}
	ack(t, b, r, d.Ref)
	if err := b.ReleaseDedup(ctx, r, "k", "not-the-holder"); err != nil {
		t.Fatal(err)
	}
	if again := sendKey("not released"); again.Outcome != broker.Duplicate {
		t.Fatalf("after a release by another id: %+v, want a duplicate", again)
	}
	if err := b.ReleaseDedup(ctx, r, "k", first.ID); err != nil {
		t.Fatal(err)
	}
	next := sendKey("after")
	if next.Outcome != broker.Queued || next.ID == first.ID {
		t.Fatalf("a send after the release: %+v, want it queued", next)
	}
	ack(t, b, r, fetchOne(t, b, r, "w", longLease).Ref)
	if err := b.ReleaseDedup(ctx, r, "k", next.ID); err != nil {
		t.Fatal(err)
	}
}

// testDebounce shows a debounce key: a send while the run's message is
// still deferred replaces it (the earlier one is never delivered), each
// send defers the latest by the wait, but never past the max after the
// run's first send, and a send after the run's message came due starts a
// new run.
func testDebounce(t *testing.T, b broker.Broker) {
	r := name("recv")
	const wait, maxWait = 400 * time.Millisecond, 1200 * time.Millisecond
	debounced := func(content string) broker.SendResult {
		t.Helper()
		return sendP(t, b, broker.SendParams{Env: *newEnv(r, content), DebounceKey: "k", DebounceWait: wait, DebounceMax: maxWait})
	}
	start := brokerNow(t, b)
	var ids []string
	// A send every wait/4: each replaces the one before, until the max.
	for i := 0; brokerNow(t, b).Before(start.Add(maxWait - wait/2)); i++ {
		res := debounced(fmt.Sprint("burst ", i))
		if res.Outcome != broker.Deferred {
			t.Fatalf("debounced send %d: %+v, want it deferred", i, res)
		}
		ids = append(ids, res.ID)
		if st := stats(t, b, r); st.Deferred != 1 {
			t.Fatalf("after %d debounced sends: %+v, want one deferred", i+1, st)
		}
		waitBrokerTime(t, b, brokerNow(t, b).Add(wait/4))
	}
	var got []broker.Delivery
	eventually(t, "the burst's one message", func() bool {
		got = append(got, fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: pollBlock, Lease: longLease})...)
		return len(got) > 0
	})
	at := brokerNow(t, b)
	if len(got) != 1 || got[0].Env.ID != ids[len(ids)-1] {
		t.Fatalf("delivered %+v, want the latest of %d sends, %s", got, len(ids), ids[len(ids)-1])
	}
	if at.Before(start.Add(wait)) || at.After(start.Add(maxWait+Patience/2)) {
		t.Fatalf("delivered at %v, %v after the first send; want by the max %v", at, at.Sub(start), maxWait)
	}
	ack(t, b, r, got[0].Ref)
	for _, id := range ids[:len(ids)-1] {
		if c := cancel(t, b, r, id); c.State != broker.CancelNotFound {
			t.Fatalf("replaced message %s: %+v, want it gone", id, c)
		}
	}
	// A new run.
	next := debounced("next run")
	eventually(t, "the next run's message", func() bool {
		ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: pollBlock, Lease: longLease})
		for _, d := range ds {
			if d.Env.ID != next.ID {
				t.Fatalf("next run delivered %s, want %s", d.Env.ID, next.ID)
			}
			ack(t, b, r, d.Ref)
		}
		return len(ds) > 0
	})
}
