package membroker

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/broker/brokertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := New(Options{})
		t.Cleanup(func() { checkEmpty(t, b) })
		return b
	})
}

func TestConformanceShared(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		return Shared("conformance", Options{})
	})
}

// checkEmpty fails t if b holds queues, replies, timeouts, open inboxes or
// group keys, which a drained
// subtest must not leave behind. Dead letters, locks and workers are
// checked by the suite itself.
func checkEmpty(t *testing.T, b *Broker) {
	t.Helper()
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queues) != 0 || len(c.replies) != 0 || len(c.timeouts) != 0 || len(c.dead) != 0 || len(c.inboxes) != 0 {
		t.Errorf("left behind: %d queues, %d reply streams, %d timeout sets, %d dead-letter lists, %d open inboxes",
			len(c.queues), len(c.replies), len(c.timeouts), len(c.dead), len(c.inboxes))
	}
	for r, gs := range c.groupSets {
		if len(gs.keys) != 0 || len(gs.rated) != 0 {
			t.Errorf("left behind: %d group keys (%d waiting for a token) of %s", len(gs.keys), len(gs.rated), r)
		}
	}
}

// TestSharedMaxMessageSize shows each handle of a shared broker keeps its
// own limit on content, as each Redis client does, and that a shared
// broker refuses a clock of its own.
func TestSharedMaxMessageSize(t *testing.T) {
	name := "max-size-" + t.Name()
	big := Shared(name, Options{MaxMessageSize: 4 << 20})
	small := Shared(name, Options{})
	defer big.Close()
	defer small.Close()
	ctx := t.Context()
	env := &broker.Envelope{ID: "m1", Sender: "s", Receiver: "r", Content: make([]byte, 2<<20)}
	if _, err := sendEnv(ctx, small, env); err == nil {
		t.Fatal("Send of 2 MiB through a handle with the default limit: got nil, want an error")
	}
	if _, err := sendEnv(ctx, big, env); err != nil {
		t.Fatalf("Send of 2 MiB through a handle with a 4 MiB limit: %v", err)
	}
	ds, err := small.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err != nil || len(ds) != 1 || len(ds[0].Env.Content) != 2<<20 {
		t.Fatalf("Fetch through the other handle: got %d deliveries, %v; want the 2 MiB message", len(ds), err)
	}
	rep := &broker.Envelope{ID: "r1", Receiver: "s", InReplyTo: "m1", Content: env.Content}
	if err := small.Reply(ctx, rep, broker.ReplyUntimed); err == nil {
		t.Fatal("Reply of 2 MiB through a handle with the default limit: got nil, want an error")
	}
	if err := big.Reply(ctx, rep, broker.ReplyUntimed); err != nil {
		t.Fatalf("Reply of 2 MiB through a handle with a 4 MiB limit: %v", err)
	}
	if err := big.Ack(ctx, "r", ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	rs, err := big.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "s", Consumer: "c", Max: 10, Block: 0, Lease: time.Minute})
	if err != nil || len(rs) != 1 {
		t.Fatalf("ReadReplies: got %d, %v", len(rs), err)
	}
	if err := big.AckReplies(ctx, "s", rs[0].Ref); err != nil {
		t.Fatal(err)
	}

	defer func() {
		if recover() == nil {
			t.Fatal("Shared with Options.Now: no panic")
		}
	}()
	Shared(name, Options{Now: time.Now})
}

// sendEnv sends env alone, due now and with no key (the form of Send most
// tests need), and returns its deadline.
func sendEnv(ctx context.Context, b broker.Queue, env *broker.Envelope) (time.Time, error) {
	res, err := broker.SendOne(ctx, b, broker.SendParams{Env: *env})
	return res.Deadline, err
}
