package redisbroker_test

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redisbroker"
	"github.com/diskerhq/disker/internal/redistest"
)

// Example sends a request with a timeout, fetches it as a worker, replies in
// time and reads the reply as the sender.
func Example() {
	srv, stop := redistest.MustStart()
	defer stop()
	b, err := redisbroker.New(redisbroker.Config{URL: srv.URL(), KeyPrefix: "example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	ctx := context.Background()

	req := &broker.Envelope{ID: "m1", Sender: "web", Receiver: "orders", Content: []byte("2 pizzas"), Timeout: time.Minute, Route: broker.RouteSender}
	if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: *req}); err != nil {
		fmt.Println(err)
		return
	}

	ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "orders", Consumer: "worker-1", Max: 10, Block: time.Second, Lease: 30 * time.Second, MaxAttempts: 5})
	d := ds[0]
	fmt.Printf("worker got %s: %s (attempt %d)\n", d.Env.ID, d.Env.Content, d.Attempt)
	err = b.Reply(ctx, &broker.Envelope{ID: "r1", Receiver: d.Env.Sender, InReplyTo: d.Env.ID, Content: []byte("order 42")}, broker.ReplyTimed)
	fmt.Println("reply:", err)
	_ = b.Ack(ctx, "orders", d.Ref)

	// A second reply to the same request is late: it was settled.
	err = b.Reply(ctx, &broker.Envelope{ID: "r2", Receiver: "web", InReplyTo: "m1"}, broker.ReplyTimed)
	fmt.Println("second reply:", err)

	rs, _ := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "web", Consumer: "web-1", Max: 10, Block: time.Second, Lease: 30 * time.Second})
	fmt.Printf("sender got a reply to %s: %s\n", rs[0].RequestID, rs[0].Env.Content)
	_ = b.AckReplies(ctx, "web", rs[0].Ref)
	// Output:
	// worker got m1: 2 pizzas (attempt 1)
	// reply: <nil>
	// second reply: disker: reply is late: the request already timed out or was answered
	// sender got a reply to m1: order 42
}
