package chaos

import (
	"slices"
	"testing"
	"time"
)

// delay adds a scheduling delay of proc from from to to ms.
func (h *hist) delay(proc string, from, to int64) *hist {
	return h.add(Event{T: ms(from), End: ms(to), Proc: proc, Kind: KindSchedDelay})
}

// lateAckPair is the history of a key of recvGroup1 whose first message's
// attempt 1 ended well on w0.g1 at 1100 ms and was acknowledged at 3400
// ms, after its lease had run out and attempt 2 had started there at
// 3200 ms; the key's next message started at 3450 ms on w1.g1, beside
// attempt 2.
func lateAckPair(h *hist) {
	h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "k"}, 0).frun("a", "w0.g1", 1, 1000, 1100, ResultOK)
	h.acked("a", "w0.g1", 1, 3400, ResultOK)
	h.frun("a", "w0.g1", 2, 3200, 4000, ResultOK).acked("a", "w0.g1", 2, 4010, ResultOK)
	h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "k"}, 500).frun("b", "w1.g1", 1, 3450, 3600, ResultOK)
}

// lateAckMoved is lateAckPair with attempt 2 on another worker, w2.g1,
// and the key's next message on w1.g1.
func lateAckMoved(h *hist) {
	h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "k"}, 0).frun("a", "w0.g1", 1, 1000, 1100, ResultOK)
	h.acked("a", "w0.g1", 1, 3400, ResultOK)
	h.frun("a", "w2.g1", 2, 3200, 4000, ResultOK).acked("a", "w2.g1", 2, 4010, ResultOK)
	h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "k"}, 500).frun("b", "w1.g1", 1, 3450, 3600, ResultOK)
}

