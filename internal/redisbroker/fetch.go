package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
	"github.com/redis/rueidis"
)

// streamKeys are the keys a fetch of one stream touches, and the name of
// the operation for errors.
type streamKeys struct {
	op       string
	receiver string // of a queue; "" for a reply stream
	stream   string // the queue or reply stream
	dlq      string // its dead-letter stream
	retries  string // its retries zset
	holders  string // its holders hash
	// high and low are the streams of the high and low priority levels
	// (for a reply stream, keys of its slot that are never written).
	high, low string
	// record: the fetch records the consumer's lease in holders (queues;
	// a reply stream's readers all read with one lease).
	record bool
	// deferred, deferredMsgs: the deferred zset and hash whose due messages
	// the fetch script queues (queues only: promote); legacy: the former
	// names of the deferred zset and hash and of the retries zset, whose
	// leftovers it moves (migrate.go).
	deferred, deferredMsgs string
	legacy                 [3]string
	promote                bool
	// groups are the keys of the groups hash and zsets P:{R}:g, gw and gt
	// (groups.go); of a reply stream, keys of its slot never written.
	groups [3]string
	// results are the keys of the results' index and sizes P:{R}:res and
	// resn, and resultPrefix the records' prefix P:{R}:res: (results.go),
	// for the fetch script's dead letters (queues only: "" for a reply
	// stream, which has no records).
	results      [2]string
	resultPrefix string
	// streams is stream alone, the streams of a blocking read of it (set
	// by newStreamState).
	streams [1]string
}

// makeQueueKeys returns the streamKeys of receiver's queue.
func (b *Broker) makeQueueKeys(receiver string) streamKeys {
	return streamKeys{op: "fetch", receiver: receiver, stream: b.keys.queue(receiver), dlq: b.keys.deadLetters(receiver), retries: b.keys.retries(receiver), holders: b.keys.holders(receiver),
		high: b.keys.queueAt(receiver, broker.PriorityHigh), low: b.keys.queueAt(receiver, broker.PriorityLow), record: true,
		deferred: b.keys.deferred(receiver), deferredMsgs: b.keys.deferredMessages(receiver), promote: true,
		legacy:  [3]string{b.keys.legacyDeferred(receiver), b.keys.legacyDeferredMessages(receiver), b.keys.legacyRetries(receiver)},
		groups:  [3]string{b.keys.groups(receiver), b.keys.groupWaits(receiver), b.keys.groupTimes(receiver)},
		results: [2]string{b.keys.resultIndex(receiver), b.keys.resultSizes(receiver)}, resultPrefix: b.keys.result(receiver, "")}
}

// fetch returns up to p.Max entries of st's stream for p.Consumer, as
// planFetch decides: at most every reclaimEvery per stream (and at once
// after this broker's Retry, or when the group is missing) it runs the
// fetch script, which reclaims expired leases and due retries,
// dead-letters entries past maxAttempts and reads new entries; of a quiet
// stream (see idleReclaimMax), at once when the reclaim epoch changed (a
// worker left the registry, or a message was sent at another priority
// level: see Heartbeat), and by time, at most once per lease or
// idleReclaimMax, only where the epoch does not cover it
// (quietUntilForced).
// Otherwise it reads new entries with one pipelined XREADGROUP without
// BLOCK, or, when block > 0, the stream was drained at the last fetch and
// one of the broker's direct reads is free, with one blocking XREADGROUP
// on a connection of its own (fetchDirect). When that (or the script)
// found nothing and block > 0, it waits for new entries in the hub of
// p.Consumer, which multiplexes the blocking reads of all of the
// consumer's streams on one dedicated connection (blockingRead, hub.go).
//
// Priorities: the script also answers whether the high or low level
// streams of a queue hold entries (two XLENs), which st keeps. While they
// do, every fetch runs the script, which serves the levels highest first
// (reclaiming only when due), and a blocking read reads every level stream
// that holds entries, keeping the highest p.Max entries and giving any
// others back at once (blockingRead). While they do not, which is the
// case of a receiver that never uses priorities, a fetch is exactly what
// it was without them.
func (b *Broker) fetch(ctx context.Context, st *streamState, p *broker.FetchParams) ([]entry, error) {
	entries, err := b.fetchEntries(ctx, st, p)
	if len(entries) > 0 {
		st.markBusy(b.reclaimEvery)
	}
	return entries, err
}

