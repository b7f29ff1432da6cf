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
