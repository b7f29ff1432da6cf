package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
	"github.com/redis/rueidis"
)

// streamKeys are the keys a fetch of one stream touches, and the name of
// the operation for errors.
type streamKeys struct {
	op      string
	stream  string // the queue or reply stream
	dlq     string // its dead-letter stream
	delayed string // its delayed zset
	holders string // its holders hash
	// high and low are the streams of the high and low priority levels
	// (for a reply stream, keys of its slot that are never written).
	high, low string
	// record: the fetch records the consumer's lease in holders (queues;
	// a reply stream's readers all read with one lease).
	record bool
	// sched, schedMsgs: the scheduled zset and hash whose due messages the
	// fetch script queues (queues only: promote).
	sched, schedMsgs string
	promote          bool
}

// queueKeys returns the streamKeys of receiver's queue, made once per
// receiver. They are shared: read only.
func (b *Broker) queueKeys(receiver string) *streamKeys {
	return b.queueStreams.get(receiver, b.makeQueueKeys)
}

func (b *Broker) makeQueueKeys(receiver string) *streamKeys {
	return &streamKeys{op: "fetch", stream: b.keys.queue(receiver), dlq: b.keys.deadLetters(receiver), delayed: b.keys.retries(receiver), holders: b.keys.holders(receiver),
		high: b.keys.queueAt(receiver, broker.PriorityHigh), low: b.keys.queueAt(receiver, broker.PriorityLow), record: true,
		sched: b.keys.deferred(receiver), schedMsgs: b.keys.deferredMessages(receiver), promote: true}
}

// fetch returns up to p.Max entries of s.stream for p.Consumer. At most every
// reclaimEvery per stream (and at once after this broker's Retry, or when
// the group is missing) it runs the fetch script, which reclaims expired
// leases and due retries, dead-letters entries past maxAttempts and reads
// new entries; of a quiet stream (see idleReclaimMax), at most once per
// lease or idleReclaimMax, and at once when the reclaim epoch changed (a
// worker left the registry, or a message was sent at another priority
// level: see Heartbeat).
// Otherwise it reads new entries with one pipelined
// XREADGROUP without BLOCK, or, when block > 0, the stream was drained at
// the last fetch and one of the broker's direct reads is free, with one
// blocking XREADGROUP on a connection of its own (fetchDirect). When that (or the script) found nothing and
// block > 0, it waits for new entries in the hub of p.Consumer, which
// multiplexes the blocking reads of all of the consumer's streams on one
// dedicated connection (blockingRead, hub.go).
//
// Priorities: the script also answers whether the high or low level
// streams of a queue hold entries (two XLENs), which this broker remembers
// per queue. While they do, every fetch runs the script, which serves the
// levels highest first (reclaiming only when due), and a blocking read
// reads every level stream that holds entries, keeping the highest p.Max
// entries and giving any others back at once (blockingRead). While they do
// not, which is the case of a receiver that never uses priorities, a
// fetch is exactly what it was without them.
func (b *Broker) fetch(ctx context.Context, s *streamKeys, p *broker.FetchParams) ([]entry, error) {
	entries, err := b.fetchEntries(ctx, s, p)
	if len(entries) > 0 {
		b.markBusy(s.stream)
	}
	return entries, err
}

// fetchEntries is fetch, but for the stream's quiet state.
func (b *Broker) fetchEntries(ctx context.Context, s *streamKeys, p *broker.FetchParams) ([]entry, error) {
	op, stream, consumer, max, block := s.op, s.stream, p.Consumer, p.Max, p.Block
	start := time.Now() // before it looks: see waiter.start
	var entries []entry
	levels := 0
	if s.record {
		if v, ok := b.levels.Load(stream); ok {
			levels = v.(int)
		}
	}
	changed := b.leaseChanged(stream, consumer, p.Lease) // recorded even when due
	due := b.reclaimDue(stream, p.Lease) || changed
	script := due || levels != 0 || (s.promote && b.scheduleDue(stream))
	drained := b.drainedFlag(stream)
	if !script && block > 0 && drained.Load() {
		entries, done, err := b.fetchDirect(ctx, s, p, start)
		if done && err == nil {
			drained.Store(len(entries) < 2)
		}
		switch {
		case errors.Is(err, errNoGroup):
			script, due = true, true // the script creates the group
		case done || err != nil:
			return entries, err
		}
	}
	// A stream whose last blocking read timed out with nothing skips the
	// read without BLOCK: the blocking read below answers at once if
	// entries came since, and an idle stream costs Redis no read but its
	// share of the hub's.
	idle := block > 0 && drained.Load() && b.reclaimOf(stream).idle.Load()
	if !script && !idle {
		read, err := asXReadOf(b.client.Do(ctx, b.client.B().Xreadgroup().Group("g", consumer).Count(int64(max)).
			Streams().Key(stream).Id(">").Build()), stream)
		switch {
		case isNoGroup(err):
			script, due = true, true // the script creates the group
		case rueidis.IsRedisNil(err):
		case err != nil:
			return nil, b.fail(ctx, op, err)
		}
		entries = appendRead(entries, read, "")
	}
	if script {
		var dead int64
		var err error
		entries, dead, levels, err = b.reclaim(ctx, s, p, due)
		if err != nil || dead > 0 {
			return entries, err
		}
	}
	if len(entries) > 0 || block <= 0 {
		return entries, nil
	}
	drained.Store(true)
	if err := ctx.Err(); err != nil {
		return nil, b.fail(ctx, op, err)
	}
	if s.promote {
		var sleep time.Duration
		if block, sleep = b.blockUntilDue(stream, block); sleep > 0 {
			// The first scheduled message is due sooner than Redis's
			// timeout of a blocking read is precise: wait here, and the
			// next fetch runs the script.
			t := time.NewTimer(sleep)
			defer t.Stop()
			select {
			case <-t.C:
				return entries, nil
			case <-ctx.Done():
				return nil, b.fail(ctx, op, ctx.Err())
			case <-b.closing.Done():
				return nil, broker.ErrClosed
			}
		}
	}
	return b.blockingRead(ctx, s, p, levels, block, start)
}

