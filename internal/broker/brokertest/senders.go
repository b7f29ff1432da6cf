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

func expireSender(t *testing.T, b broker.Broker, sender string, ttl time.Duration) {
	t.Helper()
	if err := b.ExpireSender(ctxT(t), sender, ttl); err != nil {
		t.Fatalf("ExpireSender %s %v: %v", sender, ttl, err)
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

// inboxName returns an inbox's name (see broker.InboxPrefix) unique to
// this run.
func inboxName() string { return broker.InboxPrefix + name("inbox") }

// senderState gives inbox, under ExpireSender, a timed request still
// waiting, a sent untimed one and an unread reply to it. It returns the
// two messages and the timed one's deadline.
func senderState(t *testing.T, b broker.Broker, inbox, receiver string) (timed, plain *broker.Envelope, deadline time.Time) {
	t.Helper()
	timed = timedEnv(inbox, receiver, "timed", longLease)
	plain = newEnv(receiver, "plain")
	plain.Sender = inbox
	deadline = send(t, b, timed)
	send(t, b, plain)
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
func checkSenderGone(t *testing.T, b broker.Broker, inbox string, timed, plain *broker.Envelope, deadline time.Time) {
	t.Helper()
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
	if rs := readReplies(t, b, broker.ReadRepliesParams{Sender: inbox, Consumer: "c", Max: 10, Block: 0, Lease: longLease}); len(rs) != 0 {
		t.Fatalf("ReadReplies of an inbox whose state is gone: got %+v", rs)
	}
}

// testExpireSenderLapses shows an inbox's state, including what was added
// after ExpireSender, vanishes when its ttl passes without a refresh.
func testExpireSenderLapses(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	expireSender(t, b, s, shortLease)
	set := brokerNow(t, b)
	timed, plain, deadline := senderState(t, b, s, r)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	checkSenderGone(t, b, s, timed, plain, deadline)
	expireSender(t, b, s, 0) // the read re-created the Redis stream
}

// testExpireSenderRefresh shows a later ExpireSender replaces the expiry
// of the state that exists: a longer ttl keeps it past the first, a
// shorter one ends it sooner.
func testExpireSenderRefresh(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	ctx := ctxT(t)
	expireSender(t, b, s, longLease)
	timed, plain, deadline := senderState(t, b, s, r)
	expireSender(t, b, s, time.Second)
	expireSender(t, b, s, longLease)
	set := brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(time.Second+expirySlack))

	rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Block: 0, Lease: longLease})
	if len(rs) != 1 || rs[0].RequestID != plain.ID {
		t.Fatalf("ReadReplies after a refresh: got %+v, want the reply to %s", rs, plain.ID)
	}
	ackReplies(t, b, s, rs)
	if err := b.ReplyInbox(ctx, replyTo(timed, "pong"), deadline); err != nil {
		t.Fatalf("ReplyInbox before the deadline after a refresh: got %v, want it accepted", err)
	}
	if err := b.ReplyInbox(ctx, replyTo(plain, "again"), time.Time{}); err != nil {
		t.Fatalf("ReplyInbox after a refresh: got %v, want it accepted", err)
	}

	expireSender(t, b, s, shortLease)
	set = brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	if err := b.ReplyInbox(ctx, replyTo(plain, "after"), time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox after a shorter ttl passed: got %v, want ErrLate", err)
	}
	if rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Block: 0, Lease: longLease}); len(rs) != 0 {
		t.Fatalf("ReadReplies after a shorter ttl passed: got %+v", rs)
	}
	expireSender(t, b, s, 0)
}

// testExpireSenderZero shows ttl 0 deletes an inbox's state at once and
// closes it; replies that come later are refused and re-create nothing.
func testExpireSenderZero(t *testing.T, b broker.Broker) {
	s, r := inboxName(), name("recv")
	expireSender(t, b, s, longLease)
	timed, plain, deadline := senderState(t, b, s, r)
	expireSender(t, b, s, 0)
	checkSenderGone(t, b, s, timed, plain, deadline)
	expireSender(t, b, s, 0) // idempotent; and the read re-created the Redis stream

	never := inboxName()
	if err := b.ReplyInbox(ctxT(t), &broker.Envelope{ID: name("reply"), Receiver: never, InReplyTo: name("req")}, time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox to an inbox never opened: got %v, want ErrLate", err)
	}
	if err := b.ExpireSender(ctxT(t), "", time.Second); err == nil {
		t.Fatalf("ExpireSender with an empty sender: got nil, want an error")
	}
	if err := b.ExpireSender(ctxT(t), s, -time.Second); err == nil {
		t.Fatalf("ExpireSender with a negative ttl: got nil, want an error")
	}
	checkStats(t, b, r, 0, 0, 0)
}
