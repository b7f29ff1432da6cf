package disker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/keyslot"
)

// TestResultRetention follows retained messages to each final outcome: a
// reply, a fire-and-forget message's handling with its progress, a dead
// letter and a cancellation; the results then go after their retention.
func TestResultRetention(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		ctx := ctxTimeout(t, time.Minute)
		progressed := make(chan error, 1)
		if err := worker.Handle("res", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			switch string(m.Content) {
			case "fail":
				return nil, disker.NoRetry(errors.New("boom"))
			case "progress":
				err := m.Progress(ctx, []byte("half"))
				if err == nil {
					err = m.Progress(ctx, []byte("all"))
				}
				progressed <- err
			}
			return append([]byte("echo:"), m.Content...), nil
		})); err != nil {
			t.Fatal(err)
		}
		if err := client.OnReply("res-sender", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})); err != nil {
			t.Fatal(err)
		}
		send := func(m disker.Message, opts ...disker.SendOption) string {
			t.Helper()
			m.Receiver = "res"
			id, err := client.Send(ctx, m, append(opts, disker.WithRetention(time.Hour))...)
			if err != nil {
				t.Fatal(err)
			}
			return id
		}

		id := send(disker.Message{Sender: "res-sender", Content: []byte("hi")}, disker.WithTimeout(30*time.Second))
		r, err := client.WaitResult(ctx, "res", id)
		if err != nil {
			t.Fatal(err)
		}
		if r.State != disker.ResultSucceeded || string(r.Reply) != "echo:hi" || r.Attempts != 1 || r.Worker != worker.ID() {
			t.Fatalf("replied: %+v", r)
		}
		if r.SentAt.IsZero() || r.StartedAt.Before(r.SentAt.Add(-time.Second)) || r.FinishedAt.Before(r.StartedAt) || r.ExpiresAt.Before(r.FinishedAt) {
			t.Fatalf("replied: times out of order: %+v", r)
		}

		id = send(disker.Message{Content: []byte("progress")})
		if err := <-progressed; err != nil {
			t.Fatalf("Progress: %v", err)
		}
		if r, err = client.WaitResult(ctx, "res", id); err != nil {
			t.Fatal(err)
		}
		if r.State != disker.ResultSucceeded || string(r.Progress) != "all" || string(r.Reply) != "echo:progress" {
			t.Fatalf("fire-and-forget with progress: %+v", r)
		}

		id = send(disker.Message{Content: []byte("fail")})
		if r, err = client.WaitResult(ctx, "res", id); err != nil {
			t.Fatal(err)
		}
		if r.State != disker.ResultDeadLettered || r.Err == nil || r.Err.Code != disker.CodeDeadLetter {
			t.Fatalf("dead-lettered: %+v (err %+v)", r, r.Err)
		}

		id = send(disker.Message{Content: []byte("later")}, disker.WithDelay(time.Hour))
		if r, err = client.Result(ctx, "res", id); err != nil || r.State != disker.ResultQueued || r.State.Final() {
			t.Fatalf("deferred: %+v, %v", r, err)
		}
		if _, err := client.Cancel(ctx, "res", id); err != nil {
			t.Fatal(err)
		}
		if r, err = client.Result(ctx, "res", id); err != nil || r.State != disker.ResultCancelled {
			t.Fatalf("cancelled: %+v, %v", r, err)
		}

		plain, err := client.Send(ctx, disker.Message{Receiver: "res", Content: []byte("plain")})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.Result(ctx, "res", plain); !errors.Is(err, disker.ErrResultNotFound) {
			t.Fatalf("a message without a retention: %v, want ErrResultNotFound", err)
		}
		list, err := client.ListResults(ctx, "res", 10)
		if err != nil || len(list) != 4 {
			t.Fatalf("ListResults: %d results, %v; want 4", len(list), err)
		}

		short, err := client.Send(ctx, disker.Message{Receiver: "res", Content: []byte("short")}, disker.WithRetention(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := client.WaitResult(ctx, "res", short); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the short retention to pass", func() bool {
			_, err := client.Result(ctx, "res", short)
			return errors.Is(err, disker.ErrResultNotFound)
		})
	})
}

