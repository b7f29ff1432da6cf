package disker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/membroker"
	"github.com/diskerhq/disker/internal/redisbroker"
)

// batches records the batches a batch handler got, by the contents of
// their messages, and hands each to the test on a channel.
type batches struct {
	mu  sync.Mutex
	all [][]string
	ch  chan []string
}

func newBatches() *batches { return &batches{ch: make(chan []string, 100)} }

func (b *batches) record(msgs []*disker.Message) []string {
	var got []string
	for _, m := range msgs {
		got = append(got, string(m.Content))
	}
	b.mu.Lock()
	b.all = append(b.all, got)
	b.mu.Unlock()
	b.ch <- got
	return got
}

// sizes returns the sizes of the batches so far.
func (b *batches) sizes() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var s []int
	for _, x := range b.all {
		s = append(s, len(x))
	}
	return s
}

// once waits for batches that hold n messages in all, and fails the test
// if a message came twice.
func (b *batches) once(t *testing.T, n int, within time.Duration) {
	t.Helper()
	seen := map[string]int{}
	for len(seen) < n {
		for _, c := range recv(t, b.ch, within, "a batch") {
			if seen[c]++; seen[c] > 1 {
				t.Fatalf("%s handled twice", c)
			}
		}
	}
}

// acks is a batch handler's outcomes that acknowledge every message.
func acks(msgs []*disker.Message) []disker.Outcome { return make([]disker.Outcome, len(msgs)) }

// sendN sends n fire-and-forget messages to receiver in one SendBatch,
// their contents prefix0, prefix1, ...
func sendN(t *testing.T, d *disker.Disker, receiver, prefix string, n int) []string {
	t.Helper()
	msgs := make([]disker.Message, n)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: receiver, Content: fmt.Append(nil, prefix, i)}
	}
	ids, err := d.SendBatch(ctxTimeout(t, 10*time.Second), msgs)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// waitInFlight waits until d holds n messages of receiver.
func waitInFlight(t *testing.T, d *disker.Disker, receiver string, n int64) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d messages of %s in flight", n, receiver), func() bool {
		return d.LocalStats().Receivers[receiver].InFlight == n
	})
}

// TestHandleBatchOutcomes serves one batch with an outcome of each kind
// and shows each message settled by its own: an ack, a reply, an error
// reply, a retry (handled at its second attempt), a dead letter (NoRetry)
// and a reply sent later with Reply.
func TestHandleBatchOutcomes(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		type result struct {
			content string
			reply   *disker.Message
			err     error
		}
		results := make(chan result, 4)
		for _, c := range []string{"reply", "error", "dead", "later"} {
			go func() {
				r, err := d.Request(ctx, disker.Message{Receiver: "mixed", Content: []byte(c)})
				results <- result{c, r, err}
			}()
		}
		for _, c := range []string{"ack", "retry"} {
			if _, err := d.Send(ctx, disker.Message{Receiver: "mixed", Content: []byte(c)}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*time.Second, "six messages queued", func() bool {
			s, err := d.Stats(ctx, "mixed")
			return err == nil && s.Queued == 6
		})
		var mu sync.Mutex
		attempts := map[string][]int{}
		err := d.HandleBatch("mixed", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			outs := make([]disker.Outcome, len(msgs))
			mu.Lock()
			defer mu.Unlock()
			for i, m := range msgs {
				c := string(m.Content)
				attempts[c] = append(attempts[c], m.Attempt)
				switch {
				case c == "reply":
					outs[i].Reply = []byte("re:" + c)
				case c == "error":
					outs[i].ReplyError = &disker.RemoteError{Code: "invalid", Text: "bad input"}
				case c == "retry" && m.Attempt == 1:
					outs[i].Err = errors.New("not yet")
				case c == "dead":
					outs[i].Err = disker.NoRetry(errors.New("hopeless"))
				case c == "later":
					outs[i].Err = disker.ErrReplyLater
					go func() {
						if err := d.Reply(context.Background(), m, []byte("later reply")); err != nil { // not the batch's ctx, which ends when it returns
							t.Error(err)
						}
					}()
				}
			}
			return outs, nil
		}), disker.WithBackoff(func(int) time.Duration { return 0 }))
		if err != nil {
			t.Fatal(err)
		}
		for range 4 {
			r := recv(t, results, 20*time.Second, "a Request's outcome")
			var re *disker.RemoteError
			switch r.content {
			case "reply", "later":
				want := map[string]string{"reply": "re:reply", "later": "later reply"}[r.content]
				if r.err != nil || string(r.reply.Content) != want {
					t.Errorf("Request(%s) = %v, %v; want %q", r.content, r.reply, r.err, want)
				}
			case "error":
				if !errors.As(r.err, &re) || re.Code != "invalid" || re.Text != "bad input" {
					t.Errorf("Request(error) = %v, %v; want the RemoteError invalid: bad input", r.reply, r.err)
				}
			case "dead":
				if !errors.As(r.err, &re) || re.Code != disker.CodeDeadLetter || !strings.Contains(re.Text, "hopeless") {
					t.Errorf("Request(dead) = %v, %v; want a dead-letter RemoteError", r.reply, r.err)
				}
			}
		}
		waitFor(t, 10*time.Second, "every message settled", func() bool {
			s := d.LocalStats().Receivers["mixed"]
			return s.Processed == 5 && s.DeadLettered == 1 && s.InFlight == 0
		})
		if s := d.LocalStats().Receivers["mixed"]; s.Retried != 1 || s.Failed != 2 {
			t.Errorf("LocalStats = %+v; want 1 retried, 2 failed", s)
		}
		mu.Lock()
		defer mu.Unlock()
		want := map[string][]int{"ack": {1}, "reply": {1}, "error": {1}, "retry": {1, 2}, "dead": {1}, "later": {1}}
		for c, w := range want {
			if !slices.Equal(attempts[c], w) {
				t.Errorf("%s was handled at attempts %v, want %v", c, attempts[c], w)
			}
		}
		dls, err := d.DeadLetters(ctx, "mixed", 10)
		if err != nil || len(dls) != 1 || string(dls[0].Message.Content) != "dead" || !strings.Contains(dls[0].Reason, "hopeless") {
			t.Fatalf("DeadLetters = %+v, %v; want the message dead", dls, err)
		}
	})
}

