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
	deadline, err := b.Send(ctx, e)
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
		"nil":         {nil, "envelope is nil"},
		"no receiver": {&broker.Envelope{ID: "x"}, "Envelope.Receiver"},
		"no id":       {&broker.Envelope{Receiver: "r"}, "Envelope.ID"},
		"too big":     {&broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 11)}, "MaxMessageSize"},
		"negative":    {&broker.Envelope{ID: "x", Receiver: "r", Timeout: -1}, "Envelope.Timeout"},
		"no sender":   {&broker.Envelope{ID: "x", Receiver: "r", Timeout: time.Second}, "Envelope.Sender"},
	}
	for name, tc := range tests {
		if _, err := b.Send(ctx, tc.env); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "redisbroker: ") {
			t.Errorf("%s: Send = %v; want an error about %s", name, err, tc.want)
		}
	}
	if _, err := b.Send(ctx, &broker.Envelope{ID: "x", Receiver: "r", Content: make([]byte, 10)}); err != nil {
		t.Fatalf("Send at the size limit: %v", err)
	}
}

// TestSendBatchPartialFailure makes one receiver's queue key a string, so
// that Redis refuses its XADD (WRONGTYPE) and its send_timed: the batch
// reports those two messages in a *BatchError and sends the others, in
// order, in one pipeline per run.
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
	deadlines, err := b.SendBatch(ctx, envs)
	var be *broker.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 4 || be.Errs[0] != nil || be.Errs[2] != nil ||
		!strings.Contains(fmt.Sprint(be.Errs[1]), "WRONGTYPE") || !strings.Contains(fmt.Sprint(be.Errs[3]), "WRONGTYPE") {
		t.Fatalf("SendBatch = %v; want a *BatchError with WRONGTYPE for messages 1 and 3 only", err)
	}
	if len(deadlines) != 4 || !deadlines[3].IsZero() {
		t.Fatalf("deadlines = %v; want 4, the failed timed one zero", deadlines)
	}
	if !strings.Contains(err.Error(), "2 of 4 messages not sent; message 1") {
		t.Fatalf("error text %q does not say what failed", err)
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
	if _, err := viaProxy.SendRequest(ctx, req); err != nil {
		t.Fatal(err)
	}
	req.ID = "m2"
	proxy.SetCut(true)
	dl, err := viaProxy.SendRequest(ctx, req)
	if !errors.Is(err, broker.ErrUnavailable) || dl.IsZero() {
		t.Fatalf("send with its answer lost = %v, %v; want ErrUnavailable with the deadline", dl, err)
	}
	if n, _ := do(t, rawClient(t, s), "XLEN", direct.keys.queue("orders")).AsInt64(); n != 2 {
		t.Fatalf("%d messages queued, want 2: the first and the one whose answer was lost", n)
	}
	s.Kill()
	req.ID = "m3"
	dl, err = direct.SendRequest(ctx, req)
	if !errors.Is(err, broker.ErrUnavailable) || !dl.IsZero() {
		t.Fatalf("send to a server that is down = %v, %v; want ErrUnavailable and no deadline", dl, err)
	}
}
