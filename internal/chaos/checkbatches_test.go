package chaos

import (
	"fmt"
	"testing"
)

// The hand-made histories of batches and chains: each breaks one rule
// (and the test fails if its check is gone), or keeps it, or breaks it
// where the documented exception applies.

// batchOf adds the batch of op created at at ms (id "bt-op") with n
// children on a base receiver, each acknowledged, and its Seal when
// sealed.
func (h *hist) batchOf(op string, n int, at int64, sealed bool) *hist {
	h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: op, Mode: ModeBatchDone, Receiver: recvBatchDone, N: int64(n)})
	h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: op, ID: "bt-" + op})
	for i := range n {
		h.fsend(Event{Op: child(op, i), Mode: ModeBatchChild, Receiver: Receivers[0]}, at+2)
	}
	if sealed {
		h.add(Event{T: ms(at + 4), Proc: "p0.g1", Kind: KindSeal, Op: op, ID: "bt-" + op, Result: ResultOK})
	}
	return h
}

// threeDone adds a sealed batch of op with three children, which ended
// well, the last at 40 ms.
func (h *hist) threeDone(op string) *hist {
	return h.batchOf(op, 3, 0, true).frun(child(op, 0), "w1.g1", 1, 10, 20, ResultOK).frun(child(op, 1), "w2.g1", 1, 10, 40, ResultOK).
		frun(child(op, 2), "w1.g1", 1, 10, 30, ResultOK)
}

// child is the op of a batch's child, or of a chain's step.
func child(op string, i int) string { return fmt.Sprintf("%s.%d", op, i) }

// completion adds attempt of the completion message id of the batch of op
// from at ms, which read counts (none: the read is not recorded).
func (h *hist) completion(op, id string, attempt int, at int64, result string, counts *BatchCounts) *hist {
	h.add(Event{T: ms(at), Proc: "w0.g1", Kind: KindStart, Op: op, ID: id, Attempt: attempt, Receiver: recvBatchDone})
	if counts != nil {
		h.add(Event{T: ms(at + 1), Proc: "w0.g1", Kind: KindBatchCounts, Op: op, ID: "bt-" + op, Attempt: attempt, Result: ResultOK, Counts: counts})
	}
	return h.add(Event{T: ms(at + 2), Proc: "w0.g1", Kind: KindEnd, Op: op, ID: id, Attempt: attempt, Result: result})
}

// chainOf adds the sends of a chain of n steps, op ".0" to ".n-1", at at
// ms, its first acknowledged.
func (h *hist) chainOf(op string, n int, at int64) *hist {
	for i := range n {
		mode := ModeChainNext
		if i == 0 {
			mode = ModeChain
		}
		h.add(Event{T: ms(at), Proc: "p0.g1", Kind: KindSend, Op: child(op, i), Mode: mode, Receiver: recvChain, N: int64(n)})
	}
	return h.add(Event{T: ms(at + 1), Proc: "p0.g1", Kind: KindSent, Op: child(op, 0), ID: "id-" + child(op, 0)})
}

// dead adds op's dead letter, found at the end.
func (h *hist) dead(op string) *hist {
	return h.add(Event{T: ms(90_000), Proc: "harness", Kind: KindDeadLetter, Op: op, ID: "id-" + op, Attempt: 1})
}

// opWhere returns the first of prefix0, prefix1, ... whose step or child i
// has a hash that f accepts.
func opWhere(prefix string, i int, f func(uint32) bool) string {
	for n := 0; ; n++ {
		if op := fmt.Sprintf("%s%d", prefix, n); f(opHash(child(op, i))) {
			return op
		}
	}
}

// three: a batch of three whose children all succeeded.
var three = &BatchCounts{Children: 3, Succeeded: 3}

