package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// DefaultStartSlack is the default CheckOptions.StartSlack.
const DefaultStartSlack = 200 * time.Millisecond

// maxListed bounds how many violations a Report lists by name.
const maxListed = 50

// CheckOptions tune Check.
type CheckOptions struct {
	// StartSlack is how long after its deadline a handler's first
	// instruction may run and still count as started in time: Disker
	// checks the deadline just before it calls the handler, and the
	// handler reads the clock first thing, but a loaded machine may
	// deschedule it in between. 0 means DefaultStartSlack.
	StartSlack time.Duration
	// FailoverLoss sets apart, in LostInFailover, the messages whose
	// invariants broke because a failover lost writes (Redis replicates
	// asynchronously: what the old master acknowledged and had not passed
	// on is gone, a settled timeout may come back, a lost reply may be
	// settled as a timeout): those sent less than failoverWindowMax before
	// a failover began, or during it.
	FailoverLoss bool
	// Lease is the workers' lease; 0 means the harness's (2s). A
	// delivery more than a lease after the message's send may follow one
	// whose lease ran out before its acknowledgement landed.
	Lease time.Duration
}

// failoverWindowMax is how long before a failover an acknowledged message
// may be lost in it, with CheckOptions.FailoverLoss.
const failoverWindowMax = 10 * time.Second

// pauseFailoverTail is how long after a CLIENT PAUSE of a Sentinel's master
// the failover it may cause can take to complete.
const pauseFailoverTail = 5 * time.Second

