package disker_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// silentListener accepts connections and never answers on them, as a Redis
// that hangs would; it returns its address.
func silentListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// TestNewHonoursContext: New returns by ctx's deadline when Redis does not
// answer, whether the connection is accepted and left silent or the
// address drops it. Without ctx New would wait for the Redis client's dial
// and I/O timeouts (5s and 10s), well beyond the bound checked here.
func TestNewHonoursContext(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		what   string
		addr   string
		silent bool // the connection is accepted: only ctx can end the wait
	}{
		{"silent listener", silentListener(t), true},
		// TEST-NET-1 (RFC 5737): nothing routes there; the dial hangs or
		// fails at once, depending on the machine's routes.
		{"blackhole", "192.0.2.1:6379", false},
	} {
		t.Run(tc.what, func(t *testing.T) {
			t.Parallel()
			const wait = 300 * time.Millisecond
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			start := time.Now()
			d, err := disker.New(ctx, disker.Config{RedisURL: "redis://" + tc.addr + "/0", Logger: testLogger()})
			took := time.Since(start)
			if d != nil {
				_ = d.Close(context.Background())
				t.Fatal("New connected to an address where Redis does not answer")
			}
			if !errors.Is(err, disker.ErrUnavailable) {
				t.Fatalf("New = %v, want an error wrapping ErrUnavailable", err)
			}
			if tc.silent && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("New = %v, want an error matching context.DeadlineExceeded", err)
			}
			// Generous for a loaded machine, and still well under the
			// client's own timeouts.
			if took > wait+3*time.Second {
				t.Fatalf("New returned after %v, want by ctx's deadline (%v)", took, wait)
			}
		})
	}
}

// TestNewCancelled: New with a cancelled ctx does not connect.
func TestNewCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d, err := disker.New(ctx, disker.Config{RedisURL: "redis://" + silentListener(t) + "/0", Logger: testLogger()})
	if d != nil || !errors.Is(err, context.Canceled) || !errors.Is(err, disker.ErrUnavailable) {
		t.Fatalf("New = %v, %v; want an error matching ErrUnavailable and context.Canceled", d, err)
	}
}
