package disker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// streamItems ranges over a RequestStream and returns its partials and
// its final item (the reply, or the error); it marks the test failed (it
// may run on any goroutine) if the stream yields anything after a final
// item, or none.
func streamItems(t testing.TB, seq func(func(disker.Part, error) bool)) (parts []disker.Part, reply *disker.Message, err error) {
	t.Helper()
	finals := 0
	for p, e := range seq {
		if finals > 0 {
			t.Errorf("an item after the final one: %+v, %v", p, e)
		}
		switch {
		case e != nil:
			finals++
			err = e
		case p.Reply != nil:
			finals++
			reply = p.Reply
		default:
			parts = append(parts, p)
		}
	}
	if finals != 1 {
		t.Errorf("the stream ended with %d final items, want 1", finals)
	}
	return parts, reply, err
}

// TestRequestStreamInOrder streams 1,000 partial replies then a reply:
// they arrive in order, none twice, then the final outcome once; the
// handler's partial after its final reply, and one from outside a
// handler, get clear errors.
func TestRequestStreamInOrder(t *testing.T) {
	const n = 1000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		after := make(chan error, 1)
		if err := worker.Handle("tokens", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			for i := range n {
				if err := m.Partial(ctx, []byte(strconv.Itoa(i))); err != nil {
					return nil, err
				}
			}
			if err := worker.Reply(ctx, m, []byte("done")); err != nil {
				return nil, err
			}
			after <- m.Partial(ctx, []byte("after the reply"))
			return nil, disker.ErrReplyLater
		})); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		parts, reply, err := streamItems(t, client.RequestStream(ctx, disker.Message{Receiver: "tokens"}))
		if err != nil || reply == nil || string(reply.Content) != "done" {
			t.Fatalf("final item: %v, %v; want the reply done", reply, err)
		}
		if len(parts) != n {
			t.Fatalf("got %d partials, want %d", len(parts), n)
		}
		for i, p := range parts {
			if string(p.Content) != strconv.Itoa(i) || p.Attempt != 1 || p.Restart {
				t.Fatalf("partial %d: %q attempt %d restart %v; want %d of attempt 1", i, p.Content, p.Attempt, p.Restart, i)
			}
		}
		if err := recv(t, after, 10*time.Second, "the partial after the reply"); !errors.Is(err, disker.ErrLate) {
			t.Fatalf("Partial after the final reply = %v, want ErrLate", err)
		}
		if err := (&disker.Message{ID: "x", Sender: "s"}).Partial(ctx, nil); !errors.As(err, new(*disker.ValidationError)) {
			t.Fatalf("Partial outside a handler = %v, want a *ValidationError", err)
		}
	})
}

