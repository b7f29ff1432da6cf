package chaos

import (
	"slices"
	"testing"
	"time"
)

// busy adds the records of a busy run from from to to ms, one every ms
// by a process of its own, but in the silences given (from, to ms): the
// host ran no process then.
func (h *hist) busy(from, to int64, silences ...[2]int64) *hist {
next:
	for at := from; at < to; at++ {
		for _, s := range silences {
			if at > s[0] && at < s[1] {
				continue next
			}
		}
		h.add(Event{T: ms(at), Proc: "p9.g1", Kind: KindIdle})
	}
	return h
}

// fourAtOnce is a history of four runs of receiver (of key, if any) at
// once: one on w0.g1 from at+2000 to at+3000 ms, sent at at, and three
// on w1.g1 from at+2200 ms.
func fourAtOnce(receiver, key string, at int64) func(h *hist) {
	return func(h *hist) {
		h.fsend(Event{Op: "a", Receiver: receiver, Key: key}, at).frun("a", "w0.g1", 1, at+2000, at+3000, ResultOK)
		for i, op := range []string{"b", "c", "d"} {
			h.fsend(Event{Op: op, Receiver: receiver, Key: key}, at+2100).frun(op, "w1.g1", 1, at+2200+int64(i), at+2500, ResultOK)
		}
	}
}

// lateStart is a history of a timed send at at ms (timeout 1s) whose
// handler started 2 s later, on w0.g1: a late start.
func lateStart(at int64) func(h *hist) {
	return func(h *hist) {
		h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: "a", Mode: ModeTimed, Timeout: int64(time.Second)})
		h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: "a", ID: "id-a"})
		h.add(Event{T: ms(at + 2000), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Deadline: ms(at + 1001)})
		h.add(Event{T: ms(at + 2010), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultOK})
		h.outcome("a", "p0.g1", at+2100, ResultTimeout)
	}
}

func TestHostStalls(t *testing.T) {
	h := &hist{}
	h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultOK)
	h.fault(FaultStallConns, "proxy", 15000, 15500)
	// The fault's record is stamped with its start and written at its
	// end: it does not break the silence from 8000 to 8400 ms.
	h.fault(FaultStopWorker, "w1.g1", 8100, 30000)
	h.busy(0, 30000, [2]int64{8000, 8400}, [2]int64{12000, 12200}, [2]int64{15100, 15500})
	// After the settle, and in a sparse history, silences are no stalls.
	h.final(0)
	h.add(Event{T: ms(200_000), Proc: "harness", Kind: KindIdle})
	events := sorted(*h)
	var fi faultIndex
	for _, e := range events {
		if e.Kind == KindFault {
			fi.faults = append(fi.faults, e)
		}
	}
	got := hostStalls(events, fi)
	if len(got) != 1 || got[0] != (hostStall{ms(8000), ms(8400)}) {
		t.Fatalf("hostStalls = %v, want one from 8000 to 8400 ms (not the 200 ms one, nor the one under stall_conns, nor the ones after the settle)", got)
	}
	if d := stalledWithin(got, ms(8300), ms(9000)); d != 100*time.Millisecond {
		t.Errorf("stalledWithin = %v, want 100ms", d)
	}
	sparse := &hist{}
	sparse.sendFF("a", 0).handle("a", "w0.g1", 1, 5000, ResultOK)
	if got := hostStalls(sorted(sparse.final(0)), faultIndex{}); len(got) != 0 {
		t.Errorf("hostStalls of a sparse history = %v, want none", got)
	}
	r := Check(events, CheckOptions{})
	if r.HostStalls != 1 || r.MaxHostStall != 400*time.Millisecond {
		t.Errorf("report: %d host stalls, longest %v; want 1, 400ms", r.HostStalls, r.MaxHostStall)
	}
}

// wantOnly fails t unless f broke only broken (if any, at least once) and
// explained only by explained (likewise).
func wantOnly(t *testing.T, f *FeatureReport, broken, explained string) {
	t.Helper()
	for inv, n := range f.Broken {
		if inv != broken && n != 0 {
			t.Errorf("broken %s: %d, want 0", inv, n)
		}
	}
	if broken != "" && f.Broken[broken] == 0 {
		t.Errorf("broken %s: 0, want at least 1", broken)
	}
	if explained != "" && f.Explained[explained] == 0 {
		t.Errorf("explained %s: 0, want at least 1", explained)
	}
	for k, n := range f.Explained {
		if k != explained && n != 0 {
			t.Errorf("explained %s: %d, want 0", k, n)
		}
	}
}

