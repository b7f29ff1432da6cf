package brokertest

import (
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func acquire(t *testing.T, b broker.Broker, receiver, owner string, ttl time.Duration) bool {
	t.Helper()
	ok, err := b.Acquire(ctxT(t), receiver, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire %s for %s: %v", receiver, owner, err)
	}
	return ok
}

func release(t *testing.T, b broker.Broker, receiver, owner string) {
	t.Helper()
	if err := b.Release(ctxT(t), receiver, owner); err != nil {
		t.Fatalf("Release %s by %s: %v", receiver, owner, err)
	}
}

func testLock(t *testing.T, b broker.Broker) {
	r := name("recv")
	if !acquire(t, b, r, "a", longLease) {
		t.Fatalf("Acquire of a free lock: got false")
	}
	if acquire(t, b, r, "b", longLease) {
		t.Fatalf("Acquire of a lock held by another: got true")
	}
	if !acquire(t, b, r, "a", longLease) {
		t.Fatalf("renewal by the owner: got false")
	}
	release(t, b, r, "b") // not the owner: no effect
	if acquire(t, b, r, "b", longLease) {
		t.Fatalf("Acquire after a Release by a non-owner: got true")
	}
	release(t, b, r, "a")
	if !acquire(t, b, r, "b", shortLease) {
		t.Fatalf("Acquire after the owner's Release: got false")
	}
	// b does not renew: its lock expires.
	eventually(t, "the lock to expire", func() bool { return acquire(t, b, r, "a", longLease) })
	if acquire(t, b, r, "b", longLease) {
		t.Fatalf("Acquire by the previous owner after expiry: got true")
	}
	release(t, b, r, "a")
	// Locks of different receivers are independent.
	r2 := name("recv")
	if !acquire(t, b, r, "a", longLease) || !acquire(t, b, r2, "b", longLease) {
		t.Fatalf("Acquire of two receivers' locks by two owners: got false")
	}
	release(t, b, r, "a")
	release(t, b, r2, "b")
}

func workers(t *testing.T, b broker.Broker) map[string]broker.WorkerInfo {
	t.Helper()
	ws, err := b.Workers(ctxT(t))
	if err != nil {
		t.Fatalf("Workers: %v", err)
	}
	m := make(map[string]broker.WorkerInfo, len(ws))
	for _, w := range ws {
		m[w.ID] = w
	}
	return m
}

func heartbeat(t *testing.T, b broker.Broker, info broker.WorkerInfo, ttl time.Duration) {
	t.Helper()
	if err := b.Heartbeat(ctxT(t), info, ttl); err != nil {
		t.Fatalf("Heartbeat %s: %v", info.ID, err)
	}
}

func sameInfo(a, b broker.WorkerInfo) bool {
	return a.ID == b.ID && a.Host == b.Host && a.PID == b.PID && slices.Equal(a.Receivers, b.Receivers) &&
		maps.Equal(a.Concurrency, b.Concurrency) && a.InFlight == b.InFlight && a.Processed == b.Processed &&
		a.Failed == b.Failed && a.StartedAt.Equal(b.StartedAt)
}

func testWorkers(t *testing.T, b broker.Broker) {
	ra, rb := name("recv"), name("recv")
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := broker.WorkerInfo{ID: name("worker"), Host: "host-a", PID: 11, Receivers: []string{ra}, Concurrency: map[string]int{ra: 4},
		InFlight: 2, Processed: 30, Failed: 1, StartedAt: started}
	bw := broker.WorkerInfo{ID: name("worker"), Host: "host-b", PID: 22, Receivers: []string{rb}, Concurrency: map[string]int{rb: 1},
		StartedAt: started}
	heartbeat(t, b, a, longLease)
	heartbeat(t, b, bw, shortLease)

	ws := workers(t, b)
	for _, want := range []broker.WorkerInfo{a, bw} {
		got, ok := ws[want.ID]
		if !ok || !sameInfo(got, want) || got.LastSeen.IsZero() {
			t.Fatalf("Workers: got %+v (listed: %v), want %+v with LastSeen set", got, ok, want)
		}
	}
	rs := receivers(t, b)
	if !rs[ra] || !rs[rb] {
		t.Fatalf("Receivers does not list the receivers of live workers %s, %s", ra, rb)
	}

	// b stops beating: it expires. a beats again with new numbers.
	eventually(t, "worker b to expire", func() bool {
		_, ok := workers(t, b)[bw.ID]
		return !ok
	})
	if receivers(t, b)[rb] {
		t.Fatalf("Receivers lists %s, served only by an expired worker", rb)
	}
	a.Processed, a.InFlight = 31, 0
	heartbeat(t, b, a, longLease)
	if got := workers(t, b)[a.ID]; !sameInfo(got, a) {
		t.Fatalf("Workers after a second heartbeat: got %+v, want %+v", got, a)
	}

	if err := b.Deregister(ctxT(t), a.ID); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if _, ok := workers(t, b)[a.ID]; ok {
		t.Fatalf("Workers lists a deregistered worker")
	}
	if receivers(t, b)[ra] {
		t.Fatalf("Receivers lists %s, served only by a deregistered worker", ra)
	}
}

func testReceivers(t *testing.T, b broker.Broker) {
	r := name("recv")
	if receivers(t, b)[r] {
		t.Fatalf("Receivers lists %s before anything happened", r)
	}
	send(t, b, newEnv(r, "x"))
	if !receivers(t, b)[r] {
		t.Fatalf("Receivers does not list %s, which holds a message", r)
	}
	d := fetchOne(t, b, r, "c", longLease)
	if !receivers(t, b)[r] {
		t.Fatalf("Receivers does not list %s, which holds a message in flight", r)
	}
	ack(t, b, r, d.Ref)
	if receivers(t, b)[r] {
		t.Fatalf("Receivers lists %s, whose queue was drained", r)
	}
}

func testStats(t *testing.T, b broker.Broker) {
	r := name("recv")
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
	for range 4 {
		send(t, b, newEnv(r, "x"))
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 4, Pending: 0, DeadLetters: 0})
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 2, Block: 0, Lease: longLease, MaxAttempts: 10})
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 2, Pending: 2, DeadLetters: 0})
	deadLetter(t, b, r, ds[0], "no")
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 2, Pending: 1, DeadLetters: 1})
	ack(t, b, r, ds[1].Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 2, Pending: 0, DeadLetters: 1})
	ds = fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	if n, err := b.PurgeDeadLetters(ctxT(t), r); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: got %d, %v", n, err)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