// fetchEntries is fetch, but for the stream's quiet state: it carries out
// the fetch's plan (planFetch).
func (b *Broker) fetchEntries(ctx context.Context, st *streamState, p *broker.FetchParams) ([]entry, error) {
	s := &st.keys
	if p.Wait != nil {
		if entries, err, done := b.takeUp(ctx, st, p); done {
			return entries, err
		}
	}
	start := time.Now() // before it looks: see waiter.start
	plan := st.plan(p.Consumer, b.inputs(st, start, p.Block, p.Lease))
	script, reclaim, levels := plan.script, plan.reclaim, plan.levels
	var entries []entry
	if plan.direct && p.Wake == nil {
		// A fetch with Wake waits in the hub, without a goroutine: the
		// direct reads stay free for busy streams.
		entries, done, err := b.fetchDirect(ctx, s, p, plan.directBlock, start)
		if done && err == nil {
			st.readDirect(len(entries))
		}
		switch {
		case errors.Is(err, errNoGroup):
			script, reclaim = true, true // the script creates the group
		case done || err != nil:
			return entries, err
		}
	}
	if plan.read && !script {
		read, err := asXReadOf(b.client.Do(ctx, b.client.B().Xreadgroup().Group("g", p.Consumer).Count(int64(p.Max)).
			Streams().Key(s.stream).Id(">").Build()), s.stream)
		switch {
		case isNoGroup(err):
			script, reclaim = true, true // the script creates the group
		case rueidis.IsRedisNil(err):
		case err != nil:
			return nil, b.fail(ctx, s.op, err)
		}
		entries = appendRead(entries, read, "")
	}
	if script {
		var dead int64
		var err error
		entries, dead, levels, err = b.reclaim(ctx, st, p, reclaim)
		if err != nil || dead > 0 {
			return entries, err
		}
	}
	if len(entries) > 0 || !plan.wait {
		return entries, nil
	}
	st.foundNothing()
	if err := ctx.Err(); err != nil {
		return nil, b.fail(ctx, s.op, err)
	}
	w := planWait(st.nextDue.Load(), time.Now(), p.Block)
	if w.sleep > 0 {
		// The first message sent for later is due sooner than Redis's
		// timeout of a blocking read is precise: wait here, and the next
		// fetch runs the script.
		if p.Wake != nil {
			p.Wait = sleepWait{time.AfterFunc(w.sleep, p.Wake)}
			return nil, nil
		}
		t := time.NewTimer(w.sleep)
		defer t.Stop()
		select {
		case <-t.C:
			return entries, nil
		case <-ctx.Done():
			return nil, b.fail(ctx, s.op, ctx.Err())
		case <-b.closing.Done():
			return nil, broker.ErrClosed
		}
	}
	return b.blockingRead(ctx, st, p, levels, w.block, start)
}

// fetchDirect is the read of a fetch that needs no script, of a drained
// stream, when one of the broker's direct reads is free (directRead): a
// blocking read of up to block answers at once when entries wait, so the
// fetch makes one read instead of a read without BLOCK and then a blocking
// one, which saves a lone requester a round trip. done is false when it
// did not read: no direct read was free, the hub holds the stream, or the
// group is missing (err is errNoGroup).
func (b *Broker) fetchDirect(ctx context.Context, s *streamKeys, p *broker.FetchParams, block time.Duration, start time.Time) (entries []entry, done bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, true, b.fail(ctx, s.op, err)
	}
	w := &waiter{home: s.stream, count: p.Max, deadline: time.Now().Add(block), start: start}
	read, ok, err := b.directRead(ctx, p.Consumer, w)
	switch {
	case !ok:
		return nil, false, nil
	case errors.Is(err, errNoGroup):
		return nil, false, err
	case err != nil:
		return nil, true, b.fail(ctx, s.op, err)
	}
	return appendRead(nil, read, ""), true, nil
}

