package chaos

import (
	"maps"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ms gives a time in the hand-made histories: n milliseconds after a base.
func ms(n int64) int64 { return 1_700_000_000_000_000_000 + n*int64(time.Millisecond) }

// hist builds a hand-made history.
type hist []Event

func (h *hist) add(e Event) *hist { *h = append(*h, e); return h }

func (h *hist) sendFF(op string, at int64) *hist {
	h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: op, Mode: ModeFireAndForget})
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: op, ID: "id-" + op})
}

func (h *hist) sendTimed(op string, at int64) *hist {
	h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: op, Mode: ModeTimed, Timeout: int64(time.Second)})
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: op, ID: "id-" + op})
}

func (h *hist) sendDelayed(op string, at, delay int64) *hist {
	h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: op, Mode: ModeDelayed, Timeout: delay * int64(time.Millisecond)})
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: op, ID: "id-" + op})
}

// cancelCall records that the producer is about to Cancel op.
func (h *hist) cancelCall(op string, at int64) *hist {
	return h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindCancelCall, Op: op, ID: "id-" + op})
}

func (h *hist) cancel(op string, at int64, result string) *hist {
	return h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindCancel, Op: op, ID: "id-" + op, Result: result})
}

func (h *hist) handle(op, proc string, attempt int, at int64, result string) *hist {
	h.add(Event{T: ms(at), Proc: proc, Kind: KindStart, Op: op, ID: "id-" + op, Attempt: attempt})
	return h.add(Event{T: ms(at + 5), Proc: proc, Kind: KindEnd, Op: op, ID: "id-" + op, Attempt: attempt, Result: result})
}

// acked records the acknowledgement of op's attempt on proc, named by the
// message's id as a worker records it.
func (h *hist) acked(op, proc string, attempt int, at int64, result string) *hist {
	return h.add(Event{T: ms(at), Proc: proc, Kind: KindAcked, Op: "id:id-" + op, ID: "id-" + op, Attempt: attempt, Result: result})
}

func (h *hist) reply(op, proc string, at int64, result string) *hist {
	return h.add(Event{T: ms(at), Proc: proc, Kind: KindReply, Op: op, ID: "id-" + op, Attempt: 1, Result: result})
}

func (h *hist) outcome(op, proc string, at int64, result string) *hist {
	return h.add(Event{T: ms(at), Proc: proc, Kind: KindOutcome, Op: op, ID: "id-" + op, Result: result})
}

func (h *hist) fault(kind, target string, from, to int64) *hist {
	return h.add(Event{T: ms(from), Proc: "harness", Kind: KindFault, Fault: kind, Target: target, End: ms(to)})
}

