package disker_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/broker"
)

// raceSpan returns the longest timeout to draw for a race of replies
// against their timeouts on worker's backend: twice the median round trip
// of Requests made 32 at a time to a receiver of worker that works as the
// race's does (at least 10ms), so that both outcomes occur however slow
// the machine is (the race detector, a loaded host, the Cluster).
func raceSpan(t *testing.T, worker, client *disker.Disker) time.Duration {
	t.Helper()
	if err := worker.Handle("race-warm", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
		return nil, nil
	}), disker.WithConcurrency(64)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var took []time.Duration
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 10 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				start := time.Now()
				_, err := client.Request(ctx, disker.Message{Receiver: "race-warm"})
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				took = append(took, time.Since(start))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	// A Request may return its reply before the worker counts it (the
	// count follows the broker's answer to the replier): wait for the
	// counts, so that the rounds after count only their own replies.
	waitFor(t, time.Minute, "the worker to count the warm-up's replies", func() bool {
		return worker.LocalStats().Receivers["race-warm"].Processed == 32*10
	})
	slices.Sort(took)
	span := max(10*time.Millisecond, 2*took[len(took)/2])
	t.Logf("round trips 32 at a time: median %v; timeouts drawn up to %v", took[len(took)/2], span)
	return span
}

// TestReplyRacesTimeout races 10,000 replies against their own timeouts:
// each message gets exactly one outcome at its sender, and both outcomes
// occur (the timeouts are drawn around the round trip measured first:
// see raceSpan and raceUntilBoth).
func TestReplyRacesTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 10000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("race", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			// Work that ignores ctx: its reply may come after the deadline.
			time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond)
			return []byte("r"), nil
		}), disker.WithConcurrency(64)); err != nil {
			t.Fatal(err)
		}
		span := raceSpan(t, worker, client)
		var mu sync.Mutex
		outcomes := make(map[string][]byte, n)
		// At most 64 messages wait for their outcome at a time, so that
		// they race their timeouts instead of a backlog.
		inFlight := make(chan struct{}, 64)
		record := func(id string, kind byte) {
			mu.Lock()
			outcomes[id] = append(outcomes[id], kind)
			first := len(outcomes[id]) == 1
			mu.Unlock()
			if first {
				select {
				case <-inFlight:
				default:
				}
			}
		}
		if err := client.OnReply("racer", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { record(r.InReplyTo, 'r') })); err != nil {
			t.Fatal(err)
		}
		if err := client.OnTimeout("racer", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { record(m.ID, 't') })); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 3*time.Minute)
		// round races n messages with timeouts up to span, checks that
		// each got exactly one outcome, agreed with the worker, and
		// returns how many of each.
		round := func(span time.Duration) (replies, timeouts int) {
			base := worker.LocalStats()
			ids := make(chan string, n)
			var wg sync.WaitGroup
			for p := range 32 {
				wg.Go(func() {
					for i := p; i < n; i += 32 {
						timeout := time.Millisecond + rand.N(span-time.Millisecond)
						select {
						case inFlight <- struct{}{}:
						case <-ctx.Done():
							t.Error(ctx.Err())
							return
						}
						id, err := client.Send(ctx, disker.Message{Sender: "racer", Receiver: "race"}, disker.WithTimeout(timeout))
						if err != nil {
							t.Error(err)
							return
						}
						ids <- id
					}
				})
			}
			wg.Wait()
			close(ids)
			if t.Failed() {
				t.FailNow()
			}
			settled := func() bool {
				s, b := worker.LocalStats().Receivers["race"], base.Receivers["race"]
				return s.Processed+s.Expired-b.Processed-b.Expired == n
			}
			var mine []string
			for id := range ids {
				mine = append(mine, id)
			}
			waitFor(t, 3*time.Minute, "every message settled by the worker and every outcome at the sender", func() bool {
				mu.Lock()
				defer mu.Unlock()
				for _, id := range mine {
					if len(outcomes[id]) == 0 {
						return false
					}
				}
				return settled()
			})
			mu.Lock()
			defer mu.Unlock()
			for _, id := range mine {
				o := outcomes[id]
				if len(o) != 1 {
					t.Fatalf("message %s had outcomes %q, want exactly one", id, o)
				}
				if o[0] == 'r' {
					replies++
				} else {
					timeouts++
				}
			}
			ws := worker.LocalStats()
			replied, late := ws.Replied-base.Replied, ws.Late-base.Late
			expired := ws.Receivers["race"].Expired - base.Receivers["race"].Expired
			t.Logf("timeouts up to %v: %d replies, %d timeouts (worker: %d replies accepted, %d late, %d expired unstarted)",
				span, replies, timeouts, replied, late, expired)
			if int64(replies) != replied {
				t.Fatalf("the sender got %d replies, the broker accepted %d", replies, replied)
			}
			if replied+late+expired != n {
				t.Fatalf("worker: replied %d + late %d + expired %d != %d", replied, late, expired, n)
			}
			return replies, timeouts
		}
		raceUntilBoth(t, span, round)
	})
}