// blockingRead is the blocking read of a fetch that found nothing: it
// reads st's stream (and, when levels says the high or low level streams
// hold entries, those too) for p.Consumer through the consumer's hub
// (hub.go), waiting up to block; start is when the fetch began to look
// for entries. With levels it keeps the p.Max highest
// entries and gives the others back at once, as if never delivered
// (XCLAIM IDLE lease RETRYCOUNT 0: the next reclaim takes them, as
// attempt 1). With p.Wake, it reads through the hub (no direct read) and
// does not wait: the read is left in the hub as p.Wait (parkRead), and the
// fetch returns nothing.
func (b *Broker) blockingRead(ctx context.Context, st *streamState, p *broker.FetchParams, levels int, block time.Duration, start time.Time) ([]entry, error) {
	r := b.newRead(st, p, levels, block, start)
	var home []xentry // a direct read's, of s.stream alone (levels is 0)
	var a hubAnswer
	direct := false
	if levels == 0 && p.Wake == nil {
		home, direct, a.err = b.directRead(ctx, p.Consumer, r.w)
	}
	if !direct {
		if p.Wake != nil {
			return b.parkRead(ctx, st, p, r)
		}
		a.read, a.err = b.hubRead(ctx, p.Consumer, r.w)
	}
	return b.readResult(ctx, st, p, r, home, a)
}

// blocking is a blocking read of a fetch: its waiter, and the prefix of
// the refs of each of its streams.
type blocking struct {
	w        *waiter
	prefixes []string
}

// newRead returns the blocking read of blockingRead.
func (b *Broker) newRead(st *streamState, p *broker.FetchParams, levels int, block time.Duration, start time.Time) blocking {
	s := &st.keys
	w := &waiter{home: s.stream, lease: p.Lease, count: p.Max, deadline: time.Now().Add(block), start: start,
		noLinger: b.recoveryDue(s.stream, p.Consumer)}
	prefixes := noPrefix
	w.streams = s.streams[:]
	if levels != 0 {
		w.streams = nil
		prefixes = nil
		if levels&1 != 0 {
			w.streams, prefixes = append(w.streams, s.high), append(prefixes, "h")
		}
		w.streams, prefixes = append(w.streams, s.stream), append(prefixes, "")
		if levels&2 != 0 {
			w.streams, prefixes = append(w.streams, s.low), append(prefixes, "l")
		}
	}
	return blocking{w: w, prefixes: prefixes}
}

// noPrefix is the prefixes of a read of a queue's stream alone.
var noPrefix = []string{""}

// readResult returns the entries of r's answer: home, read by a direct
// read, or a, the hub's (see blockingRead).
func (b *Broker) readResult(ctx context.Context, st *streamState, p *broker.FetchParams, r blocking, home []xentry, a hubAnswer) ([]entry, error) {
	s := &st.keys
	switch {
	case errors.Is(a.err, errNoGroup):
		// The group is missing: Redis lost its data (a restart without
		// persistence) or the stream was deleted. The fetch script creates
		// it again and reads what is there, such as messages sent since.
		entries, _, _, err := b.reclaim(ctx, st, p, true)
		return entries, err
	case a.err != nil:
		return nil, b.fail(ctx, s.op, a.err)
	}
	entries := appendRead(nil, home, "")
	for i, stream := range r.w.streams {
		entries = appendRead(entries, a.read[stream], r.prefixes[i])
	}
	if len(entries) == 0 {
		st.waitedInVain()
	}
	if len(entries) <= p.Max {
		return entries, nil
	}
	for _, e := range entries[p.Max:] {
		stream, id, _ := b.splitRef(s, e.id)
		if err := b.giveBack(ctx, stream, p.Consumer, p.Lease, []string{id}, false); err != nil {
			// It stays with p.Consumer until its lease ends.
			st.forceReclaim()
			return entries[:p.Max], b.fail(ctx, s.op, err)
		}
	}
	st.forceReclaim()
	return entries[:p.Max], nil
}

