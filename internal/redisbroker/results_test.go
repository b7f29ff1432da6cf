package redisbroker

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestResultsCap: over Config.MaxResultBytes, a receiver's records closest
// to the end of their retention go first, and the sizes it counts stay
// under the cap; once every record's retention passed, nothing of them is
// left in Redis.
func TestResultsCap(t *testing.T) {
	t.Parallel()
	const limit = 4000
	prefix := "rescap" + strconv.FormatInt(time.Now().UnixNano(), 36)
	b := newBrokerOn(t, srv, Config{MaxResultBytes: limit, KeyPrefix: prefix})
	c := rawClient(t, srv)
	ctx := ctxT(t)
	const n = 20
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("m%02d", i)
		e := env(ids[i], "r")
		// Retentions that grow: the first messages end first.
		ret := 2*time.Second + time.Duration(i)*50*time.Millisecond
		if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: *e, Retention: ret}); err != nil {
			t.Fatal(err)
		}
		d := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "A", Max: 1, Lease: time.Minute})[0]
		rep := &broker.Envelope{ID: "rep" + ids[i], Sender: "r", Receiver: "s", InReplyTo: ids[i], Content: bytes.Repeat([]byte("x"), 500)}
		if err := b.FinishResult(ctx, &broker.FinishResultParams{Receiver: "r", ID: ids[i], Ref: d.Ref, State: broker.ResultDone,
			Worker: "A", Attempt: 1, Reply: rep, Retention: ret}); err != nil {
			t.Fatal(err)
		}
	}
	total, err := do(t, c, "HGET", b.keys.resultSizes("r"), "#").AsInt64()
	if err != nil || total > limit || total < limit/2 {
		t.Fatalf("counted bytes %d (%v), want at most %d and most of it used", total, err, limit)
	}
	kept := 0
	for i, id := range ids {
		_, err := b.Result(ctx, "r", id)
		switch {
		case err == nil:
			kept++
		case !errors.Is(err, broker.ErrNoResult):
			t.Fatal(err)
		case kept > 0:
			t.Fatalf("record %d evicted after a later one was kept: the first to end go first", i)
		}
	}
	if kept == 0 || kept == n {
		t.Fatalf("%d of %d records kept, want some evicted, some kept", kept, n)
	}
	if err := b.SetProgress(ctx, "r", ids[n-1], make([]byte, broker.MaxProgressSize+1)); err == nil {
		t.Fatal("SetProgress over MaxProgressSize: no error")
	}
	eventually(t, "every record, its index and sizes to go", func() bool {
		for _, k := range keysOf(t, c, prefix) {
			if strings.Contains(k, ":res") {
				return false
			}
		}
		return true
	})
}

// TestResultsPlainSendUnchanged: a send without a retention is still the
// one XADD, and writes no record.
func TestResultsPlainSendUnchanged(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	p := broker.SendParams{Env: *env("m", "r")}
	if w := b.wayOf(&p); w != sendXadd {
		t.Fatalf("a plain send goes way %d, want the plain XADD", w)
	}
	p.Retention = time.Minute
	if w := b.wayOf(&p); w != sendEnqueue {
		t.Fatalf("a send with a retention goes way %d, want the enqueue script", w)
	}
}