// TestResultReceiverDefault keeps results by the receiver's default
// (WithResultRetention) for messages sent without one.
func TestResultReceiverDefault(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		ctx := ctxTimeout(t, time.Minute)
		if err := worker.Handle("resdef", disker.HandlerFunc(echo), disker.WithResultRetention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		id, err := client.Send(ctx, disker.Message{Receiver: "resdef", Content: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		var r *disker.Result
		waitFor(t, 30*time.Second, "the default retention's result", func() bool {
			r, err = client.Result(ctx, "resdef", id)
			return err == nil && r.State.Final()
		})
		if r.State != disker.ResultSucceeded || r.Attempts != 1 {
			t.Fatalf("%+v", r)
		}
		// A batch handler's receiver too.
		if err := worker.HandleBatch("resbatch", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			return make([]disker.Outcome, len(msgs)), nil
		}), disker.WithResultRetention(time.Hour)); err != nil {
			t.Fatal(err)
		}
		id, err = client.Send(ctx, disker.Message{Receiver: "resbatch", Content: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the batch's result", func() bool {
			r, err = client.Result(ctx, "resbatch", id)
			return err == nil && r.State.Final()
		})
		if r.State != disker.ResultSucceeded || r.Attempts != 1 || r.StartedAt.IsZero() {
			t.Fatalf("batch: %+v", r)
		}
	})
}

// TestResultValidation: bad retentions and progress outside a handler are
// refused, and nothing is queued.
func TestResultValidation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, time.Minute)
		for _, ret := range []time.Duration{0, -time.Second, time.Microsecond, disker.MaxRetention + time.Hour} {
			if _, err := d.Send(ctx, disker.Message{Receiver: "resval"}, disker.WithRetention(ret)); err == nil {
				t.Errorf("WithRetention(%v): no error", ret)
			}
		}
		if err := d.Handle("resval", disker.HandlerFunc(echo), disker.WithResultRetention(0)); err == nil {
			t.Error("WithResultRetention(0): no error")
		}
		st, err := d.Stats(ctx, "resval")
		if err != nil || st.Queued != 0 {
			t.Fatalf("queued %d, %v; want nothing", st.Queued, err)
		}
		if err := (&disker.Message{ID: "x"}).Progress(ctx, nil); !errors.Is(err, disker.ErrNotInHandler) {
			t.Fatalf("Progress outside a handler: %v", err)
		}
		if _, err := d.Result(ctx, "resval", "not-an-id"); err == nil {
			t.Fatal("Result of a bad id: no error")
		}
	})
}

// TestResultRacesTimeout races 2,000 timed replies with a retention
// against their deadlines: each message's retained fate is the one
// outcome its sender saw (a reply, or a timeout notice).
func TestResultRacesTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 2000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("resrace", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
			return []byte("r"), nil
		}), disker.WithConcurrency(64)); err != nil {
			t.Fatal(err)
		}
		span := raceSpan(t, worker, client)
		var mu sync.Mutex
		outcomes := make(map[string][]byte, n)
		inFlight := make(chan struct{}, 64)
		record := func(id string, kind byte) {
			mu.Lock()
			outcomes[id] = append(outcomes[id], kind)
			first := len(outcomes[id]) == 1
			mu.Unlock()
			if first {
				<-inFlight
			}
		}
		if err := client.OnReply("resracer", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { record(r.InReplyTo, 'r') })); err != nil {
			t.Fatal(err)
		}
		if err := client.OnTimeout("resracer", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { record(m.ID, 't') })); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 3*time.Minute)
		round := func(span time.Duration) (replies, timeouts int) {
			ids := make([]string, 0, n)
			for range n {
				inFlight <- struct{}{}
				timeout := time.Millisecond + rand.N(span-time.Millisecond)
				id, err := client.Send(ctx, disker.Message{Sender: "resracer", Receiver: "resrace"}, disker.WithTimeout(timeout), disker.WithRetention(time.Hour))
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, id)
			}
			for _, id := range ids {
				r, err := client.WaitResult(ctx, "resrace", id)
				if err != nil {
					t.Fatalf("WaitResult %s: %v", id, err)
				}
				waitFor(t, time.Minute, "the sender's outcome", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(outcomes[id]) > 0
				})
				mu.Lock()
				o := outcomes[id]
				mu.Unlock()
				switch {
				case len(o) != 1:
					t.Fatalf("message %s had outcomes %q, want exactly one", id, o)
				case o[0] == 'r' && (r.State != disker.ResultSucceeded || string(r.Reply) != "r"):
					t.Fatalf("message %s: the sender got the reply, the result says %v (reply %q)", id, r.State, r.Reply)
				case o[0] == 't' && r.State != disker.ResultTimedOut:
					t.Fatalf("message %s: the sender got a timeout, the result says %v (reply %q)", id, r.State, r.Reply)
				case o[0] == 'r':
					replies++
				default:
					timeouts++
				}
			}
			t.Logf("timeouts up to %v: %d replies, %d timeouts, each retained as its sender saw it", span, replies, timeouts)
			return replies, timeouts
		}
		raceUntilBoth(t, span, round)
	})
}

