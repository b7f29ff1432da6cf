package disker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// Send options compose: this reminder is deferred, urgent when it comes
// due, and sent once per key however often it is asked for.
func ExampleSendOption() {
	ctx := context.Background()
	d := openExample("example-send-options", disker.Config{})
	defer d.Close(ctx)
	reminder := disker.Message{Receiver: "reminders", Content: []byte("call Ada")}
	opts := []disker.SendOption{
		disker.WithDelay(10 * time.Minute),
		disker.WithPriority(disker.PriorityHigh),
		disker.WithDedupKey("call-ada", time.Hour),
	}
	first, err := d.Send(ctx, reminder, opts...)
	fmt.Println(err)
	again, err := d.Send(ctx, reminder, opts...)
	fmt.Println(errors.Is(err, disker.ErrDuplicate), again == first)
	s, _ := d.Stats(ctx, "reminders")
	fmt.Println("deferred:", s.Deferred, "queued:", s.Queued)
	// Output:
	// <nil>
	// true true
	// deferred: 1 queued: 0
}

// SendEach sends many messages in as few round trips as it can, each with
// options of its own: here a due time each.
func ExampleDisker_SendEach() {
	ctx := context.Background()
	d := openExample("example-send-each", disker.Config{})
	defer d.Close(ctx)
	ids, err := d.SendEach(ctx, []disker.Outgoing{
		{Message: disker.Message{Receiver: "digest", Content: []byte("now")}},
		{Message: disker.Message{Receiver: "digest", Content: []byte("in a day")}, Options: []disker.SendOption{disker.WithDelay(24 * time.Hour)}},
		{Message: disker.Message{Receiver: "digest", Content: []byte("in a week")}, Options: []disker.SendOption{disker.WithDelay(7 * 24 * time.Hour)}},
	}, disker.WithPriority(disker.PriorityLow))
	fmt.Println(len(ids), err)
	s, _ := d.Stats(ctx, "digest")
	fmt.Println("queued:", s.Queued, "low:", s.QueuedLow, "deferred:", s.Deferred)
	// Output:
	// 3 <nil>
	// queued: 1 low: 1 deferred: 2
}

// WithOnSent tells a Request's caller the message's id while it waits, so
// that it can be cancelled from elsewhere.
func ExampleWithOnSent() {
	ctx := context.Background()
	d := openExample("example-on-sent", disker.Config{})
	defer d.Close(ctx)
	started := make(chan struct{})
	if err := d.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})); err != nil {
		panic(err)
	}
	ids := make(chan string, 1)
	cancelled := make(chan disker.CancelResult, 1)
	go func() {
		<-started
		res, err := d.Cancel(ctx, "slow", <-ids)
		if err != nil {
			panic(err)
		}
		cancelled <- res
	}()
	_, err := d.Request(ctx, disker.Message{Receiver: "slow"}, disker.WithTimeout(time.Minute),
		disker.WithOnSent(func(id string) { ids <- id }))
	fmt.Println("cancel:", <-cancelled)
	fmt.Println(errors.Is(err, disker.ErrCancelled))
	// Output:
	// cancel: in flight
	// true
}

// WithExpiry drops a message that nobody started in time: a Request for
// it gets ErrExpired instead of a reply, and Stats counts it.
func ExampleWithExpiry() {
	ctx := context.Background()
	d := openExample("example-with-expiry", disker.Config{})
	defer d.Close(ctx)
	// Nobody serves "quotes" yet: the request waits in the queue.
	answer := make(chan error, 1)
	go func() {
		_, err := d.Request(ctx, disker.Message{Receiver: "quotes", Content: []byte("EUR/USD")},
			disker.WithExpiry(20*time.Millisecond), disker.WithTimeout(10*time.Second))
		answer <- err
	}()
	for s, _ := d.Stats(ctx, "quotes"); s.Queued == 0; s, _ = d.Stats(ctx, "quotes") {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond) // the quote is stale now
	if err := d.Handle("quotes", upper); err != nil {
		panic(err)
	}
	fmt.Println(errors.Is(<-answer, disker.ErrExpired))
	s, _ := d.Stats(ctx, "quotes")
	fmt.Println("expired:", s.Expired)
	// Output:
	// true
	// expired: 1
}

// WithExpireAt drops a message that nobody started by a given time.
func ExampleWithExpireAt() {
	ctx := context.Background()
	d := openExample("example-with-expire-at", disker.Config{})
	defer d.Close(ctx)
	closes := time.Now().Add(time.Hour)
	id, err := d.Send(ctx, disker.Message{Receiver: "orders", Content: []byte("lunch")}, disker.WithExpireAt(closes))
	fmt.Println(id != "", err)
	// Output: true <nil>
}

// WithDedupUntilSettled queues a message once per key until it has run:
// a send while the first waits or runs is a duplicate.
func ExampleWithDedupUntilSettled() {
	ctx := context.Background()
	d := openExample("example-dedup-until-settled", disker.Config{})
	defer d.Close(ctx)
	report := disker.Message{Receiver: "reports", Content: []byte("monthly")}
	first, err := d.Send(ctx, report, disker.WithDedupUntilSettled("monthly", time.Hour))
	fmt.Println(err)
	again, err := d.Send(ctx, report, disker.WithDedupUntilSettled("monthly", time.Hour))
	fmt.Println(errors.Is(err, disker.ErrDuplicate), again == first)
	// Output:
	// <nil>
	// true true
}

// WithDebounce runs the latest of a burst of sends once: here a search
// as its user types.
func ExampleWithDebounce() {
	ctx := context.Background()
	d := openExample("example-debounce", disker.Config{})
	defer d.Close(ctx)
	searched := make(chan string)
	if err := d.Handle("search", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		searched <- string(m.Content)
		return nil, nil
	})); err != nil {
		panic(err)
	}
	for _, typed := range []string{"w", "wo", "wor", "work"} {
		if _, err := d.Send(ctx, disker.Message{Receiver: "search", Content: []byte(typed)},
			disker.WithDebounce("user-7", 50*time.Millisecond, time.Second)); err != nil {
			panic(err)
		}
	}
	fmt.Println(<-searched)
	// Output: work
}
