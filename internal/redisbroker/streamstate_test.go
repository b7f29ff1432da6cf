package redisbroker

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// A stream's first fetch runs the script (reclaim due, lease new); the
// next with the same lease, before the period, reads; another lease
// reclaims again, without taking the periodic reclaim.
func TestStreamStatePlan(t *testing.T) {
	t.Parallel()
	st := newStreamState(streamName{name: "r"}, streamKeys{})
	now := time.Now()
	in := fetchInputs{now: now, block: time.Second, lease: time.Minute, every: 100 * time.Millisecond}
	if p := st.plan("c", in); !p.script || !p.reclaim || p.claim != now.Add(in.every).UnixNano() {
		t.Fatalf("first plan = %+v, want the script, reclaiming, next reclaim in every", p)
	}
	if got := st.reclaimAt.Load(); got != now.Add(in.every).UnixNano() {
		t.Fatalf("reclaimAt = %v after the first plan, want now + every", time.Unix(0, got))
	}
	if p := st.plan("c", in); p.script || !p.read {
		t.Fatalf("second plan = %+v, want a read", p)
	}
	in.lease = time.Second
	if p := st.plan("c", in); !p.script || !p.reclaim || p.claim != 0 {
		t.Fatalf("plan with another lease = %+v, want the script, reclaiming, nothing claimed", p)
	}
	if p := st.plan("c", in); p.script {
		t.Fatalf("plan with the lease of the last = %+v, want a read", p)
	}
}

// Of fetches that plan at once, one takes the reclaim that is due; the
// others read.
func TestStreamStatePlanOneReclaim(t *testing.T) {
	t.Parallel()
	for range 100 {
		st := newStreamState(streamName{name: "r"}, streamKeys{})
		in := fetchInputs{now: time.Now(), lease: time.Minute, every: time.Second}
		st.recordLease("c", in.lease)
		var wg sync.WaitGroup
		plans := make([]fetchPlan, 8)
		for i := range plans {
			wg.Go(func() { plans[i] = st.plan("c", in) })
		}
		wg.Wait()
		n := 0
		for _, p := range plans {
			if p.reclaim {
				n++
			} else if !p.read {
				t.Fatalf("plan = %+v, want a read", p)
			}
		}
		if n != 1 {
			t.Fatalf("%d of %d fetches reclaim, want 1", n, len(plans))
		}
	}
}

// The consumers' leases are kept up to leasesKept: past it, the consumer
// that came first is dropped, and its next fetch finds its lease changed.
func TestStreamStateLeasesBounded(t *testing.T) {
	t.Parallel()
	st := newStreamState(streamName{name: "r"}, streamKeys{})
	for i := range leasesKept {
		if !st.recordLease(fmt.Sprint("c", i), time.Minute) {
			t.Fatalf("c%d's first lease is not new", i)
		}
	}
	if st.recordLease("c0", time.Minute) {
		t.Fatal("c0's lease changed, but it fetched with the same")
	}
	if !st.recordLease("late", time.Minute) || len(*st.leases.Load()) != leasesKept {
		t.Fatalf("one consumer past the bound: %d leases kept, want %d", len(*st.leases.Load()), leasesKept)
	}
	if !st.recordLease("c0", time.Minute) {
		t.Fatal("c0 was dropped, yet its lease is not new")
	}
	if st.recordLease("late", time.Minute) {
		t.Fatal("the latest consumer was dropped")
	}
	if !st.recordLease("late", time.Second) || st.recordLease("late", time.Second) {
		t.Fatal("a changed lease is not reported once")
	}
	if n := len(*st.leases.Load()); n != leasesKept {
		t.Fatalf("%d leases kept, want %d", n, leasesKept)
	}
}

// setQuiet moves the next reclaim of a quiet stream to its period, keeps a
// forced one, and brings a busy one's back to every; markBusy ends the
// quiet.
func TestStreamStateQuiet(t *testing.T) {
	t.Parallel()
	const every = 100 * time.Millisecond
	st := newStreamState(streamName{name: "r"}, streamKeys{})
	start := time.Now()
	st.reclaimAt.Store(start.Add(every).UnixNano())
	st.setQuiet(true, start, 10*time.Second, every)
	if !st.quiet.Load() || st.reclaimAt.Load() != start.Add(10*time.Second).UnixNano() {
		t.Fatalf("quiet: %v, next reclaim at %v; want quiet, a lease after start", st.quiet.Load(), time.Unix(0, st.reclaimAt.Load()))
	}
	st.idle.Store(true)
	st.markBusy(every)
	if st.quiet.Load() || st.idle.Load() || time.Until(time.Unix(0, st.reclaimAt.Load())) > every {
		t.Fatalf("after markBusy: quiet %v, idle %v, next reclaim in %v", st.quiet.Load(), st.idle.Load(), time.Until(time.Unix(0, st.reclaimAt.Load())))
	}
	st.forceReclaim()
	st.setQuiet(true, start, time.Minute, every)
	if st.reclaimAt.Load() != 0 {
		t.Fatal("setQuiet undid a forced reclaim")
	}
	st.reclaimAt.Store(start.Add(time.Hour).UnixNano())
	st.setQuiet(false, start, time.Minute, every)
	if st.quiet.Load() || st.reclaimAt.Load() != start.Add(every).UnixNano() {
		t.Fatalf("busy: quiet %v, next reclaim at %v; want every after start", st.quiet.Load(), time.Unix(0, st.reclaimAt.Load()))
	}
}

