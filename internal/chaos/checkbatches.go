package chaos

// The checks of batches and chains (batches.go): a batch's completion is
// queued once, after every child settled, with the children's counts; a
// chain's step runs only after the step before succeeded, none is
// skipped and none queued twice. RELIABILITY.md, "The features", says
// what each check judges.

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Invariants of batches and chains: keys of FeatureReport.Broken.
const (
	brokeBatchTwo     = "batch_two_completions"  // two completion messages started for one batch
	brokeBatchEarly   = "batch_early_completion" // a completion started before a child's final end
	brokeBatchCounts  = "batch_counts"           // the counts a completion read are not its children's outcomes
	brokeBatchMissing = "batch_not_completed"    // a sealed batch whose children all settled, never completed
	brokeChainOrder   = "chain_order"            // a step started before the step before it succeeded
	brokeChainTwice   = "chain_step_twice"       // two messages started for one step
	brokeChainStalled = "chain_stalled"          // a step succeeded, and the next one never started
)

// orderSlack allows for the clock readings' resolution when a record
// must come after another: a child's end before its batch's completion
// starts, a step's end before the next starts. The end is recorded before
// the acknowledgement that settles the message, on the same host's clock.
const orderSlack = time.Millisecond

// batchChecks gathers the ops of batches and chains.
type batchChecks struct {
	batches  []string            // the completions' ops (ModeBatchDone)
	children map[string][]string // by batch op, by index
	chains   map[string][]string // the steps' ops by chain op, by index
	seals    map[string]bool     // the batch ops whose Seal returned nil
	counts   map[string][]Event  // by batch op (KindBatchCounts)
}

// splitOp splits a child's or a step's op, "<parent>.<i>".
func splitOp(op string) (string, int, bool) {
	i := strings.LastIndexByte(op, '.')
	if i < 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(op[i+1:])
	return op[:i], n, err == nil
}

// maxParts bounds the index of a child or a step that place takes.
const maxParts = 100

// place puts op at index i of ops[parent].
func place(ops map[string][]string, op string) {
	parent, i, ok := splitOp(op)
	if !ok || i < 0 || i >= maxParts {
		return
	}
	for len(ops[parent]) <= i {
		ops[parent] = append(ops[parent], "")
	}
	ops[parent][i] = op
}

// batches judges the batches and the chains; Check calls it from
// checkFeatures.
func (c *features) batches() {
	b := batchChecks{children: map[string][]string{}, chains: map[string][]string{}, seals: map[string]bool{}, counts: map[string][]Event{}}
	for op, h := range c.ops {
		if h.send == nil {
			continue
		}
		switch h.send.Mode {
		case ModeBatchDone:
			b.batches = append(b.batches, op)
		case ModeBatchChild:
			place(b.children, op)
		case ModeChain, ModeChainNext:
			place(b.chains, op)
		}
	}
	for _, e := range c.events[KindSeal] {
		if e.Result == ResultOK {
			b.seals[e.Op] = true
		}
	}
	for _, e := range c.events[KindBatchCounts] {
		b.counts[e.Op] = append(b.counts[e.Op], e)
	}
	if len(b.batches) > 0 {
		for _, k := range []string{brokeBatchTwo, brokeBatchEarly, brokeBatchCounts, brokeBatchMissing} {
			c.f.Broken[k] += 0 // listed, at 0, once batches were sent
		}
	}
	if len(b.chains) > 0 {
		for _, k := range []string{brokeChainOrder, brokeChainTwice, brokeChainStalled} {
			c.f.Broken[k] += 0
		}
	}
	slices.Sort(b.batches)
	for _, op := range b.batches {
		c.batch(op, b)
	}
	chains := make([]string, 0, len(b.chains))
	for op := range b.chains {
		chains = append(chains, op)
	}
	slices.Sort(chains)
	for _, op := range chains {
		c.chain(op, b.chains[op])
	}
}

// started returns the earliest start of h, and the number of distinct
// messages (ids) that started as its op.
func started(h *opHistory) (int64, int) {
	if len(h.starts) == 0 {
		return 0, 0
	}
	ids := map[string]bool{}
	for _, s := range h.starts {
		ids[s.ID] = true
	}
	return firstStart(h), len(ids)
}

// finalEnd returns the earliest end of op, a batch's child, that settled
// it for good, and whether it was a success: an end ok; a failure of an op
// that the plain handler fails for good (poisoned: NoRetry); any end of a
// last attempt.
func (c *features) finalEnd(op string) (int64, bool, bool) {
	h := c.ops[op]
	if h == nil {
		return 0, false, false
	}
	var t int64
	ok, found, fails := false, false, poisoned(opHash(op))
	for _, e := range h.ends {
		final := e.Result == ResultOK || (e.Result == ResultFailed && fails) || e.Attempt >= maxAttempts
		if final && (!found || e.T < t) {
			t, ok, found = e.T, e.Result == ResultOK, true
		}
	}
	return t, ok, found
}

// firstSuccess returns the earliest end ok of op.
func (c *features) firstSuccess(op string) (int64, bool) {
	var t int64
	found := false
	if h := c.ops[op]; h != nil {
		for _, e := range h.ends {
			if e.Result == ResultOK && (!found || e.T < t) {
				t, found = e.T, true
			}
		}
	}
	return t, found
}