// raceUntilBoth runs round, a race of replies against their timeouts
// drawn up to span, until a round has both outcomes: doubling span after
// a round of timeouts alone (the machine was slower than raceSpan
// measured), halving it after one of replies alone; four rounds at most.
// Each round checks the contract on its own.
func raceUntilBoth(t *testing.T, span time.Duration, round func(time.Duration) (replies, timeouts int)) {
	t.Helper()
	for try := 1; ; try++ {
		replies, timeouts := round(span)
		if replies > 0 && timeouts > 0 {
			return
		}
		if try == 4 {
			t.Fatalf("replies %d, timeouts %d after %d rounds: the race needs both outcomes", replies, timeouts, try)
		}
		if replies == 0 {
			span *= 2
		} else {
			span = max(span/2, 2*time.Millisecond)
		}
	}
}

// handledSet records which messages were handled successfully.
type handledSet struct {
	mu  sync.Mutex
	ids map[string]int
}

func newHandledSet() *handledSet { return &handledSet{ids: make(map[string]int)} }

func (h *handledSet) add(id string) {
	h.mu.Lock()
	h.ids[id]++
	h.mu.Unlock()
}

// missing returns how many of ids were not handled.
func (h *handledSet) missing(ids []string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, id := range ids {
		if h.ids[id] == 0 {
			n++
		}
	}
	return n
}

func (h *handledSet) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids)
}

