package disker_test

import (
	"context"
	"testing"

	"github.com/diskerhq/disker"
)

// TestSendAllocations counts the heap allocations of a fire-and-forget Send
// over Redis, the client's reading of the answer included: the send's job
// and its goroutine's start, and its envelope's encoding, are reused.
// Counted, not timed.
func TestSendAllocations(t *testing.T) {
	if raceOn {
		t.Skip("the race detector drops what sync.Pool keeps")
	}
	d := newEnv(t, true, redisURL(t)).open(func(c *disker.Config) {
		c.HeartbeatInterval, c.TimeoutMonitorFrequency = 0, 0 // the defaults: nothing else runs meanwhile
	})
	ctx := context.Background()
	msg := disker.Message{Receiver: "allocs", Content: make([]byte, 64)}
	// rueidis opens each wire of its pipeline at its first use and picks
	// one at random per command: open them all before counting.
	for range 100 {
		if _, err := d.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(2000, func() {
		if _, err := d.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
	})
	// The id Send returns, and the id in Redis's answer (rueidis's).
	if allocs > 2 {
		t.Fatalf("a Send allocates %v times, want at most 2", allocs)
	}
}