// TestCheckHostStalls: a host stall explains a timing-bounded departure
// only by what it covered of the span where the promise depends on
// timing, and never a core invariant.
func TestCheckHostStalls(t *testing.T) {
	const base = 10000 // ms: the run is busy from 0
	tests := []struct {
		name      string
		silence   [2]int64 // ms after base
		events    func(h *hist)
		broken    string
		explained string
	}{{
		name:    "pause: a start 1.265s after the Pause returned, 400ms of it stalled",
		silence: [2]int64{500, 900},
		events: func(h *hist) {
			h.pauseCall(KindPause, base, ResultOK).pauseCall(KindResume, base+4000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, base-100).frun("a", "w0.g1", 1, base+2+1265, base+1280, ResultOK)
		},
		explained: brokePaused + ":" + explainStall,
	}, {
		name:    "pause: a start 1.6s after the Pause returned, 400ms of it stalled",
		silence: [2]int64{500, 900},
		events: func(h *hist) {
			h.pauseCall(KindPause, base, ResultOK).pauseCall(KindResume, base+4000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, base-100).frun("a", "w0.g1", 1, base+2+1600, base+1610, ResultOK)
		},
		broken: brokePaused,
	}, {
		name:    "pause: a start 1.265s after the Pause returned, the stall before it",
		silence: [2]int64{-600, -200},
		events: func(h *hist) {
			h.pauseCall(KindPause, base, ResultOK).pauseCall(KindResume, base+4000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, base-2000).frun("a", "w0.g1", 1, base+2+1265, base+1280, ResultOK)
		},
		broken: brokePaused,
	}, {
		name:    "rate: sixteen at once, a stall within a token's lag before",
		silence: [2]int64{600, 950},
		events: func(h *hist) {
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				h.fsend(Event{Op: op, Receiver: recvRate}, base).frun(op, "w0.g1", 1, base+1000+int64(i), base+1020, ResultOK)
			}
		},
		explained: brokeRate + ":" + explainStall,
	}, {
		name:    "rate: sixteen at once, a stall more than a token's lag before",
		silence: [2]int64{-100, 400},
		events: func(h *hist) {
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				h.fsend(Event{Op: op, Receiver: recvRate}, base-200).frun(op, "w0.g1", 1, base+1000+int64(i), base+1020, ResultOK)
			}
		},
		broken: brokeRate,
	}, {
		name:      "group: four of a key at once, one's lease window stalled beyond two thirds of the lease",
		silence:   [2]int64{500, 1900},
		events:    fourAtOnce(recvGroupN, "g0", base),
		explained: brokeGroupBusy + ":" + explainStall,
	}, {
		name:    "group: four of a key at once, one's lease window stalled for less",
		silence: [2]int64{900, 1900},
		events:  fourAtOnce(recvGroupN, "g0", base),
		broken:  brokeGroupBusy,
	}, {
		name:      "global: four at once, one's lease window stalled beyond two thirds of the lease",
		silence:   [2]int64{500, 1900},
		events:    fourAtOnce(recvGlobal, "", base),
		explained: brokeGlobal + ":" + explainStall,
	}, {
		name:    "a late start stays one, whatever the stall",
		silence: [2]int64{500, 1900},
		events:  lateStart(base),
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			h.busy(0, 2*base, [2]int64{base + tt.silence[0], base + tt.silence[1]})
			r := Check(sorted(h.final(0)), CheckOptions{})
			if r.HostStalls != 1 {
				t.Errorf("%d host stalls, want 1", r.HostStalls)
			}
			wantOnly(t, r.Features, tt.broken, tt.explained)
			if tt.name == "a late start stays one, whatever the stall" && r.LateStarts != 1 {
				t.Errorf("late starts %d, want 1", r.LateStarts)
			}
			if t.Failed() {
				t.Logf("report:\n%s", r)
			}
		})
	}
}

