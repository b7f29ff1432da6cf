package disker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/diskerhq/disker"
)

// openExample opens an instance on the in-memory broker name, with cfg's
// other fields; it panics on error, as an example may.
func openExample(name string, cfg disker.Config) *disker.Disker {
	cfg.RedisURL = "mem://" + name
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	d, err := disker.New(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	return d
}

// upper is a handler that answers with its message's content upper-cased.
var upper = disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
	out := make([]byte, len(m.Content))
	for i, c := range m.Content {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		out[i] = c
	}
	return out, nil
})

// request sends content to receiver with Request, and prints the reply or
// the error.
func request(d *disker.Disker, receiver, content string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := d.Request(ctx, disker.Message{Receiver: receiver, Content: []byte(content)})
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println(string(r.Content))
}

// New connects to the broker that Config.RedisURL names; ctx bounds the
// connecting. "mem://name" is an in-memory broker shared in the process.
func ExampleNew() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := disker.New(ctx, disker.Config{RedisURL: "mem://example-new"}) // or "redis://host:6379/0"
	if err != nil {
		panic(err)
	}
	fmt.Println(d.ID() != "", d.Close(context.Background()))
	// Output: true <nil>
}

// Close stops the instance; later calls return ErrClosed.
func ExampleDisker_Close() {
	d := openExample("example-close", disker.Config{})
	fmt.Println(d.Close(context.Background()))
	_, err := d.Send(context.Background(), disker.Message{Receiver: "jobs"})
	fmt.Println(errors.Is(err, disker.ErrClosed))
	// Output:
	// <nil>
	// true
}

// ID is the instance's id, as Workers lists it.
func ExampleDisker_ID() {
	d := openExample("example-id", disker.Config{InstanceID: "worker-1"})
	defer d.Close(context.Background())
	fmt.Println(d.ID())
	// Output: worker-1
}

// Send queues a message. Without a Sender it is fire-and-forget: the
// handler's response goes nowhere.
func ExampleDisker_Send() {
	ctx := context.Background()
	d := openExample("example-send", disker.Config{})
	defer d.Close(ctx)
	got := make(chan string)
	err := d.Handle("audit", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		got <- fmt.Sprintf("%s (reply expected: %v)", m.Content, m.ExpectsReply())
		return nil, nil
	}))
	if err != nil {
		panic(err)
	}
	if _, err := d.Send(ctx, disker.Message{Receiver: "audit", Content: []byte("user 7 logged in")}); err != nil {
		panic(err)
	}
	fmt.Println(<-got)
	// Output: user 7 logged in (reply expected: false)
}

// WithTimeout gives a message a deadline: its sender gets the reply or a
// timeout notice. A message without a Sender cannot have one.
func ExampleWithTimeout() {
	ctx := context.Background()
	d := openExample("example-with-timeout", disker.Config{TimeoutMonitorFrequency: 10 * time.Millisecond})
	defer d.Close(ctx)
	notices := make(chan string)
	if err := d.OnTimeout("billing", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
		notices <- string(m.Content)
	})); err != nil {
		panic(err)
	}
	_, err := d.Send(ctx, disker.Message{Sender: "billing", Receiver: "nobody", Content: []byte("invoice 9")},
		disker.WithTimeout(20*time.Millisecond))
	fmt.Println(err, "->", "timed out:", <-notices)

	_, err = d.Send(ctx, disker.Message{Receiver: "nobody"}, disker.WithTimeout(time.Second))
	var ve *disker.ValidationError
	fmt.Println(errors.As(err, &ve), ve.Field)
	// Output:
	// <nil> -> timed out: invoice 9
	// true WithTimeout
}

// Handle serves a receiver: its handler's response is the reply.
func ExampleDisker_Handle() {
	d := openExample("example-handle", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper); err != nil {
		panic(err)
	}
	request(d, "upper", "hello")
	// Output: HELLO
}

