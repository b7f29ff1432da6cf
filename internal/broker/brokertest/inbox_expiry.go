package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// expirySlack is how far past an expiry the suite waits before it looks:
// Redis expires a key once its time is strictly past, to the millisecond.
const expirySlack = 50 * time.Millisecond

func keepInbox(t *testing.T, b broker.Broker, inbox string, ttl time.Duration) {
	t.Helper()
	if err := b.KeepInbox(ctxT(t), inbox, ttl); err != nil {
		t.Fatalf("KeepInbox %s %v: %v", inbox, ttl, err)
	}
}

func closeInbox(t *testing.T, b broker.Broker, inbox string) {
	t.Helper()
	if err := b.CloseInbox(ctxT(t), inbox); err != nil {
		t.Fatalf("CloseInbox %s: %v", inbox, err)
	}
}

// sendRequest sends env from its inbox (env.Sender), setting its route,
// and returns its deadline.
func sendRequest(t *testing.T, b broker.Broker, env *broker.Envelope) time.Time {
	t.Helper()
	env.Route = broker.RouteInbox
	return sendP(t, b, broker.SendParams{Env: *env}).Deadline
}

func readInbox(t *testing.T, b broker.Broker, inbox string, max int) []broker.Reply {
	t.Helper()
	rs, err := b.ReadInbox(ctxT(t), inbox, max, 0)
	if err != nil {
		t.Fatalf("ReadInbox %s: %v", inbox, err)
	}
	return rs
}

func ackInbox(t *testing.T, b broker.Broker, inbox string, rs []broker.Reply) {
	t.Helper()
	refs := make([]string, len(rs))
	for i, r := range rs {
		refs[i] = r.Ref
	}
	if err := b.AckInbox(ctxT(t), inbox, refs...); err != nil {
		t.Fatalf("AckInbox %s: %v", inbox, err)
	}
}

func brokerNow(t *testing.T, b broker.Broker) time.Time {
	t.Helper()
	now, err := b.Now(ctxT(t))
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	return now
}

// inboxName returns an inbox's name unique to this run.
func inboxName() string { return name("inbox") }

// senderState gives inbox, open, a timed request still
// waiting, a sent untimed one and an unread reply to it. It returns the
// two messages and the timed one's deadline.
func senderState(t *testing.T, b broker.Broker, inbox, receiver string) (timed, plain *broker.Envelope, deadline time.Time) {
	t.Helper()
	timed = timedEnv(inbox, receiver, "timed", longLease)
	plain = newEnv(receiver, "plain")
	plain.Sender = inbox
	deadline = sendRequest(t, b, timed)
	sendRequest(t, b, plain)
	ds := fetch(t, b, broker.FetchParams{Receiver: receiver, Consumer: "w", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d deliveries, want 2", len(ds))
	}
	ack(t, b, receiver, ds[0].Ref, ds[1].Ref)
	if err := b.ReplyInbox(ctxT(t), replyTo(plain, "while open"), time.Time{}); err != nil {
		t.Fatalf("ReplyInbox while the inbox is open: %v", err)
	}
	return timed, plain, deadline
}

// checkSenderGone checks that inbox's state is gone: it is closed, its
// reply is no more, and nothing can be appended. It reads the reply
// stream last: on Redis a read re-creates it.
func checkSenderGone(t *testing.T, b broker.Broker, timed, plain *broker.Envelope, deadline time.Time) {
	t.Helper()
	inbox := timed.Sender
	ctx := ctxT(t)
	if err := b.ReplyInbox(ctx, replyTo(plain, "after"), time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox to an inbox whose state is gone: got %v, want ErrLate", err)
	}
	if err := b.ReplyInbox(ctx, replyTo(timed, "after"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox before the deadline to an inbox whose state is gone: got %v, want ErrLate", err)
	}
	if _, err := b.GiveUp(ctx, inbox, timed.ID); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("GiveUp in an inbox whose state is gone: got %v, want ErrLate", err)
	}
	if rs := readInbox(t, b, inbox, 10); len(rs) != 0 {
		t.Fatalf("ReadReplies of an inbox whose state is gone: got %+v", rs)
	}
}

// testInboxLapses shows an inbox's state, including what was added
// after KeepInbox, vanishes when its ttl passes without a refresh.
func testInboxLapses(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	keepInbox(t, b, s, shortLease)
	set := brokerNow(t, b)
	timed, plain, deadline := senderState(t, b, s, r)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	checkSenderGone(t, b, timed, plain, deadline)
	closeInbox(t, b, s) // the read re-created the Redis stream
}

// testInboxRefresh shows a later KeepInbox replaces the expiry
// of the state that exists: a longer ttl keeps it past the first, a
// shorter one ends it sooner.
func testInboxRefresh(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	ctx := ctxT(t)
	keepInbox(t, b, s, longLease)
	timed, plain, deadline := senderState(t, b, s, r)
	keepInbox(t, b, s, time.Second)
	keepInbox(t, b, s, longLease)
	set := brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(time.Second+expirySlack))

	rs := readInbox(t, b, s, 10)
	if len(rs) != 1 || rs[0].RequestID != plain.ID {
		t.Fatalf("ReadReplies after a refresh: got %+v, want the reply to %s", rs, plain.ID)
	}
	ackInbox(t, b, s, rs)
	if err := b.ReplyInbox(ctx, replyTo(timed, "pong"), deadline); err != nil {
		t.Fatalf("ReplyInbox before the deadline after a refresh: got %v, want it accepted", err)
	}
	if err := b.ReplyInbox(ctx, replyTo(plain, "again"), time.Time{}); err != nil {
		t.Fatalf("ReplyInbox after a refresh: got %v, want it accepted", err)
	}

	keepInbox(t, b, s, shortLease)
	set = brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	if err := b.ReplyInbox(ctx, replyTo(plain, "after"), time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox after a shorter ttl passed: got %v, want ErrLate", err)
	}
	if rs := readInbox(t, b, s, 10); len(rs) != 0 {
		t.Fatalf("ReadReplies after a shorter ttl passed: got %+v", rs)
	}
	closeInbox(t, b, s)
}

// testInboxClose shows CloseInbox deletes an inbox's state at once and
// closes it; replies that come later are refused and re-create nothing.
func testInboxClose(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	keepInbox(t, b, s, longLease)
	timed, plain, deadline := senderState(t, b, s, r)
	closeInbox(t, b, s)
	checkSenderGone(t, b, timed, plain, deadline)
	closeInbox(t, b, s) // idempotent; and the read re-created the Redis stream

	never := inboxName()
	if err := b.ReplyInbox(ctxT(t), &broker.Envelope{ID: name("reply"), Receiver: never, InReplyTo: name("req")}, time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox to an inbox never opened: got %v, want ErrLate", err)
	}
	if err := b.KeepInbox(ctxT(t), "", time.Second); err == nil {
		t.Fatalf("KeepInbox with an empty inbox: got nil, want an error")
	}
	if err := b.KeepInbox(ctxT(t), s, -time.Second); err == nil {
		t.Fatalf("KeepInbox with a negative ttl: got nil, want an error")
	}
	if err := b.KeepInbox(ctxT(t), s, 0); err == nil {
		t.Fatalf("KeepInbox with a ttl of 0: got nil, want an error")
	}
	if err := b.CloseInbox(ctxT(t), ""); err == nil {
		t.Fatalf("CloseInbox with an empty inbox: got nil, want an error")
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}
