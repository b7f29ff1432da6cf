package disker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// WithDedupKey sends a message once per key: a second Send with the key
// within the ttl queues nothing, and returns the first message's id with
// an error that matches ErrDuplicate.
func ExampleWithDedupKey() {
	d := openExample("example-dedup", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	msg := disker.Message{Receiver: "emails", Content: []byte("welcome, user 42")}

	first, err := d.Send(ctx, msg, disker.WithDedupKey("welcome:42", time.Hour))
	fmt.Println("first:", err)
	again, err := d.Send(ctx, msg, disker.WithDedupKey("welcome:42", time.Hour))
	var dup *disker.DuplicateError
	fmt.Println("again:", errors.Is(err, disker.ErrDuplicate), errors.As(err, &dup), again == first, dup.ID == first)
	st, _ := d.Stats(ctx, "emails")
	fmt.Println("queued:", st.Queued)
	// Output:
	// first: <nil>
	// again: true true true true
	// queued: 1
}

// DuplicateError says which message a Send WithDedupKey duplicates.
func ExampleDuplicateError_Error() {
	err := &disker.DuplicateError{ID: "01m8q2b0k9c1s7v8a0m4n3r6tq", Receiver: "emails", Key: "welcome:42"}
	fmt.Println(err)
	// Output:
	// disker: duplicate: message 01m8q2b0k9c1s7v8a0m4n3r6tq was sent to emails with dedup key "welcome:42" within its ttl
}

// DuplicateError matches ErrDuplicate.
func ExampleDuplicateError_Is() {
	var err error = &disker.DuplicateError{ID: "m1", Receiver: "emails", Key: "k"}
	fmt.Println(errors.Is(err, disker.ErrDuplicate))
	// Output:
	// true
}

// WithIdempotencyKey runs the handler once for all Requests with the key:
// here three concurrent Requests (a client and its retries) get one reply,
// from one run.
func ExampleWithIdempotencyKey() {
	d := openExample("example-idempotency", disker.Config{})
	defer d.Close(context.Background())
	var mu sync.Mutex
	runs := 0
	_ = d.Handle("charge", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		runs++
		return fmt.Appendf(nil, "charged %s (run %d)", m.Content, runs), nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	replies := make([]string, 3)
	var wg sync.WaitGroup
	for i := range replies {
		wg.Go(func() {
			r, err := d.Request(ctx, disker.Message{Receiver: "charge", Content: []byte("$100")}, disker.WithIdempotencyKey("order-7"))
			if err != nil {
				replies[i] = err.Error()
				return
			}
			replies[i] = string(r.Content)
		})
	}
	wg.Wait()
	for _, r := range replies {
		fmt.Println(r)
	}
	// Output:
	// charged $100 (run 1)
	// charged $100 (run 1)
	// charged $100 (run 1)
}

// WithIdempotencyTTL bounds how long the key and its reply are kept: after
// it, a Request with the key runs the handler again.
func ExampleWithIdempotencyTTL() {
	d := openExample("example-idempotency-ttl", disker.Config{})
	defer d.Close(context.Background())
	_ = d.Handle("clock", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return []byte(time.Now().Format(time.RFC3339Nano)), nil
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ask := func() string {
		r, err := d.Request(ctx, disker.Message{Receiver: "clock"}, disker.WithIdempotencyKey("now"), disker.WithIdempotencyTTL(100*time.Millisecond))
		if err != nil {
			return err.Error()
		}
		return string(r.Content)
	}
	first := ask()
	fmt.Println("within the ttl, the same reply:", ask() == first)
	for ask() == first { // until the ttl has passed
	}
	fmt.Println("after the ttl, a new run")
	// Output:
	// within the ttl, the same reply: true
	// after the ttl, a new run
}

// Pause stops every instance from starting a receiver's messages, which
// still queue; Resume starts them again.
func ExampleDisker_Pause() {
	d := openExample("example-pause", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	done := make(chan string, 1)
	_ = d.Handle("reports", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		done <- string(m.Content)
		return nil, nil
	}))
	if err := d.Pause(ctx, "reports"); err != nil {
		panic(err)
	}
	_, _ = d.Send(ctx, disker.Message{Receiver: "reports", Content: []byte("monthly")})
	st, _ := d.Stats(ctx, "reports")
	fmt.Println("paused:", st.Paused, "waiting:", st.Queued+st.Pending)

	if err := d.Resume(ctx, "reports"); err != nil {
		panic(err)
	}
	fmt.Println("handled:", <-done)
	// Output:
	// paused: true waiting: 1
	// handled: monthly
}

// Resume undoes Pause; resuming a receiver that is not paused does nothing.
func ExampleDisker_Resume() {
	d := openExample("example-resume", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	fmt.Println(d.Resume(ctx, "reports"))
	_ = d.Pause(ctx, "reports")
	st, _ := d.Stats(ctx, "reports")
	fmt.Println("paused:", st.Paused)
	_ = d.Resume(ctx, "reports")
	st, _ = d.Stats(ctx, "reports")
	fmt.Println("paused:", st.Paused)
	// Output:
	// <nil>
	// paused: true
	// paused: false
}
