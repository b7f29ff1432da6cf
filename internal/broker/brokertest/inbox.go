package brokertest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func giveUp(t *testing.T, b broker.Broker, inbox, id string) broker.Reply {
	t.Helper()
	m, err := b.GiveUp(ctxT(t), inbox, id)
	if err != nil {
		t.Fatalf("GiveUp %s: %v", id, err)
	}
	return m
}

// checkOrder fails unless the times of rs never decrease.
func checkOrder(t *testing.T, rs []broker.Reply) {
	t.Helper()
	for i := 1; i < len(rs); i++ {
		if rs[i].At.Before(rs[i-1].At) {
			t.Fatalf("reply-stream entry %d is at %v, before entry %d at %v", i, rs[i].At, i-1, rs[i-1].At)
		}
	}
}

// testInboxReply shows a timed request from an inbox: it has its deadline
// but no pending timeout; replies are accepted while their time is before
// the deadline, a second one too, and a late one is refused but kept for
// the requester to skip; entries come in order with their times.
func testInboxReply(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	ib, r := inboxName(), name("recv")
	keepInbox(t, b, ib, longLease)
	before := brokerNow(t, b).Truncate(time.Millisecond)
	env := timedEnv(ib, r, "ping", longLease)
	deadline := sendRequest(t, b, env)
	if deadline.Before(before.Add(env.Timeout - time.Millisecond)) {
		t.Fatalf("Send from an inbox: got deadline %v, want at least broker time before Send %v + %v", deadline, before, env.Timeout)
	}
	d := fetchOne(t, b, r, "w", longLease)
	if !d.Deadline.Equal(deadline) {
		t.Fatalf("delivery deadline: got %v, want %v as Send returned", d.Deadline, deadline)
	}
	if n := expire(t, b, ib, 10); n != 0 {
		t.Fatalf("ExpireTimeouts of an inbox: settled %d, want 0: an inbox has no pending timeouts", n)
	}

	first, second := replyTo(env, "pong"), replyTo(env, "again")
	for _, rep := range []*broker.Envelope{first, second} {
		if err := b.ReplyInbox(ctx, rep, deadline); err != nil {
			t.Fatalf("ReplyInbox before the deadline: %v", err)
		}
	}
	rs := readInbox(t, b, ib, 10)
	if len(rs) != 2 {
		t.Fatalf("ReadReplies: got %+v, want the two replies", rs)
	}
	for i, rep := range []*broker.Envelope{first, second} {
		if rs[i].Kind != broker.KindReply || rs[i].RequestID != env.ID || rs[i].Ref == "" {
			t.Fatalf("reply %d: got %+v", i, rs[i])
		}
		checkEnv(t, fmt.Sprint("reply ", i), rs[i].Env, rep)
		if rs[i].At.Before(before) || !rs[i].At.Before(deadline) {
			t.Fatalf("reply %d is at %v, want from %v to before the deadline %v", i, rs[i].At, before, deadline)
		}
	}
	checkOrder(t, rs)
	ackInbox(t, b, ib, rs)
	ack(t, b, r, d.Ref)

	late := timedEnv(ib, r, "late", shortLease)
	deadline = sendRequest(t, b, late)
	waitBrokerTime(t, b, deadline)
	if err := b.ReplyInbox(ctx, replyTo(late, "too late"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox after the deadline: got %v, want ErrLate", err)
	}
	rs = readInbox(t, b, ib, 10)
	if len(rs) != 1 || rs[0].Kind != broker.KindReply || rs[0].At.Before(deadline) {
		t.Fatalf("ReadReplies after a late reply: got %+v, want the late reply, at or after %v", rs, deadline)
	}
	ackInbox(t, b, ib, rs)
	ack(t, b, r, fetchOne(t, b, r, "w", longLease).Ref)

	for _, c := range []struct {
		what string
		rep  *broker.Envelope
	}{
		{"nil", nil},
		{"without a request id", &broker.Envelope{ID: name("reply"), Receiver: ib}},
	} {
		if err := b.ReplyInbox(ctx, c.rep, deadline); err == nil || errors.Is(err, broker.ErrLate) {
			t.Fatalf("ReplyInbox %s: got %v, want an error that is not ErrLate", c.what, err)
		}
	}
	// A name that was never opened as an inbox is an inbox that is gone.
	if err := b.ReplyInbox(ctx, replyTo(timedEnv(name("sender"), r, "x", time.Second), "x"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox to a name that is not an open inbox: got %v, want ErrLate", err)
	}
	closeInbox(t, b, ib)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

// testInboxGiveUp shows GiveUp's markers: each is an entry in order after
// what came before it, with its time; one appended before the deadline is
// before it, one appended after it is not.
func testInboxGiveUp(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	ib, r := inboxName(), name("recv")
	keepInbox(t, b, ib, longLease)
	env := timedEnv(ib, r, "ping", shortLease)
	deadline := sendRequest(t, b, env)

	early := giveUp(t, b, ib, env.ID)
	if early.Kind != broker.KindTimeout || early.RequestID != env.ID || early.Ref == "" || early.Env.ID != env.ID {
		t.Fatalf("GiveUp: got %+v, want a marker for %s", early, env.ID)
	}
	if !early.At.Before(deadline) {
		t.Fatalf("GiveUp at once: the marker is at %v, want before the deadline %v", early.At, deadline)
	}
	if err := b.ReplyInbox(ctx, replyTo(env, "pong"), deadline); err != nil {
		t.Fatalf("ReplyInbox after an early marker, before the deadline: %v", err)
	}
	waitBrokerTime(t, b, deadline)
	final := giveUp(t, b, ib, env.ID)
	if final.At.Before(deadline) {
		t.Fatalf("GiveUp after the deadline: the marker is at %v, before the deadline %v", final.At, deadline)
	}
	rs := readInbox(t, b, ib, 10)
	if len(rs) != 3 || rs[0].Ref != early.Ref || rs[1].Kind != broker.KindReply || rs[2].Ref != final.Ref {
		t.Fatalf("ReadReplies: got %+v, want the early marker, the reply and the final marker, in order", rs)
	}
	for i, m := range map[int]broker.Reply{0: early, 2: final} {
		if rs[i].Kind != m.Kind || rs[i].RequestID != m.RequestID || !rs[i].At.Equal(m.At) || rs[i].Env.ID != env.ID {
			t.Fatalf("marker %d read as %+v, GiveUp returned %+v", i, rs[i], m)
		}
	}
	checkOrder(t, rs)
	ackInbox(t, b, ib, rs)
	if rs := readInbox(t, b, ib, 10); len(rs) != 0 {
		t.Fatalf("ReadReplies after AckReplies: got %+v", rs)
	}

	for _, c := range []struct{ what, inbox, id string }{
		{"with an empty inbox", "", env.ID},
		{"with an empty id", ib, ""},
	} {
		if _, err := b.GiveUp(ctx, c.inbox, c.id); err == nil || errors.Is(err, broker.ErrLate) {
			t.Fatalf("GiveUp %s: got %v, want an error that is not ErrLate", c.what, err)
		}
	}
	if _, err := b.GiveUp(ctx, name("sender"), env.ID); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("GiveUp of a name that is not an open inbox: got %v, want ErrLate", err)
	}
	ack(t, b, r, fetchOne(t, b, r, "w", longLease).Ref)
	closeInbox(t, b, ib)
}

// testInboxReplyRacesGiveUp races replies against the requesters' markers
// 2,000 times, as Request does: each requester gives up at its deadline
// (or a little before, and then again until a marker is at or after it).
// Reading the inbox in order, the first reply before the deadline that
// precedes the final marker must exist exactly when ReplyInbox accepted a
// reply: exactly one outcome, which replier and requester agree on.
func testInboxReplyRacesGiveUp(t *testing.T, b broker.Broker) {
	if testing.Short() {
		t.Skip("stress: 2,000 races; runs without -short")
	}
	const n, workers = 2000, 8
	ib, r := inboxName(), name("recv")
	ctx := ctxT(t)
	keepInbox(t, b, ib, longLease)

	type request struct {
		deadline time.Time
		accepted bool   // ReplyInbox returned nil
		marker   string // the final marker's ref
	}
	var (
		mu   sync.Mutex
		reqs = map[string]*request{}
		errs errorList
		wg   sync.WaitGroup
	)
	fail := errs.add
	waitUntil := func(at time.Time) bool {
		_, err := spinUntil(ctx, b, at)
		if err != nil {
			fail(err)
		}
		return err == nil
	}
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				env := timedEnv(ib, r, fmt.Sprint(i), time.Duration(1+i%2)*time.Millisecond)
				env.Route = broker.RouteInbox
				res, err := broker.SendOne(ctx, b, broker.SendParams{Env: *env})
				deadline := res.Deadline
				if err != nil {
					fail(err)
					return
				}
				req := &request{deadline: deadline}
				var inner sync.WaitGroup
				inner.Go(func() { // the replier, from a little before the deadline to just after
					if !waitUntil(deadline.Add(-time.Duration(i%5) * 200 * time.Microsecond)) {
						return
					}
					err := b.ReplyInbox(ctx, replyTo(env, "pong"), deadline)
					if err != nil && !errors.Is(err, broker.ErrLate) {
						fail(err)
					}
					req.accepted = err == nil
				})
				inner.Go(func() { // the requester, giving up
					if !waitUntil(deadline.Add(-time.Duration(i%3) * 500 * time.Microsecond)) {
						return
					}
					for {
						m, err := b.GiveUp(ctx, ib, env.ID)
						if err != nil {
							fail(err)
							return
						}
						if !m.At.Before(deadline) {
							req.marker = m.Ref
							return
						}
						time.Sleep(deadline.Sub(m.At))
					}
				})
				inner.Wait()
				mu.Lock()
				reqs[env.ID] = req
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	errs.check(t)

	// Read the inbox in order and decide each request as its requester
	// would: the first reply before its deadline, unless its final marker
	// came first.
	replied, settled := map[string]bool{}, map[string]bool{}
	var last broker.Reply
	for {
		rs := readInbox(t, b, ib, 500)
		if len(rs) == 0 {
			break
		}
		for _, e := range rs {
			if e.At.Before(last.At) {
				t.Fatalf("entry %+v is before the entry read before it, %+v", e, last)
			}
			last = e
			req := reqs[e.RequestID]
			if req == nil {
				t.Fatalf("entry for an unknown request: %+v", e)
			}
			switch {
			case settled[e.RequestID]:
			case e.Kind == broker.KindReply && e.At.Before(req.deadline):
				replied[e.RequestID], settled[e.RequestID] = true, true
			case e.Kind == broker.KindTimeout && e.Ref == req.marker:
				settled[e.RequestID] = true
			}
		}
		ackInbox(t, b, ib, rs)
	}
	accepted := 0
	for id, req := range reqs {
		if !settled[id] {
			t.Fatalf("request %s: its final marker %s was not read", id, req.marker)
		}
		if replied[id] != req.accepted {
			t.Fatalf("request %s: the requester saw a reply: %v; ReplyInbox accepted one: %v", id, replied[id], req.accepted)
		}
		if req.accepted {
			accepted++
		}
	}
	if len(reqs) != n {
		t.Fatalf("got %d requests, want %d", len(reqs), n)
	}
	t.Logf("%d replies accepted, %d timed out", accepted, n-accepted)
	drainQueue(t, b, r)
	closeInbox(t, b, ib)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}