// TestHandleBatchGathers shows when a batch starts: full at once, even
// with a long wait; with no wait, at once when a slot is free, and
// otherwise with what came while every slot was busy; and what was
// gathered when the receiver is unhandled is handled then.
func TestHandleBatchGathers(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)

		full := newBatches()
		if err := d.HandleBatch("full", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			full.record(msgs)
			return acks(msgs), nil
		}), disker.WithBatchSize(5), disker.WithBatchWait(time.Hour)); err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			if _, err := d.Send(ctx, disker.Message{Receiver: "full", Content: fmt.Append(nil, "f", i)}); err != nil {
				t.Fatal(err)
			}
		}
		if got := recv(t, full.ch, 10*time.Second, "the full batch"); len(got) != 5 {
			t.Fatalf("batch %v, want the 5 messages", got)
		}
		sendN(t, d, "full", "g", 2)
		waitInFlight(t, d, "full", 2) // gathered, waiting for the hour
		if s := d.LocalStats().Receivers["full"]; s.BatchSize != 5 || s.Concurrency != 1 {
			t.Fatalf("LocalStats = %+v, want BatchSize 5 and Concurrency 1", s)
		}
		if err := d.Unhandle(ctx, "full"); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, full.ch, 10*time.Second, "the gathered batch"); !slices.Equal(got, []string{"g0", "g1"}) {
			t.Fatalf("batch on Unhandle %v, want [g0 g1]", got)
		}

		busy := newBatches()
		release := make(chan struct{})
		if err := d.HandleBatch("busy", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			if busy.record(msgs)[0] == "first" {
				<-release
			}
			return acks(msgs), nil
		})); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "busy", Content: []byte("first")}); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, busy.ch, 10*time.Second, "the first batch"); len(got) != 1 {
			t.Fatalf("first batch %v, want one message at once", got)
		}
		for i := range 30 { // one at a time: each may come in a fetch of its own
			if _, err := d.Send(ctx, disker.Message{Receiver: "busy", Content: fmt.Append(nil, "b", i)}); err != nil {
				t.Fatal(err)
			}
		}
		waitInFlight(t, d, "busy", 31)
		close(release)
		if got := recv(t, busy.ch, 10*time.Second, "the second batch"); len(got) != 30 {
			t.Fatalf("second batch has %d messages, want the 30 gathered while the slot was busy", len(got))
		}
	})
}

// TestHandleBatchBacklog serves a backlog of 250 messages in batches of at
// most 100 with two batches at a time and a prefetch: each message is
// handled once, and the first batch is full.
func TestHandleBatchBacklog(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		sendN(t, d, "backlog", "m", 250)
		b := newBatches()
		if err := d.HandleBatch("backlog", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			b.record(msgs)
			return acks(msgs), nil
		}), disker.WithConcurrency(2), disker.WithPrefetch(100)); err != nil {
			t.Fatal(err)
		}
		b.once(t, 250, 20*time.Second)
		sizes := b.sizes()
		if sizes[0] != 100 || slices.Max(sizes) > 100 {
			t.Fatalf("batch sizes %v, want the first full and none over 100", sizes)
		}
	})
}