// TestResultRacesCancel cancels 2,000 timed messages with a retention at
// random moments of their handling, one in ten of them dead-lettered: each
// one's retained fate is the one outcome its sender saw (the reply, the
// cancelled or dead-letter error, or a timeout notice).
func TestResultRacesCancel(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 2000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("rescancel", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
			if m.Headers["dead"] != "" {
				return nil, disker.NoRetry(errors.New("dead"))
			}
			return []byte("r"), nil
		}), disker.WithConcurrency(64)); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		outcomes := make(map[string][]byte, n)
		record := func(id string, kind byte) {
			mu.Lock()
			outcomes[id] = append(outcomes[id], kind)
			mu.Unlock()
		}
		if err := client.OnReply("rescanceller", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) {
			switch {
			case r.Error == nil:
				record(r.InReplyTo, 'r')
			case r.Error.Code == disker.CodeCancelled:
				record(r.InReplyTo, 'c')
			case r.Error.Code == disker.CodeDeadLetter:
				record(r.InReplyTo, 'd')
			default:
				record(r.InReplyTo, '?')
			}
		})); err != nil {
			t.Fatal(err)
		}
		if err := client.OnTimeout("rescanceller", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { record(m.ID, 't') })); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 3*time.Minute)
		ids := make([]string, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 64)
		for i := range ids {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				msg := disker.Message{Sender: "rescanceller", Receiver: "rescancel"}
				if i%10 == 0 {
					msg.Headers = map[string]string{"dead": "1"}
				}
				id, err := client.Send(ctx, msg, disker.WithTimeout(5*time.Second), disker.WithRetention(time.Hour))
				if err != nil {
					t.Error(err)
					return
				}
				ids[i] = id
				time.Sleep(time.Duration(rand.N(3000)) * time.Microsecond)
				if _, err := client.Cancel(ctx, "rescancel", id); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}
		want := map[byte]disker.ResultState{'r': disker.ResultSucceeded, 'c': disker.ResultCancelled, 'd': disker.ResultDeadLettered, 't': disker.ResultTimedOut}
		count := map[disker.ResultState]int{}
		for _, id := range ids {
			waitFor(t, time.Minute, "the sender's outcome", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(outcomes[id]) > 0
			})
			r, err := client.WaitResult(ctx, "rescancel", id)
			if err != nil {
				t.Fatalf("WaitResult %s: %v", id, err)
			}
			mu.Lock()
			o := outcomes[id]
			mu.Unlock()
			if len(o) != 1 || want[o[0]] != r.State {
				t.Fatalf("message %s: the sender saw %q, the result says %v (%+v)", id, o, r.State, r)
			}
			count[r.State]++
		}
		t.Logf("outcomes, each retained as its sender saw it: %v", count)
		if count[disker.ResultCancelled] == 0 || count[disker.ResultSucceeded] == 0 {
			t.Fatalf("the race needs both cancellations and replies: %v", count)
		}
	})
}

