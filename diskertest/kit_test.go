package diskertest_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
	"github.com/diskerhq/disker/pool"
)

// must fails t on err.
func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// send sends msg with opts through the kit's Disker, failing t on an
// error, and returns its id.
func send(t *testing.T, kit *diskertest.Kit, msg disker.Message, opts ...disker.SendOption) string {
	t.Helper()
	id, err := kit.Disker().Send(context.Background(), msg, opts...)
	must(t, err)
	return id
}

// failing returns a handler that fails its first n attempts, then
// replies "ok" to a message that expects a reply.
func failing(n int) disker.HandlerFunc {
	return func(_ context.Context, m *disker.Message) ([]byte, error) {
		if m.Attempt <= n {
			return nil, fmt.Errorf("attempt %d failed", m.Attempt)
		}
		if !m.ExpectsReply() {
			return nil, nil
		}
		return []byte("ok"), nil
	}
}

// outcomes lists the outcomes of ds.
func outcomes(ds []diskertest.Delivery) []diskertest.Outcome {
	out := make([]diskertest.Outcome, len(ds))
	for i := range ds {
		out[i] = ds[i].Outcome
	}
	return out
}

func TestRetryBackoffOnTheKitsClock(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(2), disker.WithBackoff(func(attempt int) time.Duration {
		return time.Duration(attempt) * time.Minute
	})))
	id := send(t, kit, disker.Message{Sender: "s", Receiver: "r"})

	ds := kit.Drain()
	if len(ds) != 1 || ds[0].Outcome != diskertest.Retried || ds[0].Err == nil || ds[0].Err.Error() != "attempt 1 failed" {
		t.Fatalf("first Drain: got %+v, want one delivery retried with the handler's error", ds)
	}
	if want := kit.Now().Add(time.Minute); !ds[0].RetryAt.Equal(want) {
		t.Fatalf("RetryAt: got %v, want %v (the backoff on the kit's clock)", ds[0].RetryAt, want)
	}
	kit.Advance(time.Minute - time.Millisecond)
	if ds := kit.Drain(); len(ds) != 0 {
		t.Fatalf("a millisecond before the retry is due, Drain ran %v", outcomes(ds))
	}
	kit.Advance(time.Millisecond)
	if ds := kit.Drain(); len(ds) != 1 || ds[0].Message.Attempt != 2 || ds[0].Outcome != diskertest.Retried {
		t.Fatalf("at the retry's time: got %+v, want attempt 2, retried", ds)
	}
	kit.Advance(2 * time.Minute)
	kit.Drain()
	kit.RequireDelivered("r", diskertest.ID(id), diskertest.Attempt(3), diskertest.Ended(diskertest.Handled))
	kit.RequireReply("s", diskertest.InReplyTo(id), diskertest.Content("ok"), diskertest.ErrorCode(""))
}

func TestDeadLetter(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(10), disker.WithMaxAttempts(2), disker.WithBackoff(func(int) time.Duration { return time.Second })))
	must(t, kit.Disker().Handle("strict", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		return nil, disker.NoRetry(errors.New("bad input"))
	})))
	id := send(t, kit, disker.Message{Sender: "s", Receiver: "r", Content: []byte("x")})
	send(t, kit, disker.Message{Receiver: "strict", Content: []byte("y")})
	kit.Drain()
	kit.Advance(time.Second)
	ds := kit.Drain()
	if len(ds) != 1 || ds[0].Outcome != diskertest.DeadLettered || ds[0].Reason == "" || ds[0].Reply == nil || ds[0].Reply.Error == nil {
		t.Fatalf("after the last attempt: got %+v, want it dead-lettered with a reason and an error reply", ds)
	}
	kit.RequireDeadLetter("r", diskertest.ID(id), diskertest.Attempt(2), diskertest.Reason("attempt 2 of 2 failed"))
	kit.RequireDeadLetter("strict", diskertest.Content("y"), diskertest.Reason("bad input"))
	kit.RequireReply("s", diskertest.InReplyTo(id), diskertest.ErrorCode(disker.CodeDeadLetter))
	if got := kit.Delivered("strict"); len(got) != 1 || got[0].Outcome != diskertest.DeadLettered {
		t.Fatalf("NoRetry: got %+v, want one delivery, dead-lettered at once", got)
	}
}

