package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// The checks of the features' promises (features.go): each departure from
// a promise is either explained by a fault (counted in
// FeatureReport.Explained) or broken (FeatureReport.Broken, an
// invariant). RELIABILITY.md, "The features", says what each check
// judges.

// Slack of the checks of the features.
const (
	// pauseSlack is how long after a Pause returned a handler of the
	// receiver may still start: PausePollInterval and a round trip, here
	// up to 750ms on a loaded host.
	pauseSlack = disker.PausePollInterval + 750*time.Millisecond
	// noticeWindow is how long the workers may take to notice a message
	// at another priority level when that level's stream was empty: a
	// heartbeat and a blocking read.
	noticeWindow = disker.DefaultHeartbeatInterval + blockTimeout
	// tokenLag is how long after its token a start may be recorded with
	// no fault: the fetch loop takes the tokens (WithRateLimit's gate),
	// then fetches, then starts the handlers, up to half a second on a
	// loaded host.
	tokenLag = 500 * time.Millisecond
	// rateSlack is how many starts beyond the token bucket the rate check
	// allows: tokenLag of the rate, and one for the broker's and the
	// host's rounding.
	rateSlack = 1 + rateLimit*float64(tokenLag)/float64(time.Second)
	// keySlack is how far a key's window may end off its length: Redis
	// keeps a key's expiry, and reads its clock, in milliseconds, once per
	// command or script.
	keySlack = 2 * time.Millisecond
	// missedAfter is the schedules' rule (schedule.go): a tick is missed
	// when it is this old and its following tick is due.
	missedAfter = time.Second
)

// Invariants of the features: the keys of FeatureReport.Broken.
const (
	brokeLevel         = "priority_level"     // delivered at a level other than its send's
	brokeOrder         = "priority_order"     // a lower level started before a higher one queued in the same pause
	brokePaused        = "start_while_paused" // a handler started while its receiver was paused
	brokeDedupTwo      = "dedup_two_queued"   // two messages queued for one dedup key and window
	brokeDedupHolder   = "dedup_wrong_holder" // a duplicate named a message of another key, or one whose window had passed
	brokeIdemTwo       = "idem_two_messages"  // two messages for one idempotency key and window
	brokeIdemReplies   = "idem_two_replies"   // callers of one message got different replies
	brokeIdemForeign   = "idem_foreign_reply" // a caller's reply came from no run of a message of its key
	brokeGlobal        = "global_over_limit"  // more than globalLimit handlers at once
	brokeRate          = "rate_over_limit"    // more starts than the token bucket allows
	brokePoolDead      = "pool_dead_letter"   // a message of HandleWithPool dead-lettered
	brokePoolAttempt   = "pool_attempt_counted"
	brokeGroupBusy     = "group_over_limit" // more runs of one key at once than its concurrency
	brokeGroupOrder    = "group_order"      // a key's message started before one sent earlier
	brokeTickTwice     = "tick_sent_twice"
	brokeTickSkipped   = "tick_skipped"
	brokeTickMalformed = "tick_malformed"
	brokeFeatureLost   = "lost" // an acknowledged message of a feature never handled
)

// FeatureReport is what Check found of the features: what the run
// exercised, and the departures from their promises, explained by a fault
// or broken.
type FeatureReport struct {
	// Exercised counts what the run did with the features: sends by
	// feature, pauses, ticks, crashes and reruns, given-back messages,
	// degraded pools...
	Exercised map[string]int `json:"exercised"`
	// Broken counts, by invariant, the departures that no fault explains:
	// every count must be 0.
	Broken map[string]int `json:"broken"`
	// Explained counts the departures that a fault explains, by invariant
	// and explanation.
	Explained map[string]int `json:"explained"`
	// MaxGlobal is the most handlers of the receiver served
	// WithGlobalConcurrency that ran at once; MaxGroup the most of one
	// key of the receiver served WithGroupConcurrency(groupLimit).
	MaxGlobal int `json:"max_global"`
	MaxGroup  int `json:"max_group"`
	// MaxRateExcess is the most starts, in any span, beyond what the
	// token bucket allows (before rateSlack).
	MaxRateExcess float64 `json:"max_rate_excess"`
	// MaxPauseLag is the latest start of a handler after a Pause of its
	// receiver returned, before its Resume began, that no fault explains.
	MaxPauseLag time.Duration `json:"max_pause_lag"`
	// MaxOvertaken is the most messages of higher levels, queued in the
	// same pause, that started after a message.
	MaxOvertaken int `json:"max_overtaken"`
	// FailoverWindow is, by invariant, the largest time from the last
	// write of the state a departure needed to the start of the failover
	// that explains it (CheckOptions.FailoverLoss; checkfailover.go): how
	// much of failoverWindowMax the explanations used.
	FailoverWindow map[string]time.Duration `json:"failover_window,omitempty"`
}

// OK reports whether every invariant of the features held (true for a
// nil report).
func (f *FeatureReport) OK() bool {
	if f == nil {
		return true
	}
	for _, n := range f.Broken {
		if n != 0 {
			return false
		}
	}
	return true
}

// String renders the report's rows.
func (f *FeatureReport) String() string {
	if f == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "features exercised  %s\n", counts(f.Exercised))
	fmt.Fprintf(&b, "features broken     %s\n", counts(f.Broken))
	fmt.Fprintf(&b, "features explained  %s\n", counts(f.Explained))
	fmt.Fprintf(&b, "features figures    at once: %d global (limit %d), %d of a key (limit %d); rate excess %.1f (slack %.1f); start after a pause %v (slack %v); overtaken by %d of higher levels (limit: the workers' slots)\n",
		f.MaxGlobal, globalLimit, f.MaxGroup, groupLimit, f.MaxRateExcess, rateSlack,
		f.MaxPauseLag.Round(time.Millisecond), pauseSlack, f.MaxOvertaken)
	if len(f.FailoverWindow) > 0 {
		parts := make([]string, 0, len(f.FailoverWindow))
		for inv, w := range f.FailoverWindow {
			parts = append(parts, fmt.Sprintf("%s %v", inv, w.Round(time.Millisecond)))
		}
		slices.Sort(parts)
		fmt.Fprintf(&b, "features failover   state written up to this long before the failover that explains its loss began (bound %v): %s\n", failoverWindowMax, strings.Join(parts, ", "))
	}
	return b.String()
}

