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
	tests := []struct {
		name    string
		events  func(h *hist)
		broken  bool
		checked int
	}{
		{"the reply kept", func(h *hist) { replied(h, "a", "a", "succeeded", "a") }, false, 1},
		{"another reply kept", func(h *hist) { replied(h, "a", "a", "succeeded", "b") }, true, 1},
		{"timed out kept for a reply", func(h *hist) { replied(h, "a", "a", "timed_out", "") }, true, 1},
		{"no result for a reply", func(h *hist) { replied(h, "a", "a", ResultNotFound, "") }, true, 1},
		{"the lookup failed", func(h *hist) { replied(h, "a", "a", ResultError, "") }, false, 0},
		{"a timeout kept", func(h *hist) {
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1001), Proc: "p0.g1", Kind: KindOutcome, Op: "a", ID: "id-a", Result: ResultTimeout})
			h.add(Event{T: ms(3000), Proc: "p0.g1", Kind: KindResult, Op: "a", ID: "id-a", Result: "timed_out"})
		}, false, 1},
		{"a timeout kept as running", func(h *hist) {
			h.sendTimed("a", 0)
			h.add(Event{T: ms(1001), Proc: "p0.g1", Kind: KindOutcome, Op: "a", ID: "id-a", Result: ResultTimeout})
			h.add(Event{T: ms(3000), Proc: "p0.g1", Kind: KindResult, Op: "a", ID: "id-a", Result: "running"})
		}, true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			r := Check(sorted(h.final(0)), CheckOptions{})
			f := r.Features
			for inv, n := range f.Broken {
				if inv != brokeResult && n != 0 {
					t.Errorf("broken %s: %d, want 0", inv, n)
				}
			}
			if got := f.Broken[brokeResult] > 0; got != tt.broken {
				t.Errorf("broken %s: %d, want broken %v", brokeResult, f.Broken[brokeResult], tt.broken)
			}
			if r.OK() == tt.broken {
				t.Errorf("report OK %v with %s broken %v:\n%s", r.OK(), brokeResult, tt.broken, r)
			}
			if f.Exercised["results_checked"] != tt.checked {
				t.Errorf("results checked %d, want %d", f.Exercised["results_checked"], tt.checked)
			}
		})
	}
}