func (h *hist) final(pending int64) []Event {
	h.add(Event{T: ms(100_000), Proc: "harness", Kind: KindSettle})
	h.add(Event{T: ms(100_001), Proc: "harness", Kind: KindFinal, N: pending, Result: ResultSettled})
	return *h
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name   string
		events func() []Event
		opts   CheckOptions
		ok     bool
		check  func(r *Report) bool
	}{{
		name: "clean: handled, replied, timed out, dead-lettered, retried",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultFailed).handle("a", "w1.g1", 2, 100, ResultOK)
			h.sendTimed("b", 0).handle("b", "w0.g1", 1, 10, ResultOK).reply("b", "w0.g1", 14, ResultAccepted).outcome("b", "p1.g1", 20, ResultReply)
			h.sendTimed("c", 0).outcome("c", "p0.g1", 1100, ResultTimeout)
			h.sendFF("d", 0).handle("d", "w0.g1", 1, 10, ResultFailed).add(Event{T: ms(50), Proc: "harness", Kind: KindDeadLetter, Op: "d"})
			return h.final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.Acked == 4 && r.DeadLetters == 1 && len(r.Duplicates) == 0 },
	}, {
		name: "delayed: handled at its due time, cancelled scheduled, cancelled in flight",
		events: func() []Event {
			h := &hist{}
			h.sendDelayed("a", 0, 100).handle("a", "w0.g1", 1, 101, ResultOK)
			h.sendDelayed("b", 0, 100).cancel("b", 50, CancelDeferred)
			h.sendDelayed("c", 0, 100).handle("c", "w0.g1", 1, 101, ResultCancelled).cancel("c", 102, CancelInFlight)
			// A Cancel whose answer was lost may have taken effect.
			h.sendDelayed("d", 0, 100).cancel("d", 50, ResultError)
			return h.final(0)
		},
		ok: true,
		check: func(r *Report) bool {
			return r.Cancelled[CancelDeferred] == 1 && r.Cancelled[CancelInFlight] == 1 && r.Cancelled[ResultError] == 1 && r.Lost == 0
		},
	}, {
		name: "delayed: started before its due time",
		events: func() []Event {
			h := &hist{}
			return h.sendDelayed("a", 0, 100).handle("a", "w0.g1", 1, 50, ResultOK).final(0)
		},
		check: func(r *Report) bool { return r.EarlyStarts == 1 },
	}, {
		name: "delayed: handled although Cancel found it queued",
		events: func() []Event {
			h := &hist{}
			return h.sendDelayed("a", 0, 100).cancel("a", 120, CancelQueued).handle("a", "w0.g1", 1, 130, ResultOK).final(0)
		},
		check: func(r *Report) bool { return r.CancelledHandled == 1 },
	}, {
		name: "delayed: lost when no Cancel found it",
		events: func() []Event {
			h := &hist{}
			return h.sendDelayed("a", 0, 100).cancelCall("a", 119).cancel("a", 120, CancelNotFound).final(0)
		},
		check: func(r *Report) bool { return r.Lost == 1 },
	}, {
		name: "delayed: a Cancel begun whose producer was killed before it returned may have taken effect",
		events: func() []Event {
			h := &hist{}
			h.sendDelayed("a", 0, 100).cancelCall("a", 57).fault(FaultKillProducer, "p0.g1", 102, 102)
			// A message sent and never cancelled is lost all the same.
			h.sendDelayed("b", 0, 100)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.Lost == 1 },
	}, {
		name: "lost send",
		events: func() []Event {
			h := &hist{}
			return h.sendFF("a", 0).final(0)
		},
		check: func(r *Report) bool { return r.Lost == 1 },
	}, {
		name: "lost send after a failed attempt",
		events: func() []Event {
			h := &hist{}
			return h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultFailed).final(0)
		},
		check: func(r *Report) bool { return r.Lost == 1 },
	}, {
		name: "unknown send is not lost",
		events: func() []Event {
			h := &hist{}
			h.add(Event{T: ms(0), Proc: "p1.g1", Kind: KindSend, Op: "a", Mode: ModeFireAndForget})
			return h.fault(FaultKillProducer, "p1.g1", 1, 1).final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.Unknown == 1 },
	}, {
		name: "timed send without outcome",
		events: func() []Event {
			h := &hist{}
			return h.sendTimed("a", 0).final(0)
		},
		check: func(r *Report) bool { return r.NoOutcome == 1 },
	}, {
		name: "double outcome: a reply and a timeout",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).outcome("a", "p0.g1", 900, ResultReply).outcome("a", "p1.g1", 1100, ResultTimeout)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.MultiOutcome == 1 },
	}, {
		name: "same outcome twice with no fault",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).outcome("a", "p0.g1", 1100, ResultTimeout).outcome("a", "p1.g1", 1200, ResultTimeout)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.MultiOutcome == 1 },
	}, {
		name: "same outcome again after the first reader was killed",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).outcome("a", "p1.g1", 1100, ResultTimeout).fault(FaultKillProducer, "p1.g1", 1101, 1101).outcome("a", "p0.g1", 3200, ResultTimeout)
			return h.final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.RedeliveredOutcomes == 1 },
	}, {
		name: "reply accepted but the sender saw a timeout",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).handle("a", "w0.g1", 1, 10, ResultOK).reply("a", "w0.g1", 14, ResultAccepted).outcome("a", "p0.g1", 1100, ResultTimeout)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.Disagreements == 1 },
	}, {
		name: "sender saw a reply that was refused as late",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).handle("a", "w0.g1", 1, 10, ResultOK).reply("a", "w0.g1", 14, ResultLate).outcome("a", "p0.g1", 20, ResultReply)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.Disagreements == 1 },
	}, {
		name: "a reply whose result is unknown may be the one the sender saw",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0).handle("a", "w0.g1", 1, 10, ResultFailed).reply("a", "w0.g1", 14, ResultError).outcome("a", "p0.g1", 20, ResultReply)
			return h.final(0)
		},
		ok: true,
	}, {
		name: "a dead letter's error reply is matched by the id its handler saw",
		events: func() []Event {
			h := &hist{}
			h.add(Event{T: ms(0), Proc: "p1.g1", Kind: KindSend, Op: "a", Mode: ModeTimed})
			h.fault(FaultKillProducer, "p1.g1", 1, 1).handle("a", "w0.g1", 1, 10, ResultFailed)
			h.outcome("id:id-a", "p0.g1", 20, ResultRemoteError).outcome("a", "p0.g1", 1100, ResultTimeout)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.MultiOutcome == 1 },
	}, {
		name: "late start",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1500), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Deadline: ms(1001)})
			h.add(Event{T: ms(1505), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultExpired})
			return h.outcome("a", "p0.g1", 1100, ResultTimeout).final(0)
		},
		check: func(r *Report) bool { return r.LateStarts == 1 && r.MaxLateness == 499*time.Millisecond },
	}, {
		name: "start just before the deadline",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1000), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Deadline: ms(1001)})
			h.add(Event{T: ms(1005), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultExpired})
			return h.outcome("a", "p0.g1", 1100, ResultTimeout).final(0)
		},
		ok: true,
	}, {
		name: "start judged by Redis's deadline, not by a skewed one the handler was given",
		events: func() []Event {
			h := &hist{}
			h.sendTimed("a", 0)
			h.add(Event{T: ms(900), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1, Deadline: ms(600)})
			h.add(Event{T: ms(905), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultExpired})
			return h.outcome("a", "p0.g1", 1100, ResultTimeout).final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.MaxDeadlineSkew == 401*time.Millisecond },
	}, {
		name: "duplicate after a lease expiry",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultLeaseLost).handle("a", "w1.g1", 2, 2100, ResultOK)
			return h.final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.Duplicates["lease_lost"] == 1 },
	}, {
		name: "duplicate after the worker was killed",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0)
			h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1})
			h.fault(FaultKillWorker, "w0.g1", 12, 12).handle("a", "w1.g1", 2, 2100, ResultOK)
			return h.final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.Duplicates["process_fault"] == 1 },
	}, {
		name: "duplicate whose first delivery was held up by a stall",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0).fault(FaultStallConns, "proxy", 2, 2600)
			h.handle("a", "w0.g1", 1, 2601, ResultOK).handle("a", "w1.g1", 2, 2700, ResultOK)
			return h.final(0)
		},
		ok:    true,
		check: func(r *Report) bool { return r.Duplicates["redis_fault"] == 1 },
	}, {
		name: "duplicate with no lease expiry nor fault",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultOK).handle("a", "w1.g1", 2, 500, ResultOK)
			return h.final(0)
		},
		check: func(r *Report) bool { return r.Duplicates["unexplained"] == 1 },
	}, {
		name: "pending at the end",
		events: func() []Event {
			h := &hist{}
			return h.final(3)
		},
		check: func(r *Report) bool { return r.PendingAtEnd == 3 },
	}, {
		name: "a killed requester owes no outcome, nor one that could not send; a live one does",
		events: func() []Event {
			h := &hist{}
			h.add(Event{T: ms(0), Proc: "p1.g1", Kind: KindSend, Op: "a", Mode: ModeRequest})
			h.fault(FaultKillProducer, "p1.g1", 10, 10)
			h.add(Event{T: ms(0), Proc: "p0.g1", Kind: KindSend, Op: "b", Mode: ModeRequest})
			h.add(Event{T: ms(0), Proc: "p0.g1", Kind: KindSend, Op: "c", Mode: ModeRequest})
			h.add(Event{T: ms(1), Proc: "p0.g1", Kind: KindSendFailed, Op: "c", Err: "unreachable"})
			return h.final(0)
		},
		check: func(r *Report) bool { return r.NoOutcome == 1 },
	}, {
		name: "loss in a failover is measured apart",
		events: func() []Event {
			h := &hist{}
			h.sendFF("a", 0).sendTimed("b", 10).fault(FaultSentinelFailover, "sentinel", 500, 2500)
			return h.final(0)
		},
		opts:  CheckOptions{FailoverLoss: true},
		ok:    true,
		check: func(r *Report) bool { return r.LostInFailover == 2 && r.LossWindow == 500*time.Millisecond },
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.events(), tt.opts)
			if r.OK() != tt.ok || (tt.check != nil && !tt.check(r)) {
				t.Errorf("Check: OK %v, want %v; report:\n%s", r.OK(), tt.ok, r)
			}
		})
	}
}