// run is one handler run of a feature's message: from its start to its
// end, or to its worker's death, or to the end of the history.
type run struct {
	op, id, proc, receiver, key string
	attempt, prio               int
	start, end                  int64
	result                      string // the end's; "" when none was recorded
}

// features is the state of the features' checks.
type features struct {
	r       *Report
	f       *FeatureReport
	fi      faultIndex
	stalls  []hostStall            // the host and Redis stalls, merged: only the timing-bounded checks read them
	delays  map[string][]hostStall // each process's scheduling delays (delays.go): likewise
	opts    CheckOptions
	ops     map[string]*opHistory
	first   int64 // the history's first event
	last    int64 // and its last
	workers int   // the worker positions (w0, w1, ...) that ran handlers

	runs   []*run            // by start
	byRecv map[string][]*run // by start
	byOp   map[string][]*run // by start
	events map[string][]Event
}

// checkFeatures judges the features' promises; Check calls it.
func checkFeatures(r *Report, events []Event, ops map[string]*opHistory, fi faultIndex, stalls []hostStall, delays map[string][]hostStall, opts CheckOptions) *FeatureReport {
	c := &features{
		r: r, fi: fi, stalls: stalls, delays: delays, opts: opts, ops: ops,
		f:      &FeatureReport{Exercised: map[string]int{}, Broken: map[string]int{}, Explained: map[string]int{}},
		byRecv: map[string][]*run{}, byOp: map[string][]*run{}, events: map[string][]Event{},
	}
	if len(events) > 0 {
		c.first = events[0].T
	}
	c.collect(events)
	c.priorities()
	c.pauses()
	c.dedup()
	c.idempotent()
	c.global()
	c.rate()
	c.pool()
	c.groups()
	c.schedules()
	c.results(events)
	c.batches()
	return c.f
}

// collect gathers the runs of the features' receivers and the features'
// own events.
func (c *features) collect(events []Event) {
	feature := map[string]bool{}
	for _, r := range featureReceivers {
		feature[r] = true
	}
	// A process may start one delivery (op and attempt) twice at once:
	// after a failover lost the first read, the new master hands the
	// message out again as the same attempt. Ends close the open runs of
	// their key in start order, so that no run is left without an end.
	open := map[string][]*run{}
	last := int64(0)
	for _, e := range events {
		last = e.T
		switch e.Kind {
		case KindStart:
			if !feature[e.Receiver] {
				continue
			}
			ru := &run{op: e.Op, id: e.ID, proc: e.Proc, receiver: e.Receiver, key: e.Key, attempt: e.Attempt, prio: e.Priority, start: e.T}
			c.runs = append(c.runs, ru)
			open[runKey(e)] = append(open[runKey(e)], ru)
		case KindEnd:
			if rs := open[runKey(e)]; len(rs) > 0 {
				rs[0].end, rs[0].result = e.T, e.Result
				open[runKey(e)] = rs[1:]
			}
		case KindPause, KindResume, KindTick, KindGivenBack, KindPoolState, KindIdemOutcome, KindSeal, KindBatchCounts, KindSlotsLapsed:
			c.events[e.Kind] = append(c.events[e.Kind], e)
		}
	}
	c.last = last
	positions := map[string]bool{}
	for _, ru := range c.runs {
		positions[strings.SplitN(ru.proc, ".", 2)[0]] = true
	}
	c.workers = len(positions)
	for _, rs := range open {
		for _, ru := range rs {
			ru.end = last
			if t, ok := c.died(ru.proc, ru.start); ok {
				ru.end = t
			}
		}
	}
	for _, ru := range c.runs {
		c.byRecv[ru.receiver] = append(c.byRecv[ru.receiver], ru)
		c.byOp[ru.op] = append(c.byOp[ru.op], ru)
	}
	c.f.Exercised["runs"] = len(c.runs)
}

func runKey(e Event) string { return e.Proc + "\x00" + e.Op + "\x00" + fmt.Sprint(e.Attempt) }

// died returns when proc was killed or crashed, after from.
func (c *features) died(proc string, from int64) (int64, bool) {
	for _, f := range c.fi.faults {
		if f.Target == proc && f.T >= from && (f.Fault == FaultKillWorker || f.Fault == FaultCrashWorker) {
			return f.T, true
		}
	}
	return 0, false
}

// at renders t as the time since the history's first event.
func (c *features) at(t int64) time.Duration {
	return time.Duration(t - c.first).Round(time.Millisecond)
}

// broke counts a departure from invariant that no fault explains, judged
// by the time t of the write whose loss would explain it: in a Sentinel
// run, one that a failover may have lost counts as explained by it
// (checkfailover.go; brokeState for the features whose state lives on).
func (c *features) broke(invariant string, t int64, format string, args ...any) {
	c.brokeState(invariant, at(t), format, args...)
}

// explained counts a departure from invariant that a fault explains.
func (c *features) explained(invariant, why string) {
	c.f.Explained[invariant+":"+why]++
}

// touched explains a run whose lease or slot may have been lost: its
// handler saw its lease lost, or its worker was killed or stopped, or
// Redis failed, from a lease before it started to its end.
func (c *features) touched(rs []*run) string {
	for _, ru := range rs {
		switch ru.result {
		case ResultLeaseLost, ResultStopped, ResultExpired, ResultCancelled:
			return "lease_lost"
		}
		if why := c.fi.explain(ru.proc, ru.start-int64(c.opts.Lease), ru.end); why != "" {
			return why
		}
	}
	return ""
}

// send returns the send of op, or nil.
func (c *features) send(op string) *Event {
	if h := c.ops[op]; h != nil {
		return h.send
	}
	return nil
}

// sweep calls over at each start of rs when more than limit of them run
// at once, with those running, and returns the most that ran at once. An
// end at the instant of a start comes first.
func sweep(rs []*run, limit int, over func(t int64, running []*run)) int {
	type edge struct {
		t     int64
		start bool
		ru    *run
	}
	edges := make([]edge, 0, 2*len(rs))
	for _, ru := range rs {
		edges = append(edges, edge{ru.start, true, ru}, edge{ru.end, false, ru})
	}
	sort.SliceStable(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return !edges[i].start && edges[j].start
	})
	var running []*run
	most := 0
	for _, e := range edges {
		if !e.start {
			running = slices.DeleteFunc(running, func(ru *run) bool { return ru == e.ru })
			continue
		}
		running = append(running, e.ru)
		most = max(most, len(running))
		if len(running) > limit {
			over(e.t, slices.Clone(running))
		}
	}
	return most
}