// splitRef returns the stream of s, the entry id and the priority level
// of a delivery's ref: the entry id, prefixed "h" or "l" at the high and
// low levels.
func (b *Broker) splitRef(s *streamKeys, ref string) (stream, id string, prio int) {
	if ref != "" {
		switch ref[0] {
		case 'h':
			return s.high, ref[1:], broker.PriorityHigh
		case 'l':
			return s.low, ref[1:], broker.PriorityLow
		}
	}
	return s.stream, ref, broker.PriorityNormal
}

// refLevel returns the priority level of ref (a delivery's, marked or
// not: see groupRefMark) and its entry id.
func refLevel(ref string) (prio int, id string) {
	ref, _ = unmarkRef(ref)
	if ref != "" {
		switch ref[0] {
		case 'h':
			return broker.PriorityHigh, ref[1:]
		case 'l':
			return broker.PriorityLow, ref[1:]
		}
	}
	return broker.PriorityNormal, ref
}

// blockingCtx returns the context of a blocking read under ctx, and what
// releases it. rueidis cannot cancel a command whose context has a
// deadline (it only sets the connection's deadline), so the read gets a
// context without one, cancelled when ctx ends or the broker closes; the
// connection of a read cancelled that way is closed. A ctx without a
// deadline, such as a fetching loop's, is the read's parent as it is.
func (b *Broker) blockingCtx(ctx context.Context) (context.Context, blockingRelease) {
	parent := ctx
	if _, ok := ctx.Deadline(); ok {
		parent = context.WithoutCancel(ctx)
	}
	bctx, cancel := context.WithCancel(parent)
	r := blockingRelease{reads: &b.blocking, cancel: cancel, id: b.blocking.add(cancel)}
	if parent != ctx {
		r.stopCtx = context.AfterFunc(ctx, cancel)
	}
	return bctx, r
}

// blockingRelease releases the context of a blocking read (blockingCtx).
type blockingRelease struct {
	reads   *blockingReads
	cancel  context.CancelFunc
	id      uint64      // in reads
	stopCtx func() bool // nil when ctx is the parent
}

func (r blockingRelease) release() {
	r.reads.remove(r.id)
	if r.stopCtx != nil {
		r.stopCtx()
	}
	r.cancel()
}

// blockingReads are the cancels of the blocking reads in progress, by an id
// of their own, which close calls: a broker's reads so end at its Close
// with no registration on a context of their own (context.AfterFunc costs
// each read two allocations).
type blockingReads struct {
	mu      sync.Mutex
	closed  bool
	last    uint64
	cancels map[uint64]context.CancelFunc
}

// add registers cancel and returns its id; after close it calls cancel at
// once.
func (r *blockingReads) add(cancel context.CancelFunc) uint64 {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return 0
	}
	if r.cancels == nil {
		r.cancels = make(map[uint64]context.CancelFunc)
	}
	r.last++
	id := r.last
	r.cancels[id] = cancel
	r.mu.Unlock()
	return id
}

// remove forgets the cancel of id.
func (r *blockingReads) remove(id uint64) {
	r.mu.Lock()
	delete(r.cancels, id)
	r.mu.Unlock()
}

// close calls the cancels registered, and those added after at once.
func (r *blockingReads) close() {
	r.mu.Lock()
	r.closed = true
	cancels := r.cancels
	r.cancels = nil
	r.mu.Unlock()
	for _, cancel := range cancels {
		cancel()
	}
}

