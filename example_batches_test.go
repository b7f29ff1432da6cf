package disker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker"
)

// A batch of three resizes with a completion: the completion's handler
// runs once, after the last child settled, and reads the final counts by
// the batch id in its headers.
func ExampleDisker_NewBatch() {
	ctx := context.Background()
	d := openExample("example-batch", disker.Config{})
	defer d.Close(ctx)
	_ = d.Handle("resize", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return nil, nil
	}))
	done := make(chan *disker.BatchInfo, 1)
	_ = d.Handle("album-ready", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		info, err := d.Batch(ctx, m.Headers[disker.HeaderBatch])
		if err != nil {
			return nil, err
		}
		done <- info
		return nil, nil
	}))
	b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "album-ready", Content: []byte("album 7")}})
	if err != nil {
		panic(err)
	}
	for _, img := range []string{"a.jpg", "b.jpg", "c.jpg"} {
		if _, err := b.Send(ctx, disker.Message{Receiver: "resize", Content: []byte(img)}); err != nil {
			panic(err)
		}
	}
	if _, err := b.Seal(ctx); err != nil {
		panic(err)
	}
	info := <-done
	fmt.Println(info.State, info.Children, info.Succeeded, info.CompletionSent)
	// Output:
	// completed 3 3 true
}

// A batch sealed with no child completes at once; adding to it then
// fails, and nothing is sent.
func ExampleBatch_Seal() {
	ctx := context.Background()
	d := openExample("example-batch-seal", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nightly-done"}, Retention: time.Hour})
	info, _ := b.Seal(ctx)
	fmt.Println(info.State, info.CompletionSent)
	_, err := b.Send(ctx, disker.Message{Receiver: "nightly"})
	fmt.Println(err)
	// Output:
	// completed true
	// disker: the batch is sealed: no child can be added
}

// A chain of three steps: each is sent when the one before succeeded.
func ExampleWithThen() {
	ctx := context.Background()
	d := openExample("example-then", disker.Config{})
	defer d.Close(ctx)
	done := make(chan struct{})
	_ = d.Handle("pipeline", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		fmt.Println(string(m.Content))
		if string(m.Content) == "publish" {
			close(done)
		}
		return nil, nil
	}))
	_, err := d.Send(ctx, disker.Message{Receiver: "pipeline", Content: []byte("fetch")},
		disker.WithThen(disker.Message{Receiver: "pipeline", Content: []byte("transform")},
			disker.WithThen(disker.Message{Receiver: "pipeline", Content: []byte("publish")})))
	if err != nil {
		panic(err)
	}
	<-done
	// Output:
	// fetch
	// transform
	// publish
}

// A step with no content takes the reply of the step before: its content,
// and its headers under the step's own.
func ExampleWithThen_reply() {
	ctx := context.Background()
	d := openExample("example-then-reply", disker.Config{})
	defer d.Close(ctx)
	done := make(chan struct{})
	_ = d.Handle("shout", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		m.SetReplyHeader("lang", "en")
		return bytes.ToUpper(m.Content), nil
	}))
	_ = d.Handle("print", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		fmt.Println(string(m.Content), m.Headers["lang"], m.Headers["to"])
		close(done)
		return nil, nil
	}))
	_, err := d.Send(ctx, disker.Message{Receiver: "shout", Content: []byte("hello")},
		disker.WithThen(disker.Message{Receiver: "print", Headers: map[string]string{"to": "stdout"}}))
	if err != nil {
		panic(err)
	}
	<-done
	// Output:
	// HELLO en stdout
}