// TestHandleBatchFailsWhole shows the failures of a whole batch: a panic
// and the handler's error retry every message (the panic as a
// *PanicError), and outcomes of the wrong number or that cannot be sent
// fail their messages with an error that says why (here dead-lettered,
// with one attempt).
func TestHandleBatchFailsWhole(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		var panics atomic.Int64
		d := e.open(func(c *disker.Config) {
			c.OnEvent = func(ev disker.Event) {
				var p *disker.PanicError
				if ev.Kind == disker.EventRetried && errors.As(ev.Err, &p) && p.Value == "boom" {
					panics.Add(1)
				}
			}
		})
		ctx := ctxTimeout(t, 30*time.Second)
		sendN(t, d, "panics", "p", 3)
		sendN(t, d, "errs", "e", 3)
		attempts := make(chan int, 12)
		noBackoff := disker.WithBackoff(func(int) time.Duration { return 0 })
		if err := d.HandleBatch("panics", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			for _, m := range msgs {
				attempts <- m.Attempt
			}
			if msgs[0].Attempt == 1 {
				panic("boom")
			}
			return acks(msgs), nil
		}), noBackoff); err != nil {
			t.Fatal(err)
		}
		if err := d.HandleBatch("errs", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			if msgs[0].Attempt == 1 {
				return nil, errors.New("the database is down")
			}
			return acks(msgs), nil
		}), noBackoff); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "both receivers' messages handled at their second attempt", func() bool {
			p, e := d.LocalStats().Receivers["panics"], d.LocalStats().Receivers["errs"]
			return p.Processed == 3 && p.Retried == 3 && e.Processed == 3 && e.Retried == 3
		})
		if n := panics.Load(); n != 3 {
			t.Fatalf("%d retries carried the *PanicError, want 3", n)
		}
		close(attempts)
		var got []int
		for a := range attempts {
			got = append(got, a)
		}
		if slices.Sort(got); !slices.Equal(got, []int{1, 1, 1, 2, 2, 2}) {
			t.Fatalf("attempts %v, want each of 3 messages at attempts 1 and 2", got)
		}

		for _, c := range []struct {
			receiver string
			outs     func(n int) []disker.Outcome
			reason   string
		}{
			{"short", func(n int) []disker.Outcome { return make([]disker.Outcome, n-1) }, "returned 2 outcomes for 3 messages"},
			{"nocode", func(n int) []disker.Outcome {
				return slices.Repeat([]disker.Outcome{{ReplyError: &disker.RemoteError{Text: "no code"}}}, n)
			}, "Outcome.ReplyError.Code: must not be empty"},
			{"both", func(n int) []disker.Outcome {
				return slices.Repeat([]disker.Outcome{{Reply: []byte("r"), ReplyError: &disker.RemoteError{Code: "c"}}}, n)
			}, "Reply and ReplyError are both set"},
		} {
			sendN(t, d, c.receiver, "x", 3)
			if err := d.HandleBatch(c.receiver, disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
				return c.outs(len(msgs)), nil
			}), disker.WithMaxAttempts(1)); err != nil {
				t.Fatal(err)
			}
			var dls []disker.DeadLetter
			waitFor(t, 10*time.Second, "three dead letters of "+c.receiver, func() bool {
				var err error
				dls, err = d.DeadLetters(ctx, c.receiver, 10)
				return err == nil && len(dls) == 3
			})
			for _, dl := range dls {
				if !strings.Contains(dl.Reason, c.reason) {
					t.Errorf("%s: dead letter reason %q, want it to say %q", c.receiver, dl.Reason, c.reason)
				}
			}
		}
	})
}

