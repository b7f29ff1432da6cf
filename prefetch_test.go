package disker_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestPrefetch serves a receiver with one handler slot and a prefetch of
// two: while the handler is busy, the instance holds two more messages in
// line and leaves the fourth in the broker; once released, all four are
// handled in order.
func TestPrefetch(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		release := make(chan struct{})
		handled := make(chan string, 4)
		if err := d.Handle("lined", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			<-release
			handled <- string(m.Content)
			return nil, nil
		}), disker.WithConcurrency(1), disker.WithPrefetch(2)); err != nil {
			t.Fatal(err)
		}
		var msgs []disker.Message
		for i := range 4 {
			msgs = append(msgs, disker.Message{Receiver: "lined", Content: fmt.Append(nil, i)})
		}
		if _, err := d.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "three messages in flight", func() bool {
			return d.LocalStats().Receivers["lined"].InFlight == 3
		})
		if st, err := d.Stats(ctx, "lined"); err != nil || st.Queued != 1 {
			t.Fatalf("Stats = %+v, %v; want 1 message left in the broker", st, err)
		}
		close(release)
		for i := range 4 {
			if got := recv(t, handled, 10*time.Second, "a message"); got != fmt.Sprint(i) {
				t.Fatalf("handled %q, want %d: order", got, i)
			}
		}
	})
}

// TestPrefetchedLeftOnStop stops an instance whose handler is busy and two
// messages wait in line: the waiting ones are never started there, and
// another instance handles all three once their leases end.
func TestPrefetchedLeftOnStop(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		first := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		var started atomic.Int64
		if err := first.Handle("stopping", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			started.Add(1)
			<-ctx.Done()
			return nil, ctx.Err()
		}), disker.WithConcurrency(1), disker.WithPrefetch(2), disker.WithLease(disker.MinLease)); err != nil {
			t.Fatal(err)
		}
		var msgs []disker.Message
		for i := range 3 {
			msgs = append(msgs, disker.Message{Receiver: "stopping", Content: fmt.Append(nil, i)})
		}
		if _, err := first.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "three messages in flight", func() bool {
			return first.LocalStats().Receivers["stopping"].InFlight == 3
		})
		stopCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := first.Close(stopCtx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Close with a busy handler = %v, want the drain to time out", err)
		}
		if n := started.Load(); n != 1 {
			t.Fatalf("%d handlers started on the stopped instance, want 1: the waiting messages must not start", n)
		}
		second := e.open()
		handled := make(chan string, 3)
		if err := second.Handle("stopping", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			handled <- string(m.Content)
			return nil, nil
		}), disker.WithLease(disker.MinLease)); err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for range 3 {
			seen[recv(t, handled, 20*time.Second, "a redelivered message")] = true
		}
		if len(seen) != 3 {
			t.Fatalf("redelivered %v, want all three", seen)
		}
	})
}