// TestCloseDuringLoadLosesNothing closes a worker in the middle of a load,
// with a grace too short for its long jobs, and shows that a second worker
// handles every accepted message.
func TestCloseDuringLoadLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 2000
	eachBackend(t, func(t *testing.T, e *env) {
		sender := e.open()
		handled := newHandledSet()
		h := disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			work := 200 * time.Microsecond
			if m.Content[0] == 'L' {
				work = 2 * time.Second // a long job that the first worker cannot finish
			}
			select {
			case <-time.After(work):
				handled.add(m.ID)
				return nil, nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
		first, err := disker.New(context.Background(), e.config())
		if err != nil {
			t.Fatal(err)
		}
		if err := first.Handle("load", h, disker.WithConcurrency(16), disker.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
		var (
			mu  sync.Mutex
			ids []string
		)
		ctx := ctxTimeout(t, 2*time.Minute)
		// Four long jobs first, so that they are in flight at Close.
		for range 4 {
			id, err := sender.Send(ctx, disker.Message{Receiver: "load", Content: []byte("L")})
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		var wg sync.WaitGroup
		for p := range 4 {
			wg.Go(func() {
				for i := p; i < n; i += 4 {
					id, err := sender.Send(ctx, disker.Message{Receiver: "load", Content: []byte("s")})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					ids = append(ids, id)
					mu.Unlock()
				}
			})
		}
		waitFor(t, time.Minute, "the first worker to handle some", func() bool { return handled.len() >= n/5 })
		cctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err = first.Close(cctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close with long jobs in flight = %v, want DeadlineExceeded", err)
		}
		abandoned := handled.len()
		second := e.open()
		if err := second.Handle("load", h, disker.WithConcurrency(16), disker.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		waitFor(t, 2*time.Minute, "every accepted message handled", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return handled.missing(ids) == 0
		})
		t.Logf("first worker handled %d before Close; %d messages in all", abandoned, len(ids))
		waitFor(t, 10*time.Second, "an empty queue", func() bool {
			s, err := second.Stats(context.Background(), "load")
			return err == nil && s.Length == 0 && s.Pending == 0
		})
	})
}

// TestManyReceiversDoNotStarveSends serves 500 receivers from one instance
// with the default connection pool; sends and replies still go through.
func TestManyReceiversDoNotStarveSends(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const receivers = 500
	eachBackend(t, func(t *testing.T, e *env) {
		cfg := func(c *disker.Config) { c.ReceiverBlockTimeout = 0 } // the default, 1s
		d := e.open(cfg)
		for i := range receivers {
			if err := d.Handle(fmt.Sprintf("r%d", i), disker.HandlerFunc(echo), disker.WithConcurrency(1)); err != nil {
				t.Fatal(err)
			}
		}
		// Generous: starved sends would wait for ever; a loaded machine
		// running the race detector takes its time with 500 receivers.
		ctx := ctxTimeout(t, 3*time.Minute)
		var wg sync.WaitGroup
		for i := 0; i < receivers; i += 10 {
			wg.Go(func() {
				r, err := d.Request(ctx, disker.Message{Receiver: fmt.Sprintf("r%d", i), Content: []byte("x")})
				if err != nil {
					t.Errorf("Request r%d: %v", i, err)
					return
				}
				if string(r.Content) != "echo:x" {
					t.Errorf("reply %q", r.Content)
				}
			})
		}
		wg.Wait()
	})
}

func TestRetriesWithBackoffThenDeadLetter(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		type call struct {
			attempt int
			at      time.Time
		}
		calls := make(chan call, 10)
		backoff := func(attempt int) time.Duration { return time.Duration(attempt) * 40 * time.Millisecond }
		if err := d.Handle("flaky", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls <- call{m.Attempt, time.Now()}
			return nil, errors.New("boom")
		}), disker.WithMaxAttempts(3), disker.WithBackoff(backoff)); err != nil {
			t.Fatal(err)
		}
		replies := make(chan *disker.Message, 1)
		if err := d.OnReply("client", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { replies <- r })); err != nil {
			t.Fatal(err)
		}
		id, err := d.Send(ctxTimeout(t, 5*time.Second), disker.Message{Sender: "client", Receiver: "flaky", Content: []byte("p")})
		if err != nil {
			t.Fatal(err)
		}
		var prev time.Time
		for want := 1; want <= 3; want++ {
			c := recv(t, calls, 10*time.Second, fmt.Sprintf("attempt %d", want))
			if c.attempt != want {
				t.Fatalf("attempt %d, want %d", c.attempt, want)
			}
			// The retry never comes before its backoff (a lower bound only;
			// 10ms of slack for the clock offset estimate).
			if want > 1 && c.at.Sub(prev) < backoff(want-1)-10*time.Millisecond {
				t.Fatalf("attempt %d came %v after attempt %d, before its backoff of %v", want, c.at.Sub(prev), want-1, backoff(want-1))
			}
			prev = c.at
		}
		r := recv(t, replies, 10*time.Second, "the error reply")
		if r.InReplyTo != id || r.Error == nil || r.Error.Code != disker.CodeDeadLetter || !strings.Contains(r.Error.Text, "boom") {
			t.Fatalf("reply = %+v, want a dead_letter error reply to %s", r, id)
		}
		dls, err := d.DeadLetters(context.Background(), "flaky", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || dls[0].Message.ID != id || dls[0].Attempts != 3 || string(dls[0].Message.Content) != "p" ||
			!strings.Contains(dls[0].Reason, "boom") || !strings.Contains(dls[0].Reason, "attempt 3 of 3") {
			t.Fatalf("dead letters = %+v, want %s after 3 attempts with the reason", dls, id)
		}
		s := d.LocalStats().Receivers["flaky"]
		if s.Failed != 3 || s.Retried != 2 || s.DeadLettered != 1 || s.Processed != 0 {
			t.Fatalf("LocalStats = %+v, want 3 failed, 2 retried, 1 dead-lettered", s)
		}
		select {
		case c := <-calls:
			t.Fatalf("attempt %d after the dead letter", c.attempt)
		default:
		}
	})
}

func TestNoRetryDeadLettersAtOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		var calls atomic.Int64
		if err := d.Handle("strict", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls.Add(1)
			return nil, disker.NoRetry(errors.New("bad input"))
		}), disker.WithMaxAttempts(5)); err != nil {
			t.Fatal(err)
		}
		_, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "strict", Content: []byte("x")})
		var re *disker.RemoteError
		if !errors.As(err, &re) || re.Code != disker.CodeDeadLetter || re.Text != "bad input" {
			t.Fatalf("Request = %v, want a RemoteError dead_letter: bad input", err)
		}
		dls, err := d.DeadLetters(context.Background(), "strict", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || dls[0].Attempts != 1 || !strings.Contains(dls[0].Reason, "NoRetry") || !strings.Contains(dls[0].Reason, "bad input") {
			t.Fatalf("dead letters = %+v, want one after 1 attempt", dls)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("handler called %d times, want 1", n)
		}
	})
}

func TestPanicIsAnError(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		if err := d.Handle("once", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if m.Attempt == 1 {
				panic("kaboom")
			}
			return []byte("ok"), nil
		}), disker.WithBackoff(func(int) time.Duration { return 0 })); err != nil {
			t.Fatal(err)
		}
		r, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "once"})
		if err != nil || string(r.Content) != "ok" {
			t.Fatalf("Request = %v, %v; want ok after a retry", r, err)
		}
		if err := d.Handle("always", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			panic(fmt.Errorf("kaboom %d", m.Attempt))
		}), disker.WithMaxAttempts(1)); err != nil {
			t.Fatal(err)
		}
		_, err = d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "always"})
		var re *disker.RemoteError
		if !errors.As(err, &re) || re.Text != "panic: kaboom 1" {
			t.Fatalf("Request = %v, want RemoteError panic: kaboom 1", err)
		}
		dls, err := d.DeadLetters(context.Background(), "always", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) != 1 || !strings.Contains(dls[0].Reason, "kaboom 1") || !strings.Contains(dls[0].Reason, "goroutine ") {
			t.Fatalf("dead letters = %+v, want the panic with its stack", dls)
		}
	})
}

func TestLeaseExtendedForLongJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		var calls atomic.Int64
		started := make(chan struct{})
		if err := d.Handle("long", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls.Add(1)
			close(started)
			select {
			case <-time.After(2 * time.Second): // 5 leases
				return []byte("done"), nil
			case <-ctx.Done():
				return nil, fmt.Errorf("ctx ended: %w", context.Cause(ctx))
			}
		}), disker.WithLease(400*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		type result struct {
			r   *disker.Message
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "long"})
			done <- result{r, err}
		}()
		recv(t, started, 10*time.Second, "the job to start")
		// A second instance now competes for the receiver: it would take
		// the message if the lease lapsed.
		other := e.open()
		if err := other.Handle("long", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			calls.Add(1)
			return nil, errors.New("the lease lapsed: redelivered")
		}), disker.WithLease(400*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		res := recv(t, done, 15*time.Second, "the reply")
		if res.err != nil || string(res.r.Content) != "done" {
			t.Fatalf("Request = %v, %v; want done", res.r, res.err)
		}
		if n := calls.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want 1", n)
		}
		waitFor(t, 10*time.Second, "an empty queue", func() bool {
			s, err := d.Stats(context.Background(), "long")
			return err == nil && s.Length == 0 && s.Pending == 0
		})
		if n := calls.Load(); n != 1 {
			t.Fatalf("the handler ran %d times, want 1", n)
		}
	})
}