// Report is what Check found in a history. The fields named as invariants
// must be 0 (and Settled true) for the run to pass: see OK.
type Report struct {
	// Duration runs from the first event to the settle (the faults' end).
	Duration time.Duration `json:"duration"`
	// Ops counts the operations begun, by mode of send.
	Ops map[string]int `json:"ops"`
	// Acked counts sends (Send and SendBatch, not Request, which returns
	// no id) the broker acknowledged; Unknown those whose result was not
	// recorded or was an error (the message may or may not exist).
	Acked   int `json:"acked"`
	Unknown int `json:"unknown"`
	// Faults counts the faults injected, by kind.
	Faults map[string]int `json:"faults"`
	// Handled counts handler starts; DeadLetters the dead letters found.
	Handled     int `json:"handled"`
	DeadLetters int `json:"dead_letters"`

	// Lost (invariant) counts acknowledged fire-and-forget and batch sends
	// (SendBatch, a batch's children, a chain's first step) that no
	// handler completed and that are not dead letters.
	Lost int `json:"lost"`
	// LostInFailover counts, with CheckOptions.FailoverLoss, messages
	// whose invariants broke in a failover (lost, no outcome, two
	// outcomes, a disagreement); LossWindow is the longest time from such
	// a message's send to the start of the failover (negative: sent
	// during it).
	LostInFailover int           `json:"lost_in_failover"`
	LossWindow     time.Duration `json:"loss_window"`
	// NoOutcome (invariant) counts acknowledged timed sends, and requests
	// of a requester that stayed alive, with no outcome at the sender.
	NoOutcome int `json:"no_outcome"`
	// MultiOutcome (invariant) counts timed messages whose sender saw two
	// different outcomes (a reply and a timeout).
	MultiOutcome int `json:"multi_outcome"`
	// RedeliveredOutcomes counts outcomes the sender saw a second time, of
	// the same kind, after the instance that saw it first was killed or
	// stopped or Redis failed before it acknowledged it; Unexplained
	// ones are counted in MultiOutcome.
	RedeliveredOutcomes int `json:"redelivered_outcomes"`
	// Disagreements (invariant) counts messages whose replier was told its
	// reply was accepted while the sender saw a timeout, or whose sender
	// saw a reply although every reply was refused as late.
	Disagreements int `json:"disagreements"`
	// LateStarts (invariant) counts handlers started after the message's
	// deadline by Redis time (beyond StartSlack), or after the deadline
	// they were given when that is not known; MaxLateness is the latest
	// start relative to its deadline (negative: all started before).
	LateStarts  int           `json:"late_starts"`
	MaxLateness time.Duration `json:"max_lateness"`
	// MaxDeadlineSkew is the largest difference between the deadline a
	// handler was given (Message.Deadline, Redis's deadline translated by
	// Disker's estimate of the clocks' offset) and the deadline in Redis
	// time (see redisDeadline), over requests and the timed sends that
	// took less than tightSend (whose deadline is known that closely);
	// starts are judged by the deadline in Redis time.
	MaxDeadlineSkew time.Duration `json:"max_deadline_skew"`
	// EarlyStarts (invariant) counts handlers of messages sent WithDelay
	// that started before the message's due time (the send's start plus
	// the delay: Redis, on the same host, decides the due time at the send
	// or later).
	EarlyStarts int `json:"early_starts"`
	// Cancelled counts the producers' Cancels by what they found;
	// CancelledHandled (invariant) counts messages that Cancel found
	// scheduled or queued, so never to be delivered, that a handler
	// started all the same.
	Cancelled        map[string]int `json:"cancelled"`
	CancelledHandled int            `json:"cancelled_handled"`
	// Duplicates counts deliveries of a message after one that did not
	// fail (retries after a failure are not duplicates), by explanation:
	// "lease_lost" (the earlier handler lost its lease), "process_fault"
	// (its worker was killed or stopped, or killed later before it
	// recorded the acknowledgement), "redis_fault" (Redis was killed,
	// paused or cut off in between), "ack_failed" (the earlier handler
	// ended well and its acknowledgement failed), "lease_expired" (no
	// fault, and the earlier delivery's lease may have run out first: the
	// later one came more than a lease after the send, and the earlier
	// one's acknowledgement returned more than a lease after the send, or
	// was not made because its handler ended too late to keep the lease),
	// "unexplained" (invariant: must be 0), which includes a redelivery
	// after a handler that ended well and whose acknowledgement returned
	// less than a lease after the send, or was never made (see
	// explainDuplicate).
	Duplicates map[string]int `json:"duplicates"`
	// Unexplained counts the unexplained duplicates by the rule that
	// found them: "within_lease" (the later delivery came within a lease
	// of the send), "acked_within_lease" (the earlier handler ended well
	// and its acknowledgement returned within a lease of the send),
	// "never_acked" (it ended well in time to keep its lease and was never
	// acknowledged).
	Unexplained map[string]int `json:"unexplained,omitempty"`
	// Messages counts the messages that a handler started, once each: the
	// base of DuplicatesPerThousand.
	Messages int `json:"messages"`
	// PendingAtEnd (invariant) counts messages still in the queues when the
	// run ended; Settled (must be true) says whether everything settled
	// before the harness gave up waiting.
	PendingAtEnd int64 `json:"pending_at_end"`
	Settled      bool  `json:"settled"`
	// Left describes, per receiver, what was still in the queues when the
	// run ended without settling (empty otherwise).
	Left string `json:"left,omitempty"`
	// Recovery gives, per kind of fault, the time from the fault's end
	// until a send begun after it was acknowledged and a handler started
	// after it completed: p50 and p99.
	Recovery map[string][2]time.Duration `json:"recovery"`
	// HostStalls counts the host stalls (stalls.go): silences of every
	// process of minHostStall or more while the run was busy and Redis up;
	// HostStalled is their total length, MaxHostStall the longest. Only
	// the features' timing-bounded checks take them into account.
	HostStalls   int           `json:"host_stalls"`
	HostStalled  time.Duration `json:"host_stalled"`
	MaxHostStall time.Duration `json:"max_host_stall"`
	// RedisStalls counts the Redis stalls (redisstalls.go): PINGs the
	// harness sent straight to a server that were answered
	// minRedisStall or more late, with no fault of Redis under way;
	// RedisStalled is their total length, MaxRedisStall the longest. The
	// features' timing-bounded checks take them into account as they do
	// the host stalls.
	RedisStalls   int           `json:"redis_stalls"`
	RedisStalled  time.Duration `json:"redis_stalled"`
	MaxRedisStall time.Duration `json:"max_redis_stall"`
	// SchedDelays counts the scheduling delays the processes recorded
	// (delays.go): ticks of a process's delay ticker that fired more than
	// minSchedDelay late; SchedDelayed is their total length,
	// MaxSchedDelay the longest. Only the features' timing-bounded checks
	// take them into account, each only the delays of the process it
	// depends on.
	SchedDelays   int           `json:"sched_delays"`
	SchedDelayed  time.Duration `json:"sched_delayed"`
	MaxSchedDelay time.Duration `json:"max_sched_delay"`
	// Violations names the first violations found.
	Violations []string `json:"violations,omitempty"`
	// Features is what the checks of the features found (checkfeatures.go).
	Features *FeatureReport `json:"features,omitempty"`
}

