package redisbroker

import (
	"context"
	"testing"
)

// A blocking read's context ends when it is released or when the broker
// closes, and one made after Close has ended already; released reads are
// forgotten, and a read allocates no more than its cancelable context.
func TestBlockingCtxEndsAtClose(t *testing.T) {
	var b Broker
	released, r := b.blockingCtx(context.Background())
	r.release()
	if released.Err() == nil {
		t.Fatal("a released read's context has not ended")
	}
	allocs := testing.AllocsPerRun(100, func() {
		_, r := b.blockingCtx(context.Background())
		r.release()
	})
	if allocs > 2 {
		t.Fatalf("a blocking read's context allocates %v times, want at most 2 (context.WithCancel)", allocs)
	}
	open, r := b.blockingCtx(context.Background())
	b.blocking.close()
	if open.Err() == nil {
		t.Fatal("a read's context has not ended at Close")
	}
	r.release()
	after, r := b.blockingCtx(context.Background())
	if after.Err() == nil {
		t.Fatal("a read's context made after Close has not ended")
	}
	r.release()
	if n := len(b.blocking.cancels); n != 0 {
		t.Fatalf("%d cancels kept after the reads were released", n)
	}
}
