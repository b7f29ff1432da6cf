package membroker_test

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/membroker"
)

func Example() {
	ctx := context.Background()
	b := membroker.New(membroker.Options{})
	defer b.Close()

	// A dispatcher sends a request with a timeout.
	req := &broker.Envelope{ID: "m1", Sender: "web", Receiver: "resize", Content: []byte("cat.png"), Timeout: time.Minute, Route: broker.RouteSender}
	if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: *req}); err != nil {
		fmt.Println(err)
		return
	}

	// A worker leases it, replies and acknowledges it.
	ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "resize", Consumer: "worker-1", Max: 10, Block: time.Second, Lease: 30 * time.Second, MaxAttempts: 3})
	d := ds[0]
	fmt.Printf("worker got %s, attempt %d\n", d.Env.Content, d.Attempt)
	reply := &broker.Envelope{ID: "r1", Sender: "resize", Receiver: d.Env.Sender, InReplyTo: d.Env.ID, Content: []byte("cat-small.png")}
	mode := broker.ReplyUntimed
	if d.Env.Timeout > 0 {
		mode = broker.ReplyTimed
	}
	if err := b.Reply(ctx, reply, mode); err != nil {
		fmt.Println(err)
		return
	}
	_ = b.Ack(ctx, "resize", d.Ref)

	// The dispatcher reads its reply stream.
	rs, _ := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "web", Consumer: "web-1", Max: 10, Block: time.Second, Lease: 30 * time.Second})
	fmt.Printf("reply to %s: %s\n", rs[0].RequestID, rs[0].Env.Content)
	_ = b.AckReplies(ctx, "web", rs[0].Ref)
	// Output:
	// worker got cat.png, attempt 1
	// reply to m1: cat-small.png
}

func ExampleShared() {
	ctx := context.Background()
	dispatcher := membroker.Shared("example", membroker.Options{})
	worker := membroker.Shared("example", membroker.Options{})
	defer worker.Close()

	_ = dispatcher.Send(ctx, []broker.SendParams{{Env: broker.Envelope{ID: "m1", Receiver: "jobs", Content: []byte("hello")}}})
	// Closing one handle leaves the broker to the others.
	_ = dispatcher.Close()

	ds, _ := worker.Fetch(ctx, &broker.FetchParams{Receiver: "jobs", Consumer: "w1", Max: 1, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	fmt.Println(string(ds[0].Env.Content))
	_ = worker.Ack(ctx, "jobs", ds[0].Ref)
	// Output: hello
}
