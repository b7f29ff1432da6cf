package redisbroker

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

func TestSendTimedSetsDeadline(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	before, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := env("m1", "orders")
	e.Timeout = time.Hour
	deadline, err := sendEnv(ctx, b, e)
	if err != nil {
		t.Fatal(err)
	}
	after, _ := b.Now(ctx)
	if deadline.Before(before.Add(time.Hour).Truncate(time.Millisecond)) || deadline.After(after.Add(time.Hour)) {
		t.Fatalf("deadline %v not within [%v, %v] + 1h", deadline, before, after)
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "orders", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 1 || !ds[0].Deadline.Equal(deadline) || ds[0].Env.Timeout != time.Hour {
		t.Fatalf("delivery %+v, want deadline %v", ds, deadline)
	}
}

func TestSendValidation(t *testing.T) {
	t.Parallel()
	b := newBrokerOn(t, srv, Config{MaxMessageSize: 10})
	ctx := ctxT(t)
	tests := map[string]struct {
		env  *broker.Envelope
		want string
	}{
		"no receiver": {&broker.Envelope{ID: "x"}, "Env.Receiver"},
		"no id":       {&broker.Envelope{Receiver: "r"}, "Env.ID"},
		"too big":     {&broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 11)}, "MaxMessageSize"},
		"negative":    {&broker.Envelope{ID: "x", Receiver: "r", Timeout: -1, Route: broker.RouteSender, Sender: "s"}, "Env.Timeout"},
		"no sender":   {&broker.Envelope{ID: "x", Receiver: "r", Timeout: time.Second, Route: broker.RouteSender}, "Env.Sender"},
		"no route":    {&broker.Envelope{ID: "x", Receiver: "r", Timeout: time.Second}, "without a reply route"},
	}
	for name, tc := range tests {
		if _, err := sendEnv(ctx, b, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "broker: ") {
			t.Errorf("%s: Send = %v; want an error about %s", name, err, tc.want)
		}
	}
	if _, err := sendEnv(ctx, b, &broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 10)}); err != nil {
		t.Fatalf("Send at the size limit: %v", err)
	}
}

// TestSendBatchPartialFailure makes one receiver's queue key a string, so
// that Redis refuses its XADD (WRONGTYPE) and its enqueue script: Send
// reports those two messages' errors in their results and sends the
// others, in order, in one pipeline per run.
func TestSendBatchPartialFailure(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rc := rawClient(t, srv)
	if err := do(t, rc, "SET", b.keys.queue("broken"), "not a stream").Error(); err != nil {
		t.Fatal(err)
	}
	timed := env("m4", "broken")
	timed.Timeout = time.Minute
	envs := []*broker.Envelope{env("m1", "fine"), env("m2", "broken"), env("m3", "fine"), timed}
	ps := make([]broker.SendParams, len(envs))
	for i, e := range envs {
		ps[i].Env = *e
	}
	if err := b.Send(ctx, ps); err != nil {
		t.Fatalf("Send: %v", err)
	}
	for i, p := range ps {
		res := p.Result
		failed := i == 1 || i == 3
		switch {
		case failed && (res.Outcome != broker.SendFailed || !strings.Contains(fmt.Sprint(res.Err), "WRONGTYPE") || !res.Deadline.IsZero()):
			t.Fatalf("message %d: %+v; want failed with WRONGTYPE and no deadline", i, res)
		case !failed && (res.Outcome != broker.Queued || res.Err != nil):
			t.Fatalf("message %d: %+v; want it queued", i, res)
		}
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "fine", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 2 || ds[0].Env.ID != "m1" || ds[1].Env.ID != "m3" {
		t.Fatalf("Fetch fine = %+v; want m1 then m3", ds)
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "r4", Receiver: timed.Sender, InReplyTo: timed.ID}, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("Reply to the failed timed message = %v; want ErrLate, nothing pending (the script wrote nothing)", err)
	}
}

// TestSendFromInboxUnknownOutcome: a send from an inbox whose answer was
// lost (the connection broke after the write) returns, with its error, the
// deadline the message carries, and the message is queued; a send that
// could not connect returns no deadline.
func TestSendFromInboxUnknownOutcome(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	proxy := redistest.StartCutProxy(t, s.Addr())
	prefix := redistest.Prefix(t)
	open := func(url string) *Broker {
		// One pipelined connection, which the first send opens.
		b, err := New(Config{URL: url, KeyPrefix: prefix, MaxConnectionPoolSize: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		return b
	}
	viaProxy, direct := open(proxy.URL()), open(s.URL())
	ctx := ctxT(t)
	req := env("m1", "orders")
	req.Sender, req.Timeout = "_inbox.x", time.Minute
	// A first send sets the clock a send from an inbox uses, and the
	// connection it goes on.
	if _, err := sendRequest(ctx, viaProxy, req); err != nil {
		t.Fatal(err)
	}
	req.ID = "m2"
	proxy.SetCut(true)
	dl, err := sendRequest(ctx, viaProxy, req)
	if !errors.Is(err, broker.ErrUnavailable) || dl.IsZero() {
		t.Fatalf("send with its answer lost = %v, %v; want ErrUnavailable with the deadline", dl, err)
	}
	if n, _ := do(t, rawClient(t, s), "XLEN", direct.keys.queue("orders")).AsInt64(); n != 2 {
		t.Fatalf("%d messages queued, want 2: the first and the one whose answer was lost", n)
	}
	s.Kill()
	req.ID = "m3"
	dl, err = sendRequest(ctx, direct, req)
	if !errors.Is(err, broker.ErrUnavailable) || !dl.IsZero() {
		t.Fatalf("send to a server that is down = %v, %v; want ErrUnavailable and no deadline", dl, err)
	}
}