// TestResultReplyBeforeRetry keeps, as the result of a Request, the reply
// its requester got from a first attempt that replied with Reply and then
// failed: the retry on the same instance finds the message answered
// (ErrLate) and succeeds, and the result is the first reply, before and
// after the request's deadline (not a timeout).
func TestResultReplyBeforeRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		lateRetry := make(chan error, 1)
		if err := d.Handle("resretry", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if m.Attempt == 1 {
				if err := d.Reply(ctx, m, []byte("first")); err != nil {
					return nil, err
				}
				return nil, errors.New("fails after its reply")
			}
			lateRetry <- d.Reply(ctx, m, []byte("second"))
			return nil, nil
		}), disker.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond })); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var id string
		reply, err := d.Request(rctx, disker.Message{Receiver: "resretry"}, disker.WithRetention(time.Hour), disker.WithOnSent(func(s string) { id = s }))
		if err != nil || string(reply.Content) != "first" {
			t.Fatalf("Request: %v, %v; want the first reply", reply, err)
		}
		if err := <-lateRetry; !errors.Is(err, disker.ErrLate) {
			t.Fatalf("the retry's Reply: %v, want ErrLate", err)
		}
		r, err := d.WaitResult(ctx, "resretry", id)
		if err != nil || r.State != disker.ResultSucceeded || string(r.Reply) != "first" {
			t.Fatalf("result: %+v, %v; want succeeded with the first reply", r, err)
		}
		deadline, _ := rctx.Deadline()
		time.Sleep(time.Until(deadline) + 100*time.Millisecond)
		if r, err = d.Result(ctx, "resretry", id); err != nil || r.State != disker.ResultSucceeded || string(r.Reply) != "first" {
			t.Fatalf("result after the deadline: %+v, %v; want succeeded with the first reply", r, err)
		}
	})
}

// TestResultReplyRedeliveredElsewhere: a Request's reply is accepted by
// its inbox, then the instance that sent it is closed before it
// acknowledges the message; the message comes back to another instance
// after its deadline, which finds it late and settles it with no reply of
// its own: the result holds the reply its requester received, not a
// timeout.
func TestResultReplyRedeliveredElsewhere(t *testing.T) {
	testResultReplyRedelivered(t, "resmoved", false)
}

// TestResultStreamReplyRedeliveredElsewhere is
// TestResultReplyRedeliveredElsewhere for the final reply of a
// RequestStream, after a partial.
func TestResultStreamReplyRedeliveredElsewhere(t *testing.T) {
	testResultReplyRedelivered(t, "resmovedstream", true)
}

// testResultReplyRedelivered runs TestResultReplyRedeliveredElsewhere on
// receiver, with RequestStream when stream.
func testResultReplyRedelivered(t *testing.T, receiver string, stream bool) {
	eachBackend(t, func(t *testing.T, e *env) {
		requester := e.open()
		first, err := disker.New(context.Background(), e.config())
		if err != nil {
			t.Fatal(err)
		}
		replied := make(chan error, 1)
		if err := first.Handle(receiver, disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if stream {
				if err := m.Partial(ctx, []byte("part")); err != nil {
					replied <- err
					return nil, err
				}
			}
			replied <- first.Reply(ctx, m, []byte("first"))
			<-ctx.Done() // the instance is stopped before the deadline: left for redelivery
			return nil, context.Cause(ctx)
		}), disker.WithLease(3*time.Second)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		var id string
		msg, opts := disker.Message{Receiver: receiver}, []disker.SendOption{disker.WithRetention(time.Hour), disker.WithOnSent(func(s string) { id = s })}
		var reply *disker.Message
		if stream {
			var parts []disker.Part
			parts, reply, err = streamItems(t, requester.RequestStream(rctx, msg, opts...))
			if err == nil && (len(parts) != 1 || string(parts[0].Content) != "part") {
				t.Fatalf("RequestStream's partials: %+v, want the one", parts)
			}
		} else {
			reply, err = requester.Request(rctx, msg, opts...)
		}
		if err != nil || string(reply.Content) != "first" {
			t.Fatalf("the request: %v, %v; want the first reply", reply, err)
		}
		if err := <-replied; err != nil {
			t.Fatalf("the first instance's Reply: %v", err)
		}
		cctx, ccancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err = first.Close(cctx)
		ccancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close with the handler in flight = %v, want DeadlineExceeded", err)
		}
		second := e.open()
		// It takes the message once its lease of two seconds has passed
		// since the first instance took it: after the deadline, so that
		// it drops the message without calling its handler.
		var calls atomic.Int32
		if err := second.Handle(receiver, disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls.Add(1)
			return []byte("second"), nil
		}), disker.WithLease(2*time.Second)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the second instance to settle the message", func() bool {
			s, err := second.Stats(ctx, receiver)
			return err == nil && s.Length == 0 && s.Pending == 0
		})
		r, err := second.Result(ctx, receiver, id)
		if err != nil || r.State != disker.ResultSucceeded || string(r.Reply) != "first" {
			t.Fatalf("result: %+v, %v; want succeeded with the reply the requester received", r, err)
		}
		if r.Attempts != 2 || r.Worker != second.ID() || calls.Load() != 0 {
			t.Fatalf("result: %+v, the second handler called %d times; want it dropped by the second instance's attempt 2 (%s)", r, calls.Load(), second.ID())
		}
	})
}