// OK reports whether every invariant held.
func (r *Report) OK() bool {
	return r.Lost == 0 && r.NoOutcome == 0 && r.MultiOutcome == 0 && r.Disagreements == 0 &&
		r.LateStarts == 0 && r.EarlyStarts == 0 && r.CancelledHandled == 0 &&
		r.Duplicates["unexplained"] == 0 && r.PendingAtEnd == 0 && r.Settled &&
		r.Features.OK()
}

func (r *Report) violate(format string, args ...any) {
	if len(r.Violations) < maxListed {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// String renders the report as the rows of RELIABILITY.md's table.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "duration            %v\n", r.Duration.Round(time.Second))
	fmt.Fprintf(&b, "operations          %s (acked %d, unknown %d)\n", counts(r.Ops), r.Acked, r.Unknown)
	fmt.Fprintf(&b, "faults              %s\n", counts(r.Faults))
	fmt.Fprintf(&b, "handler starts      %d, dead letters %d\n", r.Handled, r.DeadLetters)
	fmt.Fprintf(&b, "lost                %d\n", r.Lost)
	if r.LostInFailover > 0 {
		fmt.Fprintf(&b, "broken by failover  %d (window: sent up to %v before the failover began)\n", r.LostInFailover, r.LossWindow.Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "no outcome          %d\n", r.NoOutcome)
	fmt.Fprintf(&b, "two outcomes        %d (same outcome redelivered after a fault: %d)\n", r.MultiOutcome, r.RedeliveredOutcomes)
	fmt.Fprintf(&b, "disagreements       %d\n", r.Disagreements)
	fmt.Fprintf(&b, "late starts         %d (latest start: %v from its deadline; deadlines given off by up to %v)\n", r.LateStarts, r.MaxLateness.Round(time.Millisecond), r.MaxDeadlineSkew.Round(time.Millisecond))
	if len(r.Cancelled) > 0 || r.EarlyStarts > 0 || r.CancelledHandled > 0 {
		fmt.Fprintf(&b, "early starts        %d (messages sent WithDelay started before their due time)\n", r.EarlyStarts)
		fmt.Fprintf(&b, "cancels             %s; handled after a cancel found them scheduled or queued: %d\n", counts(r.Cancelled), r.CancelledHandled)
	}
	fmt.Fprintf(&b, "duplicates          %s, %.2f per 1,000 messages handled (%d)\n", counts(r.Duplicates), r.DuplicatesPerThousand(), r.Messages)
	if len(r.Unexplained) > 0 {
		fmt.Fprintf(&b, "unexplained by rule %s\n", counts(r.Unexplained))
	}
	fmt.Fprintf(&b, "pending at end      %d (settled: %v)\n", r.PendingAtEnd, r.Settled)
	if r.Left != "" {
		fmt.Fprintf(&b, "left in the queues  %s\n", r.Left)
	}
	kinds := make([]string, 0, len(r.Recovery))
	for k := range r.Recovery {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		p := r.Recovery[k]
		fmt.Fprintf(&b, "recovery %-18s p50 %v, p99 %v\n", k, p[0].Round(time.Millisecond), p[1].Round(time.Millisecond))
	}
	fmt.Fprintf(&b, "host stalls         %d (%v in all, longest %v: no process recorded anything for %v or more, the run busy, Redis up)\n",
		r.HostStalls, r.HostStalled.Round(time.Millisecond), r.MaxHostStall.Round(time.Millisecond), minHostStall)
	fmt.Fprintf(&b, "redis stalls        %d (%v in all, longest %v: a PING straight to a server answered %v or more late, no fault under way)\n",
		r.RedisStalls, r.RedisStalled.Round(time.Millisecond), r.MaxRedisStall.Round(time.Millisecond), minRedisStall)
	fmt.Fprintf(&b, "scheduling delays   %d (%v in all, longest %v: a process's %v ticker fired more than %v late)\n",
		r.SchedDelays, r.SchedDelayed.Round(time.Millisecond), r.MaxSchedDelay.Round(time.Millisecond), schedTick, minSchedDelay)
	b.WriteString(r.Features.String())
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "VIOLATION: %s\n", v)
	}
	if r.OK() {
		b.WriteString("result              every invariant held\n")
	} else {
		b.WriteString("result              INVARIANT BROKEN\n")
	}
	return b.String()
}

func counts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	total := 0
	for k, n := range m {
		keys = append(keys, k)
		total += n
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return fmt.Sprintf("%d [%s]", total, strings.Join(parts, ", "))
}