// reclaim runs the fetch script; with due, it reclaims before it reads,
// and, of a queue, first hands its batch outbox over (sweepBatchReports).
// It returns the script's answer of which level streams hold entries, and
// records in st that answer, whether the stream is quiet (setQuiet) and
// the due time of the first message sent for later.
func (b *Broker) reclaim(ctx context.Context, st *streamState, p *broker.FetchParams, due bool) ([]entry, int64, int, error) {
	s := &st.keys
	if due && s.record {
		b.sweepBatchReports(ctx, st)
	}
	op, stream := s.op, s.stream
	prune := "0"
	if due && st.dueForPrune(time.Now(), b.pruneEvery) {
		prune = msString(b.pruneIdle)
	}
	keys := []string{stream, s.dlq, s.retries, s.holders, s.high, s.low, s.retries, s.retries, s.retries, s.retries, s.retries,
		s.groups[0], s.groups[1], s.groups[2], s.retries, s.retries}
	if s.promote {
		keys[6], keys[7] = s.deferred, s.deferredMsgs
		keys[8], keys[9], keys[10] = s.legacy[0], s.legacy[1], s.legacy[2]
	}
	if s.resultPrefix != "" {
		keys[14], keys[15] = s.results[0], s.results[1]
	}
	start := time.Now()
	args := []string{p.Consumer, strconv.Itoa(p.Max), msString(p.Lease), strconv.Itoa(max0(p.MaxAttempts)), prune, boolArg(s.record), boolArg(due), boolArg(s.promote),
		s.resultPrefix, b.maxResults}
	if due && s.record {
		args = append(args, b.departedWorkers()...)
	}
	res, err := scriptFetch.Exec(ctx, b.client, keys, args).ToArray()
	if err != nil {
		st.forceReclaim()
		return nil, 0, 0, b.fail(ctx, op, err)
	}
	if len(res) < 4 {
		return nil, 0, 0, fmt.Errorf("redisbroker: %s: the fetch script answered nothing", op)
	}
	busy, _ := res[3].AsInt64()
	st.setQuiet(busy == 0, start, p.Lease, b.reclaimEvery)
	levels, _ := res[1].AsInt64()
	if levels&4 != 0 {
		// A key queued a message at a level whose stream held nothing.
		b.levelsChanged(ctx, s.receiver)
	}
	if levels&8 != 0 {
		// A batch child was dead-lettered: its report is in the outbox
		// already; handing it over now is only sooner (see
		// SettleBatchReports).
		_ = b.SettleBatchReports(ctx, s.receiver)
	}
	levels &^= 4 | 8
	if s.record {
		st.setLevels(int(levels))
	}
	if s.promote {
		next, _ := res[2].AsInt64()
		st.setNextDue(b.localDue(next))
	}
	entries := make([]entry, 0, len(res)-4)
	for _, r := range res[4:] {
		e, err := scriptEntry(r)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("redisbroker: %s: %w", op, err)
		}
		entries = append(entries, e)
	}
	dead, _ := res[0].AsInt64()
	return entries, dead, int(levels), nil
}

func max0(n int) int { return max(n, 0) }

// localDue converts a due time that the fetch script answered (unix ms,
// Redis time; -1 for none) to local unix ns (noneDue for none).
func (b *Broker) localDue(ms int64) int64 {
	if ms < 0 {
		return noneDue
	}
	return b.offset.Local(time.UnixMilli(ms)).UnixNano()
}

// Fetch leases up to p.Max messages of p.Receiver to p.Consumer. See
// broker.Broker. maxAttempts 0 means no limit. A message retried with a
// delay, or whose lease expired, is reclaimed by a Fetch at most
// reclaimEvery (100ms) after that moment, or right after a Retry through
// this broker; a Fetch blocked in Redis notices it when its block time
// ends. From a stream that was quiet for this broker (see idleReclaimMax),
// an entry another broker's consumer took since is reclaimed at the first
// Fetch after the heartbeat that saw its holder leave the registry, and,
// where that does not cover it (quietUntilForced), up to the quiet period
// after its lease expired.
func (b *Broker) Fetch(ctx context.Context, p *broker.FetchParams) ([]broker.Delivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	st := b.queueState(p.Receiver)
	s := &st.keys
	entries, err := b.fetch(ctx, st, p)
	if err != nil {
		return nil, err
	}
	if givenBackWake(entries) {
		if entries, err = b.afterGiveBack(ctx, st, p, entries); err != nil {
			return nil, err
		}
	}
	out := make([]broker.Delivery, 0, len(entries))
	var wakes []string
	for _, e := range entries {
		if e.only("w") {
			wakes = append(wakes, e.id)
			continue
		}
		d, err := delivery(&e)
		d.Env.Priority, _ = refLevel(e.id)
		if err != nil {
			if err := b.bury(ctx, s, e.id, "undecodable message: "+err.Error(), e.attempt, true); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, d)
	}
	if len(wakes) > 0 {
		// A message was deferred to before the first one known: the next
		// fetch runs the script, which queues what is due and reads the
		// new due time.
		st.forceSchedule()
		err := scriptDropWakes.Exec(ctx, b.client, []string{s.stream, s.holders}, wakes).Error()
		if err != nil {
			return nil, b.fail(ctx, "fetch", err)
		}
	}
	return out, nil
}

