package chaos

import "testing"

// TestCheckResults: a retained result that is the outcome its sender saw
// passes; another state, another reply, or none breaks result_mismatch;
// a lookup that failed, or a message whose sender saw no outcome, proves
// nothing.
func TestCheckResults(t *testing.T) {
	// replied adds a timed send of op, handled, its reply accepted and
	// received with content got, then the lookup of its result: state
	// and reply kept.
	replied := func(h *hist, op, got, state, kept string) {
		h.sendTimed(op, 0).handle(op, "w0.g1", 1, 10, ResultOK)
		h.add(Event{T: ms(14), Proc: "w0.g1", Kind: KindReply, Op: op, ID: "id-" + op, Attempt: 1, Result: ResultAccepted})
		h.acked(op, "w0.g1", 1, 16, ResultOK)
		h.add(Event{T: ms(20), Proc: "p0.g1", Kind: KindOutcome, Op: op, ID: "id-" + op, Result: ResultReply, Reply: got})
		h.add(Event{T: ms(3000), Proc: "p0.g1", Kind: KindResult, Op: op, ID: "id-" + op, Result: state, Reply: kept})
	}
	// checked: the results judged.
	checked := func(n int) func(f *FeatureReport) bool {
		return func(f *FeatureReport) bool { return f.Exercised["results_checked"] == n }
	}
	judge(t, []featureCase{
		{name: "the reply kept", events: func(h *hist) { replied(h, "a", "a", "succeeded", "a") }, check: checked(1)},
		{name: "another reply kept", events: func(h *hist) { replied(h, "a", "a", "succeeded", "b") }, broken: brokeResult, check: checked(1)},
		{name: "timed out kept for a reply", events: func(h *hist) { replied(h, "a", "a", "timed_out", "") }, broken: brokeResult, check: checked(1)},
		{name: "no result for a reply", events: func(h *hist) { replied(h, "a", "a", ResultNotFound, "") }, broken: brokeResult, check: checked(1)},
		{name: "the lookup failed", events: func(h *hist) { replied(h, "a", "a", ResultError, "") }, check: checked(0)},
		{name: "a timeout kept", events: func(h *hist) {
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1001), Proc: "p0.g1", Kind: KindOutcome, Op: "a", ID: "id-a", Result: ResultTimeout})
			h.add(Event{T: ms(3000), Proc: "p0.g1", Kind: KindResult, Op: "a", ID: "id-a", Result: "timed_out"})
		}, check: checked(1)},
		{name: "a timeout kept as running", events: func(h *hist) {
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1001), Proc: "p0.g1", Kind: KindOutcome, Op: "a", ID: "id-a", Result: ResultTimeout})
			h.add(Event{T: ms(3000), Proc: "p0.g1", Kind: KindResult, Op: "a", ID: "id-a", Result: "running"})
		}, broken: brokeResult, check: checked(1)},
	})
}