func TestDelayAndDeliverAt(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(0)))
	start := kit.Now()
	send(t, kit, disker.Message{Receiver: "r", Content: []byte("in an hour")}, disker.WithDelay(time.Hour))
	send(t, kit, disker.Message{Receiver: "r", Content: []byte("at noon")}, disker.WithDeliverAt(start.Add(90*time.Minute)))
	kit.RequireSent("r", diskertest.Content("in an hour"), diskertest.DueIn(time.Hour), diskertest.DueAt(start.Add(time.Hour)))
	kit.RequireSent("r", diskertest.Content("at noon"), diskertest.DueAt(start.Add(90*time.Minute)))

	kit.Advance(time.Hour - time.Millisecond)
	if ds := kit.Drain(); len(ds) != 0 {
		t.Fatalf("before the delay: Drain ran %d", len(ds))
	}
	kit.Advance(time.Millisecond)
	if ds := kit.Drain(); len(ds) != 1 || string(ds[0].Message.Content) != "in an hour" {
		t.Fatalf("at the delay: got %+v", ds)
	}
	kit.Advance(30 * time.Minute)
	if ds := kit.Drain(); len(ds) != 1 || string(ds[0].Message.Content) != "at noon" {
		t.Fatalf("at the delivery time: got %+v", ds)
	}
}

func TestExpiry(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(0)))
	start := kit.Now()
	id := send(t, kit, disker.Message{Sender: "s", Receiver: "r"}, disker.WithExpiry(30*time.Second))
	send(t, kit, disker.Message{Receiver: "r", Content: []byte("fresh")}, disker.WithExpiry(time.Hour))
	kit.RequireSent("r", diskertest.ID(id), diskertest.ExpiresAt(start.Add(30*time.Second)))
	kit.Advance(30 * time.Second)
	ds := kit.Drain()
	if got := outcomes(ds); len(got) != 2 || got[0] != diskertest.Expired || got[1] != diskertest.Handled {
		t.Fatalf("at the expiry: got %v, want [expired handled]", got)
	}
	kit.RequireReply("s", diskertest.InReplyTo(id), diskertest.ErrorCode(disker.CodeExpired))
}

func TestTimeoutNoticeToTheTimeoutHandler(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	var timedOut []string
	must(t, d.OnTimeout("s", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
		timedOut = append(timedOut, m.ID)
	})))
	must(t, d.Handle("r", failing(0)))
	id := send(t, kit, disker.Message{Sender: "s", Receiver: "r"}, disker.WithTimeout(5*time.Second))
	kit.RequireSent("r", diskertest.ID(id), diskertest.Timeout(5*time.Second))

	kit.Advance(5*time.Second - time.Millisecond)
	kit.Drain("s")
	if len(timedOut) != 0 {
		t.Fatalf("before the deadline: timed out %v", timedOut)
	}
	kit.Advance(time.Millisecond)
	ds := kit.Drain()
	if len(timedOut) != 1 || timedOut[0] != id {
		t.Fatalf("at the deadline: timed out %v, want [%s]", timedOut, id)
	}
	if got := outcomes(ds); len(got) != 1 || got[0] != diskertest.Expired {
		t.Fatalf("the message after its deadline: got %v, want it dropped unstarted", got)
	}
	if rs := kit.Replies("s"); len(rs) != 0 {
		t.Fatalf("replies after the timeout: %+v", rs)
	}
}

func TestReplyHandlerRunsInDrain(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	var got []string
	must(t, d.OnReply("s", disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) {
		got = append(got, string(m.Content))
	})))
	must(t, d.Handle("upper", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		return []byte("HELLO"), nil
	})))
	send(t, kit, disker.Message{Sender: "s", Receiver: "upper", Content: []byte("hello")})
	kit.Drain("upper")
	if len(got) != 0 {
		t.Fatalf("Drain(\"upper\") ran the reply handler of s: %v", got)
	}
	kit.Drain()
	if len(got) != 1 || got[0] != "HELLO" {
		t.Fatalf("reply handler: got %v, want [HELLO]", got)
	}
}

func TestDrainRunsWhatHandlersSend(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	must(t, d.Handle("order", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		_, err := d.Send(ctx, disker.Message{Receiver: "invoice", Content: m.Content})
		return nil, err
	})))
	must(t, d.Handle("invoice", failing(0)))
	send(t, kit, disker.Message{Receiver: "order", Content: []byte("42")})
	ds := kit.Drain()
	if len(ds) != 2 || ds[0].Message.Receiver != "order" || ds[1].Message.Receiver != "invoice" {
		t.Fatalf("got %+v, want the order then the invoice it sent", ds)
	}
	kit.RequireDelivered("invoice", diskertest.Content("42"), diskertest.Ended(diskertest.Handled))
}