// Unhandle stops serving a receiver, letting in-flight messages finish.
func ExampleDisker_Unhandle() {
	ctx := context.Background()
	d := openExample("example-unhandle", disker.Config{})
	defer d.Close(ctx)
	if err := d.Handle("upper", upper); err != nil {
		panic(err)
	}
	fmt.Println(d.Unhandle(ctx, "upper"))
	fmt.Println(errors.Is(d.Unhandle(ctx, "upper"), disker.ErrNotHandled))
	// Output:
	// <nil>
	// true
}

// OnReply receives the replies to a sender's messages.
func ExampleDisker_OnReply() {
	ctx := context.Background()
	d := openExample("example-on-reply", disker.Config{})
	defer d.Close(ctx)
	if err := d.Handle("upper", upper); err != nil {
		panic(err)
	}
	replies := make(chan *disker.Message)
	if err := d.OnReply("me", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) { replies <- r })); err != nil {
		panic(err)
	}
	id, err := d.Send(ctx, disker.Message{Sender: "me", Receiver: "upper", Content: []byte("hi")})
	if err != nil {
		panic(err)
	}
	r := <-replies
	fmt.Println(string(r.Content), r.Sender, r.InReplyTo == id)
	// Output: HI upper true
}

// RemoveReplyHandler unregisters a sender's ReplyHandler.
func ExampleDisker_RemoveReplyHandler() {
	d := openExample("example-remove-reply", disker.Config{})
	defer d.Close(context.Background())
	_ = d.OnReply("me", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {}))
	fmt.Println(d.RemoveReplyHandler("me"))
	fmt.Println(errors.Is(d.RemoveReplyHandler("me"), disker.ErrNotHandled))
	// Output:
	// <nil>
	// true
}

// RemoveTimeoutHandler unregisters a sender's TimeoutHandler.
func ExampleDisker_RemoveTimeoutHandler() {
	d := openExample("example-remove-timeout", disker.Config{})
	defer d.Close(context.Background())
	_ = d.OnTimeout("me", disker.TimeoutHandlerFunc(func(context.Context, *disker.Message) {}))
	fmt.Println(d.RemoveTimeoutHandler("me"))
	fmt.Println(errors.Is(d.RemoveTimeoutHandler("me"), disker.ErrNotHandled))
	// Output:
	// <nil>
	// true
}

// Reply answers a message from inside the handler (or later, from
// elsewhere); the handler then returns no response.
func ExampleDisker_Reply() {
	ctx := context.Background()
	d := openExample("example-reply", disker.Config{})
	defer d.Close(ctx)
	err := d.Handle("early", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if err := d.Reply(ctx, m, []byte("accepted")); err != nil {
			return nil, err
		}
		// ... long work that the sender does not wait for ...
		return nil, nil
	}))
	if err != nil {
		panic(err)
	}
	request(d, "early", "job")
	// Output: accepted
}

// SetReplyHeader puts a header on the reply.
func ExampleMessage_SetReplyHeader() {
	d := openExample("example-reply-header", disker.Config{})
	defer d.Close(context.Background())
	err := d.Handle("versioned", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		m.SetReplyHeader("version", "2")
		return []byte("ok"), nil
	}))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := d.Request(ctx, disker.Message{Receiver: "versioned"})
	fmt.Println(string(r.Content), r.Headers["version"], err)
	// Output: ok 2 <nil>
}

// ExpectsReply says whether anyone receives a reply to a message: not when
// it was sent without a Sender.
func ExampleMessage_ExpectsReply() {
	fmt.Println((&disker.Message{Sender: "me", Receiver: "jobs"}).ExpectsReply())
	fmt.Println((&disker.Message{Receiver: "jobs"}).ExpectsReply())
	// Output:
	// true
	// false
}

// LocalStats are this instance's counters.
func ExampleDisker_LocalStats() {
	ctx := context.Background()
	d := openExample("example-local-stats", disker.Config{})
	defer d.Close(ctx)
	for range 2 {
		if _, err := d.Send(ctx, disker.Message{Receiver: "jobs"}); err != nil {
			panic(err)
		}
	}
	fmt.Println(d.LocalStats().Sent)
	// Output: 2
}

