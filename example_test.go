package disker_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// A worker serves the receiver "greeter"; the sender "alice" receives its
// reply through her reply handler.
func Example() {
	ctx := context.Background()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example"}) // or "redis://host:6379/0"
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	err = d.Handle("greeter", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		return []byte("hello, " + string(m.Content)), nil
	}))
	if err != nil {
		panic(err)
	}
	replies := make(chan *disker.Message)
	err = d.OnReply("alice", disker.ReplyHandlerFunc(func(ctx context.Context, r *disker.Message) {
		replies <- r
	}))
	if err != nil {
		panic(err)
	}
	id, err := d.Send(ctx, disker.Message{Sender: "alice", Receiver: "greeter", Content: []byte("Alice")})
	if err != nil {
		panic(err)
	}
	r := <-replies
	fmt.Println(string(r.Content), r.InReplyTo == id)
	// Output: hello, Alice true
}

// Request sends and waits for the reply; the context's deadline is the
// message's timeout.
func ExampleDisker_Request() {
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-request"})
	if err != nil {
		panic(err)
	}
	defer d.Close(context.Background())
	err = d.Handle("sum", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		var a, b int
		if _, err := fmt.Sscan(string(m.Content), &a, &b); err != nil {
			return nil, disker.NoRetry(err)
		}
		return fmt.Append(nil, a+b), nil
	}))
	if err != nil {
		panic(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	reply, err := d.Request(ctx, disker.Message{Receiver: "sum", Content: []byte("2 40")})
	fmt.Println(string(reply.Content), err)

	_, err = d.Request(ctx, disker.Message{Receiver: "sum", Content: []byte("two")})
	var remote *disker.RemoteError
	fmt.Println(errors.As(err, &remote), remote.Code)
	// Output:
	// 42 <nil>
	// true dead_letter
}

// A timeout handler hears of the sender's messages that got no reply in
// time. It stays registered until removed.
func ExampleDisker_OnTimeout() {
	ctx := context.Background()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-timeout", TimeoutMonitorFrequency: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)

	timedOut := make(chan *disker.Message)
	err = d.OnTimeout("billing", disker.TimeoutHandlerFunc(func(ctx context.Context, m *disker.Message) {
		timedOut <- m
	}))
	if err != nil {
		panic(err)
	}
	// Nobody serves "invoices" yet: the message times out.
	_, err = d.Send(ctx, disker.Message{Sender: "billing", Receiver: "invoices", Content: []byte("march")},
		disker.WithTimeout(50*time.Millisecond))
	if err != nil {
		panic(err)
	}
	m := <-timedOut
	fmt.Printf("%s to %s timed out\n", m.Content, m.Receiver)
	// Output: march to invoices timed out
}

func ExampleValidateName() {
	for _, name := range []string{"resize.images", "resize images", "_inbox.x"} {
		fmt.Println(disker.ValidateName(name))
	}
	// Output:
	// <nil>
	// disker: invalid name: "resize images" has a character outside [A-Za-z0-9._:-] at byte 6
	// disker: invalid name: "_inbox.x" must not start with '_' (reserved for Disker's own names)
}

// SendBatch moves many messages in one round trip; here, three jobs for a
// worker that handles them one at a time, in order.
func ExampleDisker_SendBatch() {
	ctx := context.Background()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://example-batch"})
	if err != nil {
		panic(err)
	}
	defer d.Close(ctx)
	done := make(chan string, 3)
	err = d.Handle("thumbnails", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		done <- string(m.Content)
		return nil, nil
	}), disker.WithConcurrency(1))
	if err != nil {
		panic(err)
	}
	var jobs []disker.Message
	for _, img := range []string{"a.png", "b.png", "c.png"} {
		jobs = append(jobs, disker.Message{Receiver: "thumbnails", Content: []byte(img)})
	}
	ids, err := d.SendBatch(ctx, jobs)
	if err != nil {
		panic(err)
	}
	fmt.Println(len(ids), <-done, <-done, <-done)
	// Output: 3 a.png b.png c.png
}