// TestHandleBatchDeadlines shows that a message whose deadline or expiry
// passed while it waited for a slot is dropped before its batch starts
// (its sender hears of it as without batches), and that the handler's ctx
// ends at the last deadline of its batch when every message has one, and
// not otherwise.
func TestHandleBatchDeadlines(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		b := newBatches()
		release := map[string]chan struct{}{"block": make(chan struct{}), "block2": make(chan struct{})}
		type seen struct {
			deadline, last time.Time
			ok             bool
		}
		deadlines := make(chan seen, 10)
		if err := d.HandleBatch("timed", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			if r, ok := release[b.record(msgs)[0]]; ok {
				<-r
			}
			var s seen
			s.deadline, s.ok = ctx.Deadline()
			for _, m := range msgs {
				if m.Deadline.After(s.last) {
					s.last = m.Deadline
				}
			}
			deadlines <- s
			return acks(msgs), nil
		})); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "timed", Content: []byte("block")}); err != nil {
			t.Fatal(err)
		}
		recv(t, b.ch, 10*time.Second, "the blocking batch")
		rctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := d.Request(rctx, disker.Message{Receiver: "timed", Content: []byte("timed out")})
		cancel()
		if !errors.Is(err, disker.ErrTimeout) {
			t.Fatalf("Request = %v, want ErrTimeout", err)
		}
		expiry := time.Now().Add(100 * time.Millisecond)
		if _, err := d.Send(ctx, disker.Message{Receiver: "timed", Content: []byte("expired")}, disker.WithExpireAt(expiry)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "timed", Content: []byte("kept")}); err != nil {
			t.Fatal(err)
		}
		// Fetched, each late one dropped then or when its batch starts.
		waitFor(t, 10*time.Second, "the messages fetched", func() bool {
			s := d.LocalStats().Receivers["timed"]
			return s.InFlight+s.Expired == 4
		})
		time.Sleep(time.Until(expiry) + 50*time.Millisecond) // the expiry passes
		close(release["block"])
		if s := recv(t, deadlines, 10*time.Second, "the first batch's end"); s.ok {
			t.Fatalf("a batch without deadlines has a ctx deadline %v", s.deadline)
		}
		if got := recv(t, b.ch, 10*time.Second, "the second batch"); !slices.Equal(got, []string{"kept"}) {
			t.Fatalf("second batch %v, want [kept]: the late ones dropped", got)
		}
		recv(t, deadlines, 10*time.Second, "the second batch's end")
		if s := d.LocalStats().Receivers["timed"]; s.Expired != 2 {
			t.Fatalf("LocalStats = %+v, want 2 expired", s)
		}

		// Every message with a deadline: ctx ends at the last.
		for _, c := range []string{"block2", "t1", "t2"} {
			timeout := map[string]time.Duration{"block2": time.Minute, "t1": 20 * time.Second, "t2": 30 * time.Second}[c]
			if _, err := d.Send(ctx, disker.Message{Sender: "timer", Receiver: "timed", Content: []byte(c)}, disker.WithTimeout(timeout)); err != nil {
				t.Fatal(err)
			}
			if c == "block2" {
				recv(t, b.ch, 10*time.Second, "the blocking batch")
			}
		}
		waitInFlight(t, d, "timed", 3)
		close(release["block2"])
		recv(t, deadlines, 10*time.Second, "the blocking batch's end")
		if got := recv(t, b.ch, 10*time.Second, "the timed batch"); len(got) != 2 {
			t.Fatalf("timed batch %v, want t1 and t2", got)
		}
		if s := recv(t, deadlines, 10*time.Second, "the timed batch's end"); !s.ok || !s.deadline.Equal(s.last) {
			t.Fatalf("ctx deadline %v (%v), want the last message deadline %v", s.deadline, s.ok, s.last)
		}
	})
}