// names lists the runs for a violation.
func names(rs []*run) string {
	parts := make([]string, len(rs))
	for i, ru := range rs {
		parts[i] = fmt.Sprintf("%s#%d on %s", ru.op, ru.attempt, ru.proc)
	}
	return strings.Join(parts, ", ")
}

// global: never more than globalLimit handlers of recvGlobal at once, by
// the handlers' own records, unless a run among them may have lost its
// slot: its worker stopped or cut off from Redis past the lease
// (touched), or its worker recorded that the lease of its slots ran out
// while the run ran (slotsLapsed).
func (c *features) global() {
	c.f.MaxGlobal = sweep(c.byRecv[recvGlobal], globalLimit, func(t int64, running []*run) {
		if why := c.touched(running); why != "" {
			c.explained(brokeGlobal, why)
			return
		}
		if c.slotsLapsed(running) {
			c.explained(brokeGlobal, "slots_lapsed")
			return
		}
		if c.leaseStalled(running) {
			c.explained(brokeGlobal, explainStall)
			return
		}
		if c.leaseDelayed(running) {
			c.explained(brokeGlobal, explainSchedDelay)
			return
		}
		c.brokeState(brokeGlobal, c.slotsSpan(running, t), "%d handlers of %s ran at once at %v, over WithGlobalConcurrency(%d): %s (a process's delays up to %v of a run's lease window)",
			len(running), recvGlobal, c.at(t), globalLimit, names(running), c.mostDelayed(running).Round(time.Millisecond))
	})
}

// explainStall is the explanation of a timing-bounded departure by
// stalls: of the host (stalls.go) or of a Redis server (redisstalls.go).
const explainStall = "stall"

// leaseStalled reports whether stalls (of the host or of Redis) covered more of the lease
// window of a run among rs (from a lease before its start to its end) than
// a lease survives: a worker extends its leases every third of the lease,
// so a lease lapses only when its worker does not run for two thirds of
// it. Its slots and its delivery may then have gone to another while it
// ran, as a stall of its connections would (touched).
func (c *features) leaseStalled(rs []*run) bool {
	return c.mostStalled(rs) > c.opts.Lease-c.opts.Lease/3
}

// mostStalled returns the most that stalls covered of the lease
// window of a run among rs (see leaseStalled).
func (c *features) mostStalled(rs []*run) time.Duration {
	var most time.Duration
	for _, ru := range rs {
		most = max(most, stalledWithin(c.stalls, ru.start-int64(c.opts.Lease), ru.end))
	}
	return most
}

// leaseDelayed reports whether the scheduling delays of a run's process
// among rs covered more of the run's lease window than a lease survives
// (see leaseStalled): that process ran too late to extend its leases.
func (c *features) leaseDelayed(rs []*run) bool {
	return c.mostDelayed(rs) > c.opts.Lease-c.opts.Lease/3
}

// mostDelayed returns the most that a run's process's scheduling delays
// covered of the run's lease window, among rs (see leaseDelayed).
func (c *features) mostDelayed(rs []*run) time.Duration {
	var most time.Duration
	for _, ru := range rs {
		most = max(most, c.delayedWithin(ru.proc, ru.start-int64(c.opts.Lease), ru.end))
	}
	return most
}

// lateAcked is a key's messages running at once because a superseded
// attempt's acknowledgement let the key go: prev ended well, its lease
// ran out before its acknowledgement returned at ack, next (a later
// attempt of the same message) started before ack, and another run of
// the key started after ack, beside next.
type lateAcked struct {
	prev, next *run
	ack        int64
	// delayed is what prev's process's scheduling delays covered from
	// prev's end to ack; needed is what they must cover to explain it:
	// the lease lapses only when its process does not run for two thirds
	// of a lease after the handler's end (a lease is extended every third
	// of a lease while the handler runs), and the delays must account
	// for the acknowledgement's lateness but for that third.
	delayed, needed time.Duration
}

// lateAck finds among rs the shape of lateAcked.
func (c *features) lateAck(rs []*run) (lateAcked, bool) {
	for _, next := range rs {
		h := c.ops[next.op]
		if next.attempt <= 1 || h == nil {
			continue
		}
		for _, prev := range c.byOp[next.op] {
			if prev.attempt >= next.attempt || prev.result != ResultOK || prev.end > next.start {
				continue
			}
			ack := h.of(h.acks, Event{Proc: prev.proc, Attempt: prev.attempt})
			if ack == nil || ack.Result != ResultOK || ack.T <= next.start {
				continue
			}
			if !slices.ContainsFunc(rs, func(o *run) bool { return o != next && o.op != next.op && o.start >= ack.T }) {
				continue
			}
			lease := c.opts.Lease
			return lateAcked{
				prev: prev, next: next, ack: ack.T,
				delayed: c.delayedWithin(prev.proc, prev.end, ack.T),
				needed:  max(lease-lease/3, time.Duration(ack.T-prev.end)-lease/3),
			}, true
		}
	}
	return lateAcked{}, false
}

// slotsLapsed reports whether a run among rs ran while the lease of its
// worker's global concurrency slots ran out: the worker recorded a lapse
// (KindSlotsLapsed) of the run's receiver between the earliest the lease
// could end (T) and when it learnt it (End), and the run overlaps that
// span. Such a run started on a slot it held and ran on beside the
// slot's next holder, as the library allows.
func (c *features) slotsLapsed(rs []*run) bool {
	for _, ru := range rs {
		for _, e := range c.events[KindSlotsLapsed] {
			if e.Proc == ru.proc && e.Receiver == ru.receiver && ru.start <= e.End && ru.end >= e.T {
				return true
			}
		}
	}
	return false
}

