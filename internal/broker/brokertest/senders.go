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

// senderState gives sender, under ExpireSender, a pending timed message, a
// sent untimed one and an unread reply to it. It returns the two messages.
func senderState(t *testing.T, b broker.Broker, sender, receiver string) (timed, plain *broker.Envelope) {
	t.Helper()
	timed = timedEnv(sender, receiver, "timed", longLease)
	plain = newEnv(receiver, "plain")
	plain.Sender = sender
	send(t, b, timed)
	send(t, b, plain)
	ds := fetch(t, b, receiver, "w", 10, 0, longLease, 10)
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d deliveries, want 2", len(ds))
	}
	ack(t, b, receiver, ds[0].Ref, ds[1].Ref)
	if err := reply(t, b, replyTo(plain, "while open"), broker.ReplyIfOpen); err != nil {
		t.Fatalf("ReplyIfOpen while the sender is open: %v", err)
	}
	return timed, plain
}

// checkSenderGone checks that sender's state is gone: its address is
// closed, its pending timeout and its reply are no more. It reads the reply
// stream last: on Redis a read re-creates it.
func checkSenderGone(t *testing.T, b broker.Broker, sender string, timed, plain *broker.Envelope) {
	t.Helper()
	if err := reply(t, b, replyTo(plain, "after"), broker.ReplyIfOpen); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyIfOpen to a sender whose state is gone: got %v, want ErrLate", err)
	}
	if err := reply(t, b, replyTo(timed, "after"), broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyTimed to a sender whose state is gone: got %v, want ErrLate", err)
	}
	if cancelTimeout(t, b, sender, timed.ID) {
		t.Fatalf("Cancel of %s: got true, want false: its pending timeout is gone", timed.ID)
	}
	if rs := readReplies(t, b, sender, "c", 10, 0, longLease); len(rs) != 0 {
		t.Fatalf("ReadReplies of a sender whose state is gone: got %+v", rs)
	}
}

// testExpireSenderLapses shows a sender's state, including what was added
// after ExpireSender, vanishes when its ttl passes without a refresh.
func testExpireSenderLapses(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	expireSender(t, b, s, shortLease)
	set := brokerNow(t, b)
	timed, plain := senderState(t, b, s, r)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	checkSenderGone(t, b, s, timed, plain)
	expireSender(t, b, s, 0) // the read re-created the Redis stream
}

// testExpireSenderRefresh shows a later ExpireSender replaces the expiry
// of the state that exists: a longer ttl keeps it past the first, a
// shorter one ends it sooner.
func testExpireSenderRefresh(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	expireSender(t, b, s, longLease)
	timed, plain := senderState(t, b, s, r)
	expireSender(t, b, s, time.Second)
	expireSender(t, b, s, longLease)
	set := brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(time.Second+expirySlack))

	rs := readReplies(t, b, s, "c", 10, 0, longLease)
	if len(rs) != 1 || rs[0].RequestID != plain.ID {
		t.Fatalf("ReadReplies after a refresh: got %+v, want the reply to %s", rs, plain.ID)
	}
	ackReplies(t, b, s, rs)
	if err := reply(t, b, replyTo(timed, "pong"), broker.ReplyTimed); err != nil {
		t.Fatalf("ReplyTimed after a refresh: got %v, want it accepted", err)
	}
	if err := reply(t, b, replyTo(plain, "again"), broker.ReplyIfOpen); err != nil {
		t.Fatalf("ReplyIfOpen after a refresh: got %v, want it accepted", err)
	}

	expireSender(t, b, s, shortLease)
	set = brokerNow(t, b)
	waitBrokerTime(t, b, set.Add(shortLease+expirySlack))
	if err := reply(t, b, replyTo(plain, "after"), broker.ReplyIfOpen); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyIfOpen after a shorter ttl passed: got %v, want ErrLate", err)
	}
	if rs := readReplies(t, b, s, "c", 10, 0, longLease); len(rs) != 0 {
		t.Fatalf("ReadReplies after a shorter ttl passed: got %+v", rs)
	}
	expireSender(t, b, s, 0)
}

// testExpireSenderZero shows ttl 0 deletes a sender's state at once and
// closes its address; replies that come later are refused and re-create
// nothing.
func testExpireSenderZero(t *testing.T, b broker.Broker) {
	s, r := name("sender"), name("recv")
	expireSender(t, b, s, longLease)
	timed, plain := senderState(t, b, s, r)
	late := timedEnv(s, r, "times out", time.Millisecond)
	deadline := send(t, b, late)
	ack(t, b, r, fetchOne(t, b, r, "w", longLease).Ref)
	waitBrokerTime(t, b, deadline)
	if n := expire(t, b, s, 10); n != 1 {
		t.Fatalf("ExpireTimeouts: settled %d, want 1", n)
	}

	expireSender(t, b, s, 0)
	checkSenderGone(t, b, s, timed, plain)
	if n := expire(t, b, s, 10); n != 0 {
		t.Fatalf("ExpireTimeouts after ttl 0: settled %d, want 0", n)
	}
	expireSender(t, b, s, 0) // idempotent; and the read re-created the Redis stream

	never := name("sender")
	if err := reply(t, b, &broker.Envelope{ID: name("reply"), Receiver: never, InReplyTo: name("req")}, broker.ReplyIfOpen); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyIfOpen to a sender never opened: got %v, want ErrLate", err)
	}
	if err := b.ExpireSender(ctxT(t), "", time.Second); err == nil {
		t.Fatalf("ExpireSender with an empty sender: got nil, want an error")
	}
	if err := b.ExpireSender(ctxT(t), s, -time.Second); err == nil {
		t.Fatalf("ExpireSender with a negative ttl: got nil, want an error")
	}
	checkStats(t, b, r, 0, 0, 0)
}
