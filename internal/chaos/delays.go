package chaos

// Scheduling delays: spans in which the host ran one process of the run
// late. A host stall (stalls.go) is a span in which it ran none of them;
// a crowded host can also run each process in slivers, so that some
// record now and then while each lags by hundreds of milliseconds. Each
// child process (worker or producer) runs a ticker (watchDelays) and
// records each tick that fires more than minSchedDelay late
// (KindSchedDelay, from when it was due to when it fired): for that span
// the process ran none of its goroutines, the library's included. Only
// the features' timing-bounded checks take such a delay into account,
// and only the delays of the process whose promptness the promise
// depends on, in the span that matters (checkfeatures.go); the core
// invariants never do.

import (
	"context"
	"time"
)

// KindSchedDelay is the kind of the record of a scheduling delay: the
// process's delay ticker, due at T, fired at End; the process ran late by
// End-T.
const KindSchedDelay = "sched_delay"

// Bounds of the delay ticker.
const (
	// schedTick is the delay ticker's period.
	schedTick = 50 * time.Millisecond
	// minSchedDelay is the least lateness of a tick that the process
	// records.
	minSchedDelay = 50 * time.Millisecond
)

// watchDelays records in rec, until ctx ends, each tick of a schedTick
// ticker that fires more than minSchedDelay late. It sleeps to each due
// time rather than reading a time.Ticker, which drops the ticks it could
// not deliver, and counts the next period from when the tick fired.
func watchDelays(ctx context.Context, rec *Recorder) {
	t := time.NewTimer(schedTick)
	defer t.Stop()
	due := time.Now().Add(schedTick)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		if late := now.Sub(due); late > minSchedDelay {
			rec.Record(Event{T: now.UnixNano() - int64(late), End: now.UnixNano(), Kind: KindSchedDelay})
		}
		due = now.Add(schedTick)
		t.Reset(schedTick)
	}
}

// schedDelays returns each process's scheduling delays (KindSchedDelay)
// as spans from when its tick was due to when it fired.
func schedDelays(events []Event) map[string][]hostStall {
	delays := map[string][]hostStall{}
	for _, e := range events {
		if e.Kind == KindSchedDelay && e.End > e.T {
			delays[e.Proc] = append(delays[e.Proc], hostStall{e.T, e.End})
		}
	}
	return delays
}

// explainSchedDelay is the explanation of a timing-bounded departure by
// the scheduling delays of the process that matters.
const explainSchedDelay = "sched_delay"

// delayedWithin returns how long proc's scheduling delays covered of the
// span from from to to.
func (c *features) delayedWithin(proc string, from, to int64) time.Duration {
	return stalledWithin(c.delays[proc], from, to)
}
