package redisbroker

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func readAll(t *testing.T, b *Broker, sender, consumer string) []broker.Reply {
	t.Helper()
	rs, err := b.ReadReplies(ctxT(t), &broker.ReadRepliesParams{Sender: sender, Consumer: consumer, Max: 100, Block: 0, Lease: time.Minute})
	if err != nil {
		t.Fatalf("ReadReplies: %v", err)
	}
	return rs
}

func readInbox(t *testing.T, b *Broker, inbox string) []broker.Reply {
	t.Helper()
	rs, err := b.ReadInbox(ctxT(t), inbox, 100, 0)
	if err != nil {
		t.Fatalf("ReadInbox: %v", err)
	}
	return rs
}

func TestReplyUntimed(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rep := &broker.Envelope{ID: "r1", Receiver: "web", InReplyTo: "m1", Content: []byte("ok")}
	if err := b.Reply(ctx, rep, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	rs := readAll(t, b, "web", "c")
	if len(rs) != 1 || rs[0].Kind != broker.KindReply || rs[0].RequestID != "m1" || !reflect.DeepEqual(rs[0].Env, *rep) {
		t.Fatalf("ReadReplies = %+v", rs)
	}
	if again := readAll(t, b, "web", "c2"); len(again) != 0 {
		t.Fatalf("read twice: %+v", again)
	}
	if err := b.AckReplies(ctx, "web", rs[0].Ref); err != nil {
		t.Fatal(err)
	}
	if n, _ := do(t, rawClient(t, srv), "XLEN", b.keys.replies("web")).AsInt64(); n != 0 {
		t.Fatalf("reply stream holds %d entries after AckReplies", n)
	}
}

func TestReplyTimed(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	req := env("m1", "orders")
	req.Sender = "web"
	req.Timeout = time.Hour
	if _, err := sendEnv(ctx, b, req); err != nil {
		t.Fatal(err)
	}
	rep := &broker.Envelope{ID: "r1", Receiver: "web", InReplyTo: "m1", Content: []byte("ok")}
	if err := b.Reply(ctx, rep, broker.ReplyTimed); err != nil {
		t.Fatalf("timed Reply: %v", err)
	}
	if err := b.Reply(ctx, rep, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("second timed Reply = %v; want ErrLate", err)
	}
	if n, err := b.ExpireTimeouts(ctx, "web", 10); err != nil || n != 0 {
		t.Fatalf("ExpireTimeouts = %d, %v", n, err)
	}
	rs := readAll(t, b, "web", "c")
	if len(rs) != 1 || rs[0].Kind != broker.KindReply || rs[0].Env.ID != "r1" {
		t.Fatalf("ReadReplies = %+v", rs)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r2", Receiver: "web", InReplyTo: "never-sent"}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("timed Reply to an unknown request = %v; want ErrLate", err)
	}
}

func TestTimeoutNotice(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	req := env("m1", "orders")
	req.Sender = "web"
	req.Timeout = 20 * time.Millisecond
	deadline, err := sendEnv(ctx, b, req)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deadline to pass", func() bool {
		now, err := b.Now(ctx)
		return err == nil && !now.Before(deadline)
	})
	if err := b.Reply(ctx, &broker.Envelope{ID: "r1", Receiver: "web", InReplyTo: "m1"}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply after the deadline = %v; want ErrLate", err)
	}
	if n, err := b.ExpireTimeouts(ctx, "web", 10); err != nil || n != 1 {
		t.Fatalf("ExpireTimeouts = %d, %v; want 1", n, err)
	}
	if n, _ := b.ExpireTimeouts(ctx, "web", 10); n != 0 {
		t.Fatalf("second ExpireTimeouts settled %d", n)
	}
	rs := readAll(t, b, "web", "c")
	if len(rs) != 1 || rs[0].Kind != broker.KindTimeout || rs[0].RequestID != "m1" || !reflect.DeepEqual(rs[0].Env, *req) {
		t.Fatalf("ReadReplies = %+v; want a timeout notice with the original", rs)
	}
}

