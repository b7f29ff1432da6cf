package chaos

import (
	"testing"
	"time"
)

// The hand-made histories of the features' checks: each breaks one
// promise (and the test fails if the check is gone), or keeps it, or
// breaks it where a fault explains it.

// fsend adds a send of op (its fields from e) at at ms, acknowledged 1 ms
// later with id "id-op".
func (h *hist) fsend(e Event, at int64) *hist {
	e.T, e.Proc, e.Kind = ms(at), "p0.g1", KindSend
	if e.Mode == "" {
		e.Mode = ModeFireAndForget
	}
	h.add(e)
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: e.Op, ID: "id-" + e.Op})
}

// frun adds a run of op on proc from from to to ms, as the send of op
// says (receiver, key, level), ending with result.
func (h *hist) frun(op, proc string, attempt int, from, to int64, result string) *hist {
	var send *Event
	for i := range *h {
		if e := &(*h)[i]; e.Kind == KindSend && e.Op == op {
			send = e
		}
	}
	start := Event{T: ms(from), Proc: proc, Kind: KindStart, Op: op, ID: "id-" + op, Attempt: attempt}
	if send != nil {
		start.Receiver, start.Key, start.Priority = send.Receiver, send.Key, send.Priority
	}
	h.add(start)
	return h.add(Event{T: ms(to), Proc: proc, Kind: KindEnd, Op: op, ID: "id-" + op, Attempt: attempt, Result: result})
}

// tick adds the message id of schedule name for the tick at tick ms,
// standing for n missed ticks when n > 0.
func (h *hist) tick(name, id string, tick, n int64) *hist {
	return h.add(Event{T: ms(tick + 2), Proc: "w0.g1", Kind: KindTick, Key: name, ID: id, Attempt: 1, Tick: ms(tick), N: n, Receiver: recvTicks})
}

// pauseCall adds the harness's Pause (or Resume) from at to at+2 ms.
func (h *hist) pauseCall(kind string, at int64, result string) *hist {
	return h.add(Event{T: ms(at), Proc: "harness", Kind: kind, Receiver: recvPaused, Result: result, End: ms(at + 2)})
}

// sorted returns the history sorted by time, as ReadHistory does.
func sorted(events []Event) []Event {
	out := append([]Event{}, events...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].T < out[j-1].T; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// globalLapse is a history of four runs of recvGlobal at once, one of
// them on w2.g1 from 10 to 3010 ms, with a lapse of proc's slots between
// from and to ms.
func globalLapse(proc string, from, to int64) func(h *hist) {
	return func(h *hist) {
		h.fsend(Event{Op: "a", Receiver: recvGlobal}, 0).frun("a", "w2.g1", 1, 10, 3010, ResultOK)
		h.add(Event{T: ms(from), End: ms(to), Proc: proc, Kind: KindSlotsLapsed, Receiver: recvGlobal})
		for i, op := range []string{"b", "c", "d"} {
			h.fsend(Event{Op: op, Receiver: recvGlobal}, 2500).frun(op, "w0.g1", 1, 2510+int64(i), 2600, ResultOK)
		}
	}
}

// featureCase is a hand-made history of the features' checks.
type featureCase struct {
	name      string
	events    func(h *hist)
	broken    string // the invariant broken, "" for none
	also      string // another invariant it breaks too
	explained string // a key of Explained that must be counted
	check     func(f *FeatureReport) bool
}

// judge checks each case's history and its report.
func judge(t *testing.T, cases []featureCase) {
	t.Helper()
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			r := Check(sorted(h.final(0)), CheckOptions{})
			f := r.Features
			for inv, n := range f.Broken {
				if inv != tt.broken && inv != tt.also && n != 0 {
					t.Errorf("broken %s: %d, want 0", inv, n)
				}
			}
			if tt.broken != "" && f.Broken[tt.broken] == 0 {
				t.Errorf("broken %s: 0, want at least 1", tt.broken)
			}
			if tt.broken == "" && !r.OK() {
				t.Errorf("the report is not OK")
			}
			if tt.broken != "" && r.OK() {
				t.Errorf("the report is OK with %s broken", tt.broken)
			}
			if tt.explained != "" && f.Explained[tt.explained] == 0 {
				t.Errorf("explained %s: 0, want at least 1", tt.explained)
			}
			if tt.check != nil && !tt.check(f) {
				t.Errorf("check failed")
			}
			if t.Failed() {
				t.Logf("report:\n%s", r)
			}
		})
	}
}