// DuplicatesPerThousand is the duplicates per 1,000 messages handled.
func (r *Report) DuplicatesPerThousand() float64 {
	if r.Messages == 0 {
		return 0
	}
	n := 0
	for _, d := range r.Duplicates {
		n += d
	}
	return float64(n) * 1000 / float64(r.Messages)
}

// opHistory gathers the events of one operation.
type opHistory struct {
	send     *Event
	sent     *Event
	failed   *Event // the send returned an error
	outcomes []Event
	starts   []Event
	ends     []Event
	acks     []Event
	replies  []Event
	cancels  []Event
	// cancelCalls counts the Cancel calls begun (KindCancelCall).
	cancelCalls int
	dead        bool
}

// faultIndex answers whether a fault may explain what happened in a window.
type faultIndex struct {
	faults []Event
}

// redisSide tells the faults that touch Redis or the connections to it.
var redisSide = map[string]bool{
	FaultKillRedis: true, FaultResetConns: true, FaultStallConns: true,
	FaultCutAnswers: true, FaultClientPause: true, FaultSentinelFailover: true,
}

// explain returns why something that proc did at from may have been done
// again at to: "process_fault" when proc was killed or stopped in between,
// "redis_fault" when Redis was, and "" when neither. A fault counts until
// faultAftermath after its end.
func (fi faultIndex) explain(proc string, from, to int64) string {
	redis := false
	for _, f := range fi.faults {
		if f.T > to || f.End+int64(faultAftermath) < from {
			continue
		}
		if f.Target == proc {
			return "process_fault"
		}
		if redisSide[f.Fault] {
			redis = true
		}
	}
	if redis {
		return "redis_fault"
	}
	return ""
}

// faultAftermath is how long a fault may still cause a redelivery after it
// ended: a stall, a pause or a stop that outlasts a worker's heartbeat ttl
// (3 s from its last heartbeat) lets its entry in the registry lapse, and
// its peers reclaim its deliveries at once until they have read that it
// came back: at their next heartbeat, or the one after (HeartbeatInterval,
// 1 s, in the harness's processes).
const faultAftermath = 2 * time.Second

func (fi faultIndex) killed(proc string) bool {
	return fi.killedAfter(proc, 0)
}

// killedAfter reports whether proc was killed at t or later.
func (fi faultIndex) killedAfter(proc string, t int64) bool {
	for _, f := range fi.faults {
		if f.Target == proc && f.T >= t && (f.Fault == FaultKillProducer || f.Fault == FaultKillWorker) {
			return true
		}
	}
	return false
}