// TestKeyedFinishIsOneStep: FinishResult of a keyed message's delivery
// settles it for its key (its key's next message goes) and writes its
// final record in one script, so that no crash can leave the key released
// and the record (a batch child's report, a chain's next step) unwritten.
func TestKeyedFinishIsOneStep(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	raw := rawClient(t, s)
	ctx := ctxT(t)
	for _, id := range []string{"m1", "m2", "m3"} {
		p := broker.SendParams{Env: *env(id, "r"), GroupKey: "k", Retention: time.Hour}
		if _, err := broker.SendOne(ctx, b, p); err != nil {
			t.Fatal(err)
		}
	}
	// take fetches r's one delivery, which must be id's.
	take := func(id string) broker.Delivery {
		t.Helper()
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 10, Lease: time.Minute, MaxAttempts: 5})
		if err != nil || len(ds) != 1 || ds[0].Env.ID != id {
			t.Fatalf("Fetch = %+v, %v; want %s alone", ds, err, id)
		}
		return ds[0]
	}
	finishDone := func(d broker.Delivery) {
		t.Helper()
		if err := b.FinishResult(ctx, &broker.FinishResultParams{Receiver: "r", ID: d.Env.ID, Ref: d.Ref, State: broker.ResultDone,
			Worker: "w", Attempt: 1, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	finishDone(take("m1")) // loads the script
	d := take("m2")
	scripts := func() int { return commandCalls(t, raw, "evalsha") + commandCalls(t, raw, "eval") }
	before := scripts()
	finishDone(d)
	if n := scripts() - before; n != 1 {
		t.Fatalf("FinishResult of a keyed delivery ran %d scripts, want 1", n)
	}
	if rec, err := b.Result(ctx, "r", "m2"); err != nil || rec.State != broker.ResultDone {
		t.Fatalf("m2's record: %+v, %v", rec, err)
	}
	take("m3")
}

// TestInboxReplyCommands counts the Redis commands of a Request's round
// trip as a worker makes it (send, fetch, the start of its record with a
// retention, the reply to its inbox, the acknowledgement, the
// requester's read and trim), without a retention and with one, between
// a broker and a private server: the commands the broker sends (a proxy
// counts them) and those Redis runs (INFO commandstats, with what scripts
// run). The reply without a retention is still the one XADD; with one it
// is one script. The final reply of a streamed request is one script with
// a retention or without (inbox_stream, or stream_reply).
func TestInboxReplyCommands(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	proxy := redistest.StartCountProxy(t, s.Addr())
	b, err := New(Config{URL: proxy.URL(), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	rc := rawClient(t, s)
	ctx := t.Context()
	served := func() int64 {
		info, err := rc.Do(ctx, rc.B().Info().Section("commandstats").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
				continue
			}
			calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
			c, _ := strconv.ParseInt(calls, 10, 64)
			n += c
		}
		return n
	}
	const ib, r = "inbox-cmds", "recv-cmds"
	if err := b.KeepInbox(ctx, ib, time.Minute); err != nil {
		t.Fatal(err)
	}
	type count struct{ sent, ran, replySent, replyRan int64 }
	n := 0
	roundTrip := func(ret time.Duration, stream bool) count {
		t.Helper()
		var c count
		n++
		sent0, ran0 := proxy.Commands(), served()
		e := env("ping-"+strconv.Itoa(n), r)
		e.Sender, e.Timeout, e.Route, e.Stream = ib, time.Minute, broker.RouteInbox, stream
		ps := []broker.SendParams{{Env: *e, Retention: ret}}
		if err := b.Send(ctx, ps); err != nil || ps[0].Result.Err != nil {
			t.Fatalf("Send: %v, %v", err, ps[0].Result.Err)
		}
		res := ps[0].Result
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "w", Max: 1, Lease: time.Minute, MaxAttempts: 10})
		if err != nil || len(ds) != 1 {
			t.Fatalf("Fetch: %+v, %v", ds, err)
		}
		if ret > 0 {
			if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: e.ID, Worker: "w", Attempt: 1}); err != nil {
				t.Fatal(err)
			}
		}
		rep := &broker.Envelope{ID: e.ID + "-r", Sender: r, Receiver: ib, InReplyTo: e.ID, Content: []byte("pong"), Retention: ret}
		reply := b.ReplyInbox
		if stream {
			reply = b.ReplyStream
		}
		s1, r1 := proxy.Commands(), served()
		if err := reply(ctx, rep, res.Deadline); err != nil {
			t.Fatal(err)
		}
		c.replySent, c.replyRan = proxy.Commands()-s1, served()-r1
		if ret > 0 {
			err = b.FinishResult(ctx, &broker.FinishResultParams{Receiver: r, ID: e.ID, Ref: ds[0].Ref, State: broker.ResultDone, Worker: "w", Attempt: 1, Reply: rep, Retention: ret})
		} else {
			err = b.Ack(ctx, r, ds[0].Ref)
		}
		if err != nil {
			t.Fatal(err)
		}
		rs, err := b.ReadInbox(ctx, ib, 10, 0)
		if err != nil || len(rs) != 1 {
			t.Fatalf("ReadInbox: %+v, %v", rs, err)
		}
		if err := b.AckInbox(ctx, ib, rs[0].Ref); err != nil {
			t.Fatal(err)
		}
		c.sent, c.ran = proxy.Commands()-sent0, served()-ran0
		return c
	}
	// The first round trips load the scripts.
	roundTrip(0, false)
	roundTrip(time.Hour, false)
	plain, kept := roundTrip(0, false), roundTrip(time.Hour, false)
	t.Logf("a Request's round trip: without a retention %d commands sent, %d run by Redis (its reply %d sent, %d run); with one %d sent, %d run (its reply %d sent, %d run)",
		plain.sent, plain.ran, plain.replySent, plain.replyRan, kept.sent, kept.ran, kept.replySent, kept.replyRan)
	if plain.replySent != 1 || plain.replyRan != 1 {
		t.Fatalf("a reply without a retention: %d commands sent, %d run; want the one XADD", plain.replySent, plain.replyRan)
	}
	if kept.replySent != 1 {
		t.Fatalf("a reply with a retention: %d commands sent; want one script", kept.replySent)
	}
	roundTrip(0, true)
	roundTrip(time.Hour, true)
	plain, kept = roundTrip(0, true), roundTrip(time.Hour, true)
	t.Logf("a streamed request's final reply: without a retention %d sent, %d run; with one %d sent, %d run",
		plain.replySent, plain.replyRan, kept.replySent, kept.replyRan)
	if plain.replySent != 1 || kept.replySent != 1 {
		t.Fatalf("a streamed request's final reply: %d commands sent without a retention, %d with one; want one script each", plain.replySent, kept.replySent)
	}
	if plain.replyRan != 6 {
		t.Fatalf("a streamed request's final reply without a retention: %d commands run; want inbox_stream's six (EVALSHA, PTTL, HMGET, XADD, HSET, PEXPIRE)", plain.replyRan)
	}
}
