package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// partial appends a partial of attempt with content data to env's stream,
// and returns the broker's error.
func partial(t *testing.T, b broker.Broker, env *broker.Envelope, attempt int, data string, deadline time.Time, limit int) error {
	t.Helper()
	return b.Partial(ctxT(t), &broker.PartialParams{Inbox: env.Sender, RequestID: env.ID, Attempt: attempt,
		Data: []byte(data), Deadline: deadline, Max: limit})
}

// mustPartial is partial, which must succeed.
func mustPartial(t *testing.T, b broker.Broker, env *broker.Envelope, attempt int, data string, deadline time.Time) {
	t.Helper()
	if err := partial(t, b, env, attempt, data, deadline, 100); err != nil {
		t.Fatalf("Partial %q of attempt %d: %v", data, attempt, err)
	}
}

// streamedRequest sends a streamed timed request from a new inbox and
// returns it with its deadline.
func streamedRequest(t *testing.T, b broker.Broker, timeout time.Duration) (*broker.Envelope, time.Time) {
	t.Helper()
	ib := inboxName()
	keepInbox(t, b, ib, longLease)
	env := timedEnv(ib, name("recv"), "ask", timeout)
	env.Stream = true
	return env, sendRequest(t, b, env)
}

// testStreams shows a streamed request's partials: in order with their
// attempts and kinds (data, progress), before the final reply, which settles the request
// so that no partial or reply follows it; an attempt's cap; an older
// attempt refused once a later one streamed; the stream flag delivered.
func testStreams(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	env, deadline := streamedRequest(t, b, longLease)
	d := fetchOne(t, b, env.Receiver, "w", longLease)
	if !d.Env.Stream || d.Env.Route != broker.RouteInbox {
		t.Fatalf("delivery of a streamed request: Stream %v, Route %v; want true, the inbox", d.Env.Stream, d.Env.Route)
	}
	mustPartial(t, b, env, 1, "a", deadline)
	mustPartial(t, b, env, 1, "b", deadline)
	if err := partial(t, b, env, 1, "c", deadline, 2); !errors.Is(err, broker.ErrPartialCap) {
		t.Fatalf("third partial of an attempt capped at 2: got %v, want ErrPartialCap", err)
	}
	mustPartial(t, b, env, 2, "A", deadline) // a new attempt counts anew
	progress := broker.PartialParams{Inbox: env.Sender, RequestID: env.ID, Attempt: 2, Kind: broker.PartProgress,
		Data: []byte("50%"), Deadline: deadline, Max: 100}
	if err := b.Partial(ctx, &progress); err != nil {
		t.Fatalf("Partial of kind PartProgress: %v", err)
	}
	bad := progress
	bad.Kind = broker.PartProgress + 1
	if err := b.Partial(ctx, &bad); err == nil {
		t.Fatalf("Partial of kind %d: no error", bad.Kind)
	}
	if err := partial(t, b, env, 1, "stale", deadline, 100); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("partial of attempt 1 after attempt 2's: got %v, want ErrLeaseLost", err)
	}
	final := replyTo(env, "done")
	if err := b.ReplyStream(ctx, final, deadline); err != nil {
		t.Fatalf("ReplyStream: %v", err)
	}
	if err := b.ReplyStream(ctx, replyTo(env, "again"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("second ReplyStream: got %v, want ErrLate", err)
	}
	if err := partial(t, b, env, 2, "after", deadline, 100); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("partial after the final reply: got %v, want ErrLate", err)
	}
	rs := readInbox(t, b, env.Sender, 10)
	want := []struct {
		kind    broker.ReplyKind
		attempt int
		content string
		part    broker.PartKind
	}{{broker.KindPartial, 1, "a", broker.PartData}, {broker.KindPartial, 1, "b", broker.PartData}, {broker.KindPartial, 2, "A", broker.PartData},
		{broker.KindPartial, 2, "50%", broker.PartProgress}, {broker.KindReply, 0, "done", 0}}
	if len(rs) != len(want) {
		t.Fatalf("ReadInbox: got %d entries %+v, want %d", len(rs), rs, len(want))
	}
	for i, w := range want {
		r := rs[i]
		if r.Kind != w.kind || r.Attempt != w.attempt || string(r.Env.Content) != w.content || r.RequestID != env.ID || r.Ref == "" {
			t.Fatalf("entry %d: got kind %v attempt %d content %q request %s, want %+v", i, r.Kind, r.Attempt, r.Env.Content, r.RequestID, w)
		}
		if r.Kind == broker.KindPartial && (r.Part != w.part || r.Env.InReplyTo != env.ID) {
			t.Fatalf("partial %d: got part %v, InReplyTo %q", i, r.Part, r.Env.InReplyTo)
		}
		if !r.At.Before(deadline) {
			t.Fatalf("entry %d is at %v, not before the deadline %v", i, r.At, deadline)
		}
	}
	checkEnv(t, "final reply", rs[4].Env, final)
	checkOrder(t, rs)
	ackInbox(t, b, env.Sender, rs)
	ack(t, b, env.Receiver, d.Ref)
	closeInbox(t, b, env.Sender)
	if err := partial(t, b, env, 3, "closed", time.Time{}, 100); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("partial to a closed inbox: got %v, want ErrLate", err)
	}
}

