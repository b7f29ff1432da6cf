package disker_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestDelayedSend sends messages for later with WithDelay and
// WithDeliverAt (Send, SendBatch, Request): none is handled before its due
// time, each counts as scheduled until then, and a time that has passed
// delivers at once.
func TestDelayedSend(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		type got struct {
			content string
			at      time.Time
		}
		seen := make(chan got, 10)
		if err := d.Handle("later", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			seen <- got{string(m.Content), time.Now()}
			return []byte("ok:" + string(m.Content)), nil
		}), disker.WithConcurrency(4)); err != nil {
			t.Fatal(err)
		}
		const delay = 400 * time.Millisecond
		sent := time.Now()
		if _, err := d.Send(ctx, disker.Message{Receiver: "later", Content: []byte("delay")}, disker.WithDelay(delay)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "later", Content: []byte("at")}, disker.WithDeliverAt(sent.Add(delay))); err != nil {
			t.Fatal(err)
		}
		if _, err := d.SendBatch(ctx, []disker.Message{{Receiver: "later", Content: []byte("batch")}}, disker.WithDelay(delay)); err != nil {
			t.Fatal(err)
		}
		st, err := d.Stats(ctx, "later")
		if err != nil {
			t.Fatal(err)
		}
		if time.Since(sent) < delay && st.Scheduled == 0 {
			t.Fatalf("Stats before the due time: %+v, want scheduled messages", st)
		}
		// A Request's timeout counts from its delivery: 50ms would be
		// long past at the due time if it counted from the send.
		reply, err := d.Request(ctx, disker.Message{Receiver: "later", Content: []byte("request")}, disker.WithDelay(delay), disker.WithTimeout(2*time.Second))
		if err != nil || string(reply.Content) != "ok:request" {
			t.Fatalf("Request with a delay: %v, %v", reply, err)
		}
		for range 4 {
			g := recv(t, seen, 10*time.Second, "a delayed message")
			// The broker decides by its clock, to the millisecond; this
			// machine's clock is the same one.
			if early := sent.Add(delay - 2*time.Millisecond).Sub(g.at); early > 0 && g.content != "request" {
				t.Fatalf("%s handled %v before its due time", g.content, early)
			}
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "later", Content: []byte("past")}, disker.WithDeliverAt(time.Now().Add(-time.Hour))); err != nil {
			t.Fatal(err)
		}
		if g := recv(t, seen, 10*time.Second, "a message due in the past"); g.content != "past" {
			t.Fatalf("got %q, want the message due in the past", g.content)
		}
		waitFor(t, 10*time.Second, "no scheduled messages", func() bool {
			st, err := d.Stats(ctx, "later")
			return err == nil && st.Scheduled == 0 && st.Length == 0
		})
	})
}

// TestDelayValidation: bad delays and delivery times are *ValidationErrors
// naming the option, and nothing is sent.
func TestDelayValidation(t *testing.T) {
	d := newEnv(t, false, "").open()
	ctx := ctxTimeout(t, 10*time.Second)
	msg := disker.Message{Receiver: "r", Content: []byte("x")}
	for _, tc := range []struct {
		field string
		opts  []disker.SendOption
	}{
		{"WithDelay", []disker.SendOption{disker.WithDelay(-time.Second)}},
		{"WithDelay", []disker.SendOption{disker.WithDelay(time.Microsecond)}},
		{"WithDelay", []disker.SendOption{disker.WithDelay(disker.MaxDelay + time.Hour)}},
		{"WithDelay", []disker.SendOption{disker.WithDelay(time.Second), disker.WithDeliverAt(time.Now())}},
		{"WithDeliverAt", []disker.SendOption{disker.WithDeliverAt(time.Time{})}},
		{"WithDeliverAt", []disker.SendOption{disker.WithDeliverAt(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))}},
	} {
		_, err := d.Send(ctx, msg, tc.opts...)
		var ve *disker.ValidationError
		if !errors.As(err, &ve) || ve.Field != tc.field {
			t.Errorf("Send with %s: got %v, want a *ValidationError naming %s", tc.field, err, tc.field)
		}
		if _, err := d.SendBatch(ctx, []disker.Message{msg}, tc.opts...); !errors.As(err, &ve) {
			t.Errorf("SendBatch with %s: got %v, want a *ValidationError", tc.field, err)
		}
	}
	// A year is valid.
	if _, err := d.Send(ctx, msg, disker.WithDelay(365*24*time.Hour)); err != nil {
		t.Fatalf("Send with a delay of a year: %v", err)
	}
	// A Request whose deadline comes before its delivery.
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := d.Request(short, msg, disker.WithDelay(time.Second))
	var ve *disker.ValidationError
	if !errors.As(err, &ve) || ve.Field != "WithDelay" {
		t.Fatalf("Request due after its deadline: got %v, want a *ValidationError", err)
	}
	for _, id := range []string{"", "not-an-id", "01J9Z6T000000000000000000U"} {
		if _, err := d.Cancel(ctx, "r", id); !errors.As(err, &ve) || ve.Field != "id" {
			t.Errorf("Cancel %q: got %v, want a *ValidationError naming id", id, err)
		}
	}
	if _, err := d.Cancel(ctx, "", "01j9z6t0000000000000000000"); !errors.As(err, &ve) {
		t.Errorf("Cancel with no receiver: got %v, want a *ValidationError", err)
	}
}

