package redisbroker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
)

// The read hub multiplexes the blocking reads of one consumer: a Fetch or a
// ReadReplies that found nothing waiting joins the hub of its consumer (on
// a Cluster, of its consumer and its streams' slot) as a waiter, and the
// hub's goroutine serves all of them with one
//
//	XREADGROUP GROUP g <consumer> COUNT c BLOCK t STREAMS s1 s2 ... > > ...
//
// on one dedicated connection, where c is the smallest count of the
// waiters and t runs to the earliest waiter's deadline. So a process holds
// one blocking connection per consumer and slot, whatever the number of
// receivers and reply streams it reads. A waiter that joins while the read
// is blocked, with a stream the read does not cover or a deadline before
// its end, interrupts it with CLIENT UNBLOCK (sent on the shared
// connections), and the next read covers it; the streams of the waiters
// answered by one read stay in the next, so that a waiter back with its
// next fetch finds itself covered. The entries of a stream go to its first
// waiter, up to its count; the others, and the entries of a stream with no
// waiter (its loop is between two fetches, or its context ended), are
// parked for the stream's next waiter, and given back after parkFor
// (XCLAIM ... IDLE lease RETRYCOUNT 0 JUSTID), as if never delivered.
//
// A waiter of a fetch with broker.FetchParams.Wake has no goroutine
// waiting for its answer (a parked read: wait.go): the hub keeps the
// answer in it and calls its wake. At its deadline, when a fetch of its
// stream would only wait again (extend), its deadline moves on instead, so
// that an idle receiver costs nothing but its place in the hub's read.

// earlyDiv: a read that ends less than 1/earlyDiv of a waiter's block
// time before its deadline answers it then (waiter.early). A read ends at
// its earliest waiter's deadline, and each read covers every waiting
// stream; with thousands of waiters whose deadlines are spread over the
// block time, answering each at its own deadline would end a read, and
// start another of every stream, for each of them. Answered early, the
// waiters of a slice of the block time go together, and come back
// together with their next fetch: at most about earlyDiv reads per block
// time end on deadlines.
const earlyDiv = 8

// hubLinger is how long a hub without waiters keeps its goroutine and its
// dedicated connection before it gives them up.
const hubLinger = 10 * time.Second

// hubKey names a hub: one per consumer and, on a Cluster, per slot.
type hubKey struct {
	consumer string
	slot     uint16
}

// waiter is a blocking read waiting in a hub.
type waiter struct {
	streams  []string // the streams it reads, of one slot
	home     string   // the queue or reply stream it reads for (forceReclaim)
	lease    time.Duration
	count    int
	deadline time.Time
	// early: a read that ends less than this before deadline answers it
	// (empty) then, rather than read again for what is left (see next).
	early time.Duration
	start time.Time // when its fetch began
	// noLinger: its streams are not kept for the next read once it is
	// answered, so that the hub lets go of them (a reply stream whose
	// pending list is due to be read again: see recoverReplies).
	noLinger bool
	res      chan hubAnswer // capacity 1: the one answer
	done     bool           // answered or left (under hub.mu)
	// wake, if set, is called once it is answered, with its answer in ans
	// (not res): a parked read's (see parkRead), which no goroutine waits
	// for. st and block are its stream's state and block time, to wait on
	// past its deadline when a fetch would wait again (extend).
	wake  func()
	ans   atomic.Pointer[hubAnswer]
	st    *streamState
	block time.Duration
}

// emptyAnswer is the answer of a parked read at its deadline.
var emptyAnswer hubAnswer

// hubAnswer is what a hub answers a waiter: the entries of its streams
// (none at its deadline), or the error of the read. errNoGroup: a stream
// of the read has no group (the whole read failed).
type hubAnswer struct {
	read map[string][]xentry
	err  error
}

// errNoGroup is the answer of a read that failed with NOGROUP: one of its
// streams lost its group; each waiter runs the fetch script, which makes
// it again.
var errNoGroup = errors.New("redisbroker: NOGROUP")

// readStream is what a hub keeps of a stream of the read in progress, to
// give back entries whose waiter left.
type readStream struct {
	lease time.Duration
	home  string
}