func TestSchedulesTickAtEachInterval(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t, diskertest.WithStart(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)))
	d := kit.Disker()
	var ticks atomic.Int64
	must(t, d.Handle("report", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		ticks.Add(1)
		return nil, nil
	})))
	ctx := context.Background()
	must(t, d.Schedule(ctx, disker.Schedule{Name: "every-minute", Receiver: "report", Every: time.Minute}))
	must(t, d.Schedule(ctx, disker.Schedule{Name: "hourly", Receiver: "report", Cron: "0 * * * *", Content: []byte("hourly")}))
	kit.Advance(time.Hour)
	if n := len(kit.Sent("report")); n != 61 {
		t.Fatalf("after an hour: %d ticks sent, want 61 (60 of every-minute, 1 of hourly)", n)
	}
	kit.RequireSent("report", diskertest.FromSchedule("hourly"), diskertest.Content("hourly"),
		diskertest.Header(disker.HeaderTick, "2030-01-01T01:00:00.000Z"))
	kit.Drain()
	if ticks.Load() != 61 {
		t.Fatalf("handled %d ticks, want 61", ticks.Load())
	}
	kit.Advance(23 * time.Hour)
	hourly := 0
	for _, s := range kit.Sent("report") {
		if s.Schedule == "hourly" {
			hourly++
		}
	}
	if hourly != 24 {
		t.Fatalf("after a day: %d hourly ticks, want 24", hourly)
	}
}

func TestLeaseOnTheKitsClock(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	started := make(chan struct{})
	must(t, d.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		close(started)
		<-ctx.Done() // until Unhandle gives up on it
		return nil, ctx.Err()
	}), disker.WithLease(time.Minute)))
	send(t, kit, disker.Message{Receiver: "slow"})
	drained := make(chan []diskertest.Delivery)
	go func() { drained <- kit.Drain("slow") }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if err := d.Unhandle(ctx, "slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Unhandle: got %v, want the handler given up on", err)
	}
	if ds := <-drained; len(ds) != 1 || ds[0].Outcome != diskertest.Unsettled {
		t.Fatalf("the handler stopped: got %+v, want it unsettled", ds)
	}
	must(t, d.Handle("slow", failing(0), disker.WithLease(time.Minute)))
	kit.Advance(time.Minute - time.Millisecond)
	if ds := kit.Drain(); len(ds) != 0 {
		t.Fatalf("within the lease: Drain ran %d", len(ds))
	}
	kit.Advance(time.Millisecond)
	if ds := kit.Drain(); len(ds) != 1 || ds[0].Message.Attempt != 2 || ds[0].Outcome != diskertest.Handled {
		t.Fatalf("after the lease: got %+v, want attempt 2 handled", ds)
	}
}

func TestRateLimitOnTheKitsClock(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(0), disker.WithRateLimit(1, 1)))
	for i := range 3 {
		send(t, kit, disker.Message{Receiver: "r", Content: []byte(strconv.Itoa(i))})
	}
	if n := len(kit.Drain()); n != 1 {
		t.Fatalf("with one token: ran %d, want 1", n)
	}
	if n := len(kit.Drain()); n != 0 {
		t.Fatalf("with no token and no time passed: ran %d, want 0", n)
	}
	kit.Advance(time.Second)
	if n := len(kit.Drain()); n != 1 {
		t.Fatalf("a second later: ran %d, want 1", n)
	}
}

func TestPauseAndDedupWindow(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	ctx := context.Background()
	must(t, d.Handle("r", failing(0)))
	must(t, d.Pause(ctx, "r"))
	send(t, kit, disker.Message{Receiver: "r"}, disker.WithDedupKey("k", time.Minute))
	if _, err := d.Send(ctx, disker.Message{Receiver: "r"}, disker.WithDedupKey("k", time.Minute)); !errors.Is(err, disker.ErrDuplicate) {
		t.Fatalf("second send within the window: got %v, want ErrDuplicate", err)
	}
	if n := len(kit.Drain()); n != 0 {
		t.Fatalf("paused: ran %d", n)
	}
	must(t, d.Resume(ctx, "r"))
	if n := len(kit.Drain()); n != 1 {
		t.Fatalf("resumed: ran %d, want 1", n)
	}
	kit.Advance(time.Minute)
	send(t, kit, disker.Message{Receiver: "r"}, disker.WithDedupKey("k", time.Minute))
	if n := len(kit.Sent("r")); n != 2 {
		t.Fatalf("after the window: %d sent, want 2 (the duplicate is not Sent)", n)
	}
}

