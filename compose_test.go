package disker_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestDeferredKeepsPriority: messages deferred at each level, due
// together, reach a worker of concurrency 1 highest level first, each with
// its Priority, and none before its due time.
func TestDeferredKeepsPriority(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		const delay = 300 * time.Millisecond
		sent := time.Now()
		at := sent.Add(delay)
		for _, p := range []disker.Priority{disker.PriorityLow, disker.PriorityNormal, disker.PriorityHigh} {
			if _, err := d.Send(ctx, disker.Message{Receiver: "prio", Content: []byte(p.String())}, disker.WithDeliverAt(at), disker.WithPriority(p)); err != nil {
				t.Fatal(err)
			}
		}
		if st, err := d.Stats(ctx, "prio"); err != nil || st.Deferred != 3 || st.Queued != 0 {
			t.Fatalf("stats before the due time: %+v, %v; want 3 deferred", st, err)
		}
		got := make(chan *disker.Message, 3)
		if err := d.Handle("prio", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			got <- m
			return nil, nil
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		for _, want := range []disker.Priority{disker.PriorityHigh, disker.PriorityNormal, disker.PriorityLow} {
			m := recv(t, got, 10*time.Second, "a deferred message")
			if m.Priority != want || string(m.Content) != want.String() {
				t.Fatalf("got %q at priority %v, want the %v one", m.Content, m.Priority, want)
			}
			if time.Now().Before(at) {
				t.Fatalf("%q delivered before its due time", m.Content)
			}
		}
	})
}

// TestDeferredHoldsDedupKey: a deferred message takes its dedup key when
// it is sent, so a send with the key within the window is a duplicate,
// deferred or not, timed or not.
func TestDeferredHoldsDedupKey(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		msg := disker.Message{Sender: "planner", Receiver: "remind", Content: []byte("call Ada")}
		first, err := d.Send(ctx, msg, disker.WithDelay(time.Hour), disker.WithDedupKey("ada", time.Hour), disker.WithPriority(disker.PriorityHigh), disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for _, opts := range [][]disker.SendOption{
			{disker.WithDedupKey("ada", time.Hour)},
			{disker.WithDedupKey("ada", time.Hour), disker.WithDelay(time.Minute)},
			{disker.WithDedupKey("ada", time.Hour), disker.WithTimeout(time.Second)},
		} {
			id, err := d.Send(ctx, msg, opts...)
			var de *disker.DuplicateError
			if !errors.As(err, &de) || id != first || de.ID != first {
				t.Fatalf("a send with the key of a deferred message: %q, %v; want a *DuplicateError of %s", id, err, first)
			}
		}
		if _, err := d.Request(ctx, disker.Message{Receiver: "remind"}, disker.WithDedupKey("ada", time.Hour), disker.WithTimeout(time.Second)); !errors.Is(err, disker.ErrDuplicate) {
			t.Fatalf("a Request with the key: %v, want a duplicate at once", err)
		}
		if st, err := d.Stats(ctx, "remind"); err != nil || st.Deferred != 1 || st.Length != 0 {
			t.Fatalf("stats: %+v, %v; want the one deferred message", st, err)
		}
		if res, err := d.Cancel(ctx, "remind", first); err != nil || res != disker.CancelDeferred {
			t.Fatalf("Cancel: %v, %v", res, err)
		}
	})
}

// TestIdempotentDeferredRequestRunsOnce: Requests with one idempotency key,
// deferred, deduplicated, urgent and timed all at once, run the handler
// once and all get its reply; a Send with the key returns the key's
// message id.
func TestIdempotentDeferredRequestRunsOnce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		var runs atomic.Int32
		if err := d.Handle("pay", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			runs.Add(1)
			return []byte("paid " + string(m.Content)), nil
		})); err != nil {
			t.Fatal(err)
		}
		opts := []disker.SendOption{
			disker.WithDelay(200 * time.Millisecond), disker.WithIdempotencyKey("order-7"),
			disker.WithDedupKey("order-7", time.Minute), disker.WithPriority(disker.PriorityHigh), disker.WithTimeout(10 * time.Second),
		}
		const n = 5
		ids := make(chan string, n)
		var wg sync.WaitGroup
		errs := make([]error, n)
		replies := make([]string, n)
		for i := range n {
			wg.Go(func() {
				r, err := d.Request(ctx, disker.Message{Receiver: "pay", Content: []byte("7")}, append(opts, disker.WithOnSent(func(id string) { ids <- id }))...)
				errs[i] = err
				if err == nil {
					replies[i] = string(r.Content)
				}
			})
		}
		wg.Wait()
		for i := range n {
			if errs[i] != nil || replies[i] != "paid 7" {
				t.Fatalf("Request %d: %q, %v; want the one reply", i, replies[i], errs[i])
			}
		}
		if got := runs.Load(); got != 1 {
			t.Fatalf("the handler ran %d times, want once", got)
		}
		first := <-ids
		for range n - 1 {
			if id := <-ids; id != first {
				t.Fatalf("WithOnSent gave ids %s and %s, want the key's message each time", first, id)
			}
		}
		if id, err := d.Send(ctx, disker.Message{Receiver: "pay", Content: []byte("7")}, disker.WithIdempotencyKey("order-7")); err != nil || id != first {
			t.Fatalf("Send with the key: %q, %v; want the key's message %s", id, err, first)
		}
		if got := runs.Load(); got != 1 {
			t.Fatalf("the handler ran %d times after the Send, want once", got)
		}
	})
}

