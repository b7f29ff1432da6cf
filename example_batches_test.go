package disker_test

import (
	"context"
	"fmt"
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