// Stats is a snapshot of a receiver's queue.
func ExampleDisker_Stats() {
	ctx := context.Background()
	d := openExample("example-stats", disker.Config{})
	defer d.Close(ctx)
	for range 3 {
		if _, err := d.Send(ctx, disker.Message{Receiver: "backlog"}); err != nil {
			panic(err)
		}
	}
	s, err := d.Stats(ctx, "backlog")
	fmt.Println(s.Receiver, s.Queued, err)
	// Output: backlog 3 <nil>
}

// Receivers lists the receivers the broker knows.
func ExampleDisker_Receivers() {
	ctx := context.Background()
	d := openExample("example-receivers", disker.Config{})
	defer d.Close(ctx)
	for _, r := range []string{"thumbs", "emails"} {
		if _, err := d.Send(ctx, disker.Message{Receiver: r}); err != nil {
			panic(err)
		}
	}
	fmt.Println(d.Receivers(ctx))
	// Output: [emails thumbs] <nil>
}

// Workers lists the live instances.
func ExampleDisker_Workers() {
	ctx := context.Background()
	d := openExample("example-workers", disker.Config{InstanceID: "web-1"})
	defer d.Close(ctx)
	ws, err := d.Workers(ctx)
	if err != nil {
		panic(err)
	}
	for _, w := range ws {
		fmt.Println(w.ID)
	}
	// Output: web-1
}

// deadLetterExample opens an instance whose receiver "strict" refuses the
// messages "bad 1" and "bad 2", and waits until both are dead letters.
func deadLetterExample(name string) *disker.Disker {
	dead := make(chan struct{}, 2)
	d := openExample(name, disker.Config{OnEvent: func(e disker.Event) {
		if e.Kind == disker.EventDeadLettered {
			dead <- struct{}{}
		}
	}})
	err := d.Handle("strict", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return nil, disker.NoRetry(fmt.Errorf("cannot parse %q", m.Content))
	}), disker.WithConcurrency(1))
	if err != nil {
		panic(err)
	}
	for _, c := range []string{"bad 1", "bad 2"} {
		if _, err := d.Send(context.Background(), disker.Message{Receiver: "strict", Content: []byte(c)}); err != nil {
			panic(err)
		}
	}
	<-dead
	<-dead
	return d
}

// DeadLetters lists a receiver's dead letters, oldest first.
func ExampleDisker_DeadLetters() {
	ctx := context.Background()
	d := deadLetterExample("example-dead-letters")
	defer d.Close(ctx)
	dls, err := d.DeadLetters(ctx, "strict", 10)
	if err != nil {
		panic(err)
	}
	for _, dl := range dls {
		fmt.Printf("%s: %s\n", dl.Message.Content, dl.Reason)
	}
	// Output:
	// bad 1: attempt 1 failed with an error marked NoRetry: cannot parse "bad 1"
	// bad 2: attempt 1 failed with an error marked NoRetry: cannot parse "bad 2"
}

// RetryDeadLetters moves dead letters back to the queue (all of them when
// no id is given).
func ExampleDisker_RetryDeadLetters() {
	ctx := context.Background()
	d := deadLetterExample("example-retry-dead-letters")
	defer d.Close(ctx)
	if err := d.Unhandle(ctx, "strict"); err != nil { // keep them queued
		panic(err)
	}
	dls, _ := d.DeadLetters(ctx, "strict", 10)
	n, err := d.RetryDeadLetters(ctx, "strict", dls[0].ID)
	s, _ := d.Stats(ctx, "strict")
	fmt.Println(n, err, s.Queued, s.DeadLetters)
	// Output: 1 <nil> 1 1
}

// PurgeDeadLetters deletes dead letters (all of them when no id is given).
func ExampleDisker_PurgeDeadLetters() {
	ctx := context.Background()
	d := deadLetterExample("example-purge-dead-letters")
	defer d.Close(ctx)
	n, err := d.PurgeDeadLetters(ctx, "strict")
	dls, _ := d.DeadLetters(ctx, "strict", 10)
	fmt.Println(n, err, len(dls))
	// Output: 2 <nil> 0
}