// runReplierChild serves DISKER_TEST_RECEIVER with a handler that replies
// "first" with Reply, prints "replied ID ATTEMPT" once the reply is
// accepted, and blocks until the process is killed: its acknowledgement
// never comes.
func runReplierChild(d *disker.Disker) int {
	err := d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if err := d.Reply(ctx, m, []byte("first")); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return nil, err
		}
		fmt.Printf("replied %s %d\n", m.ID, m.Attempt)
		<-ctx.Done()
		return nil, ctx.Err()
	}), disker.WithLease(childLease))
	return childServes(err)
}

// TestKilledAfterReplyResult kills a worker process (SIGKILL) right after
// its Reply to a timed Send was accepted, before its acknowledgement: the
// sender got the reply, and the retained result, settled by the
// redelivery in another process after the deadline, says succeeded with
// that reply. On the Cluster the sender's and the receiver's names are in
// different slots, where the reply is accepted in one step (the sender's)
// and recorded by a later one (the receiver's).
func TestKilledAfterReplyResult(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	for _, bk := range []struct {
		name string
		srv  *shared
	}{{"redis", &sharedRedis}, {"cluster", &sharedCluster}} {
		t.Run(bk.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, true, bk.srv.URL(t))
			const sender = "kasender"
			receiver := "kareceiver"
			for i := 0; keyslot.Of("{"+receiver+"}") == keyslot.Of("{"+sender+"}"); i++ {
				receiver = fmt.Sprintf("kareceiver%d", i)
			}
			d := e.open()
			replies, timeouts := make(chan string, 4), make(chan string, 4)
			if err := d.OnReply(sender, disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { replies <- string(r.Content) })); err != nil {
				t.Fatal(err)
			}
			if err := d.OnTimeout(sender, disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timeouts <- m.ID })); err != nil {
				t.Fatal(err)
			}
			c := startChild(t, e, "replier", receiver, "")
			if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
				t.Fatalf("child said %q, want ready", l)
			}
			ctx := ctxTimeout(t, 2*time.Minute)
			id, err := d.Send(ctx, disker.Message{Sender: sender, Receiver: receiver, Content: []byte("q")},
				disker.WithTimeout(3*time.Second), disker.WithRetention(time.Hour))
			if err != nil {
				t.Fatal(err)
			}
			if l := recv(t, c.lines, 30*time.Second, "the child to reply"); l != "replied "+id+" 1" {
				t.Fatalf("child said %q, want its reply to %s accepted", l, id)
			}
			c.kill(t)
			if r := recv(t, replies, 30*time.Second, "the reply"); r != "first" {
				t.Fatalf("the sender got %q, want the first attempt's reply", r)
			}
			second := e.open()
			if err := second.Handle(receiver, disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
				return []byte("second"), nil
			}), disker.WithLease(time.Second)); err != nil {
				t.Fatal(err)
			}
			// The reply is on the result as soon as it is accepted (on the
			// Cluster, from its copy in the sender's slot until a later
			// attempt records it).
			res, err := d.WaitResult(ctx, receiver, id)
			if err != nil || res.State != disker.ResultSucceeded || string(res.Reply) != "first" {
				t.Fatalf("the result: %+v, %v; want succeeded with the reply the sender got", res, err)
			}
			waitFor(t, time.Minute, "the second instance to settle the message", func() bool {
				s, err := second.Stats(ctx, receiver)
				return err == nil && s.Length == 0 && s.Pending == 0
			})
			res, err = d.Result(ctx, receiver, id)
			if err != nil || res.State != disker.ResultSucceeded || string(res.Reply) != "first" || res.Attempts != 2 || res.Worker != second.ID() {
				t.Fatalf("the settled result: %+v, %v; want succeeded with the reply the sender got, settled by attempt 2 on %s", res, err, second.ID())
			}
			select {
			case m := <-timeouts:
				t.Fatalf("the sender got a timeout notice for %s beside the reply", m)
			case r := <-replies:
				t.Fatalf("the sender got a second reply %q", r)
			default:
			}
		})
	}
}