// TestCancel cancels a scheduled, a queued and an in-flight message: the
// first two are never handled and their sender gets the cancelled error;
// the handler of the third sees its context end with the cause
// ErrCancelled, its Request ends with ErrCancelled, and its reply is
// dropped with ErrLate. Cancelling again says not found.
func TestCancel(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		outcomes := make(chan *disker.Message, 10)
		if err := d.OnReply("canceller", disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) { outcomes <- m })); err != nil {
			t.Fatal(err)
		}
		sched, err := d.Send(ctx, disker.Message{Sender: "canceller", Receiver: "work", Content: []byte("scheduled")}, disker.WithDelay(300*time.Millisecond), disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		queued, err := d.Send(ctx, disker.Message{Sender: "canceller", Receiver: "work", Content: []byte("queued")})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			id   string
			want disker.CancelResult
		}{{sched, disker.CancelScheduled}, {queued, disker.CancelQueued}} {
			if got, err := d.Cancel(ctx, "work", c.id); err != nil || got != c.want {
				t.Fatalf("Cancel: got %v, %v; want %v", got, err, c.want)
			}
			m := recv(t, outcomes, 10*time.Second, "the cancelled notice")
			if m.InReplyTo != c.id || m.Error == nil || !errors.Is(m.Error, disker.ErrCancelled) {
				t.Fatalf("outcome of %s: %+v, want a cancelled error", c.id, m)
			}
		}
		type start struct{ id, content string }
		started := make(chan start, 10)
		causes := make(chan error, 10)
		replies := make(chan error, 10)
		// The worker is another instance than the one that cancels.
		w := e.open()
		if err := w.Handle("work", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			started <- start{m.ID, string(m.Content)}
			if string(m.Content) != "blocks" {
				return nil, nil
			}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			replies <- w.Reply(context.Background(), m, []byte("too late"))
			return nil, disker.ErrReplyLater
		})); err != nil {
			t.Fatal(err)
		}
		type result struct {
			reply *disker.Message
			err   error
		}
		done := make(chan result, 1)
		go func() {
			r, err := d.Request(ctx, disker.Message{Receiver: "work", Content: []byte("blocks")})
			done <- result{r, err}
		}()
		got := recv(t, started, 10*time.Second, "the handler")
		if got.content != "blocks" {
			t.Fatalf("handled %q: a cancelled message was handled", got.content)
		}
		id := got.id
		at := time.Now()
		if got, err := d.Cancel(ctx, "work", id); err != nil || got != disker.CancelInFlight {
			t.Fatalf("Cancel in flight: got %v, %v", got, err)
		}
		if cause := recv(t, causes, 10*time.Second, "the handler's cancellation"); !errors.Is(cause, disker.ErrCancelled) {
			t.Fatalf("handler's cause: %v, want ErrCancelled", cause)
		}
		t.Logf("the handler saw the cancellation %v after Cancel", time.Since(at))
		if err := recv(t, replies, 10*time.Second, "the late reply"); !errors.Is(err, disker.ErrLate) {
			t.Fatalf("Reply after the cancellation: %v, want ErrLate", err)
		}
		if r := recv(t, done, 10*time.Second, "the Request"); !errors.Is(r.err, disker.ErrCancelled) {
			t.Fatalf("Request of a cancelled message: %v, %v; want ErrCancelled", r.reply, r.err)
		}
		if got, err := d.Cancel(ctx, "work", id); err != nil || got != disker.CancelNotFound {
			t.Fatalf("Cancel again: got %v, %v; want not found", got, err)
		}
		// The scheduled one never comes, even after its due time.
		if _, err := d.Send(ctx, disker.Message{Receiver: "work", Content: []byte("sentinel")}, disker.WithDelay(500*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, started, 10*time.Second, "the sentinel"); got.content != "sentinel" {
			t.Fatalf("handled %q: a cancelled message was handled", got.content)
		}
	})
}

