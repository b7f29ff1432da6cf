package disker_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// HandleBatch serves a receiver a batch at a time: here the prices of a
// batch of items are looked up at once, as one query to a database would,
// and each message gets its own outcome: its price as the reply, or an
// error reply for an item not sold, which fails no other.
func ExampleDisker_HandleBatch() {
	d := openExample("example-batch", disker.Config{})
	defer d.Close(context.Background())
	prices := map[string]int{"apple": 3, "pear": 4}
	err := d.HandleBatch("prices", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		outs := make([]disker.Outcome, len(msgs))
		for i, m := range msgs {
			price, ok := prices[string(m.Content)]
			if !ok {
				outs[i].ReplyError = &disker.RemoteError{Code: "not_found", Text: string(m.Content) + " is not sold here"}
				continue
			}
			outs[i].Reply = fmt.Append(nil, price)
		}
		return outs, nil
	}))
	if err != nil {
		panic(err)
	}
	items := []string{"apple", "kiwi", "pear"}
	answers := make([]string, len(items))
	var wg sync.WaitGroup
	for i, item := range items {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := d.Request(ctx, disker.Message{Receiver: "prices", Content: []byte(item)})
			if err != nil {
				answers[i] = fmt.Sprintf("%s: %v", item, err)
				return
			}
			answers[i] = fmt.Sprintf("%s: %s", item, r.Content)
		})
	}
	wg.Wait()
	for _, a := range answers {
		fmt.Println(a)
	}
	// Output:
	// apple: 3
	// kiwi: disker: remote error (not_found): kiwi is not sold here
	// pear: 4
}

// BatchHandlerFunc adapts a function to a BatchHandler. This one adds up
// the numbers of a batch and acknowledges them all; a non-nil error would
// fail them all, to be retried.
func ExampleBatchHandlerFunc_HandleBatch() {
	d := openExample("example-batch-func", disker.Config{})
	defer d.Close(context.Background())
	var msgs []disker.Message
	for _, n := range []string{"1", "2", "3"} {
		msgs = append(msgs, disker.Message{Receiver: "sum", Content: []byte(n)})
	}
	if _, err := d.SendBatch(context.Background(), msgs); err != nil {
		panic(err)
	}
	done := make(chan struct{})
	err := d.HandleBatch("sum", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		sum := 0
		for _, m := range msgs {
			n, err := strconv.Atoi(string(m.Content))
			if err != nil {
				return nil, err
			}
			sum += n
		}
		fmt.Printf("%d messages, sum %d\n", len(msgs), sum)
		close(done)
		return make([]disker.Outcome, len(msgs)), nil // the zero Outcome acknowledges
	}))
	if err != nil {
		panic(err)
	}
	<-done
	// Output: 3 messages, sum 6
}

// WithBatchSize bounds a batch: a backlog of 250 messages comes in
// batches of at most 100, one batch at a time (the default concurrency
// of a batch handler).
func ExampleWithBatchSize() {
	d := openExample("example-batch-size", disker.Config{})
	defer d.Close(context.Background())
	msgs := make([]disker.Message, 250)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "bulk", Content: []byte("row")}
	}
	if _, err := d.SendBatch(context.Background(), msgs); err != nil {
		panic(err)
	}
	var wg sync.WaitGroup
	wg.Add(len(msgs))
	err := d.HandleBatch("bulk", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		fmt.Println(len(msgs))
		wg.Add(-len(msgs))
		return make([]disker.Outcome, len(msgs)), nil
	}), disker.WithBatchSize(100))
	if err != nil {
		panic(err)
	}
	wg.Wait()
	// Output:
	// 100
	// 100
	// 50
}

// WithBatchWait lets a batch wait for more messages after its first: the
// three messages sent one by one here come in one batch.
func ExampleWithBatchWait() {
	d := openExample("example-batch-wait", disker.Config{})
	defer d.Close(context.Background())
	done := make(chan struct{})
	err := d.HandleBatch("trickle", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		var words []string
		for _, m := range msgs {
			words = append(words, string(m.Content))
		}
		fmt.Println(strings.Join(words, " "))
		close(done)
		return make([]disker.Outcome, len(msgs)), nil
	}), disker.WithBatchWait(200*time.Millisecond))
	if err != nil {
		panic(err)
	}
	for _, w := range []string{"one", "two", "three"} {
		if _, err := d.Send(context.Background(), disker.Message{Receiver: "trickle", Content: []byte(w)}); err != nil {
			panic(err)
		}
	}
	<-done
	// Output: one two three
}