// TestComposedTimedSendOneOutcome: a named sender's timed messages, each
// deferred, at a level and with a dedup key, get exactly one outcome each:
// the reply for the one answered, a timeout notice for the one not, and
// nothing for a duplicate.
func TestComposedTimedSendOneOutcome(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		var mu sync.Mutex
		outcomes := map[string][]string{}
		record := func(id, what string) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[id] = append(outcomes[id], what)
		}
		if err := d.OnReply("desk", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { record(r.InReplyTo, "reply") })); err != nil {
			t.Fatal(err)
		}
		if err := d.OnTimeout("desk", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { record(m.ID, "timeout") })); err != nil {
			t.Fatal(err)
		}
		if err := d.Handle("answer", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			if string(m.Content) == "ignore" {
				return nil, disker.ErrReplyLater
			}
			return []byte("ok"), nil
		})); err != nil {
			t.Fatal(err)
		}
		send := func(content, key string) (string, error) {
			return d.Send(ctx, disker.Message{Sender: "desk", Receiver: "answer", Content: []byte(content)},
				disker.WithDelay(50*time.Millisecond), disker.WithPriority(disker.PriorityLow),
				disker.WithDedupKey(key, time.Minute), disker.WithTimeout(time.Second))
		}
		answered, err := send("answer", "a")
		if err != nil {
			t.Fatal(err)
		}
		ignored, err := send("ignore", "b")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := send("answer", "a"); !errors.Is(err, disker.ErrDuplicate) {
			t.Fatalf("a duplicate: %v", err)
		}
		waitFor(t, 20*time.Second, "both outcomes", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(outcomes) == 2
		})
		time.Sleep(300 * time.Millisecond) // room for a second outcome, which must not come
		mu.Lock()
		defer mu.Unlock()
		if got := outcomes[answered]; len(got) != 1 || got[0] != "reply" {
			t.Fatalf("the answered message's outcomes: %v, want one reply", got)
		}
		if got := outcomes[ignored]; len(got) != 1 || got[0] != "timeout" {
			t.Fatalf("the unanswered message's outcomes: %v, want one timeout", got)
		}
	})
}

// TestSendEachOptionsPerMessage: SendEach gives each message its own
// options over those of the call, and reports a duplicate in its place.
func TestSendEachOptionsPerMessage(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		msg := func(c string) disker.Message { return disker.Message{Receiver: "each", Content: []byte(c)} }
		ids, err := d.SendEach(ctx, []disker.Outgoing{
			{Message: msg("third"), Options: []disker.SendOption{disker.WithDelay(400 * time.Millisecond)}},
			{Message: msg("second"), Options: []disker.SendOption{disker.WithDelay(200 * time.Millisecond)}},
			{Message: msg("first")},
			{Message: msg("dup"), Options: []disker.SendOption{disker.WithDedupKey("k", time.Minute)}},
			{Message: msg("dup again"), Options: []disker.SendOption{disker.WithDedupKey("k", time.Minute)}},
		}, disker.WithPriority(disker.PriorityHigh))
		var be *disker.BatchError
		if !errors.As(err, &be) || len(be.Errs) != 5 || !errors.Is(be.Errs[4], disker.ErrDuplicate) || ids[4] != ids[3] {
			t.Fatalf("SendEach: %v, %v; want the last one a duplicate of the one before", ids, err)
		}
		for i, e := range be.Errs[:4] {
			if e != nil || ids[i] == "" {
				t.Fatalf("message %d: %q, %v", i, ids[i], e)
			}
		}
		got := make(chan string, 5)
		if err := d.Handle("each", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			if m.Priority != disker.PriorityHigh {
				t.Errorf("%q at priority %v, want high", m.Content, m.Priority)
			}
			got <- string(m.Content)
			return nil, nil
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"first", "dup", "second", "third"} {
			if c := recv(t, got, 10*time.Second, want); c != want {
				t.Fatalf("got %q, want %q (in due order)", c, want)
			}
		}
	})
}