// groups: per key, no two runs of recvGroup1 at once and no more than
// groupLimit of recvGroupN, unless a fault explains it; and the messages
// of a key of recvGroup1 start in send order.
func (c *features) groups() {
	for _, g := range []struct {
		receiver string
		limit    int
	}{{recvGroup1, 1}, {recvGroupN, groupLimit}} {
		byKey := map[string][]*run{}
		for _, ru := range c.byRecv[g.receiver] {
			byKey[ru.key] = append(byKey[ru.key], ru)
		}
		for key, rs := range byKey {
			most := sweep(rs, g.limit, func(t int64, running []*run) {
				if why := c.touched(running); why != "" {
					c.explained(brokeGroupBusy, why)
					return
				}
				if c.leaseStalled(running) {
					c.explained(brokeGroupBusy, explainStall)
					return
				}
				if late, ok := c.lateAck(running); ok {
					// The key was let go by a superseded attempt's late
					// acknowledgement: only what lapsed that attempt's
					// lease explains it, a fault of its process or of
					// Redis from a lease before its start to the
					// acknowledgement (a worker stopped while its
					// delivery's lease ran), or a delay of its process
					// long enough.
					prev := *late.prev
					prev.end = late.ack
					if why := c.touched([]*run{&prev}); why != "" {
						c.explained(brokeGroupBusy, why)
						return
					}
					if late.delayed >= late.needed {
						c.explained(brokeGroupBusy, explainSchedDelay)
						return
					}
					c.brokeState(brokeGroupBusy, c.slotsSpan(running, t), "%d handlers of key %s of %s ran at once at %v, over WithGroupConcurrency(%d): %s; attempt %d on %s ended well and was acknowledged %v later, after attempt %d started (its process's delays %v of it, %v needed)",
						len(running), key, g.receiver, c.at(t), g.limit, names(running), late.prev.attempt, late.prev.proc,
						time.Duration(late.ack-late.prev.end).Round(time.Millisecond), late.next.attempt,
						late.delayed.Round(time.Millisecond), late.needed.Round(time.Millisecond))
					return
				}
				if c.leaseDelayed(running) {
					c.explained(brokeGroupBusy, explainSchedDelay)
					return
				}
				c.brokeState(brokeGroupBusy, c.slotsSpan(running, t), "%d handlers of key %s of %s ran at once at %v, over WithGroupConcurrency(%d): %s (host and Redis stalls up to %v, a process's delays up to %v of a run's lease window)",
					len(running), key, g.receiver, c.at(t), g.limit, names(running), c.mostStalled(running).Round(time.Millisecond), c.mostDelayed(running).Round(time.Millisecond))
			})
			if g.receiver == recvGroupN {
				c.f.MaxGroup = max(c.f.MaxGroup, most)
			}
		}
	}
	c.groupOrder()
}

// keyedOp is a message of recvGroup1 in the order check.
type keyedOp struct {
	op           string
	send, sent   int64
	first, later int64 // its first start; its latest start that no fault explains (or first)
}

// groupOrder: a message of a key of recvGroup1 whose send returned before
// another's began starts first, and none of its runs starts after the
// other's first, except a redelivery that a fault explains.
func (c *features) groupOrder() {
	byKey := map[string][]keyedOp{}
	for op, h := range c.ops {
		rs := c.byOp[op]
		if h.send == nil || h.send.Receiver != recvGroup1 || len(rs) == 0 {
			continue
		}
		k := keyedOp{op: op, send: h.send.T, first: rs[0].start, later: c.laterStart(rs)}
		if h.sent != nil {
			k.sent = h.sent.T
		}
		byKey[h.send.Key] = append(byKey[h.send.Key], k)
	}
	for key, ks := range byKey {
		before := slices.Clone(ks)
		before = slices.DeleteFunc(before, func(k keyedOp) bool { return k.sent == 0 })
		slices.SortFunc(before, func(a, b keyedOp) int { return cmp.Compare(a.sent, b.sent) })
		slices.SortFunc(ks, func(a, b keyedOp) int { return cmp.Compare(a.send, b.send) })
		i, top := 0, keyedOp{}
		for _, b := range ks {
			for ; i < len(before) && before[i].sent < b.send; i++ {
				if before[i].later > top.later {
					top = before[i]
				}
			}
			if top.op != "" && top.later > b.first {
				c.broke(brokeGroupOrder, b.first, "key %s of %s: %s started at %v, before %s (sent earlier) started at %v",
					key, recvGroup1, b.op, c.at(b.first), top.op, c.at(top.later))
			}
		}
		c.f.Exercised["group1_ordered_msgs"] += len(ks)
	}
}

// laterStart returns the latest start of rs (sorted by start) that no
// fault explains as a redelivery, or the first start.
func (c *features) laterStart(rs []*run) int64 {
	latest := rs[0].start
	for i, ru := range rs[1:] {
		if c.touched(append(slices.Clone(rs[:i+1]), ru)) == "" {
			latest = ru.start
		}
	}
	return latest
}

// acceptance bounds when the broker accepted a message: from its send's
// start to its send's return, or to its first start.
type acceptance struct {
	op                  string
	lower, upper, holds int64 // holds: the key surely held until then
}

// certainlyTogether reports whether a and b were accepted while the other
// held the key, however their acceptance falls within its bounds: in
// every order that is possible, the later came before the earlier's hold
// ended.
func certainlyTogether(a, b acceptance) bool {
	aFirst, bFirst := a.lower <= b.upper, b.lower <= a.upper
	return (!aFirst || b.upper < a.holds) && (!bFirst || a.upper < b.holds)
}

// pairsWithin calls f for each pair of as (sorted by lower) that lie less
// than span apart.
func pairsWithin(as []acceptance, span time.Duration, f func(a, b acceptance)) {
	for i := range as {
		for j := i + 1; j < len(as) && as[j].lower < as[i].upper+int64(span); j++ {
			f(as[i], as[j])
		}
	}
}

// dedup: one queued message per dedup key and window (WithDedupKey: the
// window of dedupTTL from the first; WithDedupUntilSettled: until it is
// settled, dedupHold at most), and a duplicate names the key's holder; an
// acknowledged message is handled.
func (c *features) dedup() {
	byKey := map[string][]acceptance{}
	idOf := map[string]string{} // message id -> op
	for op, h := range c.ops {
		if h.send == nil || (h.send.Mode != ModeDedup && h.send.Mode != ModeDedupSettled) {
			continue
		}
		c.f.Exercised["dedup_sends"]++
		if h.sent != nil && h.sent.Result == ResultDuplicate {
			c.f.Exercised["dedup_duplicates"]++
			continue
		}
		a, ok := c.accepted(op, h)
		if !ok {
			continue
		}
		if h.sent != nil {
			idOf[h.sent.ID] = op
		}
		for _, s := range h.starts {
			idOf[s.ID] = op
		}
		c.lostFeature(op, h)
		key := h.send.Mode + "/" + h.send.Receiver + "/" + h.send.Key
		byKey[key] = append(byKey[key], a)
	}
	for key, as := range byKey {
		slices.SortFunc(as, func(a, b acceptance) int { return cmp.Compare(a.lower, b.lower) })
		pairsWithin(as, dedupHold, func(a, b acceptance) {
			if certainlyTogether(a, b) {
				c.brokeState(brokeDedupTwo, keySpan(a, b), "dedup key %s: %s (sent at %v) and %s (sent at %v) both queued within the key's window",
					key, a.op, c.at(a.lower), b.op, c.at(b.lower))
			}
		})
	}
	c.dedupHolders(idOf)
}