// TestCancelRaces races 1,000 cancels against handlers that reply: each
// message ends with exactly one outcome at its sender (the reply, or the
// cancelled error), which agrees with what the replier was told (nil, or
// ErrLate) and with what Cancel found. It logs the p99 of the time from
// Cancel to the handler seeing the cause, for the handlers that did.
func TestCancelRaces(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		n := 1000
		if e.url != "" && strings.Contains(t.Name(), "cluster") || testing.Short() {
			n = 200
		}
		d := e.open()
		ctx := ctxTimeout(t, 120*time.Second)
		var mu sync.Mutex
		outcome := map[string][]*disker.Message{}
		replied := map[string]error{}
		sawCause := map[string]time.Time{}
		all := make(chan struct{}, n)
		if err := d.OnReply("racer", disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) {
			mu.Lock()
			outcome[m.InReplyTo] = append(outcome[m.InReplyTo], m)
			mu.Unlock()
			all <- struct{}{}
		})); err != nil {
			t.Fatal(err)
		}
		if err := d.Handle("race", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			select {
			case <-time.After(time.Duration(rand.IntN(300)) * time.Millisecond):
			case <-ctx.Done():
				if errors.Is(context.Cause(ctx), disker.ErrCancelled) {
					mu.Lock()
					sawCause[m.ID] = time.Now()
					mu.Unlock()
				}
			}
			err := d.Reply(context.Background(), m, []byte("done"))
			mu.Lock()
			replied[m.ID] = err
			mu.Unlock()
			return nil, disker.ErrReplyLater
		}), disker.WithConcurrency(64)); err != nil {
			t.Fatal(err)
		}
		results := map[string]disker.CancelResult{}
		cancelAt := map[string]time.Time{}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for range n {
			id, err := d.Send(ctx, disker.Message{Sender: "racer", Receiver: "race"}, disker.WithTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer func() { <-sem; wg.Done() }()
				time.Sleep(time.Duration(rand.IntN(300)) * time.Millisecond) // the race's other side
				at := time.Now()
				res, err := d.Cancel(ctx, "race", id)
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				results[id], cancelAt[id] = res, at
				mu.Unlock()
			}()
		}
		wg.Wait()
		for range n {
			recv(t, all, 60*time.Second, "an outcome")
		}
		// The handlers record what their Reply returned after it returned.
		waitFor(t, 30*time.Second, "the handlers to return", func() bool {
			return d.LocalStats().Receivers["race"].InFlight == 0
		})
		mu.Lock()
		defer mu.Unlock()
		count := map[string]int{}
		var lat []time.Duration
		for id, res := range results {
			os := outcome[id]
			if len(os) != 1 {
				t.Fatalf("%s: %d outcomes, want exactly one", id, len(os))
			}
			cancelled := os[0].Error != nil && errors.Is(os[0].Error, disker.ErrCancelled)
			rerr, handled := replied[id]
			switch {
			case !cancelled && (!handled || rerr != nil):
				t.Fatalf("%s: sender got the reply, but the replier was told %v (handled %v)", id, rerr, handled)
			case cancelled && handled && !errors.Is(rerr, disker.ErrLate):
				t.Fatalf("%s: sender got the cancelled error, but the replier was told %v", id, rerr)
			case (res == disker.CancelQueued || res == disker.CancelScheduled) && (handled || !cancelled):
				t.Fatalf("%s: Cancel found it %v, but it was handled (%v) or replied to", id, res, handled)
			case res == disker.CancelNotFound && cancelled:
				t.Fatalf("%s: Cancel found nothing, but the sender got the cancelled error", id)
			}
			if seen, ok := sawCause[id]; ok {
				lat = append(lat, seen.Sub(cancelAt[id]))
			}
			key := res.String()
			if cancelled {
				key += ", cancelled"
			} else {
				key += ", replied"
			}
			count[key]++
		}
		slices.Sort(lat)
		if len(lat) > 0 {
			t.Logf("outcomes: %v; handlers that saw ErrCancelled: %d, from Cancel: p50 %v, p99 %v, max %v",
				count, len(lat), lat[len(lat)/2], lat[len(lat)*99/100], lat[len(lat)-1])
		}
	})
}

// TestRequestCancelledCancelsHandler: a Request whose context is cancelled
// cancels its message: the handler's context ends with ErrCancelled.
func TestRequestCancelledCancelsHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		started := make(chan struct{}, 1)
		causes := make(chan error, 1)
		if err := d.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		})); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(ctxTimeout(t, 30*time.Second))
		done := make(chan error, 1)
		go func() {
			_, err := d.Request(ctx, disker.Message{Receiver: "slow"})
			done <- err
		}()
		recv(t, started, 10*time.Second, "the handler")
		cancel()
		if err := recv(t, done, 10*time.Second, "the Request"); !errors.Is(err, context.Canceled) {
			t.Fatalf("Request: %v, want context.Canceled", err)
		}
		if cause := recv(t, causes, 10*time.Second, "the handler's end"); !errors.Is(cause, disker.ErrCancelled) {
			t.Fatalf("handler's cause: %v, want ErrCancelled", cause)
		}
	})
}

