package disker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// WithGroup runs the messages of one key one at a time, in send order,
// while other keys' run in parallel: here the entries of each account are
// applied in order, whichever of the 8 handlers is free.
func ExampleWithGroup() {
	d := openExample("example-groups", disker.Config{})
	defer d.Close(context.Background())
	var mu sync.Mutex
	applied := map[string][]string{}
	done := make(chan struct{}, 6)
	_ = d.Handle("ledger", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		mu.Lock()
		applied[m.Group] = append(applied[m.Group], string(m.Content))
		mu.Unlock()
		done <- struct{}{}
		return nil, nil
	}), disker.WithConcurrency(8))
	ctx := context.Background()
	for _, entry := range []string{"alice +10", "bob +5", "alice -3", "bob -5", "alice +1", "bob +2"} {
		account, _, _ := strings.Cut(entry, " ")
		_, _ = d.Send(ctx, disker.Message{Receiver: "ledger", Content: []byte(entry)}, disker.WithGroup(account))
	}
	for range 6 {
		<-done
	}
	fmt.Println(applied["alice"])
	fmt.Println(applied["bob"])
	// Output:
	// [alice +10 alice -3 alice +1]
	// [bob +5 bob -5 bob +2]
}

// WithGroupConcurrency lets n messages of one key out at a time: here the
// thumbnails of one album are made three at a time, in the order of the
// album (each waits for a place among its album's three).
func ExampleWithGroupConcurrency() {
	d := openExample("example-group-concurrency", disker.Config{})
	defer d.Close(context.Background())
	err := d.Handle("thumbnails", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return nil, nil // make the thumbnail of m.Content, a photo of album m.Group
	}), disker.WithGroupConcurrency(3))
	fmt.Println(err)
	// Output:
	// <nil>
}

// WithGroupSkipRetries lets a key go on while its failed message waits for
// its retry: here the first message of account "a" fails once; "a"'s
// second runs meanwhile, and the first succeeds after its backoff.
func ExampleWithGroupSkipRetries() {
	d := openExample("example-group-skip", disker.Config{})
	defer d.Close(context.Background())
	var mu sync.Mutex
	var order []string
	done := make(chan struct{}, 3)
	_ = d.Handle("sync", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		mu.Lock()
		order = append(order, string(m.Content)+"/"+fmt.Sprint(m.Attempt))
		mu.Unlock()
		done <- struct{}{}
		if string(m.Content) == "a1" && m.Attempt == 1 {
			return nil, errors.New("the remote side is busy")
		}
		return nil, nil
	}), disker.WithGroupSkipRetries(), disker.WithBackoff(func(int) time.Duration { return 200 * time.Millisecond }))
	ctx := context.Background()
	for _, c := range []string{"a1", "a2"} {
		_, _ = d.Send(ctx, disker.Message{Receiver: "sync", Content: []byte(c)}, disker.WithGroup("a"))
	}
	for range 3 {
		<-done
	}
	mu.Lock()
	fmt.Println(order)
	mu.Unlock()
	// Output:
	// [a1/1 a2/1 a1/2]
}

// BusiestGroups lists the keys with the most messages waiting behind
// them: here one key with a backlog, while its first message runs.
func ExampleDisker_BusiestGroups() {
	d := openExample("example-busiest", disker.Config{})
	defer d.Close(context.Background())
	ctx := context.Background()
	for range 4 {
		_, _ = d.Send(ctx, disker.Message{Receiver: "import", Content: []byte("row")}, disker.WithGroup("tenant-7"))
	}
	_, _ = d.Send(ctx, disker.Message{Receiver: "import", Content: []byte("row")}, disker.WithGroup("tenant-9"))
	loads, err := d.BusiestGroups(ctx, "import", 10)
	fmt.Println(loads, err)
	// Output:
	// [{tenant-7 3}] <nil>
}

// WithGroupConcurrency and WithGroupRate limit each key of a receiver,
// across every instance: here at most 2 messages of one tenant at once,
// and at most 5 started per second, with bursts of 5.
func ExampleWithGroupRate() {
	d := openExample("example-group-rate", disker.Config{})
	defer d.Close(context.Background())
	err := d.Handle("tenant-api", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return nil, nil // call the tenant's API
	}), disker.WithGroupConcurrency(2), disker.WithGroupRate(5, 5))
	fmt.Println(err)
	st, _ := d.Stats(context.Background(), "tenant-api")
	fmt.Println(st.GroupWaiting, st.GroupKeys)
	// Output:
	// <nil>
	// 0 0
}