// accepted returns the acceptance of a queued message of a dedup key, and
// false for one that was not queued (or not known to be).
func (c *features) accepted(op string, h *opHistory) (acceptance, bool) {
	a := acceptance{op: op, lower: h.send.T}
	switch {
	case h.sent != nil:
		a.upper = h.sent.T
	case len(h.starts) > 0:
		a.upper = firstStart(h)
	default:
		return a, false
	}
	if h.send.Mode == ModeDedup {
		a.holds = a.lower + int64(dedupTTL-keySlack)
		return a, true
	}
	a.holds = a.lower + int64(dedupHold-keySlack)
	if t, ok := settledAfter(h); ok {
		a.holds = min(a.holds, t)
	}
	return a, true
}

// firstStart returns the first start of h (which has one).
func firstStart(h *opHistory) int64 {
	t := h.starts[0].T
	for _, s := range h.starts {
		t = min(t, s.T)
	}
	return t
}

// settledAfter returns a time before which the message was surely not
// settled: its first handler's end that succeeded, or, for a dead letter,
// its last handler's end.
func settledAfter(h *opHistory) (int64, bool) {
	var first, last int64
	for _, e := range h.ends {
		if e.Result == ResultOK && (first == 0 || e.T < first) {
			first = e.T
		}
		last = max(last, e.T)
	}
	switch {
	case first != 0:
		return first, true
	case h.dead && last != 0:
		return last, true
	}
	return 0, false
}

// dedupHolders: a duplicate's id is a message of its key, whose window
// had not passed when the duplicate was sent.
func (c *features) dedupHolders(idOf map[string]string) {
	for op, h := range c.ops {
		if h.send == nil || h.sent == nil || h.sent.Result != ResultDuplicate {
			continue
		}
		holderOp := idOf[h.sent.ID]
		holder := c.ops[holderOp]
		if holder == nil {
			c.f.Exercised["dedup_holder_unknown"]++
			continue
		}
		window := dedupTTL
		if h.send.Mode == ModeDedupSettled {
			window = dedupHold
		}
		hs := holder.send
		switch {
		case hs.Mode != h.send.Mode || hs.Receiver != h.send.Receiver || hs.Key != h.send.Key:
			c.broke(brokeDedupHolder, h.send.T, "%s (key %s) is a duplicate of %s, a message of key %s", op, h.send.Key, holderOp, hs.Key)
		case holder.sent != nil && h.send.T > holder.sent.T+int64(window+keySlack):
			c.broke(brokeDedupHolder, h.send.T, "%s (key %s) is a duplicate of %s, whose window of %v had passed", op, h.send.Key, holderOp, window)
		}
	}
}

// lostFeature: an acknowledged message of a feature, not a duplicate, is
// handled or dead-lettered; counted in Report.Lost too.
func (c *features) lostFeature(op string, h *opHistory) {
	if h.sent == nil || h.sent.Result == ResultDuplicate || h.dead {
		return
	}
	for _, e := range h.ends {
		if e.Result == ResultOK {
			return
		}
	}
	if c.opts.FailoverLoss {
		if w, ok := c.fi.failoverWindow(h.send.T); ok {
			c.r.LostInFailover++
			c.r.LossWindow = max(c.r.LossWindow, w)
			c.explained(brokeFeatureLost, "failover")
			return
		}
	}
	c.r.Lost++
	c.broke(brokeFeatureLost, h.send.T, "op %s (%s, id %s): acknowledged, never handled, not a dead letter", op, h.send.Mode, h.sent.ID)
}

// idemMessage is a message of an idempotency key, and its callers.
type idemMessage struct {
	id      string
	key     string
	accept  acceptance
	callers []string
}

// idempotent: one message per idempotency key and window (idemTTL from
// the first), so one handler run but for redeliveries (the duplicates
// check judges those); every caller of a message that got a reply got the
// same one, a reply of a run of a message of its key.
func (c *features) idempotent() {
	msgs := map[string]*idemMessage{}
	outcome := map[string]Event{}
	for _, e := range c.events[KindIdemOutcome] {
		outcome[e.Op] = e
	}
	for op, h := range c.ops {
		if h.send == nil || h.send.Mode != ModeIdempotent {
			continue
		}
		c.f.Exercised["idem_callers"]++
		if h.sent == nil {
			continue
		}
		m := msgs[h.sent.ID]
		if m == nil {
			m = &idemMessage{id: h.sent.ID, key: h.send.Key, accept: acceptance{lower: h.send.T, upper: h.sent.T}}
			msgs[h.sent.ID] = m
		}
		m.callers = append(m.callers, op)
		m.accept.lower, m.accept.upper = min(m.accept.lower, h.send.T), min(m.accept.upper, h.sent.T)
	}
	c.idemWindows(msgs)
	c.idemReplies(msgs, outcome)
}