// TestDroppedReplyCounted: a handler's reply to a fire-and-forget message
// (sent without a Sender) reaches nobody: it is counted, and the first of
// the receiver is logged, once, with a hint at the missing Sender.
func TestDroppedReplyCounted(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		var logs syncBuffer
		d := e.open(func(c *disker.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
		ctx := ctxTimeout(t, 30*time.Second)
		if err := d.Handle("forgetful", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			return []byte("nobody hears this"), nil
		})); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := d.Send(ctx, disker.Message{Receiver: "forgetful"}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*time.Second, "three handled", func() bool { return d.LocalStats().Receivers["forgetful"].Processed == 3 })
		if got := d.LocalStats().Receivers["forgetful"].DroppedReplies; got != 3 {
			t.Fatalf("DroppedReplies = %d, want 3", got)
		}
		if n := strings.Count(logs.String(), "without a Sender"); n != 1 {
			t.Fatalf("the dropped reply was logged %d times, want once:\n%s", n, logs.String())
		}
	})
}

// TestExpiry: a message that no worker started before its expiry is never
// started: it is counted (ReceiverStats.Expired, LocalStats), and its
// sender gets one outcome, a RemoteError matching ErrExpired: a Request's
// caller, and a named sender's reply handler (before its timeout, which
// then never comes). A fire-and-forget one expires too; one started in
// time runs.
func TestExpiry(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		var mu sync.Mutex
		outcomes := map[string][]error{}
		if err := d.OnReply("desk", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) {
			mu.Lock()
			defer mu.Unlock()
			var err error
			if r.Error != nil {
				err = r.Error
			}
			outcomes[r.InReplyTo] = append(outcomes[r.InReplyTo], err)
		})); err != nil {
			t.Fatal(err)
		}
		if err := d.OnTimeout("desk", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
			mu.Lock()
			defer mu.Unlock()
			outcomes[m.ID] = append(outcomes[m.ID], disker.ErrTimeout)
		})); err != nil {
			t.Fatal(err)
		}
		// Queued while nobody serves the receiver, they expire there.
		if _, err := d.Send(ctx, disker.Message{Receiver: "stale", Content: []byte("ff")}, disker.WithExpiry(50*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		named, err := d.Send(ctx, disker.Message{Sender: "desk", Receiver: "stale", Content: []byte("named")},
			disker.WithExpiry(50*time.Millisecond), disker.WithTimeout(2*time.Second), disker.WithPriority(disker.PriorityHigh))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "stale", Content: []byte("at")}, disker.WithExpireAt(time.Now().Add(50*time.Millisecond))); err != nil {
			t.Fatal(err)
		}
		requested := make(chan error, 1)
		go func() {
			_, err := d.Request(ctx, disker.Message{Receiver: "stale", Content: []byte("req")}, disker.WithExpiry(50*time.Millisecond), disker.WithTimeout(5*time.Second))
			requested <- err
		}()
		waitFor(t, 10*time.Second, "the request queued", func() bool {
			st, err := d.Stats(ctx, "stale")
			return err == nil && st.Queued == 4
		})
		time.Sleep(100 * time.Millisecond) // past every expiry, with nobody serving
		var ran sync.Map
		if err := d.Handle("stale", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			ran.Store(string(m.Content), true)
			return []byte("late"), nil
		})); err != nil {
			t.Fatal(err)
		}
		if err := recv(t, requested, 10*time.Second, "the Request's outcome"); !errors.Is(err, disker.ErrExpired) {
			t.Fatalf("the Request: %v, want an error matching ErrExpired", err)
		}
		waitFor(t, 10*time.Second, "four expired", func() bool {
			st, err := d.Stats(ctx, "stale")
			return err == nil && st.Expired == 4 && st.Length == 0
		})
		if _, err := d.Send(ctx, disker.Message{Receiver: "stale", Content: []byte("fresh")}, disker.WithExpiry(time.Minute)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the fresh one to run", func() bool { _, ok := ran.Load("fresh"); return ok })
		for _, c := range []string{"ff", "named", "at", "req"} {
			if _, ok := ran.Load(c); ok {
				t.Fatalf("the expired message %q ran", c)
			}
		}
		waitFor(t, 10*time.Second, "the named sender's outcome", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(outcomes[named]) > 0
		})
		time.Sleep(2200 * time.Millisecond) // past its deadline: no timeout notice must follow
		mu.Lock()
		defer mu.Unlock()
		if got := outcomes[named]; len(got) != 1 || !errors.Is(got[0], disker.ErrExpired) {
			t.Fatalf("the named sender's outcomes: %v, want one, matching ErrExpired", got)
		}
		if got := d.LocalStats().Receivers["stale"].Expired; got != 4 {
			t.Fatalf("LocalStats Expired = %d, want 4", got)
		}
	})
}