// TestCheckRedeliveries: a redelivery after a handler that ended well is
// explained only by a fault, a failed acknowledgement, or a lease that may
// have run out before the acknowledgement landed. Each history sends "a"
// at 0 (the lease is 2s); attempt 1 starts on w0.g1 at 10 and, unless the
// case says otherwise, ends ok at 15; attempt 2 starts on w1.g1 at 2100.
func TestCheckRedeliveries(t *testing.T) {
	first := func(h *hist) *hist { return h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultOK) }
	again := func(h *hist) []Event {
		return h.handle("a", "w1.g1", 2, 2100, ResultOK).acked("a", "w1.g1", 2, 2106, ResultOK).final(0)
	}
	tests := []struct {
		name  string
		build func(h *hist) []Event
		why   string // the duplicate's explanation
		rule  string // the rule that finds it unexplained
	}{{
		name:  "acknowledged within its lease, on a worker and a Redis no fault touched",
		build: func(h *hist) []Event { return again(first(h).acked("a", "w0.g1", 1, 20, ResultOK)) },
		why:   "unexplained",
		rule:  "acked_within_lease",
	}, {
		name:  "ended well within its lease and never acknowledged",
		build: func(h *hist) []Event { return again(first(h)) },
		why:   "unexplained",
		rule:  "never_acked",
	}, {
		name: "acknowledged within its lease, redelivered within it",
		build: func(h *hist) []Event {
			first(h).acked("a", "w0.g1", 1, 20, ResultOK)
			return h.handle("a", "w1.g1", 2, 500, ResultOK).final(0)
		},
		why:  "unexplained",
		rule: "within_lease",
	}, {
		name:  "its acknowledgement returned after the lease may have run out",
		build: func(h *hist) []Event { return again(first(h).acked("a", "w0.g1", 1, 2150, ResultOK)) },
		why:   "lease_expired",
	}, {
		name: "the handler ran past its lease and lost it: not acknowledged",
		build: func(h *hist) []Event {
			h.sendFF("a", 0).add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-a", Attempt: 1})
			h.add(Event{T: ms(2300), Proc: "w0.g1", Kind: KindEnd, Op: "a", ID: "id-a", Attempt: 1, Result: ResultOK})
			return again(h)
		},
		why: "lease_expired",
	}, {
		name: "its worker was stopped (SIGSTOP) before it acknowledged",
		build: func(h *hist) []Event {
			return again(first(h).fault(FaultStopWorker, "w0.g1", 16, 4000).acked("a", "w0.g1", 1, 4001, ResultOK))
		},
		why: "process_fault",
	}, {
		name:  "its worker was killed later, before it recorded the acknowledgement",
		build: func(h *hist) []Event { return again(first(h).fault(FaultKillWorker, "w0.g1", 3000, 3000)) },
		why:   "process_fault",
	}, {
		name: "the proxy cut the acknowledgement's answer",
		build: func(h *hist) []Event {
			return again(first(h).fault(FaultCutAnswers, "proxy", 16, 300).acked("a", "w0.g1", 1, 350, ResultOK))
		},
		why: "redis_fault",
	}, {
		name: "a Redis restart lost the acknowledgement",
		build: func(h *hist) []Event {
			return again(first(h).acked("a", "w0.g1", 1, 20, ResultOK).fault(FaultKillRedis, "redis", 25, 900))
		},
		why: "redis_fault",
	}, {
		name:  "its acknowledgement failed",
		build: func(h *hist) []Event { return again(first(h).acked("a", "w0.g1", 1, 1500, ResultError)) },
		why:   "ack_failed",
	}, {
		name: "its worker, stopped past its heartbeat's ttl, is back, and a peer took its delivery before it read so",
		build: func(h *hist) []Event {
			h.fault(FaultStopWorker, "w0.g1", -5000, -1000)
			return again(first(h).acked("a", "w0.g1", 1, 20, ResultOK))
		},
		why: "process_fault",
	}, {
		name: "Redis stalled past the heartbeat's ttl, and a peer took its delivery before it read the worker was back",
		build: func(h *hist) []Event {
			h.fault(FaultStallConns, "proxy", -5000, -1000)
			return again(first(h).acked("a", "w0.g1", 1, 20, ResultOK))
		},
		why: "redis_fault",
	}, {
		name: "a Redis fault that ended well before the send",
		build: func(h *hist) []Event {
			h.fault(FaultStallConns, "proxy", -5000, -2001)
			return again(first(h).acked("a", "w0.g1", 1, 20, ResultOK))
		},
		why:  "unexplained",
		rule: "acked_within_lease",
	}, {
		name: "handed back at shutdown",
		build: func(h *hist) []Event {
			return again(h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultStopped))
		},
		why: "lease_lost",
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.build(&hist{}), CheckOptions{})
			wantRules := map[string]int{}
			if tt.rule != "" {
				wantRules[tt.rule] = 1
			}
			if r.Duplicates[tt.why] != 1 || len(r.Duplicates) != 1 || r.OK() != (tt.why != "unexplained") || !maps.Equal(r.Unexplained, wantRules) {
				t.Errorf("Check: duplicates %v (unexplained by rule %v), OK %v; want one %s (rule %q); report:\n%s", r.Duplicates, r.Unexplained, r.OK(), tt.why, tt.rule, r)
			}
		})
	}
}

