package brokertest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// timedEnv returns a message from sender to receiver with timeout.
func timedEnv(sender, receiver, content string, timeout time.Duration) *broker.Envelope {
	env := newEnv(receiver, content)
	env.Sender = sender
	env.Timeout = timeout
	return env
}

func reply(t *testing.T, b broker.Broker, r *broker.Envelope, mode broker.ReplyMode) error {
	t.Helper()
	err := b.Reply(ctxT(t), r, mode)
	if err != nil && !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply to %s: %v", r.InReplyTo, err)
	}
	return err
}

func expire(t *testing.T, b broker.Broker, sender string, max int) int {
	t.Helper()
	n, err := b.ExpireTimeouts(ctxT(t), sender, max)
	if err != nil {
		t.Fatalf("ExpireTimeouts %s: %v", sender, err)
	}
	return n
}

// spinUntil reads the broker's clock until it is at or after at, and
// returns the last time it read.
func spinUntil(ctx context.Context, b broker.Broker, at time.Time) (time.Time, error) {
	for {
		now, err := b.Now(ctx)
		if err != nil || !now.Before(at) {
			return now, err
		}
		runtime.Gosched()
	}
}

// drainQueue fetches and acknowledges everything in receiver's queue.
func drainQueue(t *testing.T, b broker.Broker, receiver string) {
	t.Helper()
	for {
		ds := fetch(t, b, broker.FetchParams{Receiver: receiver, Consumer: "w", Max: 500, Block: 0, Lease: longLease, MaxAttempts: 10})
		if len(ds) == 0 {
			return
		}
		refs := make([]string, len(ds))
		for i, d := range ds {
			refs[i] = d.Ref
		}
		ack(t, b, receiver, refs...)
	}
}

func ackReplies(t *testing.T, b broker.Broker, sender string, rs []broker.Reply) {
	t.Helper()
	refs := make([]string, len(rs))
	for i, r := range rs {
		refs[i] = r.Ref
	}
	if err := b.AckReplies(ctxT(t), sender, refs...); err != nil {
		t.Fatalf("AckReplies %s: %v", sender, err)
	}
}

func testTimedReplyAccepted(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	before, err := b.Now(ctxT(t))
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	env := timedEnv(s, r, "ping", longLease)
	deadline := send(t, b, env)
	if deadline.Before(before.Add(env.Timeout - time.Millisecond)) {
		t.Fatalf("Send: got deadline %v, want at least broker time before Send %v + %v", deadline, before, env.Timeout)
	}
	d := fetchOne(t, b, r, "worker", longLease)
	checkEnv(t, "timed message", d.Env, env)
	if !d.Deadline.Equal(deadline) {
		t.Fatalf("delivery deadline: got %v, want %v as Send returned", d.Deadline, deadline)
	}

	rep := replyTo(env, "pong")
	if err := reply(t, b, rep, broker.ReplyTimed); err != nil {
		t.Fatalf("Reply before the deadline: %v", err)
	}
	if err := reply(t, b, replyTo(env, "again"), broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("second Reply: got %v, want ErrLate", err)
	}
	if n := expire(t, b, s, 100); n != 0 {
		t.Fatalf("ExpireTimeouts after the reply: settled %d, want 0", n)
	}
	rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: 0, Lease: longLease})
	if len(rs) != 1 || rs[0].Kind != broker.KindReply || rs[0].RequestID != env.ID || rs[0].Ref == "" {
		t.Fatalf("ReadReplies: got %+v, want the one reply to %s", rs, env.ID)
	}
	checkEnv(t, "reply", rs[0].Env, rep)
	ackReplies(t, b, s, rs)
	if rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: 0, Lease: longLease}); len(rs) != 0 {
		t.Fatalf("ReadReplies after AckReplies: got %+v", rs)
	}
	ack(t, b, r, d.Ref)
}

func testLateReply(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	env := timedEnv(s, r, "ping", shortLease)
	deadline := send(t, b, env)
	waiting := timedEnv(s, r, "keeps waiting", longLease)
	send(t, b, waiting)
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "worker", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d, want 2", len(ds))
	}
	waitBrokerTime(t, b, deadline)

	if err := reply(t, b, replyTo(env, "too late"), broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply after the deadline: got %v, want ErrLate", err)
	}
	if n := expire(t, b, s, 100); n != 1 {
		t.Fatalf("ExpireTimeouts after the deadline: settled %d, want 1", n)
	}
	if n := expire(t, b, s, 100); n != 0 {
		t.Fatalf("second ExpireTimeouts: settled %d, want 0", n)
	}
	rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: 0, Lease: longLease})
	if len(rs) != 1 || rs[0].Kind != broker.KindTimeout || rs[0].RequestID != env.ID {
		t.Fatalf("ReadReplies: got %+v, want one timeout notice for %s", rs, env.ID)
	}
	checkEnv(t, "timeout notice", rs[0].Env, env)
	ackReplies(t, b, s, rs)
	if err := reply(t, b, replyTo(waiting, "pong"), broker.ReplyTimed); err != nil {
		t.Fatalf("Reply to a request still pending: got %v, want it accepted", err)
	}
	ackReplies(t, b, s, readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: 0, Lease: longLease}))
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
}

