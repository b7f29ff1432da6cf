package redisbroker

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/broker/brokertest"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/redistest"
	"github.com/diskerhq/disker/internal/wire"
)

// TestClusterConformance runs the conformance suite on a private Redis
// Cluster of three masters: every script stays in one slot, and timed sends
// between names of different slots take the two-step path.
func TestClusterConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := clusterBroker(t, c)
		if !b.cluster {
			t.Fatalf("the broker on %s does not see a cluster", c.URL())
		}
		return b
	})
}

func clusterBroker(t testing.TB, c *redistest.Cluster) *Broker {
	t.Helper()
	b, err := New(Config{URL: c.URL(), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestClusterSlotMatchesRedis checks slot against CLUSTER KEYSLOT.
func TestClusterSlotMatchesRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	rc, err := rueidis.NewClient(rueidis.MustParseURL(c.URL()))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	k := keys{prefix: "disker"}
	for i := range 300 {
		name := fmt.Sprintf("name-%d.x:%d", i, i*7919)
		for _, key := range []string{k.queue(name), k.timeouts(name), name, "{}" + name, "a{" + name + "}b{c}"} {
			want, err := do(t, rc, "CLUSTER", "KEYSLOT", key).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			if got := keyslot.Of(key); int64(got) != want {
				t.Fatalf("keyslot.Of(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	}
}

// TestClusterTimedSendAcrossSlots sends a timed message between two names
// whose slots differ: the reply is accepted while the request is pending,
// and a second request times out with its notice. Then the sender's keys
// hold nothing pending.
func TestClusterTimedSendAcrossSlots(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	b := clusterBroker(t, c)
	ctx := ctxT(t)
	sender, receiver := namesApart(b, func(a, b uint16) bool { return a != b })
	send := func(timeout time.Duration) (broker.Envelope, time.Time) {
		env := broker.Envelope{ID: fmt.Sprintf("m%d", timeout), Sender: sender, Receiver: receiver, Content: []byte("q"), Timeout: timeout, Route: broker.RouteSender}
		dl, err := sendEnv(ctx, b, &env)
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		return env, dl
	}
	env, dl := send(time.Minute)
	ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 10, Block: time.Second, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != 1 || ds[0].Env.ID != env.ID || !ds[0].Deadline.Equal(dl) {
		t.Fatalf("Fetch = %+v, %v; want %s with deadline %v", ds, err, env.ID, dl)
	}
	rep := broker.Envelope{ID: "rep1", Sender: receiver, Receiver: sender, InReplyTo: env.ID, Content: []byte("a")}
	if err := b.Reply(ctx, &rep, broker.ReplyTimed); err != nil {
		t.Fatalf("Reply: %v", err)
	}
	if err := b.Reply(ctx, &rep, broker.ReplyTimed); err != broker.ErrLate {
		t.Fatalf("second Reply = %v, want ErrLate", err)
	}
	if err := b.Ack(ctx, receiver, ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	late, _ := send(50 * time.Millisecond)
	eventually(t, "the timeout notice", func() bool {
		n, err := b.ExpireTimeouts(ctx, sender, 10)
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	})
	rs, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: sender, Consumer: "c", Max: 10, Block: time.Second, Lease: time.Minute})
	if err != nil || len(rs) != 2 || rs[0].Kind != broker.KindReply || rs[0].RequestID != env.ID ||
		rs[1].Kind != broker.KindTimeout || rs[1].RequestID != late.ID {
		t.Fatalf("ReadReplies = %+v, %v; want the reply to %s, then the notice of %s", rs, err, env.ID, late.ID)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r2", Receiver: sender, InReplyTo: late.ID}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply after the notice = %v; want ErrLate, nothing pending", err)
	}
}

// namesApart returns a sender and a receiver name whose slots are apart as
// apart says.
func namesApart(b *Broker, apart func(senderSlot, receiverSlot uint16) bool) (sender, receiver string) {
	sender = "s"
	for i := 0; ; i++ {
		receiver = fmt.Sprintf("r%d", i)
		if apart(keyslot.Of(b.keys.queue(sender)), keyslot.Of(b.keys.queue(receiver))) {
			return sender, receiver
		}
	}
}

// TestClusterTimedSendUndoneWhenQueueFails stops the node that holds the
// receiver's queue: the timed send fails, and its pending timeout, on
// another node, is withdrawn (no timeout notice comes for it).
func TestClusterTimedSendUndoneWhenQueueFails(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	b := clusterBroker(t, c)
	ctx := ctxT(t)
	sender, receiver := namesApart(b, func(a, b uint16) bool { return c.NodeOf(a) != c.NodeOf(b) })
	c.StopNode(c.NodeOf(keyslot.Of(b.keys.queue(receiver))))
	env := broker.Envelope{ID: "m1", Sender: sender, Receiver: receiver, Timeout: 50 * time.Millisecond, Route: broker.RouteSender}
	if _, err := sendEnv(ctx, b, &env); err == nil {
		t.Fatal("Send succeeded with the receiver's node down")
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r1", Receiver: sender, InReplyTo: env.ID}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply = %v; want ErrLate: the failed send's pending timeout already withdrawn", err)
	}
	if n, err := b.ExpireTimeouts(ctx, sender, 10); err != nil || n != 0 {
		t.Fatalf("ExpireTimeouts = %d, %v; want nothing", n, err)
	}
}

// TestClusterInboxReplyRecorded: on a Cluster, a reply a Request's inbox
// accepts is on the request's record before any FinishResult, both when
// the inbox and the receiver share a slot (reply_inbox records it, or
// stream_reply for a streamed request's final reply) and when they do not
// (result_reply, right after the append); a later attempt's timeout after
// the deadline keeps it, as done.
func TestClusterInboxReplyRecorded(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	b := clusterBroker(t, c)
	ctx := ctxT(t)
	for _, tc := range []struct{ same, stream bool }{{true, false}, {false, false}, {true, true}, {false, true}} {
		same := tc.same
		inbox, receiver := namesApart(b, func(a, b uint16) bool { return (a == b) == same })
		if err := b.KeepInbox(ctx, inbox, time.Minute); err != nil {
			t.Fatal(err)
		}
		env := broker.Envelope{ID: fmt.Sprintf("m-%v-%v", same, tc.stream), Sender: inbox, Receiver: receiver, Content: []byte("q"), Timeout: 2 * time.Second, Route: broker.RouteInbox, Stream: tc.stream}
		res, err := broker.SendOne(ctx, b, broker.SendParams{Env: env, Retention: time.Hour})
		if err != nil {
			t.Fatalf("Send: %v", err)
		}
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: time.Second, Lease: time.Minute})
		if err != nil || len(ds) != 1 {
			t.Fatalf("Fetch = %+v, %v", ds, err)
		}
		rep := broker.Envelope{ID: "rep-" + env.ID, Sender: receiver, Receiver: inbox, InReplyTo: env.ID, Content: []byte("a"), Retention: time.Hour}
		reply := b.ReplyInbox
		if tc.stream {
			reply = b.ReplyStream
		}
		if err := reply(ctx, &rep, res.Deadline); err != nil {
			t.Fatalf("%+v: the reply: %v", tc, err)
		}
		rec, err := b.Result(ctx, receiver, env.ID)
		if err != nil || rec.Reply == nil || string(rec.Reply.Content) != "a" {
			t.Fatalf("%+v: the record after the reply: %+v, %v; want the reply", tc, rec, err)
		}
		eventually(t, "the deadline", func() bool {
			now, err := b.Now(ctx)
			return err == nil && !now.Before(res.Deadline)
		})
		if err := b.FinishResult(ctx, &broker.FinishResultParams{Receiver: receiver, ID: env.ID, Ref: ds[0].Ref, State: broker.ResultTimedOut, Worker: "w2", Attempt: 2, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if rec, err = b.Result(ctx, receiver, env.ID); err != nil || rec.State != broker.ResultDone || rec.Reply == nil {
			t.Fatalf("%+v: the record after a later timeout: %+v, %v; want done with the reply", tc, rec, err)
		}
	}
}

// TestClusterAcceptedReplyKept: on a Cluster whose slots part a retained
// message's record from where its reply is accepted (a timed Send's
// sender, a Request's inbox, a RequestStream's inbox), a worker that dies
// after the acceptance and before the step that records the reply leaves
// a copy of it: Result reads it, and the next attempt records it (its
// StartResult, or the FinishResult of an attempt dropped after the
// deadline without a handler), then deletes the copy. A reply recorded
// in the usual steps leaves no copy.
func TestClusterAcceptedReplyKept(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	b := clusterBroker(t, c)
	ctx := ctxT(t)
	owner, receiver := namesApart(b, func(a, b uint16) bool { return a != b })
	if err := b.KeepInbox(ctx, owner, time.Minute); err != nil {
		t.Fatal(err)
	}
	exists := func(key string) bool {
		n, err := b.client.Do(ctx, b.client.B().Exists().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n == 1
	}
	for _, kind := range []string{"timed", "inbox", "stream"} {
		for _, dies := range []bool{true, false} {
			for _, byStart := range []bool{true, false} {
				if !dies && !byStart {
					continue
				}
				name := fmt.Sprintf("%s-dies=%v-start=%v", kind, dies, byStart)
				env := broker.Envelope{ID: "m-" + name, Sender: owner, Receiver: receiver, Content: []byte("q"), Timeout: time.Second, Route: broker.RouteInbox}
				if kind == "timed" {
					env.Route = broker.RouteSender
				}
				env.Stream = kind == "stream"
				res, err := broker.SendOne(ctx, b, broker.SendParams{Env: env, Retention: time.Hour})
				if err != nil {
					t.Fatalf("%s: Send: %v", name, err)
				}
				ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: time.Second, Lease: time.Minute})
				if err != nil || len(ds) != 1 {
					t.Fatalf("%s: Fetch = %+v, %v", name, ds, err)
				}
				start := broker.StartResultParams{Receiver: receiver, ID: env.ID, Worker: "w1", Attempt: 1, Retention: time.Hour, ReplyTo: owner}
				if err := b.StartResult(ctx, &start); err != nil {
					t.Fatal(err)
				}
				rep := broker.Envelope{ID: "rep-" + name, Sender: receiver, Receiver: owner, InReplyTo: env.ID, Content: []byte("a"), Retention: time.Hour}
				data := string(wire.Encode(&rep))
				switch {
				case kind == "timed":
					err = b.Reply(ctx, &rep, broker.ReplyTimed)
				case !dies && kind == "inbox":
					err = b.ReplyInbox(ctx, &rep, res.Deadline)
				case !dies:
					err = b.ReplyStream(ctx, &rep, res.Deadline)
				case kind == "inbox":
					// The first step of ReplyInbox alone: its worker dies before the second.
					_, _, _, err = b.acceptInbox(ctx, &rep, data, res.Deadline)
				default:
					_, _, err = b.acceptStream(ctx, &rep, data, res.Deadline)
				}
				if err != nil {
					t.Fatalf("%s: the reply: %v", name, err)
				}
				copyKey := b.keys.acceptedReply(owner, env.ID)
				if !dies {
					if kind == "timed" {
						// The worker's acknowledgement records the reply and deletes the copy.
						if !exists(copyKey) {
							t.Fatalf("%s: no copy of the accepted reply before the acknowledgement", name)
						}
						if err := b.FinishResult(ctx, &broker.FinishResultParams{Receiver: receiver, ID: env.ID, Ref: ds[0].Ref, State: broker.ResultDone,
							Worker: "w1", Attempt: 1, Reply: &rep, Retention: time.Hour, ReplyTo: owner}); err != nil {
							t.Fatal(err)
						}
					}
					if exists(copyKey) {
						t.Fatalf("%s: the copy is left after the record holds the reply", name)
					}
					if rec, err := b.Result(ctx, receiver, env.ID); err != nil || rec.Reply == nil || string(rec.Reply.Content) != "a" {
						t.Fatalf("%s: the record: %+v, %v; want the reply", name, rec, err)
					}
					continue
				}
				if !exists(copyKey) {
					t.Fatalf("%s: no copy of the reply accepted in the other slot", name)
				}
				if rec, err := b.Result(ctx, receiver, env.ID); err != nil || rec.State != broker.ResultRunning || rec.Reply == nil || string(rec.Reply.Content) != "a" {
					t.Fatalf("%s: the record after the worker died: %+v, %v; want running with the reply (its copy)", name, rec, err)
				}
				eventually(t, "the deadline", func() bool {
					now, err := b.Now(ctx)
					return err == nil && !now.Before(res.Deadline)
				})
				if byStart {
					start.Attempt, start.Worker = 2, "w2"
					if err := b.StartResult(ctx, &start); err != nil {
						t.Fatal(err)
					}
					if exists(copyKey) {
						t.Fatalf("%s: the copy is left after attempt 2's StartResult", name)
					}
					if rec, err := b.Result(ctx, receiver, env.ID); err != nil || rec.Reply == nil || string(rec.Reply.Content) != "a" || rec.Attempts != 2 {
						t.Fatalf("%s: the record after attempt 2 started: %+v, %v; want the reply recorded", name, rec, err)
					}
				}
				if err := b.FinishResult(ctx, &broker.FinishResultParams{Receiver: receiver, ID: env.ID, Ref: ds[0].Ref, State: broker.ResultTimedOut,
					Worker: "w2", Attempt: 2, Retention: time.Hour, ReplyTo: owner}); err != nil {
					t.Fatal(err)
				}
				if exists(copyKey) {
					t.Fatalf("%s: the copy is left after attempt 2's FinishResult", name)
				}
				rec, err := b.Result(ctx, receiver, env.ID)
				if err != nil || rec.State != broker.ResultDone || rec.Reply == nil || string(rec.Reply.Content) != "a" || rec.Worker != "w2" {
					t.Fatalf("%s: the record after attempt 2: %+v, %v; want done by w2 with the first attempt's reply", name, rec, err)
				}
			}
		}
	}
}