// A batch of chains whose completion starts a chain: each image is
// resized, then its thumbnail made from what resize returned; when every
// image is done, the album is built, then published from what the album's
// handler returned.
func ExampleBatchOptions_completionOptions() {
	ctx := context.Background()
	d := openExample("example-batch-nesting", disker.Config{})
	defer d.Close(ctx)
	published := make(chan string)
	var thumbs atomic.Int64
	for _, r := range []string{"resize", "thumbnail", "build-album", "publish"} {
		_ = d.Handle(r, disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			switch r {
			case "thumbnail":
				thumbs.Add(1)
			case "build-album":
				return []byte(fmt.Sprintf("album of %d thumbnails", thumbs.Load())), nil
			case "publish":
				published <- string(m.Content)
			}
			return append([]byte(r+" "), m.Content...), nil
		}))
	}
	b, err := d.NewBatch(ctx, disker.BatchOptions{
		Completion:        disker.Message{Receiver: "build-album"},
		OnlyIfAllSucceed:  true,
		CompletionOptions: []disker.SendOption{disker.WithThen(disker.Message{Receiver: "publish"})},
	})
	if err != nil {
		panic(err)
	}
	for _, img := range []string{"a.png", "b.png", "c.png"} {
		if _, err := b.Send(ctx, disker.Message{Receiver: "resize", Content: []byte(img)},
			disker.WithThen(disker.Message{Receiver: "thumbnail"})); err != nil {
			panic(err)
		}
	}
	if _, err := b.Seal(ctx); err != nil {
		panic(err)
	}
	fmt.Println(<-published)
	// Output:
	// album of 3 thumbnails
}

// Children go to any receivers, one by one (Send) or many at a time
// (SendEach); WithBatch adds a child through any send, by the batch id.
func ExampleBatch_Send() {
	ctx := context.Background()
	d := openExample("example-batch-send", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "report-ready"}})
	_, err1 := b.Send(ctx, disker.Message{Receiver: "sales"})
	_, err2 := b.SendEach(ctx, []disker.Outgoing{{Message: disker.Message{Receiver: "stock"}}, {Message: disker.Message{Receiver: "stock"}}})
	_, err3 := d.Send(ctx, disker.Message{Receiver: "returns"}, disker.WithBatch(b.ID()))
	info, _ := d.Batch(ctx, b.ID())
	fmt.Println(err1, err2, err3, info.Children, info.State)
	// Output:
	// <nil> <nil> <nil> 4 open
}

// CancelBatch cancels the children not settled; the batch then completes,
// with them counted as cancelled.
func ExampleDisker_CancelBatch() {
	ctx := context.Background()
	d := openExample("example-cancel-batch", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "export-done"}})
	_, _ = b.Send(ctx, disker.Message{Receiver: "export"}, disker.WithDelay(time.Hour))
	info, err := d.CancelBatch(ctx, b.ID())
	fmt.Println(err, info.State, info.Cancelled, info.Cancels, info.CompletionSent)
	// Output:
	// <nil> completed true 1 true
}

// A batch's id names its completion's receiver.
func ExampleBatch_ID() {
	ctx := context.Background()
	d := openExample("example-batch-id", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "invoices-sent"}})
	fmt.Println(strings.HasPrefix(b.ID(), "invoices-sent/"))
	// Output:
	// true
}

// SendEach adds many children in as few round trips as it can.
func ExampleBatch_SendEach() {
	ctx := context.Background()
	d := openExample("example-batch-send-each", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "mail-done"}})
	ids, err := b.SendEach(ctx, []disker.Outgoing{{Message: disker.Message{Receiver: "mail"}}, {Message: disker.Message{Receiver: "sms"}}})
	fmt.Println(len(ids), err)
	// Output:
	// 2 <nil>
}

// Batch reads a batch's state and counts; an unknown id has none.
func ExampleDisker_Batch() {
	ctx := context.Background()
	d := openExample("example-disker-batch", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "sync-done"}})
	info, _ := d.Batch(ctx, b.ID())
	fmt.Println(info.State, info.Children)
	_, err := d.Batch(ctx, "sync-done/unknown")
	fmt.Println(errors.Is(err, disker.ErrBatchNotFound))
	// Output:
	// open 0
	// true
}

// WithBatch adds a child through any send, by the batch's id.
func ExampleWithBatch() {
	ctx := context.Background()
	d := openExample("example-with-batch", disker.Config{})
	defer d.Close(ctx)
	b, _ := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "crawl-done"}})
	_, err := d.Send(ctx, disker.Message{Receiver: "crawl"}, disker.WithBatch(b.ID()), disker.WithPriority(disker.PriorityHigh))
	fmt.Println(err)
	// Output:
	// <nil>
}

// The states of a batch, by name.
func ExampleBatchState_String() {
	fmt.Println(disker.BatchOpen, disker.BatchSealed, disker.BatchCompleted)
	// Output:
	// open sealed completed
}