func TestCheckBatches(t *testing.T) {
	poisonB := opWhere("b", 1, poisoned)
	stopC := opWhere("c", 1, stopsChain)
	judge(t, []featureCase{{
		name: "a batch completed after its last child, with its counts",
		events: func(h *hist) {
			h.threeDone("b")
			h.completion("b", "c1", 1, 41, ResultOK, three)
		},
		check: func(f *FeatureReport) bool {
			return f.Exercised["batch_counts_checked"] == 1 && f.Exercised["batches_completed"] == 1
		},
	}, {
		name: "a completion delivered again, the same message",
		events: func(h *hist) {
			h.threeDone("b")
			h.completion("b", "c1", 1, 41, ResultFailed, nil).completion("b", "c1", 2, 200, ResultOK, three)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["batch_completions_redelivered"] == 1 },
	}, {
		name: "a batch whose child failed for good",
		events: func(h *hist) {
			op := poisonB
			h.batchOf(op, 3, 0, true).frun(child(op, 0), "w1.g1", 1, 10, 20, ResultOK).frun(child(op, 1), "w2.g1", 1, 10, 40, ResultFailed).
				frun(child(op, 2), "w1.g1", 1, 10, 30, ResultOK).dead(child(op, 1))
			h.completion(op, "c1", 1, 41, ResultOK, &BatchCounts{Children: 3, Succeeded: 2, DeadLettered: 1})
		},
		check: func(f *FeatureReport) bool { return f.Exercised["batch_counts_checked"] == 1 },
	}, {
		name: "a completion started before the last child's end",
		events: func(h *hist) {
			h.threeDone("b")
			h.completion("b", "c1", 1, 21, ResultOK, three)
		},
		broken: brokeBatchEarly,
	}, {
		name: "a completion started before a child's retry, after its first attempt failed",
		events: func(h *hist) {
			h.batchOf("b", 2, 0, true).frun("b.0", "w1.g1", 1, 10, 20, ResultOK).frun("b.1", "w2.g1", 1, 10, 15, ResultFailed).frun("b.1", "w2.g1", 2, 100, 110, ResultOK)
			h.completion("b", "c1", 1, 50, ResultOK, &BatchCounts{Children: 2, Succeeded: 2})
		},
		broken: brokeBatchEarly,
	}, {
		name: "two completion messages for one batch",
		events: func(h *hist) {
			h.threeDone("b")
			h.completion("b", "c1", 1, 41, ResultOK, three).completion("b", "c2", 1, 3000, ResultOK, three)
		},
		broken: brokeBatchTwo,
	}, {
		name: "counts read short",
		events: func(h *hist) {
			h.threeDone("b")
			h.completion("b", "c1", 1, 41, ResultOK, &BatchCounts{Children: 3, Succeeded: 2})
		},
		broken: brokeBatchCounts,
	}, {
		name: "counts with a failed child counted as a success",
		events: func(h *hist) {
			op := poisonB
			h.batchOf(op, 3, 0, true).frun(child(op, 0), "w1.g1", 1, 10, 20, ResultOK).frun(child(op, 1), "w2.g1", 1, 10, 40, ResultFailed).
				frun(child(op, 2), "w1.g1", 1, 10, 30, ResultOK).dead(child(op, 1))
			h.completion(op, "c1", 1, 41, ResultOK, three)
		},
		broken: brokeBatchCounts,
	}, {
		name: "a sealed batch whose children all ended, never completed",
		events: func(h *hist) {
			h.batchOf("b", 2, 0, true).frun("b.0", "w1.g1", 1, 10, 20, ResultOK).frun("b.1", "w2.g1", 1, 10, 40, ResultOK)
		},
		broken: brokeBatchMissing,
	}, {
		name: "a batch not sealed (its producer killed before Seal), never completed",
		events: func(h *hist) {
			h.batchOf("b", 2, 0, false).frun("b.0", "w1.g1", 1, 10, 20, ResultOK).frun("b.1", "w2.g1", 1, 10, 40, ResultOK)
		},
		check: func(f *FeatureReport) bool { return f.Exercised["batches_unsealed"] == 1 },
	}, {
		name: "a batch whose child's send failed, never completed",
		events: func(h *hist) {
			h.batchOf("b", 1, 0, true).frun("b.0", "w1.g1", 1, 10, 20, ResultOK)
			h.add(Event{T: ms(3), Proc: "p0.g1", Kind: KindSend, Op: "b.1", Mode: ModeBatchChild, Receiver: Receivers[0]})
			h.add(Event{T: ms(3), Proc: "p0.g1", Kind: KindSendFailed, Op: "b.1", Err: "unavailable"})
			(*h)[0].N = 2
		},
	}, {
		name: "a batch whose child was dead-lettered by a fetch after lost leases",
		events: func(h *hist) {
			h.batchOf("b", 3, 0, true).frun("b.0", "w1.g1", 1, 10, 20, ResultOK).frun("b.1", "w2.g1", 1, 10, 40, ResultLeaseLost).dead("b.1")
			// Ended well, its acknowledgement lost, then dead-lettered.
			h.frun("b.2", "w0.g1", 1, 10, 30, ResultOK).dead("b.2")
			h.completion("b", "c1", 1, 3000, ResultOK, &BatchCounts{Children: 3, Succeeded: 1, DeadLettered: 2})
		},
		check: func(f *FeatureReport) bool {
			return f.Exercised["batch_children_dead_by_fetch"] == 1 && f.Exercised["batch_counts_checked"] == 1
		},
	}, {
		name: "a sealed batch whose child was dead-lettered by a fetch, never completed",
		events: func(h *hist) {
			h.batchOf("b", 2, 0, true).frun("b.0", "w1.g1", 1, 10, 20, ResultOK).frun("b.1", "w2.g1", 1, 10, 40, ResultLeaseLost).dead("b.1")
		},
		broken: brokeBatchMissing,
	}, {
		name: "a chain run step after step",
		events: func(h *hist) {
			h.chainOf("c", 3, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.1", "w1.g1", 1, 21, 30, ResultOK).frun("c.2", "w2.g1", 1, 31, 40, ResultOK)
		},
		check: func(f *FeatureReport) bool {
			return f.Exercised["chains_finished"] == 1 && f.Exercised["chain_steps_run"] == 3
		},
	}, {
		name: "a chain stopped by a step that failed for good, a step retried",
		events: func(h *hist) {
			op := stopC
			h.chainOf(op, 3, 0).frun(child(op, 0), "w0.g1", 1, 10, 15, ResultFailed).frun(child(op, 0), "w0.g1", 2, 100, 110, ResultOK).
				frun(child(op, 1), "w1.g1", 1, 120, 130, ResultFailed).dead(child(op, 1))
		},
		check: func(f *FeatureReport) bool { return f.Exercised["chains_stopped"] == 1 },
	}, {
		name: "a step started before the step before ended",
		events: func(h *hist) {
			h.chainOf("c", 2, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.1", "w1.g1", 1, 15, 30, ResultOK)
		},
		broken: brokeChainOrder,
	}, {
		name: "a step started after the step before failed",
		events: func(h *hist) {
			h.chainOf("c", 2, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultFailed).dead("c.0").frun("c.1", "w1.g1", 1, 25, 30, ResultOK)
		},
		broken: brokeChainOrder,
	}, {
		name: "a step skipped",
		events: func(h *hist) {
			h.chainOf("c", 3, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.2", "w2.g1", 1, 31, 40, ResultOK)
		},
		broken: brokeChainOrder,
		also:   brokeChainStalled, // step 0 ended well, step 1 never started
	}, {
		name: "a step queued twice",
		events: func(h *hist) {
			h.chainOf("c", 2, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.1", "w1.g1", 1, 21, 30, ResultOK)
			h.add(Event{T: ms(3000), Proc: "w2.g1", Kind: KindStart, Op: "c.1", ID: "another", Attempt: 1, Receiver: recvChain})
			h.add(Event{T: ms(3010), Proc: "w2.g1", Kind: KindEnd, Op: "c.1", ID: "another", Attempt: 1, Result: ResultOK})
		},
		broken: brokeChainTwice,
	}, {
		name: "a step ended well and the next never started",
		events: func(h *hist) {
			h.chainOf("c", 3, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.1", "w1.g1", 1, 21, 30, ResultOK)
		},
		broken: brokeChainStalled,
	}, {
		name: "a chain stalled at a step dead-lettered after lost leases",
		events: func(h *hist) {
			h.chainOf("c", 3, 0).frun("c.0", "w0.g1", 1, 10, 20, ResultOK).frun("c.1", "w1.g1", 1, 21, 30, ResultOK).dead("c.1")
		},
		explained: brokeChainStalled + ":dead_letter",
	}, {
		name: "a chain whose first send failed, stalled",
		events: func(h *hist) {
			h.chainOf("c", 2, 0)
			*h = (*h)[:len(*h)-1]
			h.add(Event{T: ms(1), Proc: "p0.g1", Kind: KindSendFailed, Op: "c.0", Err: "unavailable"})
			h.frun("c.0", "w0.g1", 1, 10, 20, ResultOK)
		},
	}})
}