// TestHandleBatchCancel cancels one message of a running batch: its sender
// is told at once, the batch's ctx goes on for the others, and the outcome
// returned for the cancelled one is dropped. Cancelling every message of a
// batch ends its ctx with ErrCancelled.
func TestHandleBatchCancel(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d, w := e.open(), e.open() // the worker is another instance than the one that cancels
		ctx := ctxTimeout(t, 30*time.Second)
		outcomes := make(chan *disker.Message, 10)
		if err := d.OnReply("canceller", disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) { outcomes <- m })); err != nil {
			t.Fatal(err)
		}
		type call struct {
			ctx  context.Context
			msgs []*disker.Message
			done chan struct{}
		}
		calls := make(chan call, 2)
		if err := w.HandleBatch("work", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			c := call{ctx, msgs, make(chan struct{})}
			calls <- c
			select {
			case <-c.done:
			case <-ctx.Done():
			}
			outs := make([]disker.Outcome, len(msgs))
			for i, m := range msgs {
				outs[i].Reply = append([]byte("done:"), m.Content...)
			}
			return outs, nil
		}), disker.WithBatchWait(time.Hour), disker.WithBatchSize(3)); err != nil {
			t.Fatal(err)
		}
		for _, round := range []string{"one", "all"} {
			var msgs []disker.Message
			for i := range 3 {
				msgs = append(msgs, disker.Message{Sender: "canceller", Receiver: "work", Content: fmt.Append(nil, round, i)})
			}
			ids, err := d.SendBatch(ctx, msgs)
			if err != nil {
				t.Fatal(err)
			}
			c := recv(t, calls, 10*time.Second, "the batch")
			cancelled := ids[:1]
			if round == "all" {
				cancelled = ids
			}
			for _, id := range cancelled {
				if got, err := d.Cancel(ctx, "work", id); err != nil || got != disker.CancelInFlight {
					t.Fatalf("Cancel(%s) = %v, %v; want in flight", id, got, err)
				}
			}
			for range cancelled {
				m := recv(t, outcomes, 10*time.Second, "a cancelled notice")
				if !slices.Contains(cancelled, m.InReplyTo) || !errors.Is(m.Error, disker.ErrCancelled) {
					t.Fatalf("outcome %+v, want the cancelled notice of one of %v", m, cancelled)
				}
			}
			if round == "all" {
				recv(t, c.ctx.Done(), 10*time.Second, "the ctx of the batch to end")
				if cause := context.Cause(c.ctx); !errors.Is(cause, disker.ErrCancelled) {
					t.Fatalf("ctx of a batch whose every message was cancelled ended with %v, want ErrCancelled", cause)
				}
				continue
			}
			if err := c.ctx.Err(); err != nil {
				t.Fatalf("ctx of the batch ended (%v, %v) when one of its three messages was cancelled", err, context.Cause(c.ctx))
			}
			close(c.done)
			for range 2 {
				m := recv(t, outcomes, 10*time.Second, "a reply")
				if m.Error != nil || !slices.Contains(ids[1:], m.InReplyTo) || !strings.HasPrefix(string(m.Content), "done:") {
					t.Fatalf("reply %+v, want one to the messages not cancelled", m)
				}
			}
		}
		waitInFlight(t, w, "work", 0)
		if s := w.LocalStats().Receivers["work"]; s.Processed != 2 || s.Failed != 0 {
			t.Fatalf("LocalStats = %+v, want the two not cancelled processed", s)
		}
		select {
		case m := <-outcomes:
			t.Fatalf("an outcome more: %+v", m)
		default:
		}
	})
}

// TestHandleBatchLeaseLost steals the deliveries of a running batch, as a
// partition longer than the holder's heartbeats would: its ctx ends with
// ErrLeaseLost, and the worker settles none of them.
func TestHandleBatchLeaseLost(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		b := rawBroker(t, e)
		victim := "victim-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		d := e.open(func(c *disker.Config) { c.InstanceID = victim })
		ctx := ctxTimeout(t, 20*time.Second)
		sendN(t, d, "stolen", "s", 2)
		started := make(chan struct{})
		cause := make(chan error, 1)
		if err := d.HandleBatch("stolen", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			if len(msgs) != 2 {
				return nil, fmt.Errorf("a batch of %d, want 2", len(msgs))
			}
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return acks(msgs), nil // success after the loss is discarded
		}), disker.WithLease(300*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		recv(t, started, 10*time.Second, "the batch to start")
		stolen := steal(t, b, victim, "stolen", 2)
		if err := recv(t, cause, 10*time.Second, "the batch's ctx to end"); !errors.Is(err, disker.ErrLeaseLost) {
			t.Fatalf("cause = %v, want ErrLeaseLost", err)
		}
		waitInFlight(t, d, "stolen", 0)
		if s := d.LocalStats().Receivers["stolen"]; s.Processed != 0 || s.Failed != 0 {
			t.Fatalf("LocalStats = %+v, want nothing settled", s)
		}
		refs := []string{stolen[0].Ref, stolen[1].Ref}
		if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "stolen", Consumer: "thief", Refs: refs, Lease: time.Minute}); err != nil || len(lost) != 0 {
			t.Fatalf("thief's Extend = %v, %v; want the leases still held", lost, err)
		}
	})
}

// steal takes n deliveries of receiver from victim, which holds them and
// renews their leases, as a consumer "thief": only the victim's departure
// from the registry of workers lets it, and steal makes one, as a
// partition longer than the victim's heartbeats would: a heartbeat of the
// victim's that vouches for 1ns, then one of the thief's a little later,
// which finds the victim's lapsed.
func steal(t *testing.T, b broker.Broker, victim, receiver string, n int) []broker.Delivery {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	var stolen []broker.Delivery
	waitFor(t, 10*time.Second, "the theft", func() bool {
		if err := b.Heartbeat(ctx, broker.WorkerInfo{ID: victim, Receivers: []string{receiver}}, time.Nanosecond); err != nil {
			return false
		}
		time.Sleep(2 * time.Millisecond) // the victim's entry lapses
		if err := b.Heartbeat(ctx, broker.WorkerInfo{ID: "thief", Receivers: []string{receiver}}, time.Minute); err != nil {
			return false
		}
		got, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "thief", Max: n - len(stolen), Lease: time.Minute})
		stolen = append(stolen, got...)
		return err == nil && len(stolen) == n
	})
	return stolen
}