// inboxTraffic sends two timed requests to r from an inbox, replies to one
// and gives up the other, reads and acknowledges the inbox's entries, and
// deletes the inbox.
func inboxTraffic(t *testing.T, b broker.Broker, r string) {
	t.Helper()
	ib := inboxName()
	keepInbox(t, b, ib, longLease)
	answered, abandoned := timedEnv(ib, r, "answered", longLease), timedEnv(ib, r, "abandoned", longLease)
	deadline := sendRequest(t, b, answered)
	sendRequest(t, b, abandoned)
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch from an inbox: got %d, want 2", len(ds))
	}
	if err := b.ReplyInbox(ctxT(t), replyTo(answered, "ok"), deadline); err != nil {
		t.Fatalf("ReplyInbox: %v", err)
	}
	giveUp(t, b, ib, abandoned.ID)
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	if rs := readInbox(t, b, ib, 10); len(rs) != 2 {
		t.Fatalf("ReadReplies of the inbox: got %+v, want a reply and a marker", rs)
	} else {
		ackInbox(t, b, ib, rs)
	}
	closeInbox(t, b, ib)
}

// testNothingLeftBehind runs every kind of traffic through a receiver and a
// sender, drains it, and checks that the broker shows nothing left.
func testNothingLeftBehind(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	replied := timedEnv(s, r, "replied", longLease)
	timedOut := timedEnv(s, r, "times out", time.Millisecond)
	alsoReplied := timedEnv(s, r, "also replied", longLease)
	plain := newEnv(r, "plain")
	plain.Sender = s
	retried := newEnv(r, "retried")
	dead := newEnv(r, "dead")
	send(t, b, replied)
	lastDeadline := send(t, b, timedOut)
	for _, env := range []*broker.Envelope{alsoReplied, plain, retried, dead} {
		send(t, b, env)
	}
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 6 {
		t.Fatalf("Fetch: got %d, want 6", len(ds))
	}
	if err := reply(t, b, replyTo(replied, "ok"), broker.ReplyTimed); err != nil {
		t.Fatalf("Reply: %v", err)
	}
	if err := reply(t, b, replyTo(plain, "ok"), broker.ReplyUntimed); err != nil {
		t.Fatalf("Reply: %v", err)
	}
	if err := reply(t, b, replyTo(alsoReplied, "ok"), broker.ReplyTimed); err != nil {
		t.Fatalf("Reply: %v", err)
	}
	waitBrokerTime(t, b, lastDeadline)
	if n := expire(t, b, s, 10); n != 1 {
		t.Fatalf("ExpireTimeouts: settled %d, want 1", n)
	}
	if err := b.Retry(ctxT(t), &broker.RetryParams{Receiver: r, Consumer: "w", Ref: ds[4].Ref, Delay: 0, Lease: longLease}); err != nil {
		t.Fatalf("Retry: %v", err)
	}
	deadLetter(t, b, r, ds[5], "bad")
	ack(t, b, r, ds[0].Ref, ds[1].Ref, ds[2].Ref, ds[3].Ref)
	again := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Lease: longLease, MaxAttempts: 10})
	ack(t, b, r, again[0].Ref)
	if n, err := b.PurgeDeadLetters(ctxT(t), r); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: got %d, %v", n, err)
	}
	rs := readInbox(t, b, s, 10)
	if len(rs) != 4 {
		t.Fatalf("ReadReplies: got %d entries, want 3 replies and 1 notice", len(rs))
	}
	ackInbox(t, b, s, rs)
	inboxTraffic(t, b, r)
	if !acquire(t, b, r, "w", longLease) {
		t.Fatalf("Acquire: got false")
	}
	release(t, b, r, "w")

	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
	checkStats(t, b, broker.ReceiverStats{Receiver: s, Queued: 0, Pending: 0, DeadLetters: 0})
	if rs := receivers(t, b); rs[r] || rs[s] {
		t.Fatalf("Receivers lists %s or %s after a drained run: %v", r, s, rs)
	}
	if rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Block: 0, Lease: time.Millisecond}); len(rs) != 0 {
		t.Fatalf("ReadReplies after a drained run: got %+v", rs)
	}
	if n := expire(t, b, s, 10); n != 0 {
		t.Fatalf("ExpireTimeouts after a drained run: settled %d", n)
	}
	if dls := deadLetters(t, b, r); len(dls) != 0 {
		t.Fatalf("DeadLetters after a drained run: got %+v", dls)
	}
}

