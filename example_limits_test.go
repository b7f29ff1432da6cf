package disker_test

import (
	"context"
	"fmt"
	"sync"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/pool"
)

// WithPriority sends a message ahead of the normal ones: a worker takes
// every waiting message of a higher level first.
func ExampleWithPriority() {
	d := openExample("example-priority", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	for _, m := range []struct {
		text string
		prio disker.Priority
	}{{"later", disker.PriorityLow}, {"as usual", disker.PriorityNormal}, {"urgent", disker.PriorityHigh}} {
		if _, err := d.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte(m.text)}, disker.WithPriority(m.prio)); err != nil {
			panic(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	err := d.Handle("jobs", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		fmt.Printf("%s (%v)\n", m.Content, m.Priority)
		wg.Done()
		return nil, nil
	}), disker.WithConcurrency(1))
	if err != nil {
		panic(err)
	}
	wg.Wait()
	// Output:
	// urgent (high)
	// as usual (normal)
	// later (low)
}

// Priority names its level.
func ExamplePriority_String() {
	fmt.Println(disker.PriorityHigh, disker.PriorityNormal, disker.PriorityLow)
	// Output: high normal low
}

// WithGlobalConcurrency bounds the messages handled at once across every
// instance that serves the receiver, here 5 (each instance may run 16).
func ExampleWithGlobalConcurrency() {
	d := openExample("example-global", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithConcurrency(16), disker.WithGlobalConcurrency(5)); err != nil {
		panic(err)
	}
	request(d, "upper", "five at most")
	// Output: FIVE AT MOST
}

// WithRateLimit bounds how many messages start per second across every
// instance that serves the receiver: here 100 per second, in bursts of up
// to 10. Messages over the limit wait in the queue.
func ExampleWithRateLimit() {
	d := openExample("example-rate", disker.Config{})
	defer d.Close(context.Background())
	if err := d.Handle("upper", upper, disker.WithRateLimit(100, 10)); err != nil {
		panic(err)
	}
	request(d, "upper", "paced")
	// Output: PACED
}

// HandleWithPool serves a receiver with workers of a pool (here stand-ins
// for connections): the instance fetches only as many messages as the pool
// has workers ready, and none while the pool cannot make workers.
func ExampleHandleWithPool() {
	d := openExample("example-pool", disker.Config{})
	defer d.Close(context.Background())
	conns, err := pool.New(pool.Config[string]{
		Size: 2,
		New:  func(context.Context) (string, error) { return "conn", nil },
	})
	if err != nil {
		panic(err)
	}
	defer conns.Close(context.Background())
	err = disker.HandleWithPool(d, "lookup", conns, func(_ context.Context, c string, m *disker.Message) ([]byte, error) {
		return []byte(string(m.Content) + " via " + c), nil
	})
	if err != nil {
		panic(err)
	}
	request(d, "lookup", "query")
	// Output: query via conn
}