// TestRequestStreamNotStreamed shows Partial's error on a message from
// Send and from Request: ErrNotStreamed.
func TestRequestStreamNotStreamed(t *testing.T) {
	e := newEnv(t, false, "")
	d := e.open()
	errs := make(chan error, 2)
	if err := d.Handle("plain", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		errs <- m.Partial(ctx, []byte("x"))
		return []byte("ok"), nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	if _, err := d.Send(ctx, disker.Message{Receiver: "plain"}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Request(ctx, disker.Message{Receiver: "plain"}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := recv(t, errs, 10*time.Second, "the handler"); !errors.Is(err, disker.ErrNotStreamed) {
			t.Fatalf("Partial to a message that is not streamed = %v, want ErrNotStreamed", err)
		}
	}
}

// TestRequestStreamInvalid shows RequestStream's bad input, yielded as the
// only item, and an iterator ranged twice.
func TestRequestStreamInvalid(t *testing.T) {
	e := newEnv(t, false, "")
	d := e.open()
	if err := d.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	ctx := ctxTimeout(t, 30*time.Second)
	for what, seq := range map[string]func(func(disker.Part, error) bool){
		"a sender":          d.RequestStream(ctx, disker.Message{Sender: "me", Receiver: "echo"}),
		"no receiver":       d.RequestStream(ctx, disker.Message{}),
		"an idempotent key": d.RequestStream(ctx, disker.Message{Receiver: "echo"}, disker.WithIdempotencyKey("k")),
	} {
		if _, _, err := streamItems(t, seq); !errors.As(err, new(*disker.ValidationError)) {
			t.Errorf("RequestStream with %s = %v, want a *ValidationError", what, err)
		}
	}
	seq := d.RequestStream(ctx, disker.Message{Receiver: "echo", Content: []byte("hi")})
	if _, r, err := streamItems(t, seq); err != nil || string(r.Content) != "echo:hi" {
		t.Fatalf("first range: %v, %v", r, err)
	}
	if _, _, err := streamItems(t, seq); err == nil {
		t.Fatal("second range of one RequestStream: no error")
	}
}

// TestRequestStreamStopEarly stops ranging after the first partial: the
// request is given up as by a cancelled ctx, so the handler's context ends
// and its next partial is refused with ErrLate.
func TestRequestStreamStopEarly(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		refused := make(chan error, 1)
		if err := worker.Handle("long", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if err := m.Partial(ctx, []byte("first")); err != nil {
				return nil, err
			}
			<-ctx.Done()
			refused <- m.Partial(context.WithoutCancel(ctx), []byte("second"))
			return nil, ctx.Err()
		})); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		for p, err := range client.RequestStream(ctx, disker.Message{Receiver: "long"}) {
			if err != nil || string(p.Content) != "first" {
				t.Fatalf("first item: %+v, %v; want the partial first", p, err)
			}
			break
		}
		if err := recv(t, refused, 30*time.Second, "the handler's partial after the caller left"); !errors.Is(err, disker.ErrLate) {
			t.Fatalf("Partial after the caller stopped ranging = %v, want ErrLate", err)
		}
	})
}

// TestRequestStreamRacesTimeout races 2,000 streamed requests, each with
// partials before its reply, against their deadlines: each ends with
// exactly one final outcome, its partials all before it; the broker
// accepted as many replies as the callers got (give or take the unknown
// outcomes), and every partial the handlers sent after a final outcome was
// refused with ErrLate.
func TestRequestStreamRacesTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 2000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		var sentParts, refused atomic.Int64
		if err := worker.Handle("race", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			// Work that ignores ctx: partials and a reply may come after the deadline.
			for i := range 3 {
				time.Sleep(time.Duration(rand.N(700)) * time.Microsecond)
				switch err := m.Partial(context.WithoutCancel(ctx), []byte{byte('0' + i)}); {
				case err == nil:
					sentParts.Add(1)
				case errors.Is(err, disker.ErrLate):
					refused.Add(1)
				default:
					t.Errorf("Partial = %v", err)
					return nil, err
				}
			}
			return []byte("r"), nil
		}), disker.WithConcurrency(32)); err != nil {
			t.Fatal(err)
		}
		span := raceSpan(t, worker, client)
		round := func(span time.Duration) (int, int) {
			base, sentBefore := worker.LocalStats(), client.LocalStats().Sent
			partsBefore := sentParts.Load()
			var replies, timeouts, unknown, got atomic.Int64
			var wg sync.WaitGroup
			for p := range 32 {
				wg.Go(func() {
					for i := p; i < n; i += 32 {
						ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond+rand.N(span-time.Millisecond))
						parts, r, err := streamItems(t, client.RequestStream(ctx, disker.Message{Receiver: "race"}))
						cancel()
						for j, part := range parts {
							if string(part.Content) != strconv.Itoa(j) {
								t.Errorf("partial %d = %q", j, part.Content)
							}
						}
						got.Add(int64(len(parts)))
						switch {
						case err == nil && string(r.Content) == "r":
							if len(parts) != 3 {
								t.Errorf("a reply after %d partials, want 3", len(parts))
							}
							replies.Add(1)
						case errors.Is(err, disker.ErrTimeout):
							timeouts.Add(1)
						case errors.Is(err, disker.ErrOutcomeUnknown):
							unknown.Add(1)
						default:
							t.Errorf("RequestStream = %v, %v", r, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			sent := client.LocalStats().Sent - sentBefore
			b := base.Receivers["race"]
			waitFor(t, time.Minute, "the worker to settle every message", func() bool {
				s := worker.LocalStats().Receivers["race"]
				if s.Processed+s.Expired-b.Processed-b.Expired > sent {
					t.Logf("%+v, base %+v, sent %d", s, b, sent)
				}
				return s.Processed+s.Expired-b.Processed-b.Expired == sent
			})
			ws := worker.LocalStats()
			replied := ws.Replied - base.Replied
			t.Logf("timeouts up to %v: %d replies, %d timeouts, %d unknown; %d partials sent, %d yielded; %d refused in all (worker: %d accepted)",
				span, replies.Load(), timeouts.Load(), unknown.Load(), sentParts.Load()-partsBefore, got.Load(), refused.Load(), replied)
			if replied < replies.Load() || replied > replies.Load()+unknown.Load() {
				t.Fatalf("the callers got %d replies and %d unknown outcomes, the broker accepted %d", replies.Load(), unknown.Load(), replied)
			}
			if unknown.Load() == 0 && got.Load() != sentParts.Load()-partsBefore {
				t.Fatalf("the callers got %d partials, the broker accepted %d", got.Load(), sentParts.Load()-partsBefore)
			}
			return int(replies.Load()), int(timeouts.Load())
		}
		raceUntilBoth(t, span, round)
	})
}

// runStreamChild is the child "stream-worker": its handler sends the
// partials "1.0" and "1.1" (attempt.index), prints "started ID ATTEMPT",
// and blocks until the process is killed.
func runStreamChild(d *disker.Disker) int {
	err := d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		for i := range 2 {
			if err := m.Partial(ctx, fmt.Appendf(nil, "%d.%d", m.Attempt, i)); err != nil {
				fmt.Fprintln(os.Stderr, "child:", err)
			}
		}
		fmt.Printf("started %s %d\n", m.ID, m.Attempt)
		<-ctx.Done()
		return nil, ctx.Err()
	}), disker.WithLease(childLease))
	return childServes(err)
}