// TestDedupUntilSettled: a key held until its message is settled blocks
// a second send while the message waits and while it runs, and frees once
// it was handled; a dead-lettered, an expired and a cancelled message free
// their keys too.
func TestDedupUntilSettled(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		send := func(receiver string, opts ...disker.SendOption) (string, error) {
			return d.Send(ctx, disker.Message{Receiver: receiver}, append(opts, disker.WithDedupUntilSettled("k", time.Hour))...)
		}
		release := make(chan struct{})
		started := make(chan string, 1)
		if err := d.Handle("once", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			started <- m.ID
			<-release
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		first, err := send("once")
		if err != nil {
			t.Fatal(err)
		}
		if got := recv(t, started, 10*time.Second, "the first message"); got != first {
			t.Fatalf("started %s, want %s", got, first)
		}
		if id, err := send("once"); !errors.Is(err, disker.ErrDuplicate) || id != first {
			t.Fatalf("a send while the first runs: %q, %v; want a duplicate of %s", id, err, first)
		}
		close(release)
		waitFor(t, 10*time.Second, "the key to free after the first was handled", func() bool {
			id, err := send("once")
			if err == nil {
				recv(t, started, 10*time.Second, "the second message")
				return id != first
			}
			return false
		})
		// Dead-lettered, expired, cancelled: each frees its key.
		if err := d.Handle("fails", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			return nil, disker.NoRetry(errors.New("broken"))
		})); err != nil {
			t.Fatal(err)
		}
		if _, err := send("fails"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the dead-lettered message's key to free", func() bool { _, err := send("fails"); return err == nil })
		expiring, err := send("idle", disker.WithExpiry(time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		deferred, err := send("later", disker.WithDelay(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := d.Cancel(ctx, "later", deferred); err != nil || res != disker.CancelDeferred {
			t.Fatalf("Cancel: %v, %v", res, err)
		}
		if _, err := send("later"); err != nil {
			t.Fatalf("a send after the holder was cancelled: %v", err)
		}
		if err := d.Handle("idle", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) { return nil, nil })); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the expired message's key to free", func() bool {
			id, err := send("idle")
			return err == nil && id != expiring
		})
	})
}

// TestDebounce: sends with one debounce key in a burst run one handler
// call, of the latest send's content, within the max after the first;
// WithDebounce refuses a Request and a timeout, saying why.
func TestDebounce(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		got := make(chan string, 10)
		if err := d.Handle("search", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			got <- string(m.Content)
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		first := time.Now()
		for _, q := range []string{"d", "di", "dis", "disk", "diske", "disker"} {
			if _, err := d.Send(ctx, disker.Message{Receiver: "search", Content: []byte(q)}, disker.WithDebounce("user-7", 200*time.Millisecond, time.Second)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond) // a user typing
		}
		if q := recv(t, got, 10*time.Second, "the debounced search"); q != "disker" {
			t.Fatalf("searched %q, want the latest, %q", q, "disker")
		}
		if took := time.Since(first); took < 200*time.Millisecond {
			t.Fatalf("ran %v after the first send, before the wait", took)
		}
		select {
		case q := <-got:
			t.Fatalf("a second search ran: %q", q)
		case <-time.After(400 * time.Millisecond):
		}
		_, err := d.Request(ctx, disker.Message{Receiver: "search"}, disker.WithDebounce("k", time.Second, time.Second))
		wantValidation(t, err, "WithDebounce")
		_, err = d.Send(ctx, disker.Message{Sender: "s", Receiver: "search"}, disker.WithDebounce("k", time.Second, time.Second), disker.WithTimeout(time.Second))
		wantValidation(t, err, "WithDebounce")
	})
}
