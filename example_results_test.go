package disker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// A fire-and-forget message sent with a retention: its sender looks up
// what became of it by its id, and waits until it is final.
func ExampleWithRetention() {
	ctx := context.Background()
	d := openExample("example-retention", disker.Config{})
	defer d.Close(ctx)
	_ = d.Handle("thumbnails", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return nil, nil
	}))
	id, _ := d.Send(ctx, disker.Message{Receiver: "thumbnails", Content: []byte("cat.jpg")}, disker.WithRetention(time.Hour))
	r, err := d.WaitResult(ctx, "thumbnails", id)
	fmt.Println(r.State, r.Attempts, r.Worker == d.ID(), err)
	// Output:
	// succeeded 1 true <nil>
}

// Result answers at once: a message not handled yet is still queued (not
// final); one without a retention has no result.
func ExampleDisker_Result() {
	ctx := context.Background()
	d := openExample("example-result", disker.Config{})
	defer d.Close(ctx)
	id, _ := d.Send(ctx, disker.Message{Receiver: "reports"}, disker.WithRetention(time.Hour), disker.WithDelay(time.Hour))
	r, err := d.Result(ctx, "reports", id)
	fmt.Println(r.State, r.State.Final(), err)
	plain, _ := d.Send(ctx, disker.Message{Receiver: "reports"})
	_, err = d.Result(ctx, "reports", plain)
	fmt.Println(errors.Is(err, disker.ErrResultNotFound))
	// Output:
	// queued false <nil>
	// true
}

// WaitResult returns the reply the sender received, kept with the result.
func ExampleDisker_WaitResult() {
	ctx := context.Background()
	d := openExample("example-wait-result", disker.Config{})
	defer d.Close(ctx)
	_ = d.Handle("upper", upper)
	_ = d.OnReply("me", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {}))
	id, _ := d.Send(ctx, disker.Message{Sender: "me", Receiver: "upper", Content: []byte("hi")}, disker.WithRetention(time.Hour))
	r, _ := d.WaitResult(ctx, "upper", id)
	fmt.Println(r.State, string(r.Reply))
	// Output:
	// succeeded HI
}

// A handler reports its progress, kept with the result; a receiver keeps
// the results of its messages by default (WithResultRetention).
func ExampleMessage_Progress() {
	ctx := context.Background()
	d := openExample("example-progress", disker.Config{})
	defer d.Close(ctx)
	_ = d.Handle("import", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		for _, step := range []string{"1/3", "2/3", "3/3"} {
			if err := m.Progress(ctx, []byte(step)); err != nil {
				return nil, err
			}
		}
		return nil, nil
	}), disker.WithResultRetention(time.Hour))
	id, _ := d.Send(ctx, disker.Message{Receiver: "import"})
	var r *disker.Result
	for r == nil || !r.State.Final() {
		r, _ = d.Result(ctx, "import", id)
		time.Sleep(time.Millisecond)
	}
	fmt.Println(r.State, string(r.Progress))
	// Output:
	// succeeded 3/3
}

// WithResultRetention keeps results for the messages sent without a
// retention of their own, from their start.
func ExampleWithResultRetention() {
	ctx := context.Background()
	d := openExample("example-result-retention", disker.Config{})
	defer d.Close(ctx)
	failed := make(chan struct{})
	_ = d.Handle("mail", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		defer close(failed)
		return nil, disker.NoRetry(errors.New("mailbox full"))
	}), disker.WithResultRetention(24*time.Hour))
	id, _ := d.Send(ctx, disker.Message{Receiver: "mail"})
	<-failed
	r, _ := d.WaitResult(ctx, "mail", id)
	fmt.Println(r.State, r.Err.Code)
	// Output:
	// dead_lettered dead_letter
}

// ListResults lists a receiver's final results, the latest to go first.
func ExampleDisker_ListResults() {
	ctx := context.Background()
	d := openExample("example-list-results", disker.Config{})
	defer d.Close(ctx)
	_ = d.Handle("jobs", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) { return nil, nil }))
	for range 3 {
		id, _ := d.Send(ctx, disker.Message{Receiver: "jobs"}, disker.WithRetention(time.Hour))
		_, _ = d.WaitResult(ctx, "jobs", id)
	}
	rs, err := d.ListResults(ctx, "jobs", 10)
	fmt.Println(len(rs), err)
	// Output:
	// 3 <nil>
}

// The states of a result; the first two are not final.
func ExampleResultState_Final() {
	for _, s := range []disker.ResultState{disker.ResultQueued, disker.ResultRunning, disker.ResultSucceeded, disker.ResultTimedOut} {
		fmt.Println(s.String(), s.Final())
	}
	// Output:
	// queued false
	// running false
	// succeeded true
	// timed_out true
}

// A state's name, as the command line and the gateway print it.
func ExampleResultState_String() {
	fmt.Println(disker.ResultDeadLettered, disker.ResultCancelled)
	// Output:
	// dead_lettered cancelled
}
