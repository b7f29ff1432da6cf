package chaos

import "testing"

// TestCheckFailoverWindows: in a Sentinel run a failover explains a
// departure from a feature's promise only when it may have lost the state
// the departure needed, written before the failover ended and no more than
// failoverWindowMax before it began, and the departure was seen after it
// began: a fabricated departure with no failover in that span still
// breaks its invariant.
func TestCheckFailoverWindows(t *testing.T) {
	failover := func(h *hist, from, to int64) { h.fault(FaultSentinelFailover, "sentinel", from, to) }
	fourGlobal := func(h *hist) {
		for i, op := range []string{"a", "b", "c", "d"} {
			h.fsend(Event{Op: op, Receiver: recvGlobal}, 0).frun(op, "w"+string(rune('0'+i%3))+".g1", 1, 10+int64(i), 100, ResultOK)
		}
	}
	dedupPair := func(h *hist, a, b int64) {
		h.fsend(Event{Op: "a", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, a).frun("a", "w0.g1", 1, a+10, a+20, ResultOK)
		h.fsend(Event{Op: "b", Mode: ModeDedup, Receiver: "chaos.q1", Key: "w0"}, b).frun("b", "w0.g1", 1, b+10, b+20, ResultOK)
	}
	idemPair := func(h *hist) {
		h.idem("a", "k0", "id-m", 0).idem("b", "k0", "id-n", 1000)
		h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
		h.add(Event{T: ms(1010), Proc: "w0.g1", Kind: KindStart, Op: "b", ID: "id-n", Attempt: 1, Receiver: recvIdem})
	}
	idemReplies := func(h *hist) {
		h.idem("a", "k0", "id-m", 0).idem("b", "k0", "id-m", 20)
		h.add(Event{T: ms(10), Proc: "w0.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 1, Receiver: recvIdem})
		h.add(Event{T: ms(2100), Proc: "w1.g1", Kind: KindStart, Op: "a", ID: "id-m", Attempt: 2, Receiver: recvIdem})
		h.idemOutcome("a", 25, idemReply("a", "w0.g1", 1)).idemOutcome("b", 2120, idemReply("a", "w1.g1", 2))
	}
	resultLost := func(h *hist, lookup int64) {
		h.sendTimed("a", 0).handle("a", "w0.g1", 1, 10, ResultOK)
		h.add(Event{T: ms(14), Proc: "w0.g1", Kind: KindReply, Op: "a", ID: "id-a", Attempt: 1, Result: ResultAccepted})
		h.acked("a", "w0.g1", 1, 16, ResultOK)
		h.add(Event{T: ms(20), Proc: "p0.g1", Kind: KindOutcome, Op: "a", ID: "id-a", Result: ResultReply, Reply: "a"})
		h.add(Event{T: ms(lookup), Proc: "p0.g1", Kind: KindResult, Op: "a", ID: "id-a", Result: ResultNotFound})
	}
	tests := []struct {
		name      string
		events    func(h *hist)
		invariant string
		explained bool // by the failover; otherwise broken
	}{
		{"four global handlers at once, a failover seconds later", func(h *hist) { fourGlobal(h); failover(h, 5000, 6000) }, brokeGlobal, false},
		{"two dedup messages in a window, a failover seconds later", func(h *hist) { dedupPair(h, 0, 200); failover(h, 2000, 3000) }, brokeDedupTwo, false},
		{"two dedup messages in a window, the key written before a failover, the second after it began", func(h *hist) { dedupPair(h, 1000, 1250); failover(h, 1100, 1400) }, brokeDedupTwo, true},
		{"two idempotent messages in a window, a failover seconds later", func(h *hist) { idemPair(h); failover(h, 3000, 4000) }, brokeIdemTwo, false},
		{"two idempotent messages in a window, a failover in between", func(h *hist) { idemPair(h); failover(h, 500, 800) }, brokeIdemTwo, true},
		{"two replies of one message, a failover seconds later", func(h *hist) { idemReplies(h); failover(h, 5000, 6000) }, brokeIdemReplies, false},
		{"two replies of one message, a failover in between", func(h *hist) { idemReplies(h); failover(h, 1000, 1500) }, brokeIdemReplies, true},
		{"a retained result gone, a failover long after it was written", func(h *hist) { resultLost(h, 30000); failover(h, 20000, 21000) }, brokeResult, false},
		{"a retained result gone, a failover just after it was written", func(h *hist) { resultLost(h, 3000); failover(h, 100, 500) }, brokeResult, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &hist{}
			tt.events(h)
			r := Check(sorted(h.final(0)), CheckOptions{FailoverLoss: true})
			f := r.Features
			for inv, n := range f.Broken {
				if inv != tt.invariant && n != 0 {
					t.Errorf("broken %s: %d, want 0", inv, n)
				}
			}
			broken, explained := f.Broken[tt.invariant], f.Explained[tt.invariant+":failover"]
			if w, ok := f.FailoverWindow[tt.invariant]; ok != tt.explained || w >= failoverWindowMax || w <= -failoverWindowMax {
				t.Errorf("%s: failover window %v (recorded %v), want one within the bound %v", tt.invariant, w, ok, tt.explained)
			}
			if tt.explained && (broken != 0 || explained == 0) {
				t.Errorf("%s: broken %d, explained by the failover %d; want it explained", tt.invariant, broken, explained)
			}
			if !tt.explained && (broken == 0 || explained != 0 || r.OK()) {
				t.Errorf("%s: broken %d, explained by the failover %d, report OK %v; want it broken", tt.invariant, broken, explained, r.OK())
			}
			if t.Failed() {
				t.Logf("report:\n%s", r)
			}
		})
	}
}

// TestCheckOneDeliveryStartedTwice: a process that starts one delivery
// (op and attempt) twice at once, as after a failover lost its first read,
// ends both runs: neither counts as running to the end of the history.
func TestCheckOneDeliveryStartedTwice(t *testing.T) {
	h := &hist{}
	h.fsend(Event{Op: "a", Receiver: recvGlobal}, 0).frun("a", "w0.g1", 1, 10, 30, ResultOK).frun("a", "w0.g1", 1, 20, 40, ResultOK)
	for i, op := range []string{"b", "c", "d"} {
		h.fsend(Event{Op: op, Receiver: recvGlobal}, 4000).frun(op, "w1.g1", 1, 5000+int64(i), 5100, ResultOK)
	}
	r := Check(sorted(h.final(0)), CheckOptions{})
	if f := r.Features; f.Broken[brokeGlobal] != 0 || f.MaxGlobal != 3 {
		t.Errorf("broken %s: %d, most at once %d; want 0 and 3\n%s", brokeGlobal, f.Broken[brokeGlobal], f.MaxGlobal, r)
	}
}
