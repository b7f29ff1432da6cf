package redisbroker

import (
	"math"
	"time"
)

// streamSnapshot is what planFetch reads of a stream's state (see
// streamState, whose fields these are).
type streamSnapshot struct {
	// reclaimAt is when the next reclaim is due, local unix ns (0: now;
	// reclaimTaken: another fetch took the one due).
	reclaimAt int64
	quiet     bool
	idle      bool
	drained   bool
	// leaseChanged: the consumer fetches with another lease than at its
	// last fetch (or its first is not known).
	leaseChanged bool
	levels       int
	// nextDue is the due time of the first message sent for later, local
	// unix ns (noneDue: none known; 0: due now).
	nextDue int64
}

// reclaimTaken is streamSnapshot.reclaimAt when another fetch took the
// reclaim that was due.
const reclaimTaken = math.MaxInt64

// fetchInputs is what a fetch brings to its plan besides its stream's
// state.
type fetchInputs struct {
	now   time.Time     // when the fetch began
	block time.Duration // how long it may wait for entries; 0: it does not
	lease time.Duration
	// every is the period of the reclaim of a busy stream (the broker's
	// reclaimEvery).
	every time.Duration
	// watched, when > 0, is about how soon a dead holder of the stream's
	// entries leaves the registry of workers: the ttl of the broker's
	// heartbeat, for a queue, whose fetch script reclaims a departed
	// worker's entries at once; 0 for a reply stream, or a broker that
	// does not heartbeat (Broker.inputs).
	watched time.Duration
}

// inputs returns the inputs of a fetch of st that began at now.
func (b *Broker) inputs(st *streamState, now time.Time, block, lease time.Duration) fetchInputs {
	in := fetchInputs{now: now, block: block, lease: lease, every: b.reclaimEvery}
	if st.keys.record {
		in.watched = time.Duration(b.heartbeatTTL.Load())
	}
	return in
}

// fetchPlan is what a fetch does (fetchEntries carries it out). Its steps,
// in order:
//
//  1. With direct: a blocking read of its own for up to directBlock
//     (fetchDirect), when one of the broker's direct reads is free: it
//     ends the fetch if it read (entries or not).
//  2. With script: the fetch script, which reclaims first with reclaim;
//     else, with read, a read without BLOCK.
//  3. With wait, when nothing was found: wait for entries, for a time that
//     planWait decides then, from the due time that the script may just
//     have learnt, in the hub (or a direct read) reading the queue and the
//     level streams that levels names.
//
// A missing group (NOGROUP) in any read turns to the fetch script with
// reclaim, which creates the group: the caller handles it.
type fetchPlan struct {
	script, reclaim bool
	// claim, when not 0, is when the next reclaim is due (local unix ns),
	// if this fetch takes the one due now (streamState.plan).
	claim       int64
	direct      bool
	directBlock time.Duration
	read        bool
	wait        bool
	levels      int
}

// planFetch decides what a fetch does, from its stream's state s and its
// inputs in:
//
//   - The fetch script runs when the reclaim is due (at most every
//     in.every for a busy stream, idleReclaim for a quiet one; at once
//     after a forced reclaim, or when the consumer's lease changed; a
//     quiet stream that is watched, with a lease at least in.watched, only
//     then: see quietUntilForced), while
//     level streams hold entries (it serves the levels highest first, and
//     reclaims only when due), and when the first message sent for later
//     is due (it queues it). A reclaim due by time is claimed: the next one
//     is due a period later.
//   - Otherwise, of a drained stream, with a block time, the fetch first
//     tries a direct read (fetchDirect): a blocking read answers at once
//     when entries wait, which saves a lone requester a round trip; unless
//     a message for later is due sooner than a blocking read's timeout is
//     precise (planWait), which a read in Redis would overshoot.
//   - Then it reads without BLOCK, unless the stream is idle (drained, and
//     its last blocking read found nothing) and the fetch may block: the
//     blocking read answers at once if entries came since, and an idle
//     stream costs Redis no read but its share of the hub's.
//   - A fetch with a block time that found nothing waits (see fetchPlan).
func planFetch(s streamSnapshot, in fetchInputs) fetchPlan {
	p := fetchPlan{levels: s.levels, wait: in.block > 0}
	now := in.now.UnixNano()
	if now >= s.reclaimAt && !quietUntilForced(s, in) {
		every := in.every
		if s.quiet {
			every = idleReclaim(in.lease, in.every)
		}
		p.reclaim, p.claim = true, now+int64(every)
	}
	p.reclaim = p.reclaim || s.leaseChanged
	p.script = p.reclaim || s.levels != 0 || now >= s.nextDue
	if p.script {
		return p
	}
	if p.wait && s.drained {
		if w := planWait(s.nextDue, in.now, in.block); w.sleep == 0 {
			p.direct, p.directBlock = true, w.block
		}
	}
	p.read = !(p.wait && s.drained && s.idle)
	return p
}

// quietUntilForced reports whether a quiet stream's reclaim waits until
// it is forced (reclaimAt 0: the reclaim epoch moved, this broker retried
// an entry, a fetch failed), rather than for its time. Its entries are
// then held by nobody, or by workers that renew their leases: those of a
// worker that dies are reclaimed once it left the registry (in.watched,
// and a heartbeat or two), about when a lease no shorter than in.watched
// would have run out, or sooner. So an idle receiver runs no script of its
// own, however many an instance serves.
func quietUntilForced(s streamSnapshot, in fetchInputs) bool {
	return s.quiet && s.reclaimAt != 0 && in.watched > 0 && in.lease >= in.watched
}

// fetchWait is how a fetch that found nothing waits: a blocking read of
// block, or, when sleep > 0, a wait of sleep in the client, after which it
// answers empty (and the next fetch runs the script).
type fetchWait struct {
	block, sleep time.Duration
}

// planWait bounds block, the time a fetch blocks in Redis, by nextDue, the
// due time of the first message sent for later (local unix ns, noneDue for
// none), so that the fetch after it queues that message. Redis ends a
// blocking read's timeout only at its next cron tick (every 100ms at the
// default hz 10), so the read is made to end redisTimerSlack before the
// due time; when the due time is closer than that, the fetch does not
// block but waits in the client until it (at least minDueBlock, at most
// block).
func planWait(nextDue int64, now time.Time, block time.Duration) fetchWait {
	if nextDue == noneDue {
		return fetchWait{block: block}
	}
	wait := time.Duration(nextDue - now.UnixNano())
	if wait <= redisTimerSlack+minDueBlock {
		return fetchWait{block: block, sleep: min(max(wait, minDueBlock), block)}
	}
	return fetchWait{block: min(block, wait-redisTimerSlack)}
}

// minDueBlock is the least wait of a fetch whose message sent for later is
// due (by the local clock, which may be ahead of Redis's by a little).
const minDueBlock = 2 * time.Millisecond

// redisTimerSlack is how late Redis may end a blocking read past its
// timeout: one period of its cron at the default hz (10).
const redisTimerSlack = 100 * time.Millisecond