func TestExpireTimeoutsMax(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	var last time.Time
	for i := range 5 {
		req := env(fmt.Sprint("m", i), "orders")
		req.Sender = "web"
		req.Timeout = time.Millisecond
		last, _ = sendEnv(ctx, b, req)
	}
	eventually(t, "the deadlines to pass", func() bool {
		now, _ := b.Now(ctx)
		return now.After(last)
	})
	if n, _ := b.ExpireTimeouts(ctx, "web", 3); n != 3 {
		t.Fatalf("ExpireTimeouts(3) = %d", n)
	}
	if n, _ := b.ExpireTimeouts(ctx, "web", 3); n != 2 {
		t.Fatalf("ExpireTimeouts(3) again = %d", n)
	}
}

func TestReplyReclaimAfterLease(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	if err := b.Reply(ctx, &broker.Envelope{ID: "r", Receiver: "web", InReplyTo: "m1"}, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	lease := 30 * time.Millisecond
	first, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "web", Consumer: "A", Max: 10, Block: 0, Lease: lease})
	if err != nil || len(first) != 1 {
		t.Fatalf("ReadReplies = %+v, %v", first, err)
	}
	var second []broker.Reply
	eventually(t, "the reply to be reclaimed", func() bool {
		second, err = b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "web", Consumer: "B", Max: 10, Block: 0, Lease: lease})
		return err != nil || len(second) > 0
	})
	if err != nil || len(second) != 1 || second[0].Ref != first[0].Ref {
		t.Fatalf("reclaimed = %+v, %v", second, err)
	}
}

func TestReadRepliesBlocks(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	got := make(chan []broker.Reply, 1)
	go func() {
		rs, _ := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "web", Consumer: "c", Max: 10, Block: 20 * time.Second, Lease: time.Minute})
		got <- rs
	}()
	if err := b.Reply(ctx, &broker.Envelope{ID: "r", Receiver: "web", InReplyTo: "m1"}, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	if rs := <-got; len(rs) != 1 || rs[0].RequestID != "m1" {
		t.Fatalf("blocked ReadReplies = %+v", rs)
	}
}

func TestMalformedReplyEntries(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	r := b.keys.replies("web")
	for _, fields := range [][]string{
		{"k", "rep", "i", "m1", "m", "garbage"},
		{"k", "to", "i", "m2", "m", ""},
		{"junk", "1"},
	} {
		if err := do(t, raw, append([]string{"XADD", r, "*"}, fields...)...).Error(); err != nil {
			t.Fatal(err)
		}
	}
	rs := readAll(t, b, "web", "c")
	if len(rs) != 2 {
		t.Fatalf("ReadReplies = %+v; want 2", rs)
	}
	if rs[0].Kind != broker.KindReply || rs[0].RequestID != "m1" || rs[0].Env.ErrorCode != ErrorCodeUndecodable || rs[0].Env.InReplyTo != "m1" {
		t.Errorf("undecodable reply = %+v", rs[0])
	}
	if rs[1].Kind != broker.KindTimeout || rs[1].RequestID != "m2" || rs[1].Env.ID != "m2" {
		t.Errorf("undecodable notice = %+v", rs[1])
	}
	dls, err := b.DeadLetters(ctx, "web", 10)
	if err != nil || len(dls) != 1 || string(dls[0].Raw) != `["junk","1"]` {
		t.Fatalf("DeadLetters = %+v, %v; want the junk entry", dls, err)
	}
}