// dueForPrune answers yes at most once per period.
func TestStreamStateDueForPrune(t *testing.T) {
	t.Parallel()
	st := newStreamState(streamName{name: "r"}, streamKeys{})
	now := time.Now()
	for _, step := range []struct {
		at   time.Duration
		want bool
	}{{0, true}, {time.Second, false}, {time.Minute - 1, false}, {time.Minute, true}, {time.Minute + time.Second, false}} {
		if got := st.dueForPrune(now.Add(step.at), time.Minute); got != step.want {
			t.Fatalf("dueForPrune at +%v = %v, want %v", step.at, got, step.want)
		}
	}
}

// The table keeps at most max states, drops by the clock rule (one looked
// up since the hand passed stays over one that was not), forgets a dropped
// stream under both its names, and makes it anew as a stream seen for the
// first time.
func TestStreamTableBounded(t *testing.T) {
	t.Parallel()
	tab := streamTable{max: 3}
	name := func(s string) streamName { return streamName{name: s} }
	add := func(s string) *streamState { return tab.add(name(s), streamKeys{stream: "k:" + s}) }
	kept := func() []string {
		var out []string
		for _, s := range []string{"a", "b", "c", "d", "e"} {
			if tab.get(name(s)) != nil {
				out = append(out, s)
			}
			if (tab.byStream("k:"+s) != nil) != (tab.get(name(s)) != nil) {
				t.Fatalf("%s is kept under one name only", s)
			}
		}
		return out
	}
	a := add("a")
	a.reclaimAt.Store(time.Now().Add(time.Hour).UnixNano())
	a.recordLease("c", time.Minute)
	add("b")
	add("c")
	if add("a") != a {
		t.Fatal("adding a kept stream made a new state")
	}
	add("d") // all marked: the hand clears them and drops the first, a
	if got := fmt.Sprint(kept()); got != "[b c d]" {
		t.Fatalf("kept %s, want [b c d]", got)
	}
	// kept() looked all of them up: clear the marks, then look up c only.
	for _, s := range tab.ring {
		s.used.Store(false)
	}
	tab.get(name("c"))
	add("e") // drops b, the first one not looked up
	if got := fmt.Sprint(kept()); got != "[c d e]" {
		t.Fatalf("kept %s, want [c d e]", got)
	}
	a = add("a")
	if p := a.plan("c", fetchInputs{now: time.Now(), lease: time.Minute, every: time.Second}); !p.script || !p.reclaim {
		t.Fatalf("plan of a dropped stream = %+v, want the script, reclaiming", p)
	}
	if len(tab.ring) != 3 {
		t.Fatalf("the table holds %d states, want 3", len(tab.ring))
	}
}

// A stream whose state the broker dropped (past the bound) runs the fetch
// script at its next fetch, as a stream seen for the first time; one that
// is kept does not.
func TestDroppedStreamRunsTheScript(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	b.streams.max = 1
	raw := rawClient(t, s)
	scripts := func() int { return commandCalls(t, raw, "evalsha") + commandCalls(t, raw, "eval") }
	fetch := func(r string) int {
		before := scripts()
		p := broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: time.Minute}
		if ds, err := b.Fetch(ctxT(t), &p); err != nil || len(ds) != 0 {
			t.Fatalf("Fetch(%s) = %v, %v; want nothing", r, ds, err)
		}
		return scripts() - before
	}
	// A script's first run may count twice (EVALSHA answered NOSCRIPT, then
	// EVAL).
	if n := fetch("r1"); n == 0 {
		t.Fatal("the first fetch of r1 ran no script")
	}
	if n := fetch("r1"); n != 0 {
		t.Fatalf("the next fetch of r1 ran %d scripts, want 0 (its state is kept)", n)
	}
	if n := fetch("r2"); n == 0 {
		t.Fatal("the first fetch of r2 ran no script")
	}
	if b.streams.get(streamName{name: "r1"}) != nil {
		t.Fatal("r1's state is kept past the bound")
	}
	if n := fetch("r1"); n == 0 {
		t.Fatal("the fetch of r1 after its state was dropped ran no script")
	}
}

// Looking up a known stream and planning its fetch with the lease of the
// last stores nothing: a fetch that reads allocates nothing for its plan.
func TestFetchPlanAllocatesNothing(t *testing.T) {
	b := &Broker{keys: keys{prefix: "t"}}
	in := fetchInputs{now: time.Now(), block: time.Second, lease: time.Minute, every: time.Hour}
	b.queueState("r").plan("c", in)
	allocs := testing.AllocsPerRun(1000, func() {
		if p := b.queueState("r").plan("c", in); p.script {
			t.Fatalf("plan = %+v, want no script", p)
		}
	})
	if allocs != 0 {
		t.Fatalf("a fetch's lookup and plan allocate %v times, want 0", allocs)
	}
}
