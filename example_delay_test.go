package disker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// WithDelay defers a message: until it is due it counts as Deferred and
// reaches no worker.
func ExampleWithDelay() {
	ctx := context.Background()
	d := openExample("example-with-delay", disker.Config{})
	defer d.Close(ctx)
	got := make(chan string)
	if err := d.Handle("reminders", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		got <- string(m.Content)
		return nil, nil
	})); err != nil {
		panic(err)
	}
	sent := time.Now()
	if _, err := d.Send(ctx, disker.Message{Receiver: "reminders", Content: []byte("call back")}, disker.WithDelay(100*time.Millisecond)); err != nil {
		panic(err)
	}
	s, _ := d.Stats(ctx, "reminders")
	fmt.Println("deferred:", s.Deferred)
	fmt.Println(<-got, "after 100ms:", time.Since(sent) >= 100*time.Millisecond)
	// Output:
	// deferred: 1
	// call back after 100ms: true
}

// WithDeliverAt sends a message for a given time; one that has passed
// delivers it now. A Request's WithTimeout counts from the delivery.
func ExampleWithDeliverAt() {
	ctx := context.Background()
	d := openExample("example-with-deliver-at", disker.Config{})
	defer d.Close(ctx)
	if err := d.Handle("upper", upper); err != nil {
		panic(err)
	}
	at := time.Now().Add(50 * time.Millisecond)
	r, err := d.Request(ctx, disker.Message{Receiver: "upper", Content: []byte("at last")},
		disker.WithDeliverAt(at), disker.WithTimeout(5*time.Second))
	fmt.Println(string(r.Content), err, !time.Now().Before(at))
	// Output: AT LAST <nil> true
}

// Cancel cancels a sent message: a deferred or queued one is never
// delivered; the handler of one in flight sees its context end with the
// cause ErrCancelled.
func ExampleDisker_Cancel() {
	ctx := context.Background()
	d := openExample("example-cancel", disker.Config{})
	defer d.Close(ctx)
	id, err := d.Send(ctx, disker.Message{Receiver: "reports", Content: []byte("monthly")}, disker.WithDelay(time.Hour))
	if err != nil {
		panic(err)
	}
	res, err := d.Cancel(ctx, "reports", id)
	fmt.Println(res, err)
	res, err = d.Cancel(ctx, "reports", id)
	fmt.Println(res, err)

	causes := make(chan error)
	started := make(chan string)
	if err := d.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		started <- m.ID
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return nil, ctx.Err()
	})); err != nil {
		panic(err)
	}
	if _, err := d.Send(ctx, disker.Message{Receiver: "slow"}); err != nil {
		panic(err)
	}
	res, err = d.Cancel(ctx, "slow", <-started)
	fmt.Println(res, err, errors.Is(<-causes, disker.ErrCancelled))
	// Output:
	// deferred <nil>
	// not found <nil>
	// in flight <nil> true
}

// String names what Cancel found.
func ExampleCancelResult_String() {
	fmt.Println(disker.CancelQueued, disker.CancelInFlight)
	// Output: queued in flight
}

// Is makes a RemoteError with CodeCancelled match ErrCancelled: what the
// sender of a cancelled message gets instead of a reply.
func ExampleRemoteError_Is() {
	err := error(&disker.RemoteError{Code: disker.CodeCancelled, Text: "cancelled"})
	fmt.Println(errors.Is(err, disker.ErrCancelled))
	// Output: true
}