// Check judges a history (all processes' events, sorted by time) against
// the delivery contract.
func Check(events []Event, opts CheckOptions) *Report {
	if opts.StartSlack == 0 {
		opts.StartSlack = DefaultStartSlack
	}
	if opts.Lease == 0 {
		opts.Lease = workerLease
	}
	r := &Report{
		Ops: map[string]int{}, Faults: map[string]int{}, Duplicates: map[string]int{}, Unexplained: map[string]int{}, Cancelled: map[string]int{},
		Recovery: map[string][2]time.Duration{}, MaxLateness: time.Duration(-1 << 62),
	}
	ops := map[string]*opHistory{}
	get := func(op string) *opHistory {
		h := ops[op]
		if h == nil {
			h = &opHistory{}
			ops[op] = h
		}
		return h
	}
	// A dead letter's error reply names its message by id only: the id of
	// its send, or of its deliveries when its producer died before it
	// recorded the send.
	opOfID := map[string]string{}
	for _, e := range events {
		if e.Kind == KindSent || e.Kind == KindStart {
			opOfID[e.ID] = e.Op
		}
	}
	var fi faultIndex
	var first, settle int64
	final := false
	for i := range events {
		e := events[i]
		if id, ok := strings.CutPrefix(e.Op, "id:"); ok {
			if opOfID[id] == "" {
				continue // the outcome of a send never recorded nor handled
			}
			e.Op = opOfID[id]
		}
		if first == 0 {
			first = e.T
		}
		var h *opHistory
		switch e.Kind {
		case KindSend, KindSent, KindSendFailed, KindOutcome, KindStart, KindEnd, KindAcked, KindReply, KindDeadLetter, KindCancelCall, KindCancel:
			if e.Op == "" {
				r.violate("a %s event of %s names no op", e.Kind, e.Proc)
				continue
			}
			h = get(e.Op)
		}
		switch e.Kind {
		case KindSend:
			h.send = &e
			r.Ops[e.Mode]++
		case KindSent:
			h.sent = &e
		case KindSendFailed:
			h.failed = &e
		case KindOutcome:
			h.outcomes = append(h.outcomes, e)
		case KindStart:
			h.starts = append(h.starts, e)
		case KindEnd:
			h.ends = append(h.ends, e)
		case KindAcked:
			h.acks = append(h.acks, e)
		case KindReply:
			h.replies = append(h.replies, e)
		case KindCancelCall:
			h.cancelCalls++
		case KindCancel:
			h.cancels = append(h.cancels, e)
			r.Cancelled[e.Result]++
		case KindDeadLetter:
			h.dead = true
			r.DeadLetters++
		case KindFault:
			fi.faults = append(fi.faults, e)
			r.Faults[e.Fault]++
		case KindSettle:
			settle = e.T
		case KindFinal:
			final = true
			r.PendingAtEnd = e.N
			r.Settled = e.Result == ResultSettled
			if !r.Settled {
				r.Left = e.Err
			}
		}
	}
	if settle == 0 && len(events) > 0 {
		settle = events[len(events)-1].T
	}
	r.Duration = time.Duration(settle - first)
	if !final {
		r.violate("the history has no final event: the run did not finish")
	}

	names := make([]string, 0, len(ops))
	for op := range ops {
		names = append(names, op)
	}
	sort.Strings(names)
	for _, op := range names {
		h := ops[op]
		if h.send == nil {
			r.violate("op %s: handled or settled but never sent", op)
			r.Lost++ // a message from nowhere: the history is broken
			continue
		}
		switch {
		case h.send.Mode == ModeRequest, h.send.Mode == ModeChainNext: // no id returned, or no send of its own: neither
		case h.sent != nil:
			r.Acked++
		default:
			r.Unknown++
		}
		r.Handled += len(h.starts)
		if len(h.starts) > 0 {
			r.Messages++
		}
		before := r.tally()
		checkLost(r, op, h)
		checkOutcomes(r, op, h, fi)
		checkAgreement(r, op, h)
		checkCancelled(r, op, h)
		if opts.FailoverLoss && r.tally() != before {
			if w, ok := fi.failoverWindow(h.send.T); ok {
				r.untally(before)
				r.LostInFailover++
				r.LossWindow = max(r.LossWindow, w)
			}
		}
		checkStarts(r, op, h, opts.StartSlack)
		checkDue(r, op, h)
		checkDuplicates(r, op, h, fi, opts.Lease)
	}
	if r.MaxLateness == time.Duration(-1<<62) {
		r.MaxLateness = 0
	}
	if r.PendingAtEnd != 0 {
		r.violate("%d messages still queued at the end", r.PendingAtEnd)
	}
	if final && !r.Settled {
		r.violate("the system did not settle after the faults stopped")
	}
	stalls := hostStalls(events, fi)
	r.HostStalls = len(stalls)
	for _, s := range stalls {
		r.HostStalled += time.Duration(s.to - s.from)
		r.MaxHostStall = max(r.MaxHostStall, time.Duration(s.to-s.from))
	}
	delays := schedDelays(events)
	for _, ds := range delays {
		for _, d := range ds {
			r.SchedDelays++
			r.SchedDelayed += time.Duration(d.to - d.from)
			r.MaxSchedDelay = max(r.MaxSchedDelay, time.Duration(d.to-d.from))
		}
	}
	rstalls := redisStalls(events, fi, delays[harnessProc])
	r.RedisStalls = len(rstalls)
	for _, s := range rstalls {
		r.RedisStalled += time.Duration(s.to - s.from)
		r.MaxRedisStall = max(r.MaxRedisStall, time.Duration(s.to-s.from))
	}
	r.Features = checkFeatures(r, events, ops, fi, unionSpans(stalls, rstalls), delays, opts)
	recovery(r, events, fi)
	return r
}

// tally is the counters that a failover may break, and the violations
// listed.
type tally [6]int

func (r *Report) tally() tally {
	return tally{r.Lost, r.NoOutcome, r.MultiOutcome, r.Disagreements, r.CancelledHandled, len(r.Violations)}
}

// untally restores the counters to t, dropping the violations listed
// since.
func (r *Report) untally(t tally) {
	r.Lost, r.NoOutcome, r.MultiOutcome, r.Disagreements, r.CancelledHandled = t[0], t[1], t[2], t[3], t[4]
	r.Violations = r.Violations[:t[5]]
}