func TestRequest(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	must(t, d.Handle("echo", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		return m.Content, nil
	})))
	must(t, d.Handle("flaky", failing(1)))
	must(t, d.Handle("broken", failing(10), disker.WithMaxAttempts(1)))

	reply, err := kit.Request(disker.Message{Receiver: "echo", Content: []byte("hi")}, disker.WithTimeout(time.Minute))
	if err != nil || string(reply.Content) != "hi" {
		t.Fatalf("Request: got %v, %v, want the reply \"hi\"", reply, err)
	}
	// A Request's timeout is what is left of its context's deadline when
	// it sends, in real time.
	if s := kit.RequireSent("echo", diskertest.Content("hi"), diskertest.Sender("")); !s.Request || s.Timeout <= 59*time.Second || s.Timeout > time.Minute {
		t.Fatalf("the Request's message: got %+v, want Request set and a timeout of about a minute", s)
	}
	if _, err := kit.Request(disker.Message{Receiver: "flaky"}); !errors.Is(err, diskertest.ErrNoReply) {
		t.Fatalf("a Request whose message is retried: got %v, want ErrNoReply", err)
	}
	var re *disker.RemoteError
	if _, err := kit.Request(disker.Message{Receiver: "broken"}); !errors.As(err, &re) || re.Code != disker.CodeDeadLetter {
		t.Fatalf("a Request whose message is dead-lettered: got %v, want a RemoteError %s", err, disker.CodeDeadLetter)
	}
	var ve *disker.ValidationError
	if _, err := kit.Request(disker.Message{Receiver: ""}); !errors.As(err, &ve) {
		t.Fatalf("a bad Request: got %v, want a ValidationError", err)
	}
}

func TestAdvanceKeepsTheInstanceAlive(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	ctx := context.Background()
	must(t, d.Handle("echo", failing(0)))
	if _, err := kit.Request(disker.Message{Receiver: "echo"}); err != nil { // opens the inbox
		t.Fatal(err)
	}
	kit.Advance(24 * time.Hour)
	ws, err := d.Workers(ctx)
	if err != nil || len(ws) != 1 || ws[0].ID != d.ID() {
		t.Fatalf("Workers a day later: got %v, %v, want the kit's instance", ws, err)
	}
	if reply, err := kit.Request(disker.Message{Receiver: "echo"}); err != nil || string(reply.Content) != "ok" {
		t.Fatalf("Request a day later: got %v, %v", reply, err)
	}
}

func TestCancelAndFateWithAClockFarFromTheLocalOne(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t, diskertest.WithStart(time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)))
	d := kit.Disker()
	ctx := context.Background()
	must(t, d.Handle("r", failing(0)))
	a := send(t, kit, disker.Message{Receiver: "r"})
	b := send(t, kit, disker.Message{Receiver: "r"}, disker.WithDelay(time.Hour))
	if f, err := d.Fate(ctx, "r", a); err != nil || f.State != disker.MessageQueued {
		t.Fatalf("Fate: got %+v, %v, want queued", f, err)
	}
	if res, err := d.Cancel(ctx, "r", b); err != nil || res != disker.CancelDeferred {
		t.Fatalf("Cancel: got %v, %v, want the deferred message cancelled", res, err)
	}
	kit.Advance(time.Hour)
	if ds := kit.Drain(); len(ds) != 1 || ds[0].Message.ID != a {
		t.Fatalf("got %+v, want only the message not cancelled", ds)
	}
}

// TestKitsInParallel runs many kits at once: each has its own broker and
// clock, so what one sends and advances the others never see.
func TestKitsInParallel(t *testing.T) {
	t.Parallel()
	for i := range 8 {
		t.Run(strconv.Itoa(i), func(t *testing.T) {
			t.Parallel()
			kit := diskertest.New(t)
			must(t, kit.Disker().Handle("r", failing(0)))
			send(t, kit, disker.Message{Receiver: "r", Content: []byte(strconv.Itoa(i))}, disker.WithDelay(time.Duration(i+1)*time.Second))
			kit.Advance(time.Duration(i+1) * time.Second)
			ds := kit.Drain()
			if len(ds) != 1 || string(ds[0].Message.Content) != strconv.Itoa(i) {
				t.Fatalf("kit %d: got %+v, want its own message only", i, ds)
			}
		})
	}
}