// hub multiplexes the blocking reads of one consumer (and slot).
type hub struct {
	b       *Broker
	key     hubKey
	slotKey string // a stream of the slot, to route keyless commands

	mu      sync.Mutex
	waiters []*waiter // in the order they joined
	running bool      // its goroutine runs
	kick    chan struct{}
	// The read in progress.
	reading bool
	round   uint64 // reads ended so far
	readSet map[string]readStream
	// linger: the streams of the waiters answered since the read began,
	// read once more (see next).
	linger       map[string]readStream
	readUntil    time.Time
	interrupting bool // an interrupt of this read is under way
	// hang answers the parked reads should the read in progress hang
	// (watchHang); made at the first read.
	hang  *time.Timer
	id    int64              // CLIENT ID of the dedicated connection
	abort context.CancelFunc // aborts the read (closes its connection)
	// parked: entries read for a stream that had no waiter (or beyond its
	// waiter's count), by stream, kept for its next waiter for up to
	// parkFor, then given back.
	parked map[string]*parkedEntries
	// gaveBack: when parked entries were last given back, by the queue or
	// reply stream they were read for (see join).
	gaveBack map[string]time.Time
}

// hubOf returns the hub of consumer for stream; b.hubsMu must be held.
func (b *Broker) hubOf(consumer, stream string) *hub {
	k := hubKey{consumer: consumer}
	if b.cluster {
		k.slot = keyslot.Of(stream)
	}
	h, ok := b.hubs[k]
	if !ok {
		h = &hub{b: b, key: k, slotKey: stream, kick: make(chan struct{}, 1)}
		b.hubs[k] = h
	}
	return h
}

// hubRead reads w.streams for consumer through its hub until w.deadline:
// the entries read, none at the deadline, or errNoGroup.
func (b *Broker) hubRead(ctx context.Context, consumer string, w *waiter) (map[string][]xentry, error) {
	w.res = make(chan hubAnswer, 1)
	w.early = max(time.Millisecond, time.Until(w.deadline)/earlyDiv)
	b.hubsMu.Lock()
	if b.hubsClosed {
		b.hubsMu.Unlock()
		return nil, broker.ErrClosed
	}
	h := b.hubOf(consumer, w.streams[0])
	interrupt, round := h.join(w)
	b.hubsMu.Unlock()
	if interrupt {
		h.interrupt(round)
	}
	// The hub answers at the deadline; should its read hang (a Redis that
	// stopped answering), the waiter leaves after the I/O timeout.
	t := time.NewTimer(time.Until(w.deadline) + redisTimerSlack + b.ioTimeout)
	defer t.Stop()
	select {
	case a := <-w.res:
		return a.read, a.err
	case <-ctx.Done():
	case <-b.closing.Done():
	case <-t.C:
	}
	if !h.leave(w) {
		// Answered meanwhile: give back what it read, unless it is kept.
		a := <-w.res
		if ctx.Err() == nil && b.closing.Err() == nil {
			return a.read, a.err
		}
		b.giveBackRead(context.WithoutCancel(ctx), consumer, w.lease, w.home, a.read)
	}
	switch {
	case b.closing.Err() != nil:
		return nil, broker.ErrClosed
	case ctx.Err() != nil:
		return nil, ctx.Err()
	}
	return nil, nil
}

// join adds w to h, under b.hubsMu, and starts h's goroutine if it is not
// running. It reports whether the read in progress must be interrupted to
// cover w, and its round.
func (h *hub) join(w *waiter) (bool, uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if a := h.unpark(w); a != nil {
		h.answer(w, hubAnswer{read: a})
		return false, 0
	}
	if t, ok := h.gaveBack[w.home]; ok && !t.Before(w.start) {
		// Entries of its stream were given back after its fetch looked
		// for them: answer empty, and its next fetch reclaims them.
		h.answer(w, hubAnswer{})
		return false, 0
	}
	h.waiters = append(h.waiters, w)
	if !h.running {
		h.running = true
		h.b.hubsWG.Add(1)
		go h.run()
		return false, 0
	}
	if !h.reading {
		select {
		case h.kick <- struct{}{}:
		default:
		}
		return false, 0
	}
	if h.interrupting {
		return false, 0
	}
	need := w.deadline.Before(h.readUntil)
	for _, s := range w.streams {
		if _, ok := h.readSet[s]; !ok {
			need = true
		}
	}
	h.interrupting = need
	return need, h.round
}