// TestCheckSchedDelays: a process's scheduling delay explains a
// timing-bounded departure only when it is the delay of the process the
// promise depends on, inside the span the promise times, and long enough
// to account for the excess; never a core invariant.
func TestCheckSchedDelays(t *testing.T) {
	const base = 10000 // ms
	pausedStart := func(h *hist) {
		h.pauseCall(KindPause, base, ResultOK).pauseCall(KindResume, base+4000, ResultOK)
		h.fsend(Event{Op: "a", Receiver: recvPaused}, base-100).frun("a", "w0.g1", 1, base+2+1265, base+1280, ResultOK)
	}
	burst := func(h *hist) {
		for i := range 16 {
			op := "r" + string(rune('a'+i))
			h.fsend(Event{Op: op, Receiver: recvRate}, base).frun(op, "w0.g1", 1, base+1000+int64(i), base+1020, ResultOK)
		}
	}
	tests := []struct {
		name      string
		events    func(h *hist)
		broken    string
		explained string
	}{{
		name:      "pause: a start 1.265s after the Pause returned, its worker 400ms late in between",
		events:    func(h *hist) { pausedStart(h); h.delay("w0.g1", base+500, base+900) },
		explained: brokePaused + ":" + explainSchedDelay,
	}, {
		name:   "pause: the same start, another worker late",
		events: func(h *hist) { pausedStart(h); h.delay("w1.g1", base+500, base+900) },
		broken: brokePaused,
	}, {
		name:   "pause: the same start, its worker late before the Pause returned",
		events: func(h *hist) { pausedStart(h); h.delay("w0.g1", base-600, base-200) },
		broken: brokePaused,
	}, {
		name:   "pause: the same start, its worker late for too little of it",
		events: func(h *hist) { pausedStart(h); h.delay("w0.g1", base+500, base+600) },
		broken: brokePaused,
	}, {
		name:      "rate: sixteen at once, their worker late within a token's lag before",
		events:    func(h *hist) { burst(h); h.delay("w0.g1", base+600, base+950) },
		explained: brokeRate + ":" + explainSchedDelay,
	}, {
		name:   "rate: sixteen at once, a worker that started none of them late",
		events: func(h *hist) { burst(h); h.delay("w1.g1", base+600, base+950) },
		broken: brokeRate,
	}, {
		name:   "rate: sixteen at once, their worker late more than a token's lag before",
		events: func(h *hist) { burst(h); h.delay("w0.g1", base-100, base+400) },
		broken: brokeRate,
	}, {
		name:      "global: four at once, a run's worker late beyond two thirds of the lease of its lease window",
		events:    func(h *hist) { fourAtOnce(recvGlobal, "", base)(h); h.delay("w0.g1", base+500, base+1900) },
		explained: brokeGlobal + ":" + explainSchedDelay,
	}, {
		name:   "global: four at once, a producer late",
		events: func(h *hist) { fourAtOnce(recvGlobal, "", base)(h); h.delay("p0.g1", base+500, base+1900) },
		broken: brokeGlobal,
	}, {
		name:   "group: four of a key at once, a run's worker late for less than two thirds of the lease",
		events: func(h *hist) { fourAtOnce(recvGroupN, "g0", base)(h); h.delay("w1.g1", base+900, base+1900) },
		broken: brokeGroupBusy,
	}, {
		name:      "group: a superseded attempt's late acknowledgement let the key go, its worker late until it",
		events:    func(h *hist) { lateAckPair(h); h.delay("w0.g1", 1150, 3350) },
		explained: brokeGroupBusy + ":" + explainSchedDelay,
	}, {
		name:   "group: the same, no delay",
		events: lateAckPair,
		broken: brokeGroupBusy,
	}, {
		name:   "group: the same, the other worker late",
		events: func(h *hist) { lateAckPair(h); h.delay("w1.g1", 1150, 3350) },
		broken: brokeGroupBusy,
	}, {
		// Late for 2 s of the redelivery's lease window, beyond two
		// thirds of a lease, but for 1.4 s of the 2.3 s from the first
		// attempt's end to its acknowledgement: not what made it late.
		name:   "group: the same, its worker late mostly after the acknowledgement",
		events: func(h *hist) { lateAckPair(h); h.delay("w0.g1", 2000, 4000) },
		broken: brokeGroupBusy,
	}, {
		name:   "group: the same, its worker late for less than the acknowledgement's lateness",
		events: func(h *hist) { lateAckPair(h); h.delay("w0.g1", 1150, 2550) },
		broken: brokeGroupBusy,
	}, {
		// Its delivery's lease ran while its worker was stopped: it started
		// with little of the lease left, and the acknowledgement came after.
		name:      "group: the same, attempt 2 elsewhere, attempt 1's worker stopped in its lease window before it started",
		events:    func(h *hist) { lateAckMoved(h); h.fault(FaultStopWorker, "w0.g1", -1500, 900) },
		explained: brokeGroupBusy + ":process_fault",
	}, {
		name:   "group: the same, attempt 2 elsewhere, no fault",
		events: lateAckMoved,
		broken: brokeGroupBusy,
	}, {
		name:   "group: the same, attempt 2 elsewhere, a worker of none of them stopped",
		events: func(h *hist) { lateAckMoved(h); h.fault(FaultStopWorker, "w3.g1", -1500, 900) },
		broken: brokeGroupBusy,
	}, {
		name: "a late start stays one, whatever the delay",
		events: func(h *hist) {
			lateStart(base)(h)
			h.delay("w0.g1", base, base+1990)
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			r := Check(sorted(h.final(0)), CheckOptions{})
			if r.SchedDelays == 0 && slices.ContainsFunc(*h, func(e Event) bool { return e.Kind == KindSchedDelay }) {
				t.Errorf("no scheduling delays counted")
			}
			wantOnly(t, r.Features, tt.broken, tt.explained)
			if tt.name == "a late start stays one, whatever the delay" && r.LateStarts != 1 {
				t.Errorf("late starts %d, want 1", r.LateStarts)
			}
			if t.Failed() {
				t.Logf("report:\n%s", r)
			}
		})
	}
}

func TestSchedDelaysReport(t *testing.T) {
	h := &hist{}
	h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultOK)
	h.delay("w0.g1", 100, 400).delay("p0.g1", 200, 300).delay("w0.g1", 900, 1000)
	r := Check(sorted(h.final(0)), CheckOptions{})
	if r.SchedDelays != 3 || r.SchedDelayed != 500*time.Millisecond || r.MaxSchedDelay != 300*time.Millisecond {
		t.Errorf("report: %d delays, %v in all, longest %v; want 3, 500ms, 300ms", r.SchedDelays, r.SchedDelayed, r.MaxSchedDelay)
	}
	// A delay is written when it ends: it does not break a host stall.
	if got := writeTime(Event{T: ms(100), End: ms(400), Kind: KindSchedDelay}); got != ms(400) {
		t.Errorf("writeTime = %d, want its End", got)
	}
}