// idemWindows: no two messages of a key accepted within idemTTL.
//
// The key's window starts when its first send stores the message, no
// earlier than the send of the Request that stored it (the op its runs
// name): that Request's OnSent may never have been called (its answer lost
// to a fault), and the callers that recorded the message's id may have
// joined seconds later, so the window is measured from that send when a
// run names it, not from the earliest caller that recorded the id.
func (c *features) idemWindows(msgs map[string]*idemMessage) {
	byKey := map[string][]acceptance{}
	for _, m := range msgs {
		rs := c.runsOfID(m.id)
		if len(rs) > 0 {
			m.accept.op = rs[0].op
			m.accept.upper = min(m.accept.upper, rs[0].start)
			if h := c.ops[rs[0].op]; h != nil && h.send != nil && h.send.Mode == ModeIdempotent {
				m.accept.lower = h.send.T
				if h.sent == nil {
					c.f.Exercised["idem_stored_unanswered"]++
				}
			}
		} else {
			m.accept.op = "id " + m.id
		}
		m.accept.holds = m.accept.lower + int64(idemTTL-keySlack)
		byKey[m.key] = append(byKey[m.key], m.accept)
		c.f.Exercised["idem_messages"]++
		c.f.Exercised["idem_runs"] += len(rs)
		if len(rs) > 1 {
			c.f.Exercised["idem_reruns"]++
		}
	}
	for key, as := range byKey {
		slices.SortFunc(as, func(a, b acceptance) int { return cmp.Compare(a.lower, b.lower) })
		pairsWithin(as, idemTTL, func(a, b acceptance) {
			if certainlyTogether(a, b) {
				c.brokeState(brokeIdemTwo, keySpan(a, b), "idempotency key %s: %s and %s both queued within the key's window of %v", key, a.op, b.op, idemTTL)
			}
		})
	}
}

// runsOfID returns the runs of the idempotent message id.
func (c *features) runsOfID(id string) []*run {
	var rs []*run
	for _, ru := range c.byRecv[recvIdem] {
		if ru.id == id {
			rs = append(rs, ru)
		}
	}
	return rs
}

// idemReplies: every caller of a message got one reply, that of one of
// its runs.
func (c *features) idemReplies(msgs map[string]*idemMessage, outcome map[string]Event) {
	for _, m := range msgs {
		rs := c.runsOfID(m.id)
		first, firstT := "", int64(0)
		for _, op := range m.callers {
			o, ok := outcome[op]
			if !ok || o.Result != ResultReply {
				continue
			}
			c.f.Exercised["idem_replies"]++
			if c.rerunBefore(rs, o.T) {
				c.f.Exercised["idem_replies_after_rerun"]++
			}
			if !fromRun(o.Reply, rs) {
				c.broke(brokeIdemForeign, o.T, "idempotency key %s: caller %s got %q, the reply of no run of message %s", m.key, op, o.Reply, m.id)
			}
			if first == "" {
				first, firstT = o.Reply, o.T
			} else if o.Reply != first {
				// The message's reply was stored before the earlier of
				// the two callers got it; the other reply, stored again
				// after a failover lost the first, came by the later.
				lost := lossSpan{written: m.accept.lower, writtenTo: min(firstT, o.T), seen: max(firstT, o.T)}
				c.brokeState(brokeIdemReplies, lost, "idempotency key %s: callers of message %s got %q and %q", m.key, m.id, first, o.Reply)
			}
		}
	}
}

// rerunBefore reports whether a run of rs after the first, following a
// crash or kill of the first's worker, started before t.
func (c *features) rerunBefore(rs []*run, t int64) bool {
	for _, ru := range rs[min(1, len(rs)):] {
		if _, died := c.died(rs[0].proc, rs[0].start); died && ru.start < t {
			return true
		}
	}
	return false
}

// parseIdemReply undoes idemReply.
func parseIdemReply(s string) (op, proc string, attempt int, ok bool) {
	parts := strings.Split(s, "|")
	if len(parts) != 3 {
		return "", "", 0, false
	}
	n, err := strconv.Atoi(parts[2])
	return parts[0], parts[1], n, err == nil
}

// fromRun reports whether reply is the reply of one of rs.
func fromRun(reply string, rs []*run) bool {
	op, proc, attempt, ok := parseIdemReply(reply)
	return ok && slices.ContainsFunc(rs, func(ru *run) bool { return ru.op == op && ru.proc == proc && ru.attempt == attempt })
}

// rate: in any span, the starts of recvRate exceed what the token bucket
// allows (rateBurst, and rateLimit a second) by at most rateSlack, unless
// a fault under way from tokenLag before the span's first start to its
// last start explains it.
//
// A token is taken before the fetch (limiter.gate), so a start lags its
// token by the fetch and the handler's dispatch: tokenLag, which
// rateSlack covers. A fault can hold that fetch far longer: a stalled or
// paused connection holds the fetch (or its answer) taken with tokens
// granted before the fault, a stopped worker its fetched messages; when
// the fault ends they all start at once, beside the starts of tokens
// taken after it. Such a start comes within tokenLag of the fault's end,
// so a span whose starts are not all of tokens taken within tokenLag
// before them has a fault under way within tokenLag before its first
// start, or during it; a fault that ended earlier than that held none of
// the span's tokens, and leaves its excess unexplained.
func (c *features) rate() {
	rs := c.byRecv[recvRate]
	if len(rs) == 0 {
		return
	}
	t0 := rs[0].start
	sec := func(t int64) float64 { return float64(t-t0) / float64(time.Second) }
	best, from := math.Inf(-1), 0
	for j, ru := range rs {
		if v := rateLimit*sec(ru.start) - float64(j); v > best {
			best, from = v, j
		}
		excess := float64(j+1) - rateLimit*sec(ru.start) + best - rateBurst
		c.f.MaxRateExcess = max(c.f.MaxRateExcess, excess)
		if excess <= rateSlack {
			continue
		}
		if why := c.fi.explainSpan(rs[from].start-int64(tokenLag), ru.start); why != "" {
			c.explained(brokeRate, why)
			continue
		}
		// A host stall lengthens the tokens' lag by what it covered of it.
		if st := stalledWithin(c.stalls, rs[from].start-int64(tokenLag), ru.start); excess-rateLimit*st.Seconds() <= rateSlack {
			c.explained(brokeRate, explainStall)
			continue
		}
		// So does a scheduling delay of a process that started handlers
		// in the span: its starts lag their tokens by what it covered.
		delayed := c.spanDelayed(rs[from:j+1], rs[from].start-int64(tokenLag), ru.start)
		if excess-rateLimit*delayed.Seconds() <= rateSlack {
			c.explained(brokeRate, explainSchedDelay)
			continue
		}
		c.broke(brokeRate, ru.start, "%d handlers of %s started from %v to %v, %.1f beyond WithRateLimit(%v, %d) (host and Redis stalls %v from a token's lag before, a process's delays %v)",
			j-from+1, recvRate, c.at(rs[from].start), c.at(ru.start), excess, rateLimit, rateBurst,
			stalledWithin(c.stalls, rs[from].start-int64(tokenLag), ru.start).Round(time.Millisecond), delayed.Round(time.Millisecond))
	}
}