// delivery decodes queue entry e: its message (field m), its deadline
// (field d, unix ms, if any), its expiry (field x, likewise) and its group
// key (field g, if any: then its ref is marked, groupRefMark). An entry
// whose deadline or expiry does not parse is as undecodable as one whose
// message does not.
func delivery(e *entry) (broker.Delivery, error) {
	m, ok := e.field("m")
	if !ok {
		return broker.Delivery{}, errors.New("the entry has no m field")
	}
	env, err := wire.DecodeString(m)
	if err != nil {
		return broker.Delivery{}, err
	}
	d := broker.Delivery{Env: env, Ref: e.id, Attempt: e.attempt}
	if s, ok := e.field("d"); ok {
		if d.Deadline, ok = unixMS(s); !ok {
			return broker.Delivery{}, fmt.Errorf("its deadline (field d) %q is not unix milliseconds", s)
		}
	}
	if s, ok := e.field("x"); ok {
		if d.Expiry, ok = unixMS(s); !ok {
			return broker.Delivery{}, fmt.Errorf("its expiry (field x) %q is not unix milliseconds", s)
		}
	}
	if g, ok := e.field("g"); ok {
		// A keyed message: its settle settles its key (see groups.go).
		d.GroupKey, d.Ref = g, string(groupRefMark)+e.id
	}
	return d, nil
}

// givenBackWake reports whether entries hold a give-back wake entry
// (scriptGiveBack).
func givenBackWake(entries []entry) bool {
	for i := range entries {
		if e := &entries[i]; e.only("w") {
			if v, _ := e.field("w"); v == "r" {
				return true
			}
		}
	}
	return false
}

// afterGiveBack is the rest of a Fetch whose entries hold a give-back wake
// entry: entries of the normal level were given back before the wake
// entry was queued (scriptGiveBack), and wait in the pending list for a
// reclaim, while this fetch may have read newer ones. It drops the give-
// back wake entries, gives back the entries of the normal level it read as
// first deliveries (attempt 1: none was delivered before, or it was given
// back), and runs the fetch script with its reclaim for as many entries,
// which serves the given-back ones in the order they were queued, before
// the newer ones. The other entries are kept as they were fetched.
func (b *Broker) afterGiveBack(ctx context.Context, st *streamState, p *broker.FetchParams, entries []entry) ([]entry, error) {
	s := &st.keys
	var wakes, ids []string
	kept := entries[:0:0]
	for _, e := range entries {
		if e.only("w") {
			if v, _ := e.field("w"); v == "r" {
				wakes = append(wakes, e.id)
				continue
			}
		}
		if prio, _ := refLevel(e.id); prio == broker.PriorityNormal && e.attempt == 1 && !e.only("w") {
			_, id := refLevel(e.id)
			ids = append(ids, id)
			continue
		}
		kept = append(kept, e)
	}
	if err := scriptDropWakes.Exec(ctx, b.client, []string{s.stream, s.holders}, wakes).Error(); err != nil {
		return nil, b.fail(ctx, "fetch", err)
	}
	if len(ids) > 0 {
		err := b.client.Do(ctx, b.client.B().Xclaim().Key(s.stream).Group("g").Consumer(p.Consumer).MinIdleTime("0").
			Id(ids...).Idle(p.Lease.Milliseconds()).Retrycount(0).Justid().Build()).Error()
		if err != nil {
			st.forceReclaim()
			return nil, b.fail(ctx, "fetch", err)
		}
	}
	room := p.Max - len(kept)
	if room <= 0 {
		st.forceReclaim()
		return kept, nil
	}
	q := *p
	q.Max = room
	more, _, _, err := b.reclaim(ctx, st, &q, true)
	if err != nil {
		return kept, err
	}
	return append(kept, more...), nil
}
