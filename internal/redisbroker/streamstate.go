package redisbroker

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// streamState is what a broker keeps of one stream it fetches (a queue, or
// a reply stream): its keys, made once, and what its past fetches learnt,
// from which planFetch decides how the next one reads. Its fields change
// with atomics as the steps of a fetch end, through the methods below.
//
// Forgetting it is safe: a stream whose state was dropped (the table
// keeps at most streamsKept) gets a new one, as a stream seen for the
// first time: its reclaim is due and its consumer's lease unknown, so its
// next fetch runs the fetch script, which reclaims, records the lease and
// answers the rest (levels, next due time, quiet) again.
type streamState struct {
	keys streamKeys
	name streamName
	// used: a fetch looked the state up since the table's clock hand last
	// passed it (see streamTable).
	used atomic.Bool

	// reclaimAt is when the next reclaim is due, local unix ns (0: at the
	// next fetch).
	reclaimAt atomic.Int64
	// quiet: at the last run of the script the stream was not busy (see
	// its answer), and this broker has fetched nothing of it since.
	quiet atomic.Bool
	// idle: the last blocking read of the stream through this broker
	// ended with nothing, and this broker has fetched nothing of it since.
	idle atomic.Bool
	// drained: the stream was found drained at its last fetch through this
	// broker: the read without BLOCK found nothing, or the last direct read
	// (fetchDirect) returned at most one entry. While it is set, a fetch
	// that needs no script reads with fetchDirect; a stream with a backlog
	// is read without BLOCK on the pipelined connections, which carry many
	// reads at the cost of one.
	drained atomic.Bool
	// levels is the fetch script's last answer of which priority level
	// streams hold entries (queues only): 1 the high level, +2 the low.
	levels atomic.Int64
	// nextDue is the due time of the first message sent for later to the
	// stream's receiver, as the fetch script last answered it, in local
	// unix ns (noneDue: none known, as for a reply stream; 0: due now, see
	// forceSchedule).
	nextDue atomic.Int64
	// pruned is when this broker last checked the stream for idle
	// consumers to delete (nil: never).
	pruned atomic.Pointer[time.Time]

	// leases holds the lease of each consumer's last fetch, at most
	// leasesKept, in the order they were recorded; it is copied on write,
	// under mu, so that a fetch with the lease of the last reads it
	// without a lock and writes nothing.
	leases atomic.Pointer[[]consumerLease]
	mu     sync.Mutex
}

// noneDue is streamState.nextDue when no message for later is known.
const noneDue = math.MaxInt64

// consumerLease is the lease of a consumer's last fetch of a stream.
type consumerLease struct {
	consumer string
	lease    time.Duration
}

// leasesKept bounds the consumers whose lease a streamState keeps (a
// broker fetches a stream as one consumer, its instance, as a rule). A
// consumer past the bound drops the one whose lease was recorded first,
// whose next fetch then finds its lease unknown and runs the fetch script,
// which records it.
const leasesKept = 8

func newStreamState(name streamName, keys streamKeys) *streamState {
	st := &streamState{keys: keys, name: name}
	k := &st.keys
	packStrings(&k.stream, &k.dlq, &k.retries, &k.holders, &k.high, &k.low, &k.deferred, &k.deferredMsgs,
		&k.legacy[0], &k.legacy[1], &k.legacy[2], &k.groups[0], &k.groups[1], &k.groups[2])
	k.streams[0] = k.stream
	st.nextDue.Store(noneDue)
	st.used.Store(true)
	return st
}

// packStrings makes the strings of ss substrings of one: a stream's
// state keeps a dozen keys for as long as it is kept, in one allocation
// instead of one each.
func packStrings(ss ...*string) {
	n := 0
	for _, s := range ss {
		n += len(*s)
	}
	var all strings.Builder
	all.Grow(n)
	for _, s := range ss {
		all.WriteString(*s)
	}
	packed, at := all.String(), 0
	for _, s := range ss {
		*s = packed[at : at+len(*s)]
		at += len(*s)
	}
}

// snapshot returns the state that planFetch reads, but for leaseChanged,
// which recordLease answers.
func (st *streamState) snapshot() streamSnapshot {
	return streamSnapshot{
		reclaimAt: st.reclaimAt.Load(),
		quiet:     st.quiet.Load(),
		idle:      st.idle.Load(),
		drained:   st.drained.Load(),
		levels:    int(st.levels.Load()),
		nextDue:   st.nextDue.Load(),
	}
}