// TestCheckRedisStalls: a late answer to the harness's PING explains a
// timing-bounded departure as a host stall does, but not when the
// harness's own scheduling delay covers it, nor outside the span that
// matters.
func TestCheckRedisStalls(t *testing.T) {
	const base = 10000 // ms: the run is busy from 0, with no silence
	sixteen := func(sent int64) func(h *hist) {
		return func(h *hist) {
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				h.fsend(Event{Op: op, Receiver: recvRate}, sent).frun(op, "w0.g1", 1, base+1000+int64(i), base+1020, ResultOK)
			}
		}
	}
	stall := func(from, to int64) Event {
		return Event{T: ms(base + from), End: ms(base + to), Proc: harnessProc, Kind: KindRedisStall, Target: "127.0.0.1:1"}
	}
	tests := []struct {
		name      string
		records   []Event
		events    func(h *hist)
		stalls    int
		broken    string
		explained string
	}{{
		name:      "rate: sixteen at once, Redis stalled within a token's lag before",
		records:   []Event{stall(600, 950)},
		events:    sixteen(base),
		stalls:    1,
		explained: brokeRate + ":" + explainStall,
	}, {
		name:    "rate: sixteen at once, Redis stalled more than a token's lag before",
		records: []Event{stall(-100, 400)},
		events:  sixteen(base - 200),
		stalls:  1,
		broken:  brokeRate,
	}, {
		name: "rate: sixteen at once, the late answer the harness's own delay",
		records: []Event{stall(600, 950),
			{T: ms(base + 620), End: ms(base + 940), Proc: harnessProc, Kind: KindSchedDelay}},
		events: sixteen(base),
		broken: brokeRate,
	}, {
		name:    "pause: a start 1.265s after the Pause returned, Redis stalled 400ms of it",
		records: []Event{stall(500, 900)},
		events: func(h *hist) {
			h.pauseCall(KindPause, base, ResultOK).pauseCall(KindResume, base+4000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, base-100).frun("a", "w0.g1", 1, base+2+1265, base+1280, ResultOK)
		},
		stalls:    1,
		explained: brokePaused + ":" + explainStall,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			for _, e := range tt.records {
				h.add(e)
			}
			h.busy(0, 2*base)
			r := Check(sorted(h.final(0)), CheckOptions{})
			if r.HostStalls != 0 || r.RedisStalls != tt.stalls {
				t.Errorf("%d host stalls, %d Redis stalls; want 0, %d", r.HostStalls, r.RedisStalls, tt.stalls)
			}
			wantOnly(t, r.Features, tt.broken, tt.explained)
			if t.Failed() {
				t.Logf("report:\n%s", r)
			}
		})
	}
}

// TestRedisStallsUnderAFault: a late answer while a fault of Redis is
// under way is the fault's, not a Redis stall.
func TestRedisStallsUnderAFault(t *testing.T) {
	h := &hist{}
	h.fault(FaultClientPause, "127.0.0.1:1", 1000, 3000)
	h.add(Event{T: ms(1100), End: ms(2900), Proc: harnessProc, Kind: KindRedisStall, Target: "127.0.0.1:1"})
	h.add(Event{T: ms(5000), End: ms(5300), Proc: harnessProc, Kind: KindRedisStall, Target: "127.0.0.1:1"})
	events := sorted(*h)
	var fi faultIndex
	for _, e := range events {
		if e.Kind == KindFault {
			fi.faults = append(fi.faults, e)
		}
	}
	if got := redisStalls(events, fi, nil); len(got) != 1 || got[0] != (hostStall{ms(5000), ms(5300)}) {
		t.Errorf("redisStalls = %v, want the one from 5000 to 5300 ms only", got)
	}
}

func TestUnionSpans(t *testing.T) {
	got := unionSpans([]hostStall{{ms(0), ms(100)}, {ms(500), ms(600)}}, []hostStall{{ms(50), ms(200)}, {ms(700), ms(800)}})
	want := []hostStall{{ms(0), ms(200)}, {ms(500), ms(600)}, {ms(700), ms(800)}}
	if !slices.Equal(got, want) {
		t.Errorf("unionSpans = %v, want %v", got, want)
	}
	if d := stalledWithin(got, ms(0), ms(1000)); d != 400*time.Millisecond {
		t.Errorf("stalledWithin the union = %v, want 400ms (each instant once)", d)
	}
}