// TestReplyRacesExpire runs many timed requests whose replies race the
// timeout monitor, and checks that each request gets exactly one outcome in
// the reply stream, and that Reply's answer agrees with it.
func TestReplyRacesExpire(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	t.Parallel()
	b := newBroker(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	const n = 3000
	const sender = "web"
	accepted := make([]atomic.Bool, n)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	stop := make(chan struct{})
	var monitors sync.WaitGroup
	for range 4 {
		monitors.Add(1)
		go func() {
			defer monitors.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := b.ExpireTimeouts(ctx, sender, 50); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			id := fmt.Sprint("m", i)
			req := &broker.Envelope{ID: id, Sender: sender, Receiver: "orders", Timeout: time.Duration(1+rand.IntN(8)) * time.Millisecond, Route: broker.RouteSender}
			if _, err := sendEnv(ctx, b, req); err != nil {
				t.Error(err)
				return
			}
			if rand.IntN(2) == 0 {
				// Let the deadline come closer.
				_, _ = b.Now(ctx)
			}
			err := b.Reply(ctx, &broker.Envelope{ID: "r" + id, Receiver: sender, InReplyTo: id}, broker.ReplyTimed)
			switch {
			case err == nil:
				accepted[i].Store(true)
			case !errors.Is(err, broker.ErrLate):
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	// Settle whatever is left.
	eventually(t, "every timeout to be settled", func() bool {
		k, err := b.ExpireTimeouts(ctx, sender, 1000)
		if err != nil {
			t.Fatal(err)
		}
		left, _ := do(t, raw, "ZCARD", b.keys.timeouts(sender)).AsInt64()
		return k == 0 && left == 0
	})
	close(stop)
	monitors.Wait()

	outcomes := map[string][]broker.ReplyKind{}
	for {
		rs, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: sender, Consumer: "c", Max: 1000, Block: 0, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) == 0 {
			break
		}
		for _, r := range rs {
			outcomes[r.RequestID] = append(outcomes[r.RequestID], r.Kind)
		}
	}
	var replies, notices int
	for i := range n {
		id := fmt.Sprint("m", i)
		got := outcomes[id]
		if len(got) != 1 {
			t.Fatalf("request %s has outcomes %v; want exactly one", id, got)
		}
		if (got[0] == broker.KindReply) != accepted[i].Load() {
			t.Fatalf("request %s: outcome %v, but Reply accepted = %v", id, got[0], accepted[i].Load())
		}
		if got[0] == broker.KindReply {
			replies++
		} else {
			notices++
		}
	}
	if len(outcomes) != n {
		t.Fatalf("%d outcomes for %d requests", len(outcomes), n)
	}
	t.Logf("%d replies, %d timeout notices", replies, notices)
	if n, _ := do(t, raw, "EXISTS", b.keys.timedMessages(sender)).AsInt64(); n != 0 {
		t.Fatal("the timed messages hash outlived its entries")
	}
}

// TestInboxKeys looks at the keys: KeepInbox puts an expiry on the
// inbox's reply stream, a timed request from the inbox records no pending
// timeout, the keys vanish when the expiry passes, and CloseInbox deletes
// them.
func TestInboxKeys(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rc := rawClient(t, srv)
	const s = "_inbox.x"
	stateOf := func(s string) {
		t.Helper()
		if err := b.KeepInbox(ctx, s, time.Minute); err != nil {
			t.Fatalf("KeepInbox: %v", err)
		}
		req := env("m-"+s, "orders")
		req.Sender = s
		req.Timeout = time.Hour
		if _, err := sendRequest(ctx, b, req); err != nil {
			t.Fatal(err)
		}
		if err := b.ReplyInbox(ctx, &broker.Envelope{ID: "r", Receiver: s, InReplyTo: "m0"}, time.Time{}); err != nil {
			t.Fatalf("ReplyInbox: %v", err)
		}
	}
	senderKeys := func(s string) []string {
		return []string{b.keys.replies(s), b.keys.timeouts(s), b.keys.timedMessages(s)}
	}

	stateOf(s)
	if ttl, err := do(t, rc, "PTTL", b.keys.replies(s)).AsInt64(); err != nil || ttl <= 0 || ttl > time.Minute.Milliseconds() {
		t.Fatalf("PTTL of the reply stream = %d, %v; want an expiry of at most a minute", ttl, err)
	}
	if n, _ := do(t, rc, "EXISTS", b.keys.timeouts(s), b.keys.timedMessages(s)).AsInt64(); n != 0 {
		t.Fatal("a timed send from an inbox recorded a pending timeout")
	}
	if err := b.CloseInbox(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, k := range senderKeys(s) {
		if n, _ := do(t, rc, "EXISTS", k).AsInt64(); n != 0 {
			t.Fatalf("%s exists after CloseInbox", k)
		}
	}

	const s2 = "_inbox.y"
	stateOf(s2)
	if err := b.KeepInbox(ctx, s2, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the keys of "+s2+" to expire", func() bool {
		n, err := do(t, rc, append([]string{"EXISTS"}, senderKeys(s2)...)...).AsInt64()
		return err == nil && n == 0
	})
	if err := b.ReplyInbox(ctx, &broker.Envelope{ID: "r", Receiver: s2, InReplyTo: "m0"}, time.Time{}); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox after expiry: got %v, want ErrLate", err)
	}
	if _, err := b.GiveUp(ctx, s2, "m0"); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("GiveUp after expiry: got %v, want ErrLate", err)
	}
	if n, _ := do(t, rc, "EXISTS", b.keys.replies(s2)).AsInt64(); n != 0 {
		t.Fatal("a refused reply or marker re-created the reply stream")
	}
}

// TestInboxSend sends timed messages from an inbox, each one XADD with
// the deadline from the client's estimate of Redis time: the deadline is
// Redis time plus the timeout, within the round trips around it; a reply's
// time is the Redis time of its entry id, and decides it; the inbox needs
// no opening through the broker that sends from it.
func TestInboxSend(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	const inbox = "_inbox.send"
	if err := b.KeepInbox(ctx, inbox, time.Minute); err != nil {
		t.Fatal(err)
	}
	before, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	send := func(b *Broker, id string, timeout time.Duration) time.Time {
		t.Helper()
		req := env(id, "inbox-orders")
		req.Sender, req.Timeout = inbox, timeout
		dl, err := sendRequest(ctx, b, req)
		if err != nil {
			t.Fatal(err)
		}
		return dl
	}
	dl := send(b, "m1", time.Hour)
	after, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lo, hi := before.Add(time.Hour).Add(-5*time.Millisecond), after.Add(time.Hour).Add(5*time.Millisecond); dl.Before(lo) || dl.After(hi) {
		t.Fatalf("deadline %v, want within [%v, %v]", dl, lo, hi)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "inbox-orders", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 1 || ds[0].Env.ID != "m1" || !ds[0].Deadline.Equal(dl) {
		t.Fatalf("Fetch = %+v; want m1 with deadline %v", ds, dl)
	}
	reply := &broker.Envelope{ID: "r1", Receiver: inbox, InReplyTo: "m1", Content: []byte("ok")}
	if err := b.ReplyInbox(ctx, reply, dl); err != nil {
		t.Fatalf("ReplyInbox: %v", err)
	}
	// The one second of Redis time since before bounds the reply's time.
	if err := b.ReplyInbox(ctx, reply, before.Add(-time.Second)); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox with a deadline already passed: %v, want ErrLate", err)
	}
	rs := readInbox(t, b, inbox)
	if len(rs) != 2 || rs[0].RequestID != "m1" || rs[0].Kind != broker.KindReply {
		t.Fatalf("ReadReplies = %+v; want the two replies to m1", rs)
	}
	now, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.At.Before(before.Truncate(time.Millisecond)) || r.At.After(now) {
			t.Fatalf("reply at %v, want within [%v, %v]", r.At, before, now)
		}
	}

	other := newBroker(t)
	other.keys = b.keys
	send(other, "m2", time.Hour)
	if ds := fetch1(t, b, broker.FetchParams{Receiver: "inbox-orders", Consumer: "c", Lease: time.Minute, MaxAttempts: 0}); len(ds) != 1 || ds[0].Env.ID != "m2" || ds[0].Deadline.IsZero() {
		t.Fatalf("Fetch = %+v; want m2 with its deadline", ds)
	}
}

