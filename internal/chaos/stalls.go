package chaos

// Host stalls: spans during which the host ran none of the run's
// processes (a virtual machine descheduled, a host swamped by other
// work). The processes share one host and its clock, and each records as
// it works, thousands of records a second between them; a span in which
// none of them recorded anything, with Redis up and the run busy on both
// sides of it, is one in which none of them ran. Only the checks whose
// promise depends on how soon something happens (a start after a Pause, a
// start after its token, a lease) take such a stall into account
// (checkfeatures.go); the core invariants never do.

import (
	"cmp"
	"slices"
	"sort"
	"time"
)

// Bounds of a host stall.
const (
	// minHostStall is the shortest silence of every process that counts
	// as a host stall.
	minHostStall = 300 * time.Millisecond
	// stallBusyWindow and stallBusyRecords: the run counts as busy around
	// a silence when the processes wrote at least stallBusyRecords
	// records in the stallBusyWindow before it and in the one after it.
	stallBusyWindow  = 5 * time.Second
	stallBusyRecords = 250
)

// hostStall is a span, from the last record before it to the first after
// it, in which no process of the run wrote a record.
type hostStall struct {
	from, to int64
}

// writeTime returns when e was written: its time, but for the events
// stamped with the start of what they record (a fault, a Pause or a
// Resume, a lapse of slots, a scheduling delay), whose End is when they
// were written.
func writeTime(e Event) int64 {
	switch e.Kind {
	case KindFault, KindPause, KindResume, KindSlotsLapsed, KindSchedDelay, KindRedisStall:
		if e.End != 0 {
			return e.End
		}
	}
	return e.T
}

// hostStalls returns the host stalls of a history: the silences of every
// process (no record written) of minHostStall or more, from the first send
// to the settle (the faults' end), while the run was busy around them
// (stallBusyRecords), and with no fault of Redis or of the connections to
// it under way (such a fault silences the processes too: they wait for
// Redis).
func hostStalls(events []Event, fi faultIndex) []hostStall {
	var begin, settle int64
	ts := make([]int64, 0, len(events))
	for _, e := range events {
		if e.Kind == KindSend && begin == 0 {
			begin = e.T
		}
		if e.Kind == KindSettle {
			settle = e.T
		}
		ts = append(ts, writeTime(e))
	}
	if begin == 0 {
		return nil
	}
	if settle == 0 {
		settle = events[len(events)-1].T
	}
	slices.Sort(ts)
	count := func(from, to int64) int {
		return sort.Search(len(ts), func(i int) bool { return ts[i] >= to }) -
			sort.Search(len(ts), func(i int) bool { return ts[i] >= from })
	}
	var stalls []hostStall
	for i := 1; i < len(ts); i++ {
		from, to := ts[i-1], ts[i]
		if from < begin || to > settle || time.Duration(to-from) < minHostStall {
			continue
		}
		if fi.redisFaultSpan(from, to) {
			continue
		}
		w := int64(stallBusyWindow)
		if count(from-w, from+1) < stallBusyRecords || count(to, to+w) < stallBusyRecords {
			continue
		}
		stalls = append(stalls, hostStall{from, to})
	}
	return stalls
}

// redisFaultSpan reports whether a fault of Redis or of the connections
// to it was under way between from and to.
func (fi faultIndex) redisFaultSpan(from, to int64) bool {
	for _, f := range fi.faults {
		if redisSide[f.Fault] && f.T <= to && f.End >= from {
			return true
		}
	}
	return false
}

// stalledWithin returns how long host stalls covered of the span from
// from to to.
func stalledWithin(stalls []hostStall, from, to int64) time.Duration {
	var d time.Duration
	for _, s := range stalls {
		if lo, hi := max(s.from, from), min(s.to, to); hi > lo {
			d += time.Duration(hi - lo)
		}
	}
	return d
}

// unionSpans returns the union of the spans of a and b, in order, with
// those that overlap merged: stalledWithin then counts what any of them
// covered once.
func unionSpans(a, b []hostStall) []hostStall {
	all := slices.Concat(a, b)
	slices.SortFunc(all, func(x, y hostStall) int { return cmp.Compare(x.from, y.from) })
	var out []hostStall
	for _, s := range all {
		if n := len(out); n > 0 && s.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, s.to)
			continue
		}
		out = append(out, s)
	}
	return out
}
