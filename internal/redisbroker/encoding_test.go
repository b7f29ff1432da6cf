package redisbroker

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// encodeWithMS writes the envelope as wire.Encode does and the time as
// msOf does, in one buffer, which a released encoding gives to the next
// (TestEncodeWithMSAllocations).
func TestEncodeWithMS(t *testing.T) {
	env := broker.Envelope{ID: "m1", Receiver: "r", Content: []byte("hello")}
	at := time.UnixMilli(1_700_000_000_123)
	for _, tm := range []time.Time{at, {}} {
		e, data, ms := encodeWithMS(&env, tm)
		if data != string(wire.Encode(&env)) || ms != msOf(tm) {
			t.Fatalf("encodeWithMS(%v) = %q, %q; want %q, %q", tm, data, ms, wire.Encode(&env), msOf(tm))
		}
		e.release(true)
	}
}

// TestEncodeWithMSAllocations counts the allocations of encodeWithMS with
// a released buffer: none (the buffers are pooled).
func TestEncodeWithMSAllocations(t *testing.T) {
	if raceOn {
		t.Skip("the race detector drops what sync.Pool keeps")
	}
	env := broker.Envelope{ID: "m1", Receiver: "r", Content: []byte("hello")}
	at := time.UnixMilli(1_700_000_000_123)
	allocs := testing.AllocsPerRun(100, func() {
		e, _, _ := encodeWithMS(&env, at)
		e.release(true)
	})
	if allocs > 0 {
		t.Fatalf("encodeWithMS with a released buffer allocates %v times, want 0", allocs)
	}
}