// failoverWindow finds the failovers (and pauses that may have caused
// one) that began less than failoverWindowMax after a send at sent, or
// were under way then, and returns the time from the send to the start of
// the first of them (negative: sent during it).
func (fi faultIndex) failoverWindow(sent int64) (best time.Duration, found bool) {
	for _, f := range fi.faults {
		w := time.Duration(f.T - sent)
		// A CLIENT PAUSE longer than the sentinel's down-after time makes
		// the sentinel fail the master over by itself, in the seconds
		// after the pause.
		end := f.End
		switch f.Fault {
		case FaultSentinelFailover:
		case FaultClientPause:
			end += int64(pauseFailoverTail)
		default:
			continue
		}
		if sent <= end && w < failoverWindowMax && (!found || w < best) {
			best, found = w, true // the nearest that may have lost it
		}
	}
	return best, found
}

// untimed are the modes of the sends that must be handled or
// dead-lettered once acknowledged: fire-and-forget and SendBatch
// messages, delayed ones, batches' children and chains' first steps.
var untimed = map[string]bool{ModeFireAndForget: true, ModeBatch: true, ModeDelayed: true, ModeBatchChild: true, ModeChain: true}

// checkLost: an acknowledged untimed message must be handled or dead-lettered.
func checkLost(r *Report, op string, h *opHistory) {
	if h.sent == nil || !untimed[h.send.Mode] {
		return
	}
	if h.dead || h.cancelled() {
		return
	}
	for _, e := range h.ends {
		if e.Result == ResultOK {
			return
		}
	}
	r.Lost++
	r.violate("op %s (%s, id %s): acknowledged, never handled, not a dead letter", op, h.send.Mode, h.sent.ID)
}

// cancelled reports whether a Cancel found the message (scheduled, queued
// or in flight), or may have: one that failed (its answer lost to a
// fault), or one begun whose end was never recorded (its producer was
// killed during the call), may have taken effect. The message need not be
// handled then.
func (h *opHistory) cancelled() bool {
	if h.cancelCalls > len(h.cancels) {
		return true
	}
	for _, c := range h.cancels {
		switch c.Result {
		case CancelDeferred, CancelQueued, CancelInFlight, ResultError:
			return true
		}
	}
	return false
}

// checkCancelled: a message that Cancel found scheduled or queued was
// never delivered, and never will be.
func checkCancelled(r *Report, op string, h *opHistory) {
	for _, c := range h.cancels {
		if (c.Result == CancelDeferred || c.Result == CancelQueued) && len(h.starts) > 0 {
			r.CancelledHandled++
			r.violate("op %s (id %s): Cancel found it %s, yet attempt %d started on %s", op, c.ID, c.Result, h.starts[0].Attempt, h.starts[0].Proc)
			return
		}
	}
}

// checkDue: a message sent WithDelay starts no earlier than its send's
// start plus the delay (Redis decides the due time during the send, on
// the same host's clock).
func checkDue(r *Report, op string, h *opHistory) {
	if h.send.Mode != ModeDelayed {
		return
	}
	due := h.send.T + h.send.Timeout
	for _, s := range h.starts {
		if early := time.Duration(due - s.T); early > dueSlack {
			r.EarlyStarts++
			r.violate("op %s: attempt %d started %v before its due time on %s", op, s.Attempt, early, s.Proc)
			return
		}
	}
}

// dueSlack allows for the resolution of Redis's TIME (microseconds) and
// of the clock readings.
const dueSlack = time.Millisecond

// checkOutcomes: a timed message gets exactly one outcome at its sender.
func checkOutcomes(r *Report, op string, h *opHistory, fi faultIndex) {
	mode := h.send.Mode
	if mode != ModeTimed && mode != ModeRequest {
		return
	}
	if len(h.outcomes) == 0 {
		required := h.sent != nil
		if mode == ModeRequest {
			// The requester settles its own requests: one that was killed
			// cannot; one that lived must settle even an unknown send,
			// unless it could not send at all (Redis unreachable).
			required = !fi.killed(h.send.Proc) && h.failed == nil
		}
		if required {
			r.NoOutcome++
			r.violate("op %s (%s): no outcome at the sender", op, mode)
		}
		return
	}
	firstOut := h.outcomes[0]
	for _, o := range h.outcomes[1:] {
		if o.Result != firstOut.Result {
			r.MultiOutcome++
			r.violate("op %s (%s): two outcomes, %s then %s", op, mode, firstOut.Result, o.Result)
			return
		}
		if fi.explain(firstOut.Proc, firstOut.T, o.T) == "" {
			r.MultiOutcome++
			r.violate("op %s (%s): outcome %s seen twice with no fault in between", op, mode, o.Result)
			return
		}
		r.RedeliveredOutcomes++
	}
}