// spanDelayed returns the most that the scheduling delays of one process
// that started a run among rs covered of the span from from to to.
func (c *features) spanDelayed(rs []*run, from, to int64) time.Duration {
	var most time.Duration
	seen := map[string]bool{}
	for _, ru := range rs {
		if !seen[ru.proc] {
			seen[ru.proc] = true
			most = max(most, c.delayedWithin(ru.proc, from, to))
		}
	}
	return most
}

// explainSpan returns the kind of a fault under way between from and to,
// or "".
func (fi faultIndex) explainSpan(from, to int64) string {
	for _, f := range fi.faults {
		if f.T <= to && f.End >= from {
			return f.Fault
		}
	}
	return ""
}

// pool: no message of HandleWithPool is dead-lettered (its handler never
// fails: only faults count its attempts), and a message given back is
// delivered again with the same attempt number.
func (c *features) pool() {
	for op, h := range c.ops {
		if h.send == nil || h.send.Receiver != recvPool {
			continue
		}
		c.f.Exercised["pool_sends"]++
		if !h.dead {
			continue
		}
		if why := c.touched(c.byOp[op]); why != "" {
			c.explained(brokePoolDead, why)
			continue
		}
		c.broke(brokePoolDead, h.send.T, "op %s of %s was dead-lettered, its attempts counted with no fault", op, recvPool)
	}
	for _, e := range c.events[KindPoolState] {
		if e.Result == "degraded" {
			c.f.Exercised["pool_degraded"]++
		}
	}
	c.givenBack()
}

// givenBack: the delivery that follows a give-back has its attempt.
func (c *features) givenBack() {
	backs := map[string][]Event{}
	for _, e := range c.events[KindGivenBack] {
		backs[e.Op] = append(backs[e.Op], e)
	}
	for op, bs := range backs {
		c.f.Exercised["pool_given_back"] += len(bs)
		for _, g := range bs {
			next, ok := c.nextDelivery(op, bs, g.T)
			switch {
			case !ok || next.Attempt == g.Attempt:
			case c.fi.explain(g.Proc, g.T, next.T) != "":
				c.explained(brokePoolAttempt, "fault")
			case next.Attempt < g.Attempt && c.fi.explain(next.Proc, g.T, next.T) != "":
				// An earlier attempt's delivery, started late: its worker
				// was stopped (or cut off) holding it while its lease ran
				// out and another worker took the message and gave it back.
				c.explained(brokePoolAttempt, "fault")
			case time.Duration(next.T-g.T) >= c.opts.Lease:
				c.explained(brokePoolAttempt, "lease_expired")
			default:
				c.broke(brokePoolAttempt, next.T, "op %s: given back at attempt %d on %s, delivered again as attempt %d", op, g.Attempt, g.Proc, next.Attempt)
			}
		}
	}
}

// nextDelivery returns the first delivery of op after t: a start or a
// give-back.
func (c *features) nextDelivery(op string, backs []Event, t int64) (Event, bool) {
	var next Event
	found := false
	consider := func(e Event) {
		if e.T > t && (!found || e.T < next.T) {
			next, found = e, true
		}
	}
	for _, ru := range c.byOp[op] {
		consider(Event{T: ru.start, Proc: ru.proc, Attempt: ru.attempt})
	}
	for _, b := range backs {
		consider(b)
	}
	return next, found
}

// pauseSpan is a pause of recvPaused: from its Pause's call to the first
// Resume after it.
type pauseSpan struct {
	begin, returned, resumed int64 // returned: 0 when the Pause failed
}

// pauseSpans returns the pauses of recvPaused; a pause with no Resume
// after it lasts to end.
func (c *features) pauseSpans(end int64) []pauseSpan {
	calls := append(slices.Clone(c.events[KindPause]), c.events[KindResume]...)
	slices.SortFunc(calls, func(a, b Event) int { return cmp.Compare(a.T, b.T) })
	var spans []pauseSpan
	var cur *pauseSpan
	for _, e := range calls {
		switch {
		case e.Kind == KindPause && cur == nil:
			cur = &pauseSpan{begin: e.T}
			if e.Result == ResultOK {
				cur.returned = e.End
			}
		case e.Kind == KindResume && cur != nil:
			cur.resumed = e.T
			spans = append(spans, *cur)
			cur = nil
		}
	}
	if cur != nil {
		cur.resumed = end
		spans = append(spans, *cur)
	}
	return spans
}

// pauses: no handler of recvPaused starts from pauseSlack after a Pause
// returned until the Resume began, unless a fault of its worker or of
// Redis since the Pause began explains it (the worker could not read the
// pause).
func (c *features) pauses() {
	spans := c.pauseSpans(c.last)
	for _, s := range spans {
		if s.returned != 0 {
			c.f.Exercised["pauses"]++
		}
	}
	for _, ru := range c.byRecv[recvPaused] {
		for _, s := range spans {
			if s.returned == 0 || ru.start <= s.returned || ru.start >= s.resumed {
				continue
			}
			if why := c.fi.explain(ru.proc, s.begin, ru.start); why != "" {
				c.explained(brokePaused, why)
				continue
			}
			lag := time.Duration(ru.start - s.returned)
			c.f.MaxPauseLag = max(c.f.MaxPauseLag, lag)
			if lag <= pauseSlack {
				continue
			}
			// A host stall between the Pause's return and the start
			// delayed the worker's poll by what it covered of that span.
			if lag-stalledWithin(c.stalls, s.returned, ru.start) <= pauseSlack {
				c.explained(brokePaused, explainStall)
				continue
			}
			// So did a scheduling delay of the worker that started it
			// (not of the one that paused: a late return of the Pause
			// shortens the lag).
			delayed := c.delayedWithin(ru.proc, s.returned, ru.start)
			if lag-delayed <= pauseSlack {
				c.explained(brokePaused, explainSchedDelay)
				continue
			}
			c.broke(brokePaused, ru.start, "%s started on %s %v after a Pause of %s returned, before the Resume (host and Redis stalls %v of it, its process's delays %v)",
				ru.op, ru.proc, lag.Round(time.Millisecond), recvPaused, stalledWithin(c.stalls, s.returned, ru.start).Round(time.Millisecond), delayed.Round(time.Millisecond))
		}
	}
}