// NoRetry makes a handler's error final: the message is dead-lettered at
// once, and a Request gets a *RemoteError.
func ExampleNoRetry() {
	d := openExample("example-no-retry", disker.Config{})
	defer d.Close(context.Background())
	attempts := 0
	err := d.Handle("strict", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		attempts++
		return nil, disker.NoRetry(errors.New("malformed"))
	}))
	if err != nil {
		panic(err)
	}
	request(d, "strict", "x")
	fmt.Println("attempts:", attempts)
	// Output:
	// error: disker: remote error (dead_letter): malformed
	// attempts: 1
}

// A *RemoteError is an error a receiver returned instead of a reply.
func ExampleRemoteError_Error() {
	err := &disker.RemoteError{Code: disker.CodeDeadLetter, Text: "malformed"}
	fmt.Println(err.Error())
	// Output: disker: remote error (dead_letter): malformed
}

// A *ValidationError names the field or option at fault.
func ExampleValidationError_Error() {
	d := openExample("example-validation", disker.Config{})
	defer d.Close(context.Background())
	_, err := d.Send(context.Background(), disker.Message{Receiver: "_private"})
	var ve *disker.ValidationError
	fmt.Println(errors.As(err, &ve), ve.Field)
	fmt.Println(err.Error())
	// Output:
	// true Message.Receiver
	// disker: invalid Message.Receiver: "_private" must not start with '_' (reserved for Disker's own names)
}

// WithMaxAttempts and WithBackoff: a message that fails is tried again,
// here after 10ms, up to 3 deliveries in all.
func ExampleWithMaxAttempts() {
	d := openExample("example-max-attempts", disker.Config{})
	defer d.Close(context.Background())
	err := d.Handle("flaky", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if m.Attempt < 3 {
			return nil, errors.New("not yet")
		}
		return fmt.Appendf(nil, "done on attempt %d", m.Attempt), nil
	}), disker.WithMaxAttempts(3), disker.WithBackoff(func(int) time.Duration { return 10 * time.Millisecond }))
	if err != nil {
		panic(err)
	}
	request(d, "flaky", "x")
	// Output: done on attempt 3
}

// WithBackoff sets the delay before each new attempt.
func ExampleWithBackoff() {
	d := openExample("example-backoff", disker.Config{})
	defer d.Close(context.Background())
	linear := func(attempt int) time.Duration { return time.Duration(attempt) * 5 * time.Millisecond }
	err := d.Handle("flaky", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if m.Attempt == 1 {
			return nil, errors.New("not yet")
		}
		return []byte("ok"), nil
	}), disker.WithBackoff(linear))
	if err != nil {
		panic(err)
	}
	request(d, "flaky", "x")
	// Output: ok
}

// DefaultBackoff doubles from 100ms, with jitter: the third attempt waits
// between 200ms and 400ms.
func ExampleDefaultBackoff() {
	b := disker.DefaultBackoff(3)
	fmt.Println(b >= 200*time.Millisecond && b <= 400*time.Millisecond)
	// Output: true
}

// WithConcurrency bounds how many messages of a receiver an instance
// handles at a time.
func ExampleWithConcurrency() {
	d := openExample("example-concurrency", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithConcurrency(2)); err != nil {
		panic(err)
	}
	request(d, "upper", "two at a time")
	// Output: TWO AT A TIME
}

// DefaultConcurrency is the concurrency of a receiver without
// WithConcurrency.
func ExampleDefaultConcurrency() {
	fmt.Println(disker.DefaultConcurrency() >= 16)
	// Output: true
}

// WithPrefetch lets an instance fetch messages ahead of its handlers.
func ExampleWithPrefetch() {
	d := openExample("example-prefetch", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithConcurrency(4), disker.WithPrefetch(4)); err != nil {
		panic(err)
	}
	request(d, "upper", "fetched ahead")
	// Output: FETCHED AHEAD
}