// batch judges the batch of op: one completion message, started after
// every child acknowledged at its send had its final end, with counts
// equal to the children's outcomes; and a completion for a batch whose
// Seal returned nil and whose children were all acknowledged.
func (c *features) batch(op string, b batchChecks) {
	h := c.ops[op]
	kids := b.children[op]
	c.f.Exercised["batches"]++
	c.f.Exercised["batch_children"] += len(kids)
	// all: the batch and every child it was to have were acknowledged.
	all := h.sent != nil && len(kids) == int(h.send.N) && !slices.ContainsFunc(kids, func(k string) bool { return k == "" || c.ops[k].sent == nil })
	sealed := b.seals[op]
	if !sealed {
		c.f.Exercised["batches_unsealed"]++
	}
	first, ids := started(h)
	if ids == 0 {
		if sealed && all {
			c.broke(brokeBatchMissing, h.send.T, "batch %s (%s): sealed, its %d children acknowledged, and its completion never started", op, h.sent.ID, len(kids))
		}
		return
	}
	c.f.Exercised["batches_completed"]++
	if len(h.starts) > 1 {
		c.f.Exercised["batch_completions_redelivered"]++
	}
	if ids > 1 {
		c.broke(brokeBatchTwo, first, "batch %s: %d completion messages started", op, ids)
	}
	for _, k := range kids {
		if k == "" || c.ops[k].sent == nil {
			continue // its send failed: it may not be stored, and its batch not wait for it
		}
		end, _, found := c.finalEnd(k)
		if !found && c.ops[k].dead {
			// Dead-lettered by a fetch after its leases lapsed: its
			// settlement has no record.
			c.f.Exercised["batch_children_dead_by_fetch"]++
			continue
		}
		if !found || end > first+int64(orderSlack) {
			c.broke(brokeBatchEarly, first, "batch %s: its completion started at %v, before child %s's final end (%s)", op, c.at(first), k, c.endAt(end, found))
			break
		}
	}
	if all {
		c.batchCounts(op, kids, b.counts[op])
	}
}

// endAt renders an end's time, or its absence.
func (c *features) endAt(t int64, found bool) string {
	if !found {
		return "none recorded"
	}
	return fmt.Sprintf("at %v", c.at(t))
}

// batchCounts: each read of the batch by its completion's handler shows
// every child settled, and as many successes and failures as the
// children's outcomes: a dead letter failed (poisoned, or dead-lettered by
// a fetch after its leases lapsed, even after an end ok whose
// acknowledgement did not land), any other child as its final end says.
func (c *features) batchCounts(op string, kids []string, reads []Event) {
	succeeded := 0
	for _, k := range kids {
		_, ok, found := c.finalEnd(k)
		switch {
		case c.ops[k].dead:
		case !found:
			return // judged by brokeBatchEarly
		case ok:
			succeeded++
		}
	}
	for _, e := range reads {
		switch {
		case e.Result != ResultOK || e.Counts == nil:
			c.explained(brokeBatchCounts, "read_failed")
			continue
		case e.Counts.Children != len(kids) || e.Counts.settled() != len(kids) ||
			e.Counts.Succeeded != succeeded || e.Counts.failures() != len(kids)-succeeded:
			c.broke(brokeBatchCounts, e.T, "batch %s (%s): its completion (attempt %d) read %+v; its %d children: %d succeeded, %d failed",
				op, e.ID, e.Attempt, *e.Counts, len(kids), succeeded, len(kids)-succeeded)
			return
		}
		c.f.Exercised["batch_counts_checked"]++
	}
}

// chain judges the chain whose steps' ops are steps (by index): one
// message per step, each started after the step before ended well; and,
// when its first step was acknowledged at its send, a next step for every
// step that ended well, unless that step was dead-lettered (its attempts
// used up by lost leases: its success never settled).
func (c *features) chain(op string, steps []string) {
	c.f.Exercised["chains"]++
	head := c.ops[steps[0]]
	for i, s := range steps {
		h := c.ops[s]
		if h == nil {
			continue
		}
		first, ids := started(h)
		if ids > 0 {
			c.f.Exercised["chain_steps_run"]++
		}
		if ids > 1 {
			c.broke(brokeChainTwice, first, "chain %s: %d messages of step %d started", op, ids, i)
		}
		if ids > 0 && i > 0 {
			prev, ok := c.firstSuccess(steps[i-1])
			if !ok || prev > first+int64(orderSlack) {
				c.broke(brokeChainOrder, first, "chain %s: step %d started at %v, before step %d ended well (%s)", op, i, c.at(first), i-1, c.endAt(prev, ok))
			}
		}
		_, ok := c.firstSuccess(s)
		last := i+1 >= len(steps)
		switch next := c.ops[steps[min(i+1, len(steps)-1)]]; {
		case !ok:
			if ids > 0 && !last {
				c.f.Exercised["chains_stopped"]++
			}
		case last:
			c.f.Exercised["chains_finished"]++
		case head == nil || head.sent == nil, next != nil && len(next.starts) > 0:
			// Its first send's outcome is unknown (the chain may not be
			// sealed), or the next step ran.
		case h.dead:
			c.explained(brokeChainStalled, "dead_letter")
		default:
			c.broke(brokeChainStalled, h.send.T, "chain %s: step %d ended well, and step %d never started", op, i, i+1)
		}
	}
}