func testExpireTimeoutsMax(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	var last time.Time
	ids := map[string]bool{}
	for i := range 3 {
		env := timedEnv(s, r, fmt.Sprint(i), time.Duration(i+1)*time.Millisecond)
		ids[env.ID] = true
		last = send(t, b, env)
	}
	waitBrokerTime(t, b, last)
	if n := expire(t, b, s, 2); n != 2 {
		t.Fatalf("ExpireTimeouts max 2 of 3: settled %d", n)
	}
	if n := expire(t, b, s, 2); n != 1 {
		t.Fatalf("ExpireTimeouts max 2 of the last 1: settled %d", n)
	}
	rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: 0, Lease: longLease})
	for _, rep := range rs {
		if rep.Kind != broker.KindTimeout || !ids[rep.RequestID] {
			t.Fatalf("unexpected entry %+v", rep)
		}
		delete(ids, rep.RequestID)
	}
	if len(ids) != 0 || len(rs) != 3 {
		t.Fatalf("ReadReplies: got %+v, want one notice for each of the 3", rs)
	}
	ackReplies(t, b, s, rs)
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	for _, d := range ds {
		ack(t, b, r, d.Ref)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

// testNoTimeoutBeforeDeadline expires timeouts as fast as it can and
// checks that none is settled before its deadline.
func testNoTimeoutBeforeDeadline(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	ctx := ctxT(t)
	for i := range 20 {
		deadline := send(t, b, timedEnv(s, r, fmt.Sprint(i), 3*time.Millisecond))
		for settled := 0; settled == 0; {
			settled = expire(t, b, s, 10)
			after, err := b.Now(ctx)
			if err != nil {
				t.Fatalf("Now: %v", err)
			}
			if settled > 0 && after.Before(deadline) {
				t.Fatalf("ExpireTimeouts settled a timeout before broker time %v, its deadline is %v", after, deadline)
			}
		}
	}
	rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 100, Block: 0, Lease: longLease})
	if len(rs) != 20 {
		t.Fatalf("ReadReplies: got %d notices, want 20", len(rs))
	}
	ackReplies(t, b, s, rs)
	for _, d := range fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 100, Block: 0, Lease: longLease, MaxAttempts: 10}) {
		ack(t, b, r, d.Ref)
	}
}