// TestRequestCancelRaces races the cancellation of Requests' contexts
// against handlers that reply: a Request returns the reply exactly when
// its replier was told the reply was accepted, and otherwise
// context.Canceled, the replier (if its handler ran) having got ErrLate;
// or ErrOutcomeUnknown (which matches context.Canceled too), claiming
// neither, when it could not learn its outcome within RequestGrace.
func TestRequestCancelRaces(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const n = 300
		d := e.open()
		var mu sync.Mutex
		replied := map[string]error{}
		if err := d.Handle("race", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			select {
			case <-time.After(time.Duration(rand.IntN(300)) * time.Millisecond):
			case <-ctx.Done():
			}
			err := d.Reply(context.Background(), m, []byte(m.Headers["n"]))
			mu.Lock()
			replied[m.Headers["n"]] = err
			mu.Unlock()
			return nil, disker.ErrReplyLater
		}), disker.WithConcurrency(64)); err != nil {
			t.Fatal(err)
		}
		got := map[string]error{}
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i := range n {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				time.AfterFunc(time.Duration(rand.IntN(300))*time.Millisecond, cancel)
				key := strconv.Itoa(i)
				_, err := d.Request(ctx, disker.Message{Receiver: "race", Headers: map[string]string{"n": key}})
				mu.Lock()
				got[key] = err
				mu.Unlock()
			})
		}
		wg.Wait()
		waitFor(t, 30*time.Second, "the handlers to return", func() bool {
			return d.LocalStats().Receivers["race"].InFlight == 0
		})
		mu.Lock()
		defer mu.Unlock()
		count := map[string]int{}
		for key, err := range got {
			rerr, handled := replied[key]
			switch {
			case err == nil && (!handled || rerr != nil):
				t.Fatalf("request %s: got the reply, but the replier was told %v (handled %v)", key, rerr, handled)
			case err != nil && !errors.Is(err, context.Canceled):
				t.Fatalf("request %s: %v, want the reply or context.Canceled", key, err)
			case errors.Is(err, disker.ErrOutcomeUnknown):
				count["unknown"]++
				continue
			case err != nil && handled && rerr == nil:
				t.Fatalf("request %s: cancelled, but its replier was told its reply was accepted", key)
			}
			switch {
			case err == nil:
				count["replied"]++
			case handled:
				count["cancelled in flight"]++
			default:
				count["cancelled before the handler"]++
			}
		}
		t.Logf("outcomes: %v", count)
	})
}

// TestScheduledIdleLateness: an idle worker, with the default block time,
// handles messages scheduled 100ms to 2s ahead: none early, and it logs the
// lateness (p50, p99, max), measured from the start of each Send plus its
// delay.
func TestScheduledIdleLateness(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open(func(c *disker.Config) { c.ReceiverBlockTimeout = disker.DefaultReceiverBlockTimeout })
		const n = 100
		type got struct {
			i  int
			at time.Time
		}
		seen := make(chan got, n)
		if err := d.Handle("idle", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			i, _ := strconv.Atoi(string(m.Content))
			seen <- got{i, time.Now()}
			return nil, nil
		}), disker.WithConcurrency(8)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 60*time.Second)
		due := make([]time.Time, n)
		for i := range n {
			delay := 100*time.Millisecond + time.Duration(rand.Int64N(int64(1900*time.Millisecond)))
			sent := time.Now()
			if _, err := d.Send(ctx, disker.Message{Receiver: "idle", Content: []byte(strconv.Itoa(i))}, disker.WithDelay(delay)); err != nil {
				t.Fatal(err)
			}
			due[i] = sent.Add(delay)
		}
		late := make([]time.Duration, 0, n)
		for range n {
			g := recv(t, seen, 30*time.Second, "a scheduled message")
			if early := due[g.i].Add(-2 * time.Millisecond).Sub(g.at); early > 0 {
				t.Fatalf("message %d handled %v before its due time", g.i, early)
			}
			late = append(late, g.at.Sub(due[g.i]))
		}
		slices.Sort(late)
		t.Logf("%d messages due 100ms to 2s ahead, idle worker: lateness p50 %v, p99 %v, max %v", n, late[n/2], late[n*99/100], late[n-1])
	})
}