// rawBroker opens a broker of e's of its own, for a test to act as
// another party would.
func rawBroker(t *testing.T, e *env) broker.Broker {
	t.Helper()
	var b broker.Broker
	if e.redis {
		rb, err := redisbroker.New(redisbroker.Config{URL: e.url, KeyPrefix: e.base.KeyPrefix})
		if err != nil {
			t.Fatal(err)
		}
		b = rb
	} else {
		b = membroker.Shared(strings.TrimPrefix(e.url, "mem://"), membroker.Options{})
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestHandleBatchLeaseExtended runs a batch for five leases while another
// instance competes for the receiver: the leases of its messages are
// extended, so each is handled once, by the batch.
func TestHandleBatchLeaseExtended(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		const lease = 200 * time.Millisecond
		sendN(t, d, "long", "l", 3)
		var calls atomic.Int64
		started := make(chan struct{})
		if err := d.HandleBatch("long", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			calls.Add(int64(len(msgs)))
			close(started)
			select {
			case <-time.After(5 * lease): // the work
				return acks(msgs), nil
			case <-ctx.Done():
				return nil, fmt.Errorf("ctx ended: %w", context.Cause(ctx))
			}
		}), disker.WithLease(lease)); err != nil {
			t.Fatal(err)
		}
		recv(t, started, 10*time.Second, "the batch to start")
		other := e.open()
		if err := other.Handle("long", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls.Add(1)
			return nil, errors.New("the lease lapsed: redelivered")
		}), disker.WithLease(lease)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the batch handled", func() bool { return d.LocalStats().Receivers["long"].Processed == 3 })
		if n := calls.Load(); n != 3 {
			t.Fatalf("%d messages handled, want 3, each once", n)
		}
		waitFor(t, 10*time.Second, "an empty queue", func() bool {
			s, err := d.Stats(context.Background(), "long")
			return err == nil && s.Length == 0 && s.Pending == 0
		})
	})
}

// TestHandleBatchClose closes an instance while a batch runs: Close waits
// for it, and it is acknowledged. Closed with a short grace, the batch's
// ctx ends, and another instance handles its messages again.
func TestHandleBatchClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		for _, forced := range []bool{false, true} {
			receiver := fmt.Sprint("closing-", forced)
			first, err := disker.New(context.Background(), e.config())
			if err != nil {
				t.Fatal(err)
			}
			sendN(t, first, receiver, "c", 3)
			started := make(chan struct{})
			release := make(chan struct{})
			if err := first.HandleBatch(receiver, disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
				close(started)
				select {
				case <-release:
					return acks(msgs), nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			}), disker.WithLease(disker.MinLease)); err != nil {
				t.Fatal(err)
			}
			recv(t, started, 10*time.Second, "the batch to start")
			grace := 30 * time.Second
			if forced {
				grace = 100 * time.Millisecond
			}
			closed := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), grace)
				defer cancel()
				closed <- first.Close(ctx)
			}()
			if !forced {
				// Close waits for the batch: it is still running.
				waitFor(t, 10*time.Second, "Close to stop the fetching", func() bool {
					_, err := first.Stats(context.Background(), receiver)
					return errors.Is(err, disker.ErrClosed)
				})
				select {
				case err := <-closed:
					t.Fatalf("Close returned %v while the batch ran", err)
				default:
				}
				close(release)
				if err := recv(t, closed, 10*time.Second, "Close"); err != nil {
					t.Fatalf("Close = %v", err)
				}
				d := e.open()
				if s, err := d.Stats(context.Background(), receiver); err != nil || s.Length != 0 || s.Pending != 0 {
					t.Fatalf("Stats after the drain = %+v, %v; want the batch acknowledged", s, err)
				}
				continue
			}
			if err := recv(t, closed, 10*time.Second, "Close"); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Close with a busy batch = %v, want the drain to time out", err)
			}
			second := e.open()
			again := newBatches()
			if err := second.HandleBatch(receiver, disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
				for _, m := range msgs {
					if m.Attempt != 2 {
						return nil, fmt.Errorf("%s at attempt %d, want 2", m.Content, m.Attempt)
					}
				}
				again.record(msgs)
				return acks(msgs), nil
			}), disker.WithLease(disker.MinLease)); err != nil {
				t.Fatal(err)
			}
			again.once(t, 3, 20*time.Second)
		}
	})
}