// endStream removes the streamed request env and its inbox.
func endStream(t *testing.T, b broker.Broker, env *broker.Envelope) {
	t.Helper()
	ack(t, b, env.Receiver, fetchOne(t, b, env.Receiver, "w", longLease).Ref)
	closeInbox(t, b, env.Sender)
}

// testStreamsSettled shows the other ends of a streamed request: its
// marker settles it (no partial or reply after it), and its deadline
// refuses partials and replies whose time is not before it.
func testStreamsSettled(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	env, deadline := streamedRequest(t, b, longLease)
	mustPartial(t, b, env, 1, "a", deadline)
	marker, err := b.GiveUpStream(ctx, env.Sender, env.ID)
	if err != nil || marker.Kind != broker.KindTimeout || marker.RequestID != env.ID || marker.Ref == "" {
		t.Fatalf("GiveUpStream: got %+v, %v", marker, err)
	}
	if err := partial(t, b, env, 1, "b", deadline, 100); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("partial after the marker: got %v, want ErrLate", err)
	}
	if err := b.ReplyStream(ctx, replyTo(env, "late"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("reply after the marker: got %v, want ErrLate", err)
	}
	rs := readInbox(t, b, env.Sender, 10)
	if len(rs) != 2 || rs[0].Kind != broker.KindPartial || rs[1].Ref != marker.Ref {
		t.Fatalf("ReadInbox after the marker: got %+v, want the partial and the marker", rs)
	}
	endStream(t, b, env)

	short, deadline := streamedRequest(t, b, shortLease)
	mustPartial(t, b, short, 1, "in time", deadline)
	waitBrokerTime(t, b, deadline)
	if err := partial(t, b, short, 1, "late", deadline, 100); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("partial after the deadline: got %v, want ErrLate", err)
	}
	if err := b.ReplyStream(ctx, replyTo(short, "late"), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("reply after the deadline: got %v, want ErrLate", err)
	}
	if rs := readInbox(t, b, short.Sender, 10); len(rs) != 1 || string(rs[0].Env.Content) != "in time" {
		t.Fatalf("ReadInbox after the deadline: got %+v, want the partial in time alone", rs)
	}
	endStream(t, b, short)

	for i, p := range []broker.PartialParams{
		{RequestID: "x", Attempt: 1, Max: 1},
		{Inbox: "i", Attempt: 1, Max: 1},
		{Inbox: "i", RequestID: "x", Max: 1},
		{Inbox: "i", RequestID: "x", Attempt: 1},
		{Inbox: "i", RequestID: "x", Attempt: 1, Max: 1, Kind: 99},
	} {
		if err := b.Partial(ctx, &p); err == nil || errors.Is(err, broker.ErrLate) {
			t.Fatalf("Partial with bad params %d (%+v): got %v, want a validation error", i, p, err)
		}
	}
	if _, err := b.GiveUpStream(ctx, "", "x"); err == nil {
		t.Fatal("GiveUpStream without an inbox: no error")
	}
	if err := b.ReplyStream(ctx, nil, deadline); err == nil || errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyStream of nil: got %v, want an error that is not ErrLate", err)
	}
}