// leave removes w from h unless it was answered; it reports whether it
// removed it.
func (h *hub) leave(w *waiter) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.done {
		return false
	}
	w.done = true
	h.drop()
	return true
}

// end removes w, a parked read, from h unless it was answered; it returns
// the answer, or false when it removed it.
func (h *hub) end(w *waiter) (hubAnswer, bool) {
	if a := w.ans.Load(); a != nil {
		return *a, true // no lock: many parked reads end together
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if w.done {
		return *w.ans.Load(), true
	}
	w.done = true
	h.drop()
	return hubAnswer{}, false
}

// hangAfter is how long after its deadline a parked read that the hub
// did not answer is answered empty (see watchHang).
func (b *Broker) hangAfter() time.Duration { return redisTimerSlack + b.ioTimeout }

// watchHang arms h's timer of hung reads for a read that ends by until: a
// Redis that stopped answering leaves the read in progress, and the parked
// reads, which no goroutine waits for, are answered (empty) by the timer
// instead, as hubRead's timer leaves. A waiting goroutine does.
func (h *hub) watchHang(until time.Time) {
	d := time.Until(until) + h.b.hangAfter()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hang == nil {
		h.hang = time.AfterFunc(d, h.expireHung)
		return
	}
	h.hang.Reset(d)
}

// expireHung answers empty the parked reads whose deadline passed
// hangAfter ago, and arms the timer again for the others.
func (h *hub) expireHung() {
	h.mu.Lock()
	defer h.mu.Unlock()
	cutoff := time.Now().Add(-h.b.hangAfter())
	var next time.Time
	for _, w := range h.waiters {
		switch {
		case w.wake == nil:
		case w.deadline.Before(cutoff):
			h.answer(w, hubAnswer{})
		case next.IsZero() || w.deadline.Before(next):
			next = w.deadline
		}
	}
	h.drop()
	if !next.IsZero() {
		h.hang.Reset(time.Until(next) + h.b.hangAfter())
	}
}

// drop removes the waiters that are done, under h.mu.
func (h *hub) drop() {
	n := 0
	for _, w := range h.waiters {
		if !w.done {
			h.waiters[n] = w
			n++
		}
	}
	clear(h.waiters[n:])
	h.waiters = h.waiters[:n]
}

// answer answers w, under h.mu, and keeps its streams for the next read
// (linger).
func (h *hub) answer(w *waiter, a hubAnswer) {
	w.done = true
	if w.wake != nil {
		ans := &emptyAnswer
		if a.read != nil || a.err != nil {
			ans = new(hubAnswer) // here only: a escapes on no other path
			*ans = a
		}
		w.ans.Store(ans)
		w.wake()
	} else {
		w.res <- a
	}
	if a.err != nil || w.noLinger {
		return
	}
	if h.linger == nil {
		h.linger = make(map[string]readStream)
	}
	for _, s := range w.streams {
		h.linger[s] = readStream{lease: w.lease, home: w.home}
	}
}

// interrupt ends the read of round with CLIENT UNBLOCK, sent again while
// it answers 0 and that read is still in progress (the UNBLOCK overtook
// the read), for up to the I/O timeout. When Redis refuses it (an ACL
// without CLIENT UNBLOCK), or it does not end the read in that time, the
// read is aborted: its connection is closed, and the next read takes
// another.
func (h *hub) interrupt(round uint64) {
	b := h.b
	ctx, cancel := context.WithTimeout(b.closing, b.ioTimeout)
	defer cancel()
	pause := 100 * time.Microsecond
	for ctx.Err() == nil {
		h.mu.Lock()
		id, current := h.id, h.reading && h.round == round
		h.mu.Unlock()
		if !current {
			return
		}
		if id == 0 {
			break
		}
		n, err := b.client.Do(ctx, b.client.B().ClientUnblock().ClientId(id).Build().SetSlot(h.slotKey)).AsInt64()
		if err != nil {
			break
		}
		if n == 1 {
			return
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		pause = min(2*pause, 10*time.Millisecond)
	}
	if b.closing.Err() != nil {
		return
	}
	h.mu.Lock()
	if h.reading && h.round == round && h.abort != nil {
		h.abort()
	}
	h.mu.Unlock()
}

// run is h's goroutine: it reads for the waiters until none has joined for
// hubLinger, or the broker closes.
func (h *hub) run() {
	b := h.b
	defer b.hubsWG.Done()
	var dc rueidis.DedicatedClient
	var release func()
	defer func() {
		if dc != nil {
			dc.Close()
		}
	}()
	// drop gives up the dedicated connection: closed after a failed or
	// aborted read (it may still be blocked), else back to the pool.
	drop := func(closeIt bool) {
		if dc == nil {
			return
		}
		if closeIt {
			dc.Close()
		} else {
			release()
		}
		dc, release = nil, nil
		h.mu.Lock()
		h.id = 0
		h.mu.Unlock()
	}
	defer func() {
		ps, _ := h.unparkExpired(time.Time{}, true)
		h.giveBackParked(ps)
		if b.closing.Err() != nil {
			// The parked reads (parkRead) have no goroutine that would
			// see the broker close.
			h.fail(nil, broker.ErrClosed)
		}
	}()
	idle := time.NewTimer(hubLinger)
	defer idle.Stop()
	for {
		if b.closing.Err() != nil {
			return
		}
		ps, parkedUntil := h.unparkExpired(time.Now(), false)
		h.giveBackParked(ps)
		fresh := dc == nil
		if fresh && h.waiting() {
			var err error
			if dc, release, err = h.dedicate(); err != nil {
				h.fail(nil, err)
				continue
			}
		}
		rctx, abort := context.WithCancel(b.closing)
		streams, rs, count, until := h.next(abort)
		if len(streams) == 0 {
			abort()
			if h.idle(idle, parkedUntil) {
				drop(false)
				return
			}
			continue
		}
		if dc == nil {
			// A waiter joined after the look for one: take a connection.
			h.endRead()
			abort()
			continue
		}
		ids := make([]string, len(streams))
		for i := range ids {
			ids[i] = ">"
		}
		if !parkedUntil.IsZero() && parkedUntil.Before(until) {
			until = parkedUntil // to give back what is still parked then
		}
		h.watchHang(until)
		read, err := asXRead(dc.Do(rctx, dc.B().Xreadgroup().Group("g", h.key.consumer).Count(int64(count)).
			Block(ms(max(time.Until(until), time.Millisecond))).Streams().Key(streams...).Id(ids...).Build()))
		h.hang.Stop()
		abort()
		h.endRead()
		if _, answered := rueidis.IsRedisErr(err); err != nil && !answered && !rueidis.IsRedisNil(err) {
			// Its entries may have been delivered to the consumer, their
			// answer lost: see recoverReplies.
			b.lostReads.Add(1)
		}
		switch {
		case err == nil:
			h.deliver(read, rs)
		case b.closing.Err() != nil:
			return
		case rueidis.IsRedisNil(err): // the block time ended, or CLIENT UNBLOCK
		case isNoGroup(err):
			h.fail(streams, errNoGroup)
		case errors.Is(err, context.Canceled):
			// Aborted by interrupt: the connection may still be blocked.
			drop(true)
		default:
			drop(true)
			if _, ok := rueidis.IsRedisErr(err); ok || fresh {
				h.fail(streams, err)
			}
			// Else the connection kept from an earlier read broke
			// meanwhile (Redis restarted): read again on a new one.
		}
	}
}

// endRead records that the read in progress ended.
func (h *hub) endRead() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reading, h.readSet, h.abort = false, nil, nil
	h.round++
}

// idle waits, without waiters, for one to join, or until parked entries
// expire (parkedUntil, if not zero). It reports true, with h no longer
// running and out of the broker's hubs, when none joined for hubLinger,
// nothing is parked, or the broker closes.
func (h *hub) idle(t *time.Timer, parkedUntil time.Time) bool {
	b := h.b
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	wait := hubLinger
	if !parkedUntil.IsZero() {
		wait = min(wait, max(time.Until(parkedUntil), time.Millisecond))
	}
	t.Reset(wait)
	select {
	case <-h.kick:
		return false
	case <-t.C:
		if !parkedUntil.IsZero() {
			return false
		}
	case <-b.closing.Done():
	}
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.waiters) > 0 || len(h.parked) > 0 && b.closing.Err() == nil {
		return false
	}
	h.running = false
	delete(b.hubs, h.key)
	return true
}