// TestHandleBatchPause pauses a receiver served by a batch handler: no
// batch starts while it is paused (what a fetch under way brought stays
// with the instance, leased), and every message is handled, once, after
// Resume.
func TestHandleBatchPause(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		b := newBatches()
		if err := d.HandleBatch("rests", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			b.record(msgs)
			return acks(msgs), nil
		})); err != nil {
			t.Fatal(err)
		}
		if err := d.Pause(ctx, "rests"); err != nil {
			t.Fatal(err)
		}
		sendN(t, d, "rests", "r", 20)
		time.Sleep(4 * disker.PausePollInterval) // long enough for a batch to start, were it not paused
		if got := b.sizes(); len(got) != 0 {
			t.Fatalf("batches %v started while paused", got)
		}
		if s, err := d.Stats(ctx, "rests"); err != nil || s.Length != 20 {
			t.Fatalf("Stats while paused = %+v, %v; want the 20 messages kept", s, err)
		}
		if err := d.Resume(ctx, "rests"); err != nil {
			t.Fatal(err)
		}
		b.once(t, 20, 10*time.Second)
	})
}

// TestHandleBatchFlowLimits serves batch handlers under the flow limits:
// with WithGlobalConcurrency(3) on two instances no more than 3 messages
// are in batches at once; under WithRateLimit and WithExclusive every
// message is handled once.
func TestHandleBatchFlowLimits(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, 60*time.Second)
		ds := []*disker.Disker{e.open(), e.open()}
		var running, most atomic.Int64
		global := newBatches()
		for _, d := range ds {
			if err := d.HandleBatch("global", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
				n := running.Add(int64(len(msgs)))
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(5 * time.Millisecond) // the work
				running.Add(-int64(len(msgs)))
				global.record(msgs)
				return acks(msgs), nil
			}), disker.WithBatchSize(10), disker.WithConcurrency(2), disker.WithGlobalConcurrency(3)); err != nil {
				t.Fatal(err)
			}
		}
		sendN(t, ds[0], "global", "g", 30)
		global.once(t, 30, 30*time.Second)
		if m := most.Load(); m > 3 || slices.Max(global.sizes()) > 3 {
			t.Fatalf("%d messages in batches at once, batch sizes %v; want at most 3", m, global.sizes())
		}

		for _, c := range []struct {
			receiver string
			opt      disker.HandleOption
		}{{"rate", disker.WithRateLimit(200, 5)}, {"exclusive", disker.WithExclusive()}} {
			var mu sync.Mutex
			handled := map[string]int{}
			for _, d := range ds {
				if err := d.HandleBatch(c.receiver, disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
					mu.Lock()
					defer mu.Unlock()
					for _, m := range msgs {
						handled[string(m.Content)]++
					}
					return acks(msgs), nil
				}), c.opt); err != nil {
					t.Fatal(err)
				}
			}
			sendN(t, ds[0], c.receiver, "x", 40)
			waitFor(t, 30*time.Second, "every message of "+c.receiver, func() bool {
				s, err := ds[0].Stats(ctx, c.receiver)
				mu.Lock()
				defer mu.Unlock()
				return err == nil && len(handled) == 40 && s.Length == 0 && s.Pending == 0
			})
			mu.Lock()
			for m, n := range handled {
				if n != 1 {
					t.Errorf("%s: %s handled %d times", c.receiver, m, n)
				}
			}
			mu.Unlock()
		}
	})
}

// TestHandleBatchGroups serves keyed messages (WithGroup) with a batch
// handler: a batch holds at most one message of a key (the default group
// concurrency), the messages of each key come in the order they were sent,
// one batch after another, and each carries its key in Message.Group.
func TestHandleBatchGroups(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		for i := range 4 {
			for _, key := range []string{"a", "b", "c"} {
				if _, err := d.Send(ctx, disker.Message{Receiver: "keyed", Content: fmt.Append(nil, key, i)}, disker.WithGroup(key)); err != nil {
					t.Fatal(err)
				}
			}
		}
		b := newBatches()
		wrongGroup := make(chan string, 12)
		if err := d.HandleBatch("keyed", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			for _, m := range msgs {
				if m.Group != string(m.Content[:1]) {
					wrongGroup <- fmt.Sprintf("%s in group %q", m.Content, m.Group)
				}
			}
			b.record(msgs)
			return acks(msgs), nil
		}), disker.WithBatchSize(10)); err != nil {
			t.Fatal(err)
		}
		next := map[string]int{}
		for seen := 0; seen < 12; {
			batch := recv(t, b.ch, 10*time.Second, "a batch")
			keys := map[string]bool{}
			for _, c := range batch {
				key := c[:1]
				if keys[key] {
					t.Fatalf("batch %v holds two messages of key %s", batch, key)
				}
				keys[key] = true
				if want := fmt.Sprint(key, next[key]); c != want {
					t.Fatalf("batch %v: %s where %s was due: the key's order", batch, c, want)
				}
				next[key]++
			}
			seen += len(batch)
		}
		select {
		case w := <-wrongGroup:
			t.Fatal(w)
		default:
		}
	})
}