// drainedFlag returns the flag that says whether stream was found drained
// at its last fetch through this broker: the read without BLOCK found
// nothing, or the last direct read (fetchDirect) returned at most one entry.
// While it is set, a fetch that needs no script reads with fetchDirect; a
// stream with a backlog is read without BLOCK on the pipelined connections,
// which carry many reads at the cost of one.
func (b *Broker) drainedFlag(stream string) *atomic.Bool {
	if v, ok := b.drained.Load(stream); ok {
		return v.(*atomic.Bool)
	}
	v, _ := b.drained.LoadOrStore(stream, new(atomic.Bool))
	return v.(*atomic.Bool)
}

// fetchDirect is the read of a fetch that needs no script, of a drained
// stream, when one of the broker's direct reads is free (directRead): a
// blocking read answers at once when entries wait, so the fetch makes one
// read instead of a read without BLOCK and then a blocking one, which
// saves a lone requester a round trip. done is false when it did not
// read: no direct read was free, the hub holds the stream, the first
// scheduled message is due sooner than a blocking read's timeout is
// precise, or the group is missing (err is errNoGroup).
func (b *Broker) fetchDirect(ctx context.Context, s *streamKeys, p *broker.FetchParams, start time.Time) (entries []entry, done bool, err error) {
	block := p.Block
	if s.promote {
		var sleep time.Duration
		if block, sleep = b.blockUntilDue(s.stream, block); sleep > 0 {
			return nil, false, nil
		}
	}
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
// reads s.stream (and, when levels says the high or low level streams
// hold entries, those too) for p.Consumer through the consumer's hub
// (hub.go), waiting up to block; start is when the fetch began to look
// for entries. With levels it keeps the p.Max highest
// entries and gives the others back at once, as if never delivered
// (XCLAIM IDLE lease RETRYCOUNT 0: the next reclaim takes them, as
// attempt 1).
func (b *Broker) blockingRead(ctx context.Context, s *streamKeys, p *broker.FetchParams, levels int, block time.Duration, start time.Time) ([]entry, error) {
	w := &waiter{home: s.stream, lease: p.Lease, count: p.Max, deadline: time.Now().Add(block), start: start}
	prefixes := []string{""}
	w.streams = []string{s.stream}
	if levels != 0 {
		w.streams, prefixes = w.streams[:0], prefixes[:0]
		if levels&1 != 0 {
			w.streams, prefixes = append(w.streams, s.high), append(prefixes, "h")
		}
		w.streams, prefixes = append(w.streams, s.stream), append(prefixes, "")
		if levels&2 != 0 {
			w.streams, prefixes = append(w.streams, s.low), append(prefixes, "l")
		}
	}
	var read map[string][]xentry
	var home []xentry // a direct read's, of s.stream alone (levels is 0)
	direct, err := false, error(nil)
	if levels == 0 {
		home, direct, err = b.directRead(ctx, p.Consumer, w)
	}
	if !direct {
		read, err = b.hubRead(ctx, p.Consumer, w)
	}
	switch {
	case errors.Is(err, errNoGroup):
		// The group is missing: Redis lost its data (a restart without
		// persistence) or the stream was deleted. The fetch script creates
		// it again and reads what is there, such as messages sent since.
		entries, _, _, err := b.reclaim(ctx, s, p, true)
		return entries, err
	case err != nil:
		return nil, b.fail(ctx, s.op, err)
	}
	entries := appendRead(nil, home, "")
	for i, stream := range w.streams {
		entries = appendRead(entries, read[stream], prefixes[i])
	}
	if len(entries) == 0 {
		b.reclaimOf(s.stream).idle.Store(true)
	}
	if len(entries) <= p.Max {
		return entries, nil
	}
	for _, e := range entries[p.Max:] {
		stream, id, _ := b.splitRef(s, e.id)
		if err := b.giveBack(ctx, stream, p.Consumer, p.Lease, []string{id}); err != nil {
			// It stays with p.Consumer until its lease ends.
			b.forceReclaim(s.stream)
			return entries[:p.Max], b.fail(ctx, s.op, err)
		}
	}
	b.forceReclaim(s.stream)
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

// refLevel returns the priority level of ref and its entry id.
func refLevel(ref string) (prio int, id string) {
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
	r := blockingRelease{cancel: cancel, stopClosing: context.AfterFunc(b.closing, cancel)}
	if parent != ctx {
		r.stopCtx = context.AfterFunc(ctx, cancel)
	}
	return bctx, r
}

// blockingRelease releases the context of a blocking read (blockingCtx).
type blockingRelease struct {
	cancel               context.CancelFunc
	stopCtx, stopClosing func() bool // stopCtx is nil when ctx is the parent
}

func (r blockingRelease) release() {
	r.stopClosing()
	if r.stopCtx != nil {
		r.stopCtx()
	}
	r.cancel()
}

// reclaim runs the fetch script; with due, it reclaims before it reads.
// It returns the script's answer of which level streams hold entries, and
// remembers it for s's fetches, as it does its answer of whether the
// stream is quiet (setQuiet).
func (b *Broker) reclaim(ctx context.Context, s *streamKeys, p *broker.FetchParams, due bool) ([]entry, int64, int, error) {
	op, stream := s.op, s.stream
	prune := "0"
	if due && b.dueForPrune(stream) {
		prune = msString(b.pruneIdle)
	}
	sched, schedMsgs := s.delayed, s.delayed
	if s.promote {
		sched, schedMsgs = s.sched, s.schedMsgs
	}
	start := time.Now()
	res, err := scriptFetch.Exec(ctx, b.client, []string{stream, s.dlq, s.delayed, s.holders, s.high, s.low, sched, schedMsgs},
		[]string{p.Consumer, strconv.Itoa(p.Max), msString(p.Lease), strconv.Itoa(max0(p.MaxAttempts)), prune, boolArg(s.record), boolArg(due), boolArg(s.promote)}).ToArray()
	if err != nil {
		b.forceReclaim(stream)
		return nil, 0, 0, b.fail(ctx, op, err)
	}
	if len(res) < 4 {
		return nil, 0, 0, fmt.Errorf("redisbroker: %s: the fetch script answered nothing", op)
	}
	busy, _ := res[3].AsInt64()
	b.setQuiet(stream, busy == 0, start, p.Lease)
	levels, _ := res[1].AsInt64()
	if s.record {
		if levels != 0 {
			b.levels.Store(stream, int(levels))
		} else {
			b.levels.Delete(stream)
		}
	}
	if s.promote {
		next, _ := res[2].AsInt64()
		b.setNextDue(stream, next)
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

// reclaimState is what a broker keeps of one stream for the fetch
// script's reclaim.
type reclaimState struct {
	// next is when the next reclaim is due, unix ns (0: at the next fetch).
	next atomic.Int64
	// quiet: at the last run of the script the stream was not busy (see
	// its answer), and this broker has fetched nothing of it since.
	quiet atomic.Bool
	// idle: the last blocking read of the stream through this broker
	// ended with nothing, and this broker has fetched nothing of it since.
	idle atomic.Bool
}

// reclaimOf returns the reclaimState of stream.
func (b *Broker) reclaimOf(stream string) *reclaimState {
	if v, ok := b.reclaimed.Load(stream); ok {
		return v.(*reclaimState)
	}
	v, _ := b.reclaimed.LoadOrStore(stream, new(reclaimState))
	return v.(*reclaimState)
}

// reclaimDue reports whether the fetch script should run for stream now,
// and if so counts it as run: the next is due reclaimEvery later, or, for
// a quiet stream, idleReclaim(lease) later.
func (b *Broker) reclaimDue(stream string, lease time.Duration) bool {
	st := b.reclaimOf(stream)
	now := time.Now().UnixNano()
	due := st.next.Load()
	every := b.reclaimEvery
	if st.quiet.Load() {
		every = b.idleReclaim(lease)
	}
	return now >= due && st.next.CompareAndSwap(due, now+int64(every))
}

// idleReclaim is the period of the reclaim of a quiet stream fetched with
// lease: the lease, between reclaimEvery and idleReclaimMax. An entry that
// another broker's consumer took since the last reclaim, and whose lease
// then expired, is reclaimed at most this much after it expired.
func (b *Broker) idleReclaim(lease time.Duration) time.Duration {
	return min(max(lease, b.reclaimEvery), idleReclaimMax)
}

// setQuiet records the answer of the fetch script that began at start:
// whether stream is quiet. A quiet stream's next reclaim moves to
// idleReclaim(lease) after start, unless one was forced meanwhile; a busy
// one's comes back to reclaimEvery after start.
func (b *Broker) setQuiet(stream string, quiet bool, start time.Time, lease time.Duration) {
	st := b.reclaimOf(stream)
	st.quiet.Store(quiet)
	if quiet {
		at := start.Add(b.idleReclaim(lease)).UnixNano()
		for {
			cur := st.next.Load()
			if cur == 0 || cur >= at || st.next.CompareAndSwap(cur, at) {
				return
			}
		}
	}
	b.reclaimWithin(st, start.Add(b.reclaimEvery).UnixNano())
}

// markBusy records that this broker fetched entries of stream: it is no
// longer quiet, and its next reclaim is due within reclaimEvery.
func (b *Broker) markBusy(stream string) {
	st := b.reclaimOf(stream)
	if st.idle.Load() {
		st.idle.Store(false)
	}
	if st.quiet.Load() && st.quiet.Swap(false) {
		b.reclaimWithin(st, time.Now().Add(b.reclaimEvery).UnixNano())
	}
}

// reclaimWithin brings st's next reclaim to at, unless it is due sooner.
func (b *Broker) reclaimWithin(st *reclaimState, at int64) {
	for {
		cur := st.next.Load()
		if cur <= at || st.next.CompareAndSwap(cur, at) {
			return
		}
	}
}

// leaseChanged reports whether consumer fetches stream with another lease
// than at its last fetch through this broker, which the fetch script then
// records (the holders hash).
func (b *Broker) leaseChanged(stream, consumer string, lease time.Duration) bool {
	// The lease is kept in an atomic of its own, so that a fetch with the
	// lease of the last one stores nothing in the map.
	k := leaseKey{stream, consumer}
	v, ok := b.leases.Load(k)
	if !ok {
		v, ok = b.leases.LoadOrStore(k, new(atomic.Int64))
	}
	old := v.(*atomic.Int64).Swap(int64(lease))
	return !ok || old != int64(lease)
}

// leaseKey is the key of Broker.leases.
type leaseKey struct{ stream, consumer string }

// forceReclaim makes the next fetch of stream run the fetch script.
func (b *Broker) forceReclaim(stream string) {
	if v, ok := b.reclaimed.Load(stream); ok {
		v.(*reclaimState).next.Store(0)
	}
}

// forceReclaimAll makes the next fetch of every stream run the fetch
// script: a worker left the registry (see Heartbeat), whose deliveries
// may be in any of them.
func (b *Broker) forceReclaimAll() {
	b.reclaimed.Range(func(_, v any) bool {
		v.(*reclaimState).next.Store(0)
		return true
	})
}

func (b *Broker) dueForPrune(stream string) bool {
	now := time.Now()
	last, ok := b.pruned.Load(stream)
	if ok && now.Sub(last.(time.Time)) < b.pruneEvery {
		return false
	}
	b.pruned.Store(stream, now)
	return true
}

// Fetch leases up to p.Max messages of p.Receiver to p.Consumer. See
// broker.Broker. maxAttempts 0 means no limit. A message retried with a
// delay, or whose lease expired, is reclaimed by a Fetch at most
// reclaimEvery (100ms) after that moment, or right after a Retry through
// this broker; a Fetch blocked in Redis notices it when its block time
// ends. From a stream that was quiet for this broker (see idleReclaimMax),
// an entry another broker's consumer took since is reclaimed up to the
// quiet period after its lease expired, or at the first Fetch after the
// heartbeat that saw its holder leave the registry.
func (b *Broker) Fetch(ctx context.Context, p *broker.FetchParams) ([]broker.Delivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	s := b.queueKeys(p.Receiver)
	entries, err := b.fetch(ctx, s, p)
	if err != nil {
		return nil, err
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
		// A message was scheduled before the first one known: the next
		// fetch runs the script, which queues what is due and reads the
		// new due time.
		b.forceSchedule(s.stream)
		err := scriptDropWakes.Exec(ctx, b.client, []string{s.stream, s.holders}, wakes).Error()
		if err != nil {
			return nil, b.fail(ctx, "fetch", err)
		}
	}
	return out, nil
}

// delivery decodes queue entry e: its message (field m) and its deadline
// (field d, unix ms, if any). An entry whose deadline does not parse is
// as undecodable as one whose message does not.
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
	return d, nil
}