// checkAgreement: replier and sender agree on whether the reply counted.
func checkAgreement(r *Report, op string, h *opHistory) {
	if len(h.outcomes) == 0 {
		return
	}
	out := h.outcomes[0].Result
	accepted, maybe := false, false
	for _, e := range h.replies {
		switch e.Result {
		case ResultAccepted:
			accepted = true
		case ResultError:
			maybe = true // the reply may have been written
		}
	}
	if len(h.ends) < len(h.starts) {
		maybe = true // a handler that did not record its end may have replied
	}
	switch {
	case out == ResultTimeout && accepted:
		r.Disagreements++
		r.violate("op %s: reply accepted but the sender saw a timeout", op)
	case out == ResultReply && !accepted && !maybe:
		r.Disagreements++
		r.violate("op %s: the sender saw a reply but no reply was accepted", op)
	}
}

// checkStarts: no handler starts after the message's deadline.
func checkStarts(r *Report, op string, h *opHistory, slack time.Duration) {
	for _, s := range h.starts {
		if s.Deadline == 0 {
			continue
		}
		deadline := s.Deadline
		if d, ok := redisDeadline(h); ok {
			if h.send.Mode == ModeRequest || time.Duration(h.sent.T-h.send.T) < tightSend {
				r.MaxDeadlineSkew = max(r.MaxDeadlineSkew, time.Duration(abs(s.Deadline-d)))
			}
			deadline = d
		}
		late := time.Duration(s.T - deadline)
		r.MaxLateness = max(r.MaxLateness, late)
		if late > slack {
			r.LateStarts++
			r.violate("op %s: attempt %d started %v after its deadline on %s (it was given %v)", op, s.Attempt, late, s.Proc,
				time.Duration(s.T-s.Deadline))
		}
	}
}

// redisDeadline bounds a message's deadline in Redis time from above:
// a timed Send's is Redis's time when it ran, at the latest when Send
// returned, plus the timeout; a Request's is its context's deadline (the
// send event records it; histories without it: the send's time plus the
// timeout). Redis runs on the harness's host, on its clock.
func redisDeadline(h *opHistory) (int64, bool) {
	switch {
	case h.send.Timeout == 0:
		return 0, false
	case h.send.Mode == ModeRequest && h.send.Deadline != 0:
		return h.send.Deadline, true
	case h.send.Mode == ModeRequest:
		return h.send.T + h.send.Timeout, true
	case h.sent != nil:
		return h.sent.T + h.send.Timeout, true
	}
	return 0, false
}

// tightSend is how fast a timed Send must have been for its deadline in
// Redis time to be known closely enough to measure a skew.
const tightSend = 20 * time.Millisecond

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// checkDuplicates counts deliveries after one that did not fail, and
// explains each (explainDuplicate).
func checkDuplicates(r *Report, op string, h *opHistory, fi faultIndex, lease time.Duration) {
	// By attempt: a stopped worker may start its attempt after the
	// next one began elsewhere.
	slices.SortStableFunc(h.starts, func(a, b Event) int { return a.Attempt - b.Attempt })
	for i := 1; i < len(h.starts); i++ {
		prev, cur := h.starts[i-1], h.starts[i]
		end := h.of(h.ends, prev)
		if end != nil && end.Result == ResultFailed {
			continue // a retry
		}
		why, rule, what := explainDuplicate(h, prev, cur, end, fi, lease)
		r.Duplicates[why]++
		if why == "unexplained" {
			r.Unexplained[rule]++
			r.violate("op %s: attempt %d on %s after attempt %d on %s (%s) %s", op, cur.Attempt, cur.Proc, prev.Attempt, prev.Proc, endResult(end), what)
		}
	}
}