// TestHandleBatchValidation checks HandleBatch's arguments, and that the
// batch options are refused by Handle.
func TestHandleBatchValidation(t *testing.T) {
	t.Parallel()
	d := newEnv(t, false, "").open()
	h := disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) { return acks(msgs), nil })
	for _, c := range []struct {
		err   error
		field string
	}{
		{d.HandleBatch("", h), "receiver"},
		{d.HandleBatch("r", nil), "BatchHandler"},
		{d.HandleBatch("r", h, disker.WithBatchSize(0)), "WithBatchSize"},
		{d.HandleBatch("r", h, disker.WithBatchWait(-time.Second)), "WithBatchWait"},
		{d.HandleBatch("r", h, disker.WithConcurrency(0)), "WithConcurrency"},
		{d.Handle("r", disker.HandlerFunc(echo), disker.WithBatchSize(10)), "WithBatchSize"},
		{d.Handle("r", disker.HandlerFunc(echo), disker.WithLease(time.Minute), disker.WithBatchWait(0)), "WithBatchWait"},
	} {
		var ve *disker.ValidationError
		if !errors.As(c.err, &ve) || ve.Field != c.field {
			t.Errorf("error %v, want a *ValidationError naming %s", c.err, c.field)
		}
	}
	if err := d.HandleBatch("r", h); err != nil {
		t.Fatal(err)
	}
	if err := d.Handle("r", disker.HandlerFunc(echo)); !errors.Is(err, disker.ErrAlreadyRegistered) {
		t.Fatalf("Handle of a receiver served by HandleBatch = %v, want ErrAlreadyRegistered", err)
	}
	if err := d.HandleBatch("r", h); !errors.Is(err, disker.ErrAlreadyRegistered) {
		t.Fatalf("HandleBatch twice = %v, want ErrAlreadyRegistered", err)
	}
	if err := d.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := d.HandleBatch("s", h); !errors.Is(err, disker.ErrClosed) {
		t.Fatalf("HandleBatch after Close = %v, want ErrClosed", err)
	}
}

// serveBatchChild serves the receiver of the child "batch-worker" with a
// batch handler that prints "started ID ATTEMPT" for each message of its
// batch, then blocks for good.
func serveBatchChild(d *disker.Disker, receiver string, lease time.Duration) error {
	return d.HandleBatch(receiver, disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		for _, m := range msgs {
			fmt.Printf("started %s %d\n", m.ID, m.Attempt)
		}
		select {}
	}), disker.WithLease(lease))
}

// TestHandleBatchKilledWorker kills a worker process with SIGKILL while
// its batch runs: another process handles every message of the batch
// again, as its second attempt, once the lease has ended.
func TestHandleBatchKilledWorker(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	d := e.open()
	ids := sendN(t, d, "batch-jobs", "k", 5)
	c := startChild(t, e, "batch-worker", "batch-jobs", "")
	// The child says "ready" once it serves, and its handler "started ID
	// 1" for each message of the batch: the batch may start before the
	// child says ready, so the lines come in either order.
	want := map[string]bool{"ready": true}
	for _, id := range ids {
		want["started "+id+" 1"] = true
	}
	for len(want) > 0 {
		l := recv(t, c.lines, 30*time.Second, "the child to be ready and to start the batch")
		if !want[l] {
			t.Fatalf("child said %q, want one of %v", l, want)
		}
		delete(want, l)
	}
	c.kill(t)
	got := serve(t, d, "batch-jobs", childLease)
	redelivered := map[string]int{}
	for range ids {
		m := recv(t, got, 30*time.Second, "a redelivery")
		redelivered[m.ID] = m.Attempt
	}
	for _, id := range ids {
		if redelivered[id] != 2 {
			t.Fatalf("redelivered %v, want each of %v at attempt 2", redelivered, ids)
		}
	}
}
