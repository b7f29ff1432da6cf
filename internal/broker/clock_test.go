package broker

import (
	"testing"
	"time"
)

// TestOffsetKeepsTheTightestReading: a reading made across a stalled round
// trip does not replace a tight one until the tight one has aged past the
// difference; an ordinary reading always does.
func TestOffsetKeepsTheTightestReading(t *testing.T) {
	var o Offset
	if _, ok := o.Estimate(); ok {
		t.Fatal("Estimate before any reading: ok")
	}
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	const skew = 5 * time.Second // the broker's clock is 5 s ahead
	offset := func() time.Duration { return time.Duration(o.ns.Load()) }

	// A tight reading: 1 ms round trip, the broker read its clock in the middle.
	o.Measure(base, base.Add(500*time.Microsecond+skew), base.Add(time.Millisecond))
	if got := offset(); got != skew {
		t.Fatalf("offset after a tight reading = %v, want %v", got, skew)
	}

	// A stalled reading 2 s later: a 1 s round trip whose answer was read by
	// the broker at its very end. Its midpoint would put the offset 500 ms off.
	sent := base.Add(2 * time.Second)
	o.Measure(sent, sent.Add(time.Second+skew), sent.Add(time.Second))
	if got := offset(); got != skew {
		t.Fatalf("offset after a stalled reading = %v, want %v kept", got, skew)
	}

	// An ordinary reading later, with a clock that moved by 200 ms (a
	// failover to another host): followed at once.
	sent = base.Add(4 * time.Second)
	moved := skew + 200*time.Millisecond
	o.Measure(sent, sent.Add(time.Millisecond+moved), sent.Add(2*time.Millisecond))
	if got := offset(); got != moved {
		t.Fatalf("offset after an ordinary reading = %v, want %v", got, moved)
	}

	// A loose reading replaces the kept one once that one has aged enough:
	// a 100 ms round trip (bound 50 ms) after 60 s of age (bound 1 ms + 60 ms).
	sent = base.Add(64 * time.Second)
	o.Measure(sent, sent.Add(50*time.Millisecond+skew), sent.Add(100*time.Millisecond))
	if got := offset(); got != skew {
		t.Fatalf("offset after an aged kept reading = %v, want %v", got, skew)
	}
}