// plan returns the plan of a fetch of the stream by consumer with in (see
// planFetch). It records the consumer's lease, even when the reclaim is
// due, and takes the reclaim that is due, if the plan does, so that
// concurrent fetches of the stream run one: a fetch that another beat to
// it plans again without it.
func (st *streamState) plan(consumer string, in fetchInputs) fetchPlan {
	snap := st.snapshot()
	snap.leaseChanged = st.recordLease(consumer, in.lease)
	p := planFetch(snap, in)
	if p.claim != 0 && !st.reclaimAt.CompareAndSwap(snap.reclaimAt, p.claim) {
		snap.reclaimAt = reclaimTaken
		p = planFetch(snap, in)
	}
	return p
}

// recordLease records that consumer fetches the stream with lease, and
// reports whether that is another lease than at its last fetch through this
// broker (or the first one known), which the fetch script then records (the
// holders hash). A fetch with the lease of the last takes no lock and
// stores nothing.
func (st *streamState) recordLease(consumer string, lease time.Duration) bool {
	if known(st.leases.Load(), consumer, lease) {
		return false
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	old := st.leases.Load()
	if known(old, consumer, lease) {
		return false
	}
	var next []consumerLease
	if old != nil {
		next = make([]consumerLease, 0, len(*old)+1)
		for _, l := range *old {
			if l.consumer != consumer {
				next = append(next, l)
			}
		}
	}
	if len(next) == leasesKept {
		next = next[1:]
	}
	next = append(next, consumerLease{consumer, lease})
	st.leases.Store(&next)
	return true
}

// known reports whether leases holds consumer's lease as lease.
func known(leases *[]consumerLease, consumer string, lease time.Duration) bool {
	if leases == nil {
		return false
	}
	for _, l := range *leases {
		if l.consumer == consumer {
			return l.lease == lease
		}
	}
	return false
}

// setQuiet records the answer of the fetch script that began at start:
// whether the stream is quiet. A quiet stream's next reclaim moves to
// idleReclaim(lease, every) after start, unless one was forced meanwhile; a
// busy one's comes back to every after start.
func (st *streamState) setQuiet(quiet bool, start time.Time, lease, every time.Duration) {
	st.quiet.Store(quiet)
	if quiet {
		at := start.Add(idleReclaim(lease, every)).UnixNano()
		for {
			cur := st.reclaimAt.Load()
			if cur == 0 || cur >= at || st.reclaimAt.CompareAndSwap(cur, at) {
				return
			}
		}
	}
	st.reclaimWithin(start.Add(every).UnixNano())
}

// markBusy records that this broker fetched entries of the stream: it is
// neither idle nor quiet any more, and its next reclaim is due within every.
func (st *streamState) markBusy(every time.Duration) {
	if st.idle.Load() {
		st.idle.Store(false)
	}
	if st.quiet.Load() && st.quiet.Swap(false) {
		st.reclaimWithin(time.Now().Add(every).UnixNano())
	}
}

// readDirect records that a direct read (fetchDirect) returned n
// entries: the stream stays drained while it returns at most one; a
// fuller batch sends it back to the reads without BLOCK.
func (st *streamState) readDirect(n int) { st.drained.Store(n < 2) }

// foundNothing records that a fetch found nothing before it waited: the
// stream is drained.
func (st *streamState) foundNothing() { st.drained.Store(true) }

// waitedInVain records that a blocking read of the stream ended with
// nothing: the stream is idle.
func (st *streamState) waitedInVain() { st.idle.Store(true) }

// reclaimWithin brings the next reclaim to at (local unix ns), unless it is
// due sooner.
func (st *streamState) reclaimWithin(at int64) {
	for {
		cur := st.reclaimAt.Load()
		if cur <= at || st.reclaimAt.CompareAndSwap(cur, at) {
			return
		}
	}
}

// forceReclaim makes the next fetch of the stream run the fetch script,
// reclaiming.
func (st *streamState) forceReclaim() { st.reclaimAt.Store(0) }

// setLevels records the fetch script's answer of which level streams hold
// entries.
func (st *streamState) setLevels(levels int) { st.levels.Store(int64(levels)) }

// setNextDue records the due time of the first message sent for later to
// the stream's receiver, local unix ns (noneDue: none).
func (st *streamState) setNextDue(at int64) { st.nextDue.Store(at) }

// forceSchedule makes the next fetch of the stream run the fetch script,
// which queues the due deferred messages and reads the next due time: a
// wake entry said that a message was deferred to before the one known.
func (st *streamState) forceSchedule() { st.nextDue.Store(0) }

// dueForPrune reports whether a reclaiming fetch at now should also delete
// the stream's idle consumers: the last check is every or more ago (or
// none was made). It counts the check as made.
func (st *streamState) dueForPrune(now time.Time, every time.Duration) bool {
	if last := st.pruned.Load(); last != nil && now.Sub(*last) < every {
		return false
	}
	st.pruned.Store(&now)
	return true
}

// idleReclaim is the period of the reclaim of a quiet stream fetched with
// lease by a broker that reclaims a busy one every every: the lease, between
// every and idleReclaimMax. An entry that another broker's consumer took
// since the last reclaim, and whose lease then expired, is reclaimed at most
// this much after it expired.
func idleReclaim(lease, every time.Duration) time.Duration {
	return min(max(lease, every), idleReclaimMax)
}

// streamName names a stream a broker fetches: a receiver's queue, or a
// sender's reply stream.
type streamName struct {
	reply bool
	name  string
}

// streamTable keeps the streamState of the streams a broker fetches, at
// most max of them. Lookups take no lock; adding a state past the bound
// drops one by the clock rule: the hand sweeps the states in the order they
// came, clearing the used mark of each it passes, and drops the first whose
// mark is already clear (not looked up since the hand last passed). A
// dropped stream's next fetch makes a new state, which runs the fetch
// script (see streamState); a fetch that holds the dropped state ends with
// it. The zero value is ready to use.
type streamTable struct {
	byName sync.Map // streamName -> *streamState
	byKey  sync.Map // stream key -> *streamState

	mu   sync.Mutex
	ring []*streamState // the states kept, in the clock's order
	hand int
	max  int // 0 means streamsKept
}

// streamsKept is how many streams a broker keeps the state of: more than
// the receivers and senders of the largest instances (ten thousand of
// each). A broker that fetches more streams than that keeps working, the
// fetch of a stream whose state was dropped running the fetch script.
const streamsKept = 1 << 16

// get returns the state of n, nil when it is not kept.
func (t *streamTable) get(n streamName) *streamState {
	v, ok := t.byName.Load(n)
	if !ok {
		return nil
	}
	st := v.(*streamState)
	if !st.used.Load() {
		st.used.Store(true)
	}
	return st
}

// byStream returns the state of the stream whose key is stream, nil when it
// is not kept.
func (t *streamTable) byStream(stream string) *streamState {
	if v, ok := t.byKey.Load(stream); ok {
		return v.(*streamState)
	}
	return nil
}

// add returns the state of n, made with keys when it is not kept, dropping
// one past the bound.
func (t *streamTable) add(n streamName, keys streamKeys) *streamState {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.byName.Load(n); ok {
		return v.(*streamState)
	}
	st := newStreamState(n, keys)
	limit := t.max
	if limit <= 0 {
		limit = streamsKept
	}
	if len(t.ring) < limit {
		t.ring = append(t.ring, st)
	} else {
		t.replace(st)
	}
	t.byName.Store(n, st)
	t.byKey.Store(keys.stream, st)
	return st
}

// replace puts st in the place of the state the clock drops (see
// streamTable). Fetches that keep marking states may keep the hand from
// finding a clear mark; after two turns it drops the state under it.
func (t *streamTable) replace(st *streamState) {
	for range 2 * len(t.ring) {
		if old := t.ring[t.hand]; old.used.Load() {
			old.used.Store(false)
			t.hand = (t.hand + 1) % len(t.ring)
			continue
		}
		break
	}
	old := t.ring[t.hand]
	t.byName.Delete(old.name)
	t.byKey.Delete(old.keys.stream)
	t.ring[t.hand] = st
	t.hand = (t.hand + 1) % len(t.ring)
}

// each calls f with every state kept.
func (t *streamTable) each(f func(*streamState)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, st := range t.ring {
		f(st)
	}
}

// queueState returns the state of receiver's queue.
func (b *Broker) queueState(receiver string) *streamState {
	n := streamName{name: receiver}
	if st := b.streams.get(n); st != nil {
		return st
	}
	return b.streams.add(n, b.makeQueueKeys(receiver))
}

// replyState returns the state of sender's reply stream.
func (b *Broker) replyState(sender string) *streamState {
	n := streamName{reply: true, name: sender}
	if st := b.streams.get(n); st != nil {
		return st
	}
	return b.streams.add(n, b.makeReplyKeys(sender))
}

// forceReclaim makes the next fetch of stream (a key) run the fetch script.
// A stream whose state is not kept runs it at its next fetch all the same.
func (b *Broker) forceReclaim(stream string) {
	if st := b.streams.byStream(stream); st != nil {
		st.forceReclaim()
	}
}

// forceReclaimAll makes the next fetch of every stream run the fetch
// script: a worker left the registry (see Heartbeat), whose deliveries
// may be in any of them.
func (b *Broker) forceReclaimAll() {
	b.streams.each((*streamState).forceReclaim)
}