// WithLease sets how long a crashed worker's message waits before another
// worker takes it.
func ExampleWithLease() {
	d := openExample("example-lease", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithLease(time.Minute)); err != nil {
		panic(err)
	}
	request(d, "upper", "leased")
	// Output: LEASED
}

// WithExclusive makes one instance at a time serve the receiver.
func ExampleWithExclusive() {
	d := openExample("example-exclusive", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithExclusive()); err != nil {
		panic(err)
	}
	request(d, "upper", "one at a time")
	// Output: ONE AT A TIME
}

// HandlerFunc makes a Handler of a function.
func ExampleHandlerFunc_Handle() {
	resp, err := upper.Handle(context.Background(), &disker.Message{Content: []byte("direct")})
	fmt.Println(string(resp), err)
	// Output: DIRECT <nil>
}

// ReplyHandlerFunc makes a ReplyHandler of a function.
func ExampleReplyHandlerFunc_HandleReply() {
	h := disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) {
		fmt.Printf("reply to %s: %s\n", r.InReplyTo, r.Content)
	})
	h.HandleReply(context.Background(), &disker.Message{InReplyTo: "m1", Content: []byte("ok")})
	// Output: reply to m1: ok
}

// TimeoutHandlerFunc makes a TimeoutHandler of a function.
func ExampleTimeoutHandlerFunc_HandleTimeout() {
	h := disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
		fmt.Printf("%s to %s timed out\n", m.ID, m.Receiver)
	})
	h.HandleTimeout(context.Background(), &disker.Message{ID: "m1", Receiver: "invoices"})
	// Output: m1 to invoices timed out
}

// EventKind names an Event's kind.
func ExampleEventKind_String() {
	fmt.Println(disker.EventSent, disker.EventDeadLettered)
	// Output: sent dead_lettered
}

// DeadLettersAfter pages through dead letters: each page starts after the
// last id of the one before.
func ExampleDisker_DeadLettersAfter() {
	ctx := context.Background()
	d := deadLetterExample("example-dead-letters-after")
	defer d.Close(ctx)
	after := ""
	for page := 1; ; page++ {
		dls, err := d.DeadLettersAfter(ctx, "strict", after, 1)
		if err != nil {
			panic(err)
		}
		if len(dls) == 0 {
			break
		}
		fmt.Printf("page %d: %s\n", page, dls[0].Message.Content)
		after = dls[len(dls)-1].ID
	}
	// Output:
	// page 1: bad 1
	// page 2: bad 2
}

// Fate tells where a message is now: here, queued for a receiver nobody
// serves yet, then dead-lettered.
func ExampleDisker_Fate() {
	ctx := context.Background()
	d := openExample("example-fate", disker.Config{})
	defer d.Close(ctx)
	id, err := d.Send(ctx, disker.Message{Receiver: "later", Content: []byte("x")})
	if err != nil {
		panic(err)
	}
	f, err := d.Fate(ctx, "later", id)
	fmt.Println(f.State, err)

	d2 := deadLetterExample("example-fate-dead")
	defer d2.Close(ctx)
	dls, _ := d2.DeadLetters(ctx, "strict", 1)
	f, _ = d2.Fate(ctx, "strict", dls[0].Message.ID)
	fmt.Println(f.State, f.Reason)
	// Output:
	// queued <nil>
	// dead_lettered attempt 1 failed with an error marked NoRetry: cannot parse "bad 1"
}

// StatsOf returns the stats of many receivers in one round trip.
func ExampleDisker_StatsOf() {
	ctx := context.Background()
	d := openExample("example-stats-of", disker.Config{})
	defer d.Close(ctx)
	for _, r := range []string{"a", "b", "b"} {
		if _, err := d.Send(ctx, disker.Message{Receiver: r, Content: []byte("x")}); err != nil {
			panic(err)
		}
	}
	stats, err := d.StatsOf(ctx, "a", "b")
	if err != nil {
		panic(err)
	}
	for _, s := range stats {
		fmt.Println(s.Receiver, s.Queued)
	}
	// Output:
	// a 1
	// b 2
}