// waiting reports whether h has waiters.
func (h *hub) waiting() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters) > 0
}

// next answers the waiters whose deadline passed, or is less than their
// early ahead, and returns the read for
// the others: their streams (each once, in the order the waiters joined)
// and the lingering ones, what it keeps of each, the smallest count and
// the earliest deadline; it records that read as in progress, aborted by
// abort, in the same step, so that a waiter that joins after it
// interrupts it. Without waiters it returns no streams.
func (h *hub) next(abort context.CancelFunc) ([]string, map[string]readStream, int, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	var streams []string
	rs := make(map[string]readStream, len(h.waiters)+len(h.linger))
	count := 0
	var until time.Time
	for _, w := range h.waiters {
		if w.deadline.Sub(now) < w.early && !h.b.extend(w, now) {
			h.answer(w, hubAnswer{})
			continue
		}
		for _, s := range w.streams {
			if _, ok := rs[s]; !ok {
				streams = append(streams, s)
				rs[s] = readStream{lease: w.lease, home: w.home}
			}
		}
		if count == 0 || w.count < count {
			count = w.count
		}
		if until.IsZero() || w.deadline.Before(until) {
			until = w.deadline
		}
	}
	h.drop()
	if len(streams) == 0 {
		return nil, nil, 0, time.Time{}
	}
	// The streams whose waiters were answered last round stay in this
	// read, so that those waiters, back with their next fetch, find it
	// covering them and need not interrupt it. Entries read for one
	// before it is back are given back.
	for s, r := range h.linger {
		if _, ok := rs[s]; !ok {
			streams = append(streams, s)
			rs[s] = r
		}
	}
	clear(h.linger)
	h.reading, h.readSet, h.readUntil, h.interrupting, h.abort = true, rs, until, false, abort
	return streams, rs, count, until
}