func testClose(t *testing.T, b broker.Broker) {
	r, s := name("recv"), name("sender")
	ctx := ctxT(t)
	fetched := goFetch(ctx, b, r, "c", blockLong)
	read := make(chan error, 1)
	go func() {
		_, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Block: blockLong, Lease: longLease})
		read <- err
	}()
	// Give the calls time to block. The test holds whether they did or not
	// (a call that starts after Close fails at once), but it is only worth
	// something when they did.
	<-time.After(100 * time.Millisecond)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if res := await(t, "Fetch blocked during Close to return (Close must wake blocked calls)", fetched); !errors.Is(res.err, broker.ErrClosed) {
		t.Fatalf("Fetch blocked during Close: got %v, want ErrClosed", res.err)
	}
	if err := await(t, "ReadReplies blocked during Close to return (Close must wake blocked calls)", read); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("ReadReplies blocked during Close: got %v, want ErrClosed", err)
	}
	if err := sendErr(ctx, b, broker.SendParams{Env: *newEnv(r, "x")}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Send after Close: got %v, want ErrClosed", err)
	}
	if err := b.Send(ctx, []broker.SendParams{{Env: *newEnv(r, "x")}, {Env: *newEnv(r, "y")}}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Send of two after Close: got %v, want ErrClosed", err)
	}
	if _, err := b.Now(ctx); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Now after Close: got %v, want ErrClosed", err)
	}
	if _, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Block: 0, Lease: longLease, MaxAttempts: 1}); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch after Close: got %v, want ErrClosed", err)
	}
}