// priorities: every delivery is at its send's level, and the messages
// queued during a pause start, after the Resume, higher levels first.
func (c *features) priorities() {
	for _, ru := range c.byRecv[recvPaused] {
		s := c.send(ru.op)
		if s == nil || s.Priority == ru.prio {
			continue
		}
		c.broke(brokeLevel, ru.start, "%s (sent at level %d) delivered at level %d as attempt %d on %s", ru.op, s.Priority, ru.prio, ru.attempt, ru.proc)
	}
	slots := c.workers * pausedConcurrency
	for _, s := range c.pauseSpans(c.last) {
		if s.returned != 0 {
			c.order(s, slots)
		}
	}
}

// queuedOp is a message queued while recvPaused was paused.
type queuedOp struct {
	op    string
	level int
	send  int64
	first *run
}

// order: of the messages sent and acknowledged while the workers surely
// knew of the pause, that started after the Resume, none is overtaken by
// more than slots messages of higher levels (started after it). The
// workers hold at most slots messages of recvPaused at once
// (pausedConcurrency each, no prefetch) and take every waiting message of
// a higher level before one of a lower: when a message started, the
// higher ones not started yet were among those they held, whatever the
// delay of their starts on a loaded host. A message whose start a fault of
// its worker or of Redis delayed is not counted. High is judged only when
// a high message waited long enough for the workers to notice the level
// (noticeWindow).
func (c *features) order(s pauseSpan, slots int) {
	var qs []queuedOp
	noticed := false
	for op, h := range c.ops {
		rs := c.byOp[op]
		if h.send == nil || h.send.Receiver != recvPaused || h.sent == nil || len(rs) == 0 ||
			h.send.T <= s.returned+int64(pauseSlack) || h.sent.T >= s.resumed || rs[0].start < s.resumed {
			continue // not queued while paused, or started while paused (see pauses)
		}
		qs = append(qs, queuedOp{op: op, level: h.send.Priority, send: h.send.T, first: rs[0]})
		if h.send.Priority == int(disker.PriorityHigh) && h.send.T <= s.resumed-int64(noticeWindow) {
			noticed = true
		}
	}
	if len(qs) == 0 {
		return
	}
	c.f.Exercised["priority_pauses_judged"]++
	c.f.Exercised["priority_msgs_judged"] += len(qs)
	// By start; of two at once, the higher first.
	slices.SortFunc(qs, func(a, b queuedOp) int {
		return cmp.Or(cmp.Compare(a.first.start, b.first.start), cmp.Compare(b.level, a.level))
	})
	var later [3]int // the messages started later, by level (low, normal, high)
	for i := len(qs) - 1; i >= 0; i-- {
		q := qs[i]
		overtaken := 0
		for level := q.level + 1; level <= int(disker.PriorityHigh); level++ {
			if level != int(disker.PriorityHigh) || noticed {
				overtaken += later[level+1]
			}
		}
		c.f.MaxOvertaken = max(c.f.MaxOvertaken, overtaken)
		if overtaken > slots {
			c.broke(brokeOrder, q.first.start, "%s (level %d) started at %v, before %d messages of higher levels queued during the same pause, more than the %d the workers hold",
				q.op, q.level, c.at(q.first.start), overtaken, slots)
		}
		if c.fi.explain(q.first.proc, s.resumed, q.first.start) == "" {
			later[q.level+1]++
		}
	}
}

// tickMessage is a message of a schedule.
type tickMessage struct {
	id      string
	tick    int64
	n       int64 // the ticks it stands for
	handled int64 // its first delivery
}

// schedules: each tick of a schedule is sent once (no two messages stand
// for one tick), on the schedule's grid, and none is skipped: with
// MissedOne never, with MissedSkip only when it was missed, decided a
// second or more after its time (then the schedule resumes with its first
// tick in the future, skipping those in between). The broker decides the
// tick after a gap in the step that skips it, so the gap is explained
// when that tick's message was handled at least a second after the first
// tick skipped.
func (c *features) schedules() {
	byName := map[string]map[string]*tickMessage{}
	for _, e := range c.events[KindTick] {
		if e.Err != "" {
			c.broke(brokeTickMalformed, e.T, "schedule %s: message %s has a malformed tick: %s", e.Key, e.ID, e.Err)
			continue
		}
		if byName[e.Key] == nil {
			byName[e.Key] = map[string]*tickMessage{}
		}
		if m := byName[e.Key][e.ID]; m != nil {
			continue // delivered again: its first delivery counts
		}
		byName[e.Key][e.ID] = &tickMessage{id: e.ID, tick: e.Tick, n: max(1, e.N), handled: e.T}
		if e.N > 0 {
			c.f.Exercised["ticks_caught_up"]++
		}
	}
	for _, s := range schedules {
		var ms []*tickMessage
		for _, m := range byName[s.name] {
			ms = append(ms, m)
		}
		slices.SortFunc(ms, func(a, b *tickMessage) int { return cmp.Compare(a.tick, b.tick) })
		c.f.Exercised["ticks"] += len(ms)
		for i := 1; i < len(ms); i++ {
			c.tickGap(s, ms[i-1], ms[i])
		}
	}
}

// tickGap judges two messages of schedule s in tick order.
func (c *features) tickGap(s chaosSchedule, a, b *tickMessage) {
	every := int64(s.every)
	next := a.tick + a.n*every
	switch {
	case (b.tick-a.tick)%every != 0:
		c.broke(brokeTickTwice, b.tick, "schedule %s: tick at %v is off the grid of the tick at %v", s.name, c.at(b.tick), c.at(a.tick))
	case b.tick < next:
		c.broke(brokeTickTwice, b.tick, "schedule %s: messages %s and %s both stand for the tick at %v", s.name, a.id, b.id, c.at(b.tick))
	case b.tick == next:
	case s.missed == disker.MissedOne:
		c.broke(brokeTickSkipped, next, "schedule %s (missed: one): no message stands for the ticks from %v to %v", s.name, c.at(next), c.at(b.tick))
	case b.handled >= next+int64(missedAfter):
		c.explained(brokeTickSkipped, "missed")
		c.f.Exercised["ticks_skipped"] += int((b.tick - next) / every)
	default:
		c.broke(brokeTickSkipped, next, "schedule %s (missed: skip): ticks from %v to %v skipped, and the tick at %v handled at %v, before the first skipped was a second old",
			s.name, c.at(next), c.at(b.tick), c.at(b.tick), c.at(b.handled))
	}
}