// dedicate takes a dedicated connection for h's reads and reads its id.
func (h *hub) dedicate() (rueidis.DedicatedClient, func(), error) {
	b := h.b
	dc, release := b.client.Dedicate()
	ctx, cancel := context.WithTimeout(b.closing, b.ioTimeout)
	defer cancel()
	id, err := dc.Do(ctx, dc.B().ClientId().Build().SetSlot(h.slotKey)).AsInt64()
	if err != nil {
		dc.Close()
		return nil, nil, err
	}
	h.mu.Lock()
	h.id = id
	h.mu.Unlock()
	return dc, release, nil
}

// fail answers err to the waiters that read any of streams (nil: to
// every waiter).
func (h *hub) fail(streams []string, err error) {
	set := make(map[string]bool, len(streams))
	for _, s := range streams {
		set[s] = true
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.waiters {
		for _, s := range w.streams {
			if streams == nil || set[s] {
				h.answer(w, hubAnswer{err: err})
				break
			}
		}
	}
	h.drop()
}

// deliver hands the entries of each stream to its first waiter, up to its
// count, and parks the others: those beyond the count, and those of a
// stream with no waiter (it left, or it is between two fetches).
func (h *hub) deliver(read map[string][]xentry, rs map[string]readStream) {
	answers := make(map[*waiter]map[string][]xentry)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	first := make(map[string]*waiter, len(read))
	for _, w := range h.waiters {
		for _, s := range w.streams {
			if _, ok := first[s]; !ok {
				first[s] = w
			}
		}
	}
	for s, es := range read {
		if len(es) == 0 {
			continue
		}
		to := first[s]
		if to == nil {
			h.park(s, es, rs[s], now)
			continue
		}
		if len(es) > to.count {
			h.park(s, es[to.count:], readStream{lease: to.lease, home: to.home}, now)
			es = es[:to.count:to.count]
		}
		if answers[to] == nil {
			answers[to] = make(map[string][]xentry, len(to.streams))
		}
		answers[to][s] = es
	}
	for w, a := range answers {
		h.answer(w, hubAnswer{read: a})
	}
	h.drop()
}