// TestHandlerDeadline: a handler's context carries the message's deadline
// as the local time the kit's clock would take to reach it, however far
// the clock has moved; the Delivery reports it on the kit's clock.
func TestHandlerDeadline(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	var left time.Duration
	var msgDeadline, ctxDeadline time.Time
	must(t, d.Handle("r", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		ctxDeadline, _ = ctx.Deadline()
		msgDeadline, left = m.Deadline, time.Until(m.Deadline)
		return nil, nil
	})))
	kit.Advance(48 * time.Hour)
	send(t, kit, disker.Message{Sender: "s", Receiver: "r"}, disker.WithTimeout(time.Hour), disker.WithDelay(time.Minute))
	kit.Advance(time.Minute + 20*time.Minute)
	ds := kit.Drain()
	// Each is the local time read when it was set: within the
	// microseconds between the two readings.
	if skew := ctxDeadline.Sub(msgDeadline).Abs(); left <= 39*time.Minute || left > 40*time.Minute || skew > time.Millisecond {
		t.Fatalf("the handler's deadline: %v from now (ctx's %v, the message's %v), want 40 minutes", left, ctxDeadline, msgDeadline)
	}
	if want := kit.Now().Add(40 * time.Minute); len(ds) != 1 || !ds[0].Message.Deadline.Equal(want) {
		t.Fatalf("the Delivery's deadline: got %+v, want %v on the kit's clock", ds, want)
	}
}

// TestRequestWaitsInRealTime pins what the package doc says of a Request
// whose context ends before its message is settled: the kit's clock has
// not reached the deadline that decides it, so the outcome is unknown.
func TestRequestWaitsInRealTime(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	must(t, kit.Disker().Handle("r", failing(0)))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := kit.Disker().Request(ctx, disker.Message{Receiver: "r"}); !errors.Is(err, disker.ErrOutcomeUnknown) {
		t.Fatalf("a Request whose deadline passed in real time: got %v, want ErrOutcomeUnknown", err)
	}
}

// TestGlobalConcurrencyAndPool: Drain takes a global concurrency slot for
// each message it runs and gives them back when it returns; a receiver
// served from a pool runs while the pool has a worker ready.
func TestGlobalConcurrencyAndPool(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	d := kit.Disker()
	must(t, d.Handle("r", failing(0), disker.WithGlobalConcurrency(1)))
	p, err := pool.New(pool.Config[int]{Name: "ints", Size: 1, New: func(context.Context) (int, error) { return 7, nil }})
	must(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	must(t, disker.HandleWithPool(d, "pooled", p, func(_ context.Context, w int, _ *disker.Message) ([]byte, error) {
		return nil, nil
	}))
	for range 3 {
		send(t, kit, disker.Message{Receiver: "r"})
		send(t, kit, disker.Message{Receiver: "pooled"})
	}
	if got := outcomes(kit.Drain()); len(got) != 6 {
		t.Fatalf("ran %v, want 6 handled", got)
	}
	if held := d.LocalStats().Receivers["r"].HeldSlots; held != 0 {
		t.Fatalf("slots held after Drain: %d", held)
	}
	kit.RequireDelivered("pooled", diskertest.Ended(diskertest.Handled))
}

// TestGroups: a key's messages run in its order, its failed message holds
// it until its retry succeeds (the default), and the deliveries carry the
// key.
func TestGroups(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	var order []string
	must(t, kit.Disker().Handle("g", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		order = append(order, string(m.Content)+"/"+strconv.Itoa(m.Attempt))
		if string(m.Content) == "a0" && m.Attempt == 1 {
			return nil, errors.New("first attempt fails")
		}
		return nil, nil
	}), disker.WithBackoff(func(int) time.Duration { return time.Second })))
	for _, c := range []string{"a0", "a1", "b0"} {
		send(t, kit, disker.Message{Receiver: "g", Content: []byte(c)}, disker.WithGroup(c[:1]))
	}
	kit.Drain()
	kit.Advance(time.Second)
	kit.Drain()
	if got, want := fmt.Sprint(order), "[a0/1 b0/1 a0/2 a1/1]"; got != want {
		t.Fatalf("order: %s, want %s", got, want)
	}
	kit.RequireDelivered("g", diskertest.Content("a1"), diskertest.Group("a"))
}