func TestCheckFeatures(t *testing.T) {
	judge(t, []featureCase{{
		name: "global concurrency: three at once",
		events: func(h *hist) {
			for i, op := range []string{"a", "b", "c"} {
				h.fsend(Event{Op: op, Receiver: recvGlobal}, 0).frun(op, "w0.g1", 1, 10+int64(i), 100, ResultOK)
			}
			h.fsend(Event{Op: "d", Receiver: recvGlobal}, 0).frun("d", "w1.g1", 1, 100, 150, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.MaxGlobal == 3 },
	}, {
		name: "global concurrency: four at once",
		events: func(h *hist) {
			for i, op := range []string{"a", "b", "c", "d"} {
				h.fsend(Event{Op: op, Receiver: recvGlobal}, 0).frun(op, "w"+string(rune('0'+i%3))+".g1", 1, 10+int64(i), 100, ResultOK)
			}
		},
		broken: brokeGlobal,
		check:  func(f *FeatureReport) bool { return f.MaxGlobal == 4 },
	}, {
		name: "global concurrency: four at once, one on a worker stopped past its lease",
		events: func(h *hist) {
			h.fault(FaultStopWorker, "w2.g1", 20, 3000)
			h.fsend(Event{Op: "a", Receiver: recvGlobal}, 0).frun("a", "w2.g1", 1, 10, 3010, ResultOK)
			for i, op := range []string{"b", "c", "d"} {
				h.fsend(Event{Op: op, Receiver: recvGlobal}, 2500).frun(op, "w0.g1", 1, 2510+int64(i), 2600, ResultOK)
			}
		},
		check: func(f *FeatureReport) bool { return f.Explained[brokeGlobal+":process_fault"] == 1 },
	}, {
		name:      "global concurrency: four at once, one on a worker whose slots lapsed during its run",
		events:    globalLapse("w2.g1", 2000, 3005), // learnt at 3005, ran out at 2000 at the earliest
		explained: brokeGlobal + ":slots_lapsed",
	}, {
		name:   "global concurrency: four at once, a lapse of another worker's slots",
		events: globalLapse("w1.g1", 2000, 3005),
		broken: brokeGlobal,
	}, {
		name:   "global concurrency: four at once, a lapse of the worker's slots before the run",
		events: globalLapse("w2.g1", 1, 5),
		broken: brokeGlobal,
	}, {
		name: "group of concurrency 1: two runs of a key at once",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "g0"}, 0).frun("a", "w0.g1", 1, 10, 50, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "g0"}, 5).frun("b", "w1.g1", 1, 20, 60, ResultOK)
			// Another key runs beside them.
			h.fsend(Event{Op: "c", Receiver: recvGroup1, Key: "g1"}, 0).frun("c", "w1.g1", 1, 20, 60, ResultOK)
		},
		broken: brokeGroupBusy,
	}, {
		name: "group of concurrency 3: four runs of a key at once, and three",
		events: func(h *hist) {
			for i, op := range []string{"a", "b", "c", "d"} {
				h.fsend(Event{Op: op, Receiver: recvGroupN, Key: "g0"}, 0).frun(op, "w0.g1", 1, 10+int64(i), 100, ResultOK)
			}
			for i, op := range []string{"e", "f", "g"} {
				h.fsend(Event{Op: op, Receiver: recvGroupN, Key: "g1"}, 0).frun(op, "w0.g1", 1, 10+int64(i), 100, ResultOK)
			}
		},
		broken: brokeGroupBusy,
		check:  func(f *FeatureReport) bool { return f.MaxGroup == 4 && f.Broken[brokeGroupBusy] == 1 },
	}, {
		name: "group order: a key's messages in send order, with a retry",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "g0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultFailed).frun("a", "w1.g1", 2, 80, 90, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "g0"}, 5).frun("b", "w1.g1", 1, 100, 110, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["group1_ordered_msgs"] == 2 },
	}, {
		name: "group order: a message sent later starts first",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "g0"}, 0).frun("a", "w0.g1", 1, 100, 110, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "g0"}, 5).frun("b", "w1.g1", 1, 50, 60, ResultOK)
		},
		broken: brokeGroupOrder,
	}, {
		name: "group order: a retry of the earlier message after the later one started",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "g0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultFailed).frun("a", "w0.g1", 2, 200, 210, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "g0"}, 5).frun("b", "w1.g1", 1, 100, 110, ResultOK)
		},
		broken: brokeGroupOrder,
	}, {
		name: "group order: a redelivery after its worker was stopped",
		events: func(h *hist) {
			h.fault(FaultStopWorker, "w0.g1", 15, 3000)
			h.fsend(Event{Op: "a", Receiver: recvGroup1, Key: "g0"}, 0).frun("a", "w0.g1", 1, 10, 3010, ResultOK).frun("a", "w1.g1", 2, 2100, 2110, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvGroup1, Key: "g0"}, 5).frun("b", "w1.g1", 1, 2200, 2210, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Explained[brokeGroupBusy+":process_fault"] == 2 },
	}, {
		name: "rate limit: starts within the bucket",
		events: func(h *hist) {
			for i := range 30 {
				op := "r" + string(rune('a'+i))
				at := int64(i) * int64(time.Second/time.Millisecond) / rateLimit
				h.fsend(Event{Op: op, Receiver: recvRate}, at).frun(op, "w0.g1", 1, at+2, at+5, ResultOK)
			}
		},
		check: func(f *FeatureReport) bool { return f.MaxRateExcess < 1 },
	}, {
		name: "rate limit: sixteen at once",
		events: func(h *hist) {
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				h.fsend(Event{Op: op, Receiver: recvRate}, 0).frun(op, "w0.g1", 1, 10, 15, ResultOK)
			}
		},
		broken: brokeRate,
	}, {
		name: "rate limit: sixteen at once just after a stall of the connections",
		events: func(h *hist) {
			// Tokens taken before the stall; the fetch held until it ended.
			h.fault(FaultStallConns, "proxy", 0, 2000)
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				h.fsend(Event{Op: op, Receiver: recvRate}, 0).frun(op, "w0.g1", 1, 2003+int64(i), 2010+int64(i), ResultOK)
			}
		},
		check: func(f *FeatureReport) bool { return f.Explained[brokeRate+":"+FaultStallConns] > 0 },
	}, {
		name: "rate limit: sixteen at once more than a token's lag after a stall",
		events: func(h *hist) {
			h.fault(FaultStallConns, "proxy", 0, 2000)
			for i := range 16 {
				op := "r" + string(rune('a'+i))
				at := 2000 + tokenLag.Milliseconds() + 10
				h.fsend(Event{Op: op, Receiver: recvRate}, 0).frun(op, "w0.g1", 1, at, at+5, ResultOK)
			}
		},
		broken: brokeRate,
	}, {
		name: "pool: a dead letter",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0).add(Event{T: ms(50), Proc: "harness", Kind: KindDeadLetter, Op: "a"})
		},
		broken: brokePoolDead,
	}, {
		name: "pool: a dead letter after faults",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0)
			h.fault(FaultKillWorker, "w0.g1", 20, 20).add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Receiver: recvPool})
			h.add(Event{T: ms(5000), Proc: "harness", Kind: KindDeadLetter, Op: "a"})
		},
		check: func(f *FeatureReport) bool { return f.Explained[brokePoolDead+":process_fault"] == 1 },
	}, {
		name: "pool: given back and delivered again with its attempt",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindGivenBack, Op: "a", ID: "id-a", Attempt: 1, Receiver: recvPool})
			h.frun("a", "w1.g1", 1, 20, 30, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["pool_given_back"] == 1 },
	}, {
		name: "pool: given back, and the attempt counted",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindGivenBack, Op: "a", ID: "id-a", Attempt: 1, Receiver: recvPool})
			h.frun("a", "w1.g1", 2, 20, 30, ResultOK)
		},
		broken: brokePoolAttempt,
	}, {
		name: "pool: given back at attempt 2, then attempt 1 started late by a worker stopped across the give-back",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0)
			h.fault(FaultStopWorker, "w1.g1", 5, 2500)
			h.add(Event{T: ms(2100), Proc: "w0.g1", Kind: KindGivenBack, Op: "a", ID: "id-a", Attempt: 2, Receiver: recvPool})
			h.frun("a", "w1.g1", 1, 2510, 2520, ResultOK)
		},
		explained: brokePoolAttempt + ":fault",
	}, {
		name: "pool: given back at attempt 2, then attempt 1 started by a worker with no fault",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPool}, 0)
			h.fault(FaultStopWorker, "w2.g1", 5, 2500)
			h.add(Event{T: ms(2100), Proc: "w0.g1", Kind: KindGivenBack, Op: "a", ID: "id-a", Attempt: 2, Receiver: recvPool})
			h.frun("a", "w1.g1", 1, 2510, 2520, ResultOK)
		},
		broken: brokePoolAttempt,
	}, {
		name: "pause: starts before the pause took effect and after the resume",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, 900).frun("a", "w0.g1", 1, 1500, 1510, ResultOK)
			h.fsend(Event{Op: "b", Receiver: recvPaused}, 2000).frun("b", "w0.g1", 1, 5010, 5020, ResultOK)
		},
		check: func(f *FeatureReport) bool {
			return f.MaxPauseLag == 498*time.Millisecond && f.Exercised["pauses"] == 1
		},
	}, {
		name: "pause: a start while paused",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, 2000).frun("a", "w0.g1", 1, 3000, 3010, ResultOK)
		},
		broken: brokePaused,
	}, {
		name: "pause: a start while paused, after Redis stalled",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fault(FaultStallConns, "proxy", 2000, 2500)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, 1900).frun("a", "w0.g1", 1, 2600, 2610, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Explained[brokePaused+":redis_fault"] == 1 },
	}, {
		name: "pause: a failed Pause forbids nothing",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultError).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "a", Receiver: recvPaused}, 2000).frun("a", "w0.g1", 1, 3000, 3010, ResultOK)
		},
	}, {
		name: "priority: delivered at another level",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Receiver: recvPaused, Priority: 1}, 0)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Receiver: recvPaused})
			h.add(Event{T: ms(20), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultOK})
		},
		broken: brokeLevel,
	}, {
		name: "priority: after a resume, high before normal before low",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "lo", Receiver: recvPaused, Priority: -1}, 2100).frun("lo", "w0.g1", 1, 5030, 5040, ResultOK)
			h.fsend(Event{Op: "no", Receiver: recvPaused}, 2200).frun("no", "w1.g1", 1, 5020, 5030, ResultOK)
			h.fsend(Event{Op: "hi", Receiver: recvPaused, Priority: 1}, 2300).frun("hi", "w2.g1", 1, 5010, 5020, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["priority_pauses_judged"] == 1 && f.MaxOvertaken == 0 },
	}, {
		name: "priority: after a resume, a low message overtaken by as many higher ones as the workers hold",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "lo", Receiver: recvPaused, Priority: -1}, 2100).frun("lo", "w0.g1", 1, 5010, 5020, ResultOK)
			for i, op := range []string{"h1", "h2", "n3"} {
				h.fsend(Event{Op: op, Receiver: recvPaused, Priority: 1 - i/2}, 2200).frun(op, "w"+string(rune('1'+i%2))+".g1", 1, 5400+int64(i), 5500, ResultOK)
			}
		},
		check: func(f *FeatureReport) bool { return f.MaxOvertaken == 3 },
	}, {
		name: "priority: after a resume, a normal message overtaken by more high ones than the workers hold",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "no", Receiver: recvPaused}, 2200).frun("no", "w0.g1", 1, 5010, 5020, ResultOK)
			h.fourHigh(2300)
		},
		broken: brokeOrder,
		check:  func(f *FeatureReport) bool { return f.MaxOvertaken == 4 },
	}, {
		name: "priority: high messages sent too late to be noticed are not judged",
		events: func(h *hist) {
			h.pauseCall(KindPause, 1000, ResultOK).pauseCall(KindResume, 5000, ResultOK)
			h.fsend(Event{Op: "no", Receiver: recvPaused}, 2200).frun("no", "w0.g1", 1, 5010, 5020, ResultOK)
			h.fourHigh(4000)
		},
	}, {
		name: "dedup: windows apart, and a duplicate of the holder",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultOK)
			h.add(Event{T: ms(100), Proc: "p1.g1", Kind: KindSend, Op: "b", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"})
			h.add(Event{T: ms(101), Proc: "p1.g1", Kind: KindSent, Op: "b", ID: "id-a", Result: ResultDuplicate})
			h.fsend(Event{Op: "c", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 400).frun("c", "w0.g1", 1, 410, 420, ResultOK)
			// The same key on another receiver is another key.
			h.fsend(Event{Op: "d", Mode: ModeDedup, Receiver: "chaos.q2", Key: "w0"}, 50).frun("d", "w0.g1", 1, 60, 70, ResultOK)
		},
		check: func(f *FeatureReport) bool {
			return f.Exercised["dedup_duplicates"] == 1 && f.Exercised["dedup_sends"] == 4
		},
	}, {
		name: "dedup: two queued within a window",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultOK)
			h.fsend(Event{Op: "b", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 200).frun("b", "w0.g1", 1, 210, 220, ResultOK)
		},
		broken: brokeDedupTwo,
	}, {
		name: "dedup until settled: the next queued after the first ran",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedupSettled, Receiver: "chaos.q1", Key: "s0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultOK)
			h.fsend(Event{Op: "b", Mode: ModeDedupSettled, Receiver: "chaos.q1", Key: "s0"}, 30).frun("b", "w0.g1", 1, 40, 50, ResultOK)
		},
	}, {
		name: "dedup until settled: the next queued while the first ran",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedupSettled, Receiver: "chaos.q1", Key: "s0"}, 0).frun("a", "w0.g1", 1, 10, 100, ResultOK)
			h.fsend(Event{Op: "b", Mode: ModeDedupSettled, Receiver: "chaos.q1", Key: "s0"}, 30).frun("b", "w1.g1", 1, 40, 50, ResultOK)
		},
		broken: brokeDedupTwo,
	}, {
		name: "dedup: a duplicate of a message of another key",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w1"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultOK)
			h.add(Event{T: ms(100), Proc: "p1.g1", Kind: KindSend, Op: "b", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"})
			h.add(Event{T: ms(101), Proc: "p1.g1", Kind: KindSent, Op: "b", ID: "id-a", Result: ResultDuplicate})
		},
		broken: brokeDedupHolder,
	}, {
		name: "dedup: a duplicate of a message whose window had passed",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 0).frun("a", "w0.g1", 1, 10, 20, ResultOK)
			h.add(Event{T: ms(400), Proc: "p1.g1", Kind: KindSend, Op: "b", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"})
			h.add(Event{T: ms(401), Proc: "p1.g1", Kind: KindSent, Op: "b", ID: "id-a", Result: ResultDuplicate})
		},
		broken: brokeDedupHolder,
	}, {
		name: "dedup: an acknowledged message never handled",
		events: func(h *hist) {
			h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, 0)
		},
		broken: brokeFeatureLost,
	}, {
		name: "idempotent: one message, one reply to every caller, after a crash and a rerun",
		events: func(h *hist) {
			h.idem("a", "k0", "id-m", 0).idem("b", "k0", "id-m", 20)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.fault(FaultCrashWorker, "w0.g1", 30, 30)
			h.idemOutcome("a", 25, idemReply("a", "w0.g1", 1))
			h.add(Event{T: ms(2100), Proc: "w1.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 2, Receiver: recvIdem})
			h.add(Event{T: ms(2110), Proc: "w1.g1", Kind: KindEnd, Op: "a", ID: "id-m", Attempt: 2, Result: ResultOK})
			h.idemOutcome("b", 2120, idemReply("a", "w0.g1", 1))
		},
		check: func(f *FeatureReport) bool {
			return f.Exercised["idem_reruns"] == 1 && f.Exercised["idem_replies_after_rerun"] == 1 && f.Exercised["idem_messages"] == 1
		},
	}, {
		name: "idempotent: two callers of one message, two replies",
		events: func(h *hist) {
			h.idem("a", "k0", "id-m", 0).idem("b", "k0", "id-m", 20)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(2100), Proc: "w1.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 2, Receiver: recvIdem})
			h.idemOutcome("a", 25, idemReply("a", "w0.g1", 1)).idemOutcome("b", 2120, idemReply("a", "w1.g1", 2))
		},
		broken: brokeIdemReplies,
	}, {
		name: "idempotent: a reply of no run",
		events: func(h *hist) {
			h.idem("a", "k0", "id-m", 0)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.idemOutcome("a", 25, idemReply("a", "w2.g1", 1))
		},
		broken: brokeIdemForeign,
	}, {
		name: "idempotent: two messages of a key within its window",
		events: func(h *hist) {
			h.idem("a", "k0", "id-m", 0).idem("b", "k0", "id-n", 1000)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(1010), Proc: "w0.g1", Kind: KindStart, Op: "b", ID: "id-n", Attempt: 1, Receiver: recvIdem})
		},
		broken: brokeIdemTwo,
	}, {
		name: "idempotent: a key's window counts from the send that stored its message, whose OnSent was never called",
		events: func(h *hist) {
			// a stores id-m at 0 but its answer is lost (no sent event);
			// b joins it at 3000, before its run starts at 3500; c stores
			// id-n at 6500, after a's window (from 0), within b's (from
			// 3000).
			h.add(Event{T: ms(0), Proc: "p0.g1", Kind: KindSend, Op: "a", Mode: ModeIdempotent, Receiver: recvIdem, Key: "k0"})
			h.idem("b", "k0", "id-m", 3000).idem("c", "k0", "id-n", 6500)
			h.add(Event{T: ms(3500), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(3510), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-m", Attempt: 1, Result: ResultOK})
			h.add(Event{T: ms(6510), Proc: "w0.g1", Kind: KindStart, Op: "c", ID: "id-n", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(6520), Proc: "w0.g1", Kind: KindEnd, Op: "c", ID: "id-n", Attempt: 1, Result: ResultOK})
		},
		check: func(f *FeatureReport) bool { return f.Exercised["idem_messages"] == 2 },
	}, {
		name: "idempotent: a second message within the window of a send whose OnSent was never called",
		events: func(h *hist) {
			h.add(Event{T: ms(0), Proc: "p0.g1", Kind: KindSend, Op: "a", Mode: ModeIdempotent, Receiver: recvIdem, Key: "k0"})
			h.idem("b", "k0", "id-m", 3000).idem("c", "k0", "id-n", 4000)
			h.add(Event{T: ms(3500), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(3510), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-m", Attempt: 1, Result: ResultOK})
			h.add(Event{T: ms(4010), Proc: "w0.g1", Kind: KindStart, Op: "c", ID: "id-n", Attempt: 1, Receiver: recvIdem})
			h.add(Event{T: ms(4020), Proc: "w0.g1", Kind: KindEnd, Op: "c", ID: "id-n", Attempt: 1, Result: ResultOK})
		},
		broken: brokeIdemTwo,
	}, {
		name: "schedules: every tick once, a catch-up standing for missed ticks",
		events: func(h *hist) {
			for i, tick := range []int64{1000, 1250, 1500, 1750} {
				h.tick("chaos.every", "e"+string(rune('0'+i)), tick, 0)
			}
			h.tick("chaos.catchup", "c0", 1000, 0).tick("chaos.catchup", "c1", 1400, 3).tick("chaos.catchup", "c2", 2600, 0)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["ticks"] == 7 && f.Exercised["ticks_caught_up"] == 1 },
	}, {
		name: "schedules: two messages for one tick",
		events: func(h *hist) {
			h.tick("chaos.every", "e0", 1000, 0).tick("chaos.every", "e1", 1250, 0).tick("chaos.every", "e2", 1250, 0)
		},
		broken: brokeTickTwice,
	}, {
		name: "schedules: a tick skipped, the next sent before the skipped one was a second old",
		events: func(h *hist) {
			h.tick("chaos.every", "e0", 3000, 0).tick("chaos.every", "e1", 3500, 0)
		},
		broken: brokeTickSkipped,
	}, {
		name: "schedules: ticks skipped when the next was sent a second after the first skipped",
		events: func(h *hist) {
			h.tick("chaos.every", "e0", 3000, 0).tick("chaos.every", "e1", 4500, 0)
			// Delivered again later: its first delivery counts.
			h.add(Event{T: ms(9000), Proc: "w1.g1", Kind: KindTick, Key: "chaos.every", ID: "e1", Attempt: 2, Tick: ms(4500), Receiver: recvTicks})
		},
		check: func(f *FeatureReport) bool {
			return f.Explained[brokeTickSkipped+":missed"] == 1 && f.Exercised["ticks_skipped"] == 5
		},
	}, {
		name: "schedules: a tick skipped by a schedule that sends missed ticks as one",
		events: func(h *hist) {
			h.fault(FaultKillRedis, "redis", 3100, 5000)
			h.tick("chaos.catchup", "c0", 3000, 0).tick("chaos.catchup", "c1", 5400, 0)
		},
		broken: brokeTickSkipped,
	}})
}

// fourHigh adds four high messages of recvPaused sent at at ms, started one
// after another from 5100 ms on three workers.
func (h *hist) fourHigh(at int64) {
	for i, op := range []string{"h1", "h2", "h3", "h4"} {
		h.fsend(Event{Op: op, Receiver: recvPaused, Priority: 1}, at).frun(op, "w"+string(rune('0'+i%3))+".g1", 1, 5100+100*int64(i), 5150+100*int64(i), ResultOK)
	}
}

// idem adds an idempotent Request of op with key, whose OnSent gave id.
func (h *hist) idem(op, key, id string, at int64) *hist {
	h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: op, Mode: ModeIdempotent, Receiver: recvIdem, Key: key})
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: op, ID: id})
}

// idemOutcome adds the reply an idempotent Request of op returned.
func (h *hist) idemOutcome(op string, at int64, reply string) *hist {
	return h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindIdemOutcome, Op: op, Result: ResultReply, Reply: reply})
}

// TestIdemReply: the reply of an idempotent message's run names the run.
func TestIdemReply(t *testing.T) {
	op, proc, attempt, ok := parseIdemReply(idemReply("p1.g2-f2-7", "w0.g3", 2))
	if !ok || op != "p1.g2-f2-7" || proc != "w0.g3" || attempt != 2 {
		t.Fatalf("parseIdemReply = %q, %q, %d, %v", op, proc, attempt, ok)
	}
	for _, bad := range []string{"", "a|b", "a|b|c", "a|b|1|2"} {
		if _, _, _, ok := parseIdemReply(bad); ok {
			t.Errorf("parseIdemReply(%q) ok", bad)
		}
	}
}