// TestRequestRacesTimeout races 10,000 Requests against their deadlines: a
// Request that returned a reply is exactly one whose reply the broker
// accepted, and one that timed out is one whose reply was refused (ErrLate)
// or never made. One that could not learn its outcome within RequestGrace
// (ErrOutcomeUnknown, a process too busy to read its inbox in time) claims
// neither: the broker accepted at least as many replies as the Requests
// returned, and no more than those and the unknown ones.
func TestRequestRacesTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 10000
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("race", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			time.Sleep(time.Duration(rand.N(2000)) * time.Microsecond) // ignores ctx
			return []byte("r"), nil
		}), disker.WithConcurrency(32)); err != nil {
			t.Fatal(err)
		}
		span := raceSpan(t, worker, client)
		round := func(span time.Duration) (int, int) {
			base, sentBefore := worker.LocalStats(), client.LocalStats().Sent
			var replies, timeouts, unknown atomic.Int64
			var wg sync.WaitGroup
			for p := range 32 {
				wg.Go(func() {
					for i := p; i < n; i += 32 {
						ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond+rand.N(span-time.Millisecond))
						r, err := client.Request(ctx, disker.Message{Receiver: "race"})
						cancel()
						switch {
						case err == nil && string(r.Content) == "r":
							replies.Add(1)
						case errors.Is(err, disker.ErrTimeout):
							timeouts.Add(1)
						case errors.Is(err, disker.ErrOutcomeUnknown):
							unknown.Add(1)
						default:
							t.Errorf("Request = %v, %v", r, err)
							return
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			// A Request whose deadline passed before it was sent did not send.
			sent := client.LocalStats().Sent - sentBefore
			b := base.Receivers["race"]
			waitFor(t, time.Minute, "the worker to settle every message", func() bool {
				s := worker.LocalStats().Receivers["race"]
				return s.Processed+s.Expired-b.Processed-b.Expired == sent
			})
			ws := worker.LocalStats()
			replied, late, expired := ws.Replied-base.Replied, ws.Late-base.Late, ws.Receivers["race"].Expired-b.Expired
			t.Logf("timeouts up to %v: %d replies, %d timeouts, %d outcomes unknown (worker: %d accepted, %d late, %d expired)", span, replies.Load(), timeouts.Load(), unknown.Load(), replied, late, expired)
			if replied < replies.Load() || replied > replies.Load()+unknown.Load() {
				t.Fatalf("Request returned %d replies and %d unknown outcomes, the broker accepted %d", replies.Load(), unknown.Load(), replied)
			}
			return int(replies.Load()), int(timeouts.Load())
		}
		raceUntilBoth(t, span, round)
	})
}

// TestLeaseLostCancelsHandler steals a delivery from a running handler
// (another consumer claims it once its lease looks expired): the handler's
// context ends with ErrLeaseLost, and the worker leaves the message to the
// new holder instead of acknowledging it.
func TestLeaseLostCancelsHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		b := rawBroker(t, e)
		victim := "victim-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		d := e.open(func(c *disker.Config) { c.InstanceID = victim })
		started := make(chan struct{})
		cause := make(chan error, 1)
		if err := d.Handle("stolen", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			return []byte("ignored"), nil // success after the loss is discarded too
		}), disker.WithLease(300*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 20*time.Second)
		id, err := d.Send(ctx, disker.Message{Receiver: "stolen"})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, started, 10*time.Second, "the handler to start")
		stolen := steal(t, b, victim, "stolen", 1)
		if stolen[0].Env.ID != id || stolen[0].Attempt != 2 {
			t.Fatalf("stole %s attempt %d, want %s attempt 2", stolen[0].Env.ID, stolen[0].Attempt, id)
		}
		if err := recv(t, cause, 10*time.Second, "the handler's context to end"); !errors.Is(err, disker.ErrLeaseLost) {
			t.Fatalf("cause = %v, want ErrLeaseLost", err)
		}
		// The worker did not acknowledge: the thief still holds it.
		waitFor(t, 10*time.Second, "the worker to let go", func() bool { return d.LocalStats().Receivers["stolen"].InFlight == 0 })
		if lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: "stolen", Consumer: "thief", Refs: []string{stolen[0].Ref}, Lease: time.Minute}); err != nil || len(lost) != 0 {
			t.Fatalf("thief's Extend = %v, %v; want the lease still held", lost, err)
		}
		if s := d.LocalStats().Receivers["stolen"]; s.Processed != 0 || s.Failed != 0 {
			t.Fatalf("LocalStats = %+v, want nothing settled", s)
		}
		if err := b.Ack(ctx, "stolen", stolen[0].Ref); err != nil {
			t.Fatal(err)
		}
	})
}

