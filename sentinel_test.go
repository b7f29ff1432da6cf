package disker_test

import (
	"context"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestSentinelFailover runs a worker and a requester through Redis
// Sentinel: requests go through, Sentinel fails the master over to its
// replica, and requests go through again on the new master without
// restarting either instance.
func TestSentinelFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("a Sentinel test: runs without -short")
	}
	t.Parallel()
	s := redistest.StartSentinel(t)
	e := newEnv(t, true, s.URL())
	worker, client := e.open(), e.open()
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	request := func(content string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := client.Request(ctx, disker.Message{Receiver: "echo", Content: []byte(content)})
		if err == nil && string(r.Content) != "echo:"+content {
			t.Fatalf("reply %q to %q", r.Content, content)
		}
		return err
	}
	if err := request("before"); err != nil {
		t.Fatalf("Request before the failover: %v", err)
	}
	before, err := s.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	s.Failover(t)
	after, err := s.MasterAddr()
	if err != nil || after == before {
		t.Fatalf("master %s after the failover (%v), was %s", after, err, before)
	}
	waitFor(t, 30*time.Second, "a request through the new master", func() bool {
		return request("after") == nil
	})
}