// TestInboxReadsInOrderWithoutGroup: an inbox's replies are read once, in
// order, from a cursor, without entering a pending list; AckInbox trims
// what was read and no more; a malformed entry is dead-lettered and the
// reader carries on; CloseInbox forgets the cursor.
func TestInboxReadsInOrderWithoutGroup(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rc := rawClient(t, srv)
	const inbox = "_inbox.read"
	r := b.keys.replies(inbox)
	if err := b.KeepInbox(ctx, inbox, time.Minute); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		req := env(fmt.Sprint("q", i), "inbox-read")
		req.Sender, req.Timeout = inbox, time.Hour
		dl, err := sendRequest(ctx, b, req)
		if err != nil {
			t.Fatal(err)
		}
		rep := &broker.Envelope{ID: fmt.Sprint("a", i), Receiver: inbox, InReplyTo: req.ID, Content: []byte("ok")}
		if err := b.ReplyInbox(ctx, rep, dl); err != nil {
			t.Fatal(err)
		}
	}
	ids := func(rs []broker.Reply) string {
		var out []string
		for _, r := range rs {
			out = append(out, r.RequestID)
		}
		return fmt.Sprint(out)
	}
	first, err := b.ReadInbox(ctx, inbox, 2, 0)
	if err != nil || ids(first) != "[q0 q1]" {
		t.Fatalf("first read = %s, %v; want [q0 q1]", ids(first), err)
	}
	if n, _ := do(t, rc, "XPENDING", r, "g").ToArray(); len(n) == 0 {
		t.Fatal("XPENDING answered nothing")
	} else if c, _ := n[0].AsInt64(); c != 0 {
		t.Fatalf("%d inbox entries pending in the group, want 0: the inbox is read without it", c)
	}
	// The ack of q1 trims q0 and q1, not q2, which was not read yet.
	if err := b.AckInbox(ctx, inbox, first[1].Ref, "junk"); err != nil {
		t.Fatal(err)
	}
	if n, _ := do(t, rc, "XLEN", r).AsInt64(); n != 1 {
		t.Fatalf("XLEN = %d after acking the first two of three, want 1", n)
	}
	do(t, rc, "XADD", r, "*", "x", "y") // malformed: no kind, no request id
	rep := &broker.Envelope{ID: "a9", Receiver: inbox, InReplyTo: "q9"}
	if err := b.Reply(ctx, rep, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	second, err := b.ReadInbox(ctx, inbox, 10, 0)
	if err != nil || ids(second) != "[q2 q9]" {
		t.Fatalf("second read = %s, %v; want [q2 q9] (the malformed entry dead-lettered)", ids(second), err)
	}
	if dl, _ := do(t, rc, "XLEN", b.keys.deadLetters(inbox)).AsInt64(); dl != 1 {
		t.Fatalf("%d dead letters of the inbox, want 1", dl)
	}
	if again, err := b.ReadInbox(ctx, inbox, 10, 0); err != nil || len(again) != 0 {
		t.Fatalf("third read = %s, %v; want nothing: entries are read once", ids(again), err)
	}
	if err := b.AckInbox(ctx, inbox, second[1].Ref, second[0].Ref); err != nil {
		t.Fatal(err)
	}
	if n, _ := do(t, rc, "XLEN", r).AsInt64(); n != 0 {
		t.Fatalf("XLEN = %d after every entry was acked, want 0", n)
	}
	if err := b.CloseInbox(ctx, inbox); err != nil {
		t.Fatal(err)
	}
	if _, ok := b.cursors.Load(inbox); ok {
		t.Fatal("CloseInbox kept the inbox's cursor")
	}
}