// testReplyRacesTimeout races replies against the timeout monitor 2,000
// times: each message must get exactly one outcome in the reply stream, the
// one its Reply call reported.
func testReplyRacesTimeout(t *testing.T, b broker.Broker) {
	if testing.Short() {
		t.Skip("stress: 2,000 races; runs without -short")
	}
	const n, repliers = 2000, 4
	s, r := name("sender"), name("recv")
	ctx := ctxT(t)

	var (
		mu       sync.Mutex
		accepted = map[string]bool{} // id -> Reply succeeded
		envs     = map[string]*broker.Envelope{}
		last     time.Time
		errs     errorList
		wg       sync.WaitGroup
	)
	fail := errs.add
	for w := range repliers {
		wg.Go(func() {
			for i := w; i < n; i += repliers {
				env := timedEnv(s, r, fmt.Sprint(i), time.Duration(1+i%2)*time.Millisecond)
				res, err := broker.SendOne(ctx, b, broker.SendParams{Env: *env})
				deadline := res.Deadline
				if err != nil {
					fail(err)
					return
				}
				// Reply close to the deadline, from a little before to
				// just after it, while the monitor expires timeouts.
				before, err := spinUntil(ctx, b, deadline.Add(-time.Duration(i%5)*200*time.Microsecond))
				if err != nil {
					fail(err)
					return
				}
				err = b.Reply(ctx, replyTo(env, "pong"), broker.ReplyTimed)
				if err != nil && !errors.Is(err, broker.ErrLate) {
					fail(err)
					return
				}
				if err == nil && !before.Before(deadline) {
					fail(fmt.Errorf("reply to %s accepted at %v or later, after its deadline %v", env.ID, before, deadline))
				}
				mu.Lock()
				accepted[env.ID] = err == nil
				envs[env.ID] = env
				if deadline.After(last) {
					last = deadline
				}
				mu.Unlock()
			}
		})
	}
	monitorDone := make(chan struct{})
	stopMonitor := make(chan struct{})
	expired := 0
	go func() {
		defer close(monitorDone)
		for {
			select {
			case <-stopMonitor:
				return
			default:
			}
			m, err := b.ExpireTimeouts(ctx, s, 50)
			if err != nil {
				fail(err)
				return
			}
			expired += m
		}
	}()
	wg.Wait()
	close(stopMonitor)
	<-monitorDone
	errs.check(t)
	// Settle what the monitor had not reached yet.
	waitBrokerTime(t, b, last)
	for {
		m := expire(t, b, s, 500)
		if m == 0 {
			break
		}
		expired += m
	}

	outcomes := map[string][]broker.Reply{}
	for {
		rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 500, Block: 0, Lease: longLease})
		if len(rs) == 0 {
			break
		}
		for _, rep := range rs {
			outcomes[rep.RequestID] = append(outcomes[rep.RequestID], rep)
		}
		ackReplies(t, b, s, rs)
	}
	replies, notices := 0, 0
	for id, ok := range accepted {
		got := outcomes[id]
		delete(outcomes, id)
		if len(got) != 1 {
			t.Fatalf("message %s (reply accepted: %v) has %d outcomes, want exactly 1: %+v", id, ok, len(got), got)
		}
		want := broker.KindTimeout
		if ok {
			want = broker.KindReply
			replies++
		} else {
			notices++
			checkEnv(t, "timeout notice", got[0].Env, envs[id])
		}
		if got[0].Kind != want {
			t.Fatalf("message %s (reply accepted: %v): got outcome kind %v", id, ok, got[0].Kind)
		}
	}
	if len(accepted) != n || len(outcomes) != 0 {
		t.Fatalf("got %d messages and %d stray outcomes, want %d and 0", len(accepted), len(outcomes), n)
	}
	if expired != notices {
		t.Fatalf("ExpireTimeouts settled %d, but the stream holds %d notices", expired, notices)
	}
	t.Logf("%d replies accepted, %d timed out", replies, notices)

	drainQueue(t, b, r)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testReplyStreamConsumers(t *testing.T, b broker.Broker) {
	s := name("sender")
	const n = 6
	for i := range n {
		rep := &broker.Envelope{ID: name("reply"), Sender: name("recv"), Receiver: s, InReplyTo: name("req"), Content: []byte(fmt.Sprint(i))}
		if err := reply(t, b, rep, broker.ReplyUntimed); err != nil {
			t.Fatalf("untimed Reply: %v", err)
		}
	}
	r1 := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 3, Block: 0, Lease: longLease})
	r2 := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c2", Max: 10, Block: 0, Lease: shortLease})
	if len(r1) != 3 || len(r2) != 3 {
		t.Fatalf("ReadReplies by two consumers: got %d and %d, want 3 and 3", len(r1), len(r2))
	}
	seen := map[string]bool{}
	for _, rep := range append(r1, r2...) {
		if seen[rep.Ref] || rep.Kind != broker.KindReply {
			t.Fatalf("reply %+v delivered twice or of the wrong kind", rep)
		}
		seen[rep.Ref] = true
	}
	ackReplies(t, b, s, r1)

	// c2 does not acknowledge: its replies go to c3 after the lease.
	var r3 []broker.Reply
	eventually(t, "redelivery of unacknowledged replies", func() bool {
		r3 = append(r3, readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c3", Max: 10, Block: pollBlock, Lease: shortLease})...)
		return len(r3) >= 3
	})
	got := map[string]bool{}
	for _, rep := range r3 {
		got[rep.Ref] = true
	}
	for _, rep := range r2 {
		if !got[rep.Ref] {
			t.Fatalf("reply %s held by c2 was not redelivered; got %+v", rep.Ref, r3)
		}
	}
	ackReplies(t, b, s, r3)
	if rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c4", Max: 10, Block: 0, Lease: shortLease}); len(rs) != 0 {
		t.Fatalf("ReadReplies after acknowledging everything: got %+v", rs)
	}
}

func testReadRepliesWoken(t *testing.T, b broker.Broker) {
	s := name("sender")
	type result struct {
		rs  []broker.Reply
		err error
	}
	ch := make(chan result, 1)
	go func() {
		rs, err := b.ReadReplies(ctxT(t), &broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: blockLong, Lease: longLease})
		ch <- result{rs, err}
	}()
	rep := &broker.Envelope{ID: name("reply"), Receiver: s, InReplyTo: name("req"), Content: []byte("hi")}
	if err := reply(t, b, rep, broker.ReplyUntimed); err != nil {
		t.Fatalf("Reply: %v", err)
	}
	res := await(t, "the blocked ReadReplies", ch)
	if res.err != nil || len(res.rs) != 1 {
		t.Fatalf("blocked ReadReplies: got %+v, %v; want the reply", res.rs, res.err)
	}
	checkEnv(t, "reply", res.rs[0].Env, rep)
	ackReplies(t, b, s, res.rs)

	ctx, cancel := context.WithCancel(ctxT(t))
	go func() {
		rs, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: s, Consumer: "c1", Max: 10, Block: blockLong, Lease: longLease})
		ch <- result{rs, err}
	}()
	cancel()
	if res := await(t, "the cancelled ReadReplies", ch); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("cancelled ReadReplies: got %+v, %v; want context.Canceled", res.rs, res.err)
	}
}