// TestUnhandleDrains stops serving a receiver: Unhandle waits for the
// handler in flight, and with a grace too short it cancels the handler and
// leaves the message for redelivery.
func TestUnhandleDrains(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		started := make(chan struct{}, 1)
		release := make(chan struct{})
		stopped := make(chan error, 1)
		h := disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			started <- struct{}{}
			select {
			case <-release:
				return nil, nil
			case <-ctx.Done():
				stopped <- context.Cause(ctx)
				return nil, ctx.Err()
			}
		})
		stats := func() disker.ReceiverStats {
			s, err := d.Stats(ctx, "drain")
			if err != nil {
				t.Fatal(err)
			}
			return s
		}

		// Graceful: Unhandle returns once the handler has finished.
		if err := d.Handle("drain", h, disker.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "drain"}); err != nil {
			t.Fatal(err)
		}
		recv(t, started, 10*time.Second, "the handler to start")
		done := make(chan error, 1)
		go func() { done <- d.Unhandle(ctx, "drain") }()
		select {
		case err := <-done:
			t.Fatalf("Unhandle returned %v while the handler ran", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(release)
		if err := recv(t, done, 10*time.Second, "Unhandle"); err != nil {
			t.Fatalf("Unhandle = %v", err)
		}
		if s := stats(); s.Length != 0 || s.Pending != 0 {
			t.Fatalf("after a drained Unhandle: %+v, want an empty queue", s)
		}

		// Forced: the grace ends first.
		release = make(chan struct{})
		if err := d.Handle("drain", h, disker.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
		id, err := d.Send(ctx, disker.Message{Receiver: "drain"})
		if err != nil {
			t.Fatal(err)
		}
		recv(t, started, 10*time.Second, "the handler to start")
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		err = d.Unhandle(short, "drain")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Unhandle with a short grace = %v, want DeadlineExceeded", err)
		}
		if cause := recv(t, stopped, time.Second, "the handler's cause"); cause == nil {
			t.Fatal("the handler's context ended without a cause")
		}
		if s := stats(); s.Length != 1 || s.Pending != 1 {
			t.Fatalf("after a forced Unhandle: %+v, want the message pending", s)
		}
		got := make(chan *disker.Message, 1)
		if err := d.Handle("drain", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			got <- m
			return nil, nil
		}), disker.WithLease(time.Second)); err != nil {
			t.Fatal(err)
		}
		if m := recv(t, got, 10*time.Second, "the redelivery"); m.ID != id || m.Attempt != 2 {
			t.Fatalf("redelivered %s attempt %d, want %s attempt 2", m.ID, m.Attempt, id)
		}
	})
}