// explainDuplicate tells why cur, a delivery of h's message, followed
// prev, whose handler ended with end (nil: not recorded) and did not
// fail; when nothing does ("unexplained"), rule names the rule that found
// it (see Report.Unexplained) and what says what is wrong.
//
// A lease starts when Redis hands the message out, which may be well
// before the handler starts (its answer held up by a stalled connection,
// or its worker stopped), and no earlier than the send: so a fault counts
// from the send to the later start, and a lease cannot have run out
// before the send's time plus the lease. A redelivery with no fault must
// follow a lease that ran out before the earlier delivery was
// acknowledged: it is unexplained when it came within a lease of the
// send, or when the earlier handler ended well and its acknowledgement
// returned within a lease of the send, or was never made although the
// handler ended early enough to keep its lease (a consumer acknowledges
// every delivery whose handler returned nil, unless it lost the lease
// meanwhile).
func explainDuplicate(h *opHistory, prev, cur Event, end *Event, fi faultIndex, lease time.Duration) (why, rule, what string) {
	if end != nil && (end.Result == ResultLeaseLost || end.Result == ResultStopped) {
		return "lease_lost", "", ""
	}
	if f := fi.explain(prev.Proc, min(h.send.T, prev.T), max(prev.T, cur.T)); f != "" {
		return f, "", ""
	}
	if time.Duration(cur.T-h.send.T) < lease {
		return "unexplained", "within_lease", "with no lease expiry or fault"
	}
	if end == nil || end.Result != ResultOK {
		return "lease_expired", "", ""
	}
	ack := h.of(h.acks, prev)
	switch {
	case ack == nil && fi.killedAfter(prev.Proc, prev.T):
		return "process_fault", "", "" // killed before it recorded the acknowledgement
	case ack == nil && time.Duration(end.T-h.send.T) >= lease-ackCheckSlack:
		return "lease_expired", "", "" // its lease may have been lost by the end: not acknowledged
	case ack == nil:
		return "unexplained", "never_acked", fmt.Sprintf("with no fault: it ended %v after the send and was never acknowledged", time.Duration(end.T-h.send.T).Round(time.Millisecond))
	case ack.Result != ResultOK:
		return "ack_failed", "", ""
	case time.Duration(ack.T-h.send.T) < lease:
		return "unexplained", "acked_within_lease", fmt.Sprintf("with no fault: its acknowledgement returned %v after the send, within the lease", time.Duration(ack.T-h.send.T).Round(time.Millisecond))
	}
	return "lease_expired", "", "" // the acknowledgement landed after the lease may have run out
}

// ackCheckSlack is how long after its handler's end record a consumer may
// look at whether the delivery's lease was lost, and so skip its
// acknowledgement: a loaded machine may deschedule it in between.
const ackCheckSlack = workerLease / 2

// of returns the event of es (ends or acks) of delivery s: its process's,
// of its attempt.
func (h *opHistory) of(es []Event, s Event) *Event {
	var found *Event
	for j := range es {
		if e := &es[j]; e.Proc == s.Proc && e.Attempt == s.Attempt {
			found = e
		}
	}
	return found
}

func endResult(e *Event) string {
	if e == nil {
		return "no end recorded"
	}
	return "ended " + e.Result
}

// recovery measures, for each fault, how long after its end the system
// served again: a send begun after it acknowledged, and a handler started
// after it completed.
func recovery(r *Report, events []Event, fi faultIndex) {
	type span struct{ begin, end int64 }
	var sends, handles []span
	sendAt := map[string]int64{}
	startAt := map[string]int64{}
	for _, e := range events {
		switch e.Kind {
		case KindSend:
			sendAt[e.Op] = e.T
		case KindSent:
			if b, ok := sendAt[e.Op]; ok {
				sends = append(sends, span{b, e.T})
			}
		case KindStart:
			startAt[e.Proc+"/"+e.Op] = e.T
		case KindEnd:
			if b, ok := startAt[e.Proc+"/"+e.Op]; ok && e.Result == ResultOK {
				handles = append(handles, span{b, e.T})
			}
		}
	}
	firstAfter := func(spans []span, t int64) (int64, bool) {
		best, ok := int64(0), false
		for _, s := range spans {
			if s.begin >= t && (!ok || s.end < best) {
				best, ok = s.end, true
			}
		}
		return best, ok
	}
	byKind := map[string][]time.Duration{}
	for _, f := range fi.faults {
		s, ok1 := firstAfter(sends, f.End)
		h, ok2 := firstAfter(handles, f.End)
		if ok1 && ok2 {
			byKind[f.Fault] = append(byKind[f.Fault], time.Duration(max(s, h)-f.End))
		}
	}
	for k, ds := range byKind {
		slices.Sort(ds)
		r.Recovery[k] = [2]time.Duration{percentile(ds, 50), percentile(ds, 99)}
	}
}

// percentile returns the nearest-rank p-th percentile of sorted ds.
func percentile(ds []time.Duration, p int) time.Duration {
	i := (len(ds)*p + 99) / 100
	return ds[max(i-1, 0)]
}