// TestKilledWorkerStreamRestarts kills a worker process (SIGKILL) in the
// middle of a stream: the caller gets the first attempt's partials, then
// the redelivery's, the first of them marked Restart with attempt 2, then
// exactly one final outcome.
func TestKilledWorkerStreamRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	c := startChild(t, e, "stream-worker", "streamed", "")
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}
	client, survivor := e.open(), e.open()
	ctx := ctxTimeout(t, time.Minute)
	var got []disker.Part
	var final *disker.Message
	for p, err := range client.RequestStream(ctx, disker.Message{Receiver: "streamed"}) {
		if err != nil {
			t.Fatalf("RequestStream: %v after %+v", err, got)
		}
		if p.Reply != nil {
			final = p.Reply
			continue
		}
		got = append(got, p)
		if len(got) == 2 {
			if l := recv(t, c.lines, 30*time.Second, "the child to start"); len(l) < 8 || l[:8] != "started " {
				t.Fatalf("child said %q", l)
			}
			c.kill(t)
			if err := survivor.Handle("streamed", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
				if err := m.Partial(ctx, fmt.Appendf(nil, "%d.0", m.Attempt)); err != nil {
					return nil, err
				}
				return []byte("done"), nil
			}), disker.WithLease(childLease)); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := []disker.Part{{Content: []byte("1.0"), Attempt: 1}, {Content: []byte("1.1"), Attempt: 1}, {Content: []byte("2.0"), Attempt: 2, Restart: true}}
	if len(got) != len(want) {
		t.Fatalf("partials %+v, want %+v", got, want)
	}
	for i := range want {
		if string(got[i].Content) != string(want[i].Content) || got[i].Attempt != want[i].Attempt || got[i].Restart != want[i].Restart {
			t.Fatalf("partial %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if final == nil || string(final.Content) != "done" {
		t.Fatalf("final reply %v, want done", final)
	}
}