// TestCheckNoDuplicate: a retry after an error and a message cancelled in
// flight (its handler ended well, not acknowledged: the cancel took it)
// are no duplicates.
func TestCheckNoDuplicate(t *testing.T) {
	h := &hist{}
	h.sendFF("a", 0).handle("a", "w0.g1", 1, 10, ResultFailed).handle("a", "w0.g1", 2, 100, ResultOK).acked("a", "w0.g1", 2, 106, ResultOK)
	h.sendDelayed("b", 0, 10).handle("b", "w0.g1", 1, 11, ResultOK).cancel("b", 12, CancelInFlight)
	r := Check(h.final(0), CheckOptions{})
	if !r.OK() || len(r.Duplicates) != 0 || r.Messages != 2 {
		t.Errorf("Check: OK %v, duplicates %v, messages %d; want OK, none, 2; report:\n%s", r.OK(), r.Duplicates, r.Messages, r)
	}
}

// TestHistoryRoundTrip writes events through Recorders and reads them back
// in time order, skipping a line cut short by a kill.
func TestHistoryRoundTrip(t *testing.T) {
	dir := t.TempDir()
	a, err := NewRecorder(dir, "p0.g1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRecorder(dir, "w0.g1")
	if err != nil {
		t.Fatal(err)
	}
	a.Record(Event{T: ms(2), Kind: KindSent, Op: "x"})
	b.Record(Event{T: ms(3), Kind: KindStart, Op: "x", Attempt: 1})
	b.Record(Event{T: ms(4), Kind: KindBatchCounts, Op: "x", Counts: &BatchCounts{Children: 3, Succeeded: 2, DeadLettered: 1}})
	a.Record(Event{T: ms(1), Kind: KindSend, Op: "x", Mode: ModeFireAndForget})
	a.Close()
	b.Close()
	f, err := os.OpenFile(filepath.Join(dir, "w0.g1.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"t":17,"proc":"w0.g1","ki`); err != nil {
		t.Fatal(err)
	}
	f.Close()
	events, err := ReadHistory(dir)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Proc+":"+e.Kind)
	}
	want := []string{"p0.g1:send", "p0.g1:sent", "w0.g1:start", "w0.g1:batch_counts"}
	if len(kinds) != len(want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}
	for i := range want {
		if kinds[i] != want[i] {
			t.Fatalf("events %v, want %v", kinds, want)
		}
	}
	if c := events[3].Counts; c == nil || *c != (BatchCounts{Children: 3, Succeeded: 2, DeadLettered: 1}) {
		t.Errorf("counts read back %+v", c)
	}
}
