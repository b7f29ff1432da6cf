package disker

import (
	"fmt"
	"testing"
	"time"
)

// TestMonitorSpreadsPinnedSenders: a pass looks at every sender this
// instance sent timed messages as; of those only pinned (a reply handler,
// nothing sent from here), all while there are few, and an even share of
// them, the longest unseen first, when there are many: each is looked at
// within pinnedSpread passes, and a pass makes a bounded number of calls.
func TestMonitorSpreadsPinnedSenders(t *testing.T) {
	const period, margin = time.Second, 3 * time.Second
	now := time.Now()
	m := newMonitor()
	for i := range pinnedPerPass {
		m.pin(fmt.Sprint("few", i))
	}
	for pass := range 3 {
		if got := len(m.due(now.Add(time.Duration(pass)*period), margin)); got != pinnedPerPass {
			t.Fatalf("pass %d looked at %d of %d pinned senders; want all", pass, got, pinnedPerPass)
		}
	}

	m = newMonitor()
	const n = 10_000
	for i := range n {
		m.pin(fmt.Sprint("s", i))
	}
	m.watch("active", now.Add(time.Hour))
	seen := map[string]int{}
	for pass := range 2 * pinnedSpread {
		ss := m.due(now.Add(time.Duration(pass)*period), margin)
		if want := n/pinnedSpread + 1; len(ss) != want {
			t.Fatalf("pass %d looked at %d senders; want %d (a tenth of the pinned ones, and the active one)", pass, len(ss), want)
		}
		active := false
		for _, s := range ss {
			if s == "active" {
				active = true
				continue
			}
			if last, ok := seen[s]; ok && pass-last != pinnedSpread {
				t.Fatalf("%s looked at in passes %d and %d; want every %d passes", s, last, pass, pinnedSpread)
			}
			seen[s] = pass
		}
		if !active {
			t.Fatalf("pass %d did not look at the sender with a timed message outstanding", pass)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d of %d pinned senders looked at", len(seen), n)
	}

	// An unpinned sender is dropped after its last deadline and margin.
	m = newMonitor()
	m.watch("gone", now)
	if ss := m.due(now.Add(margin+time.Millisecond), margin); len(ss) != 0 {
		t.Fatalf("due = %v after the last deadline and margin; want none", ss)
	}
	if _, ok := m.senders["gone"]; ok {
		t.Fatal("an unpinned sender past its last deadline is still watched")
	}
}
