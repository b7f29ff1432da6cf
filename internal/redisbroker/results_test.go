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
