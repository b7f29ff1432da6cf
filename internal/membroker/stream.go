package membroker

import (
	"container/list"
	"iter"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// entry is one entry of a stream: a queued message or a reply.
type entry struct {
	ref string
	raw []byte // the encoded envelope (or bytes that do not decode)

	deadline time.Time // queue entries: the message's deadline, zero if none
	expiry   time.Time // queue entries: the message's expiry, zero if none
	group    string    // queue entries: the message's group key, "" if none
	counted  bool      // queue entries of a group: counted out for their key
	prio     int       // queue entries: the message's priority level

	kind      broker.ReplyKind // reply entries
	requestID string           // reply entries
	attempt   int              // partial reply entries: the attempt that sent it
	part      broker.PartKind  // partial reply entries: its kind
	at        time.Time        // when appended (broker clock)

	// Delivery state, as a Redis consumer group keeps it.
	pending   bool          // delivered and not yet acknowledged
	owner     string        // the consumer that holds it
	count     int           // how many times it was delivered
	delivered time.Time     // the last delivery (or its stand-in after Extend and Retry)
	lease     time.Duration // the holder's lease, from delivered
	elem      *list.Element
}

// stream is a queue of entries read by competing consumers: the in-memory
// form of a Redis stream with one consumer group. New entries are delivered
// once, in order; delivered ones stay pending until acknowledged, and are
// reclaimed by a reader once idle for at least its lease.
type stream struct {
	entries map[string]*entry
	fresh   list.List // entries never delivered, oldest first (of the normal priority level)
	high    list.List // likewise, of the high level
	low     list.List // likewise, of the low level
	pending list.List // delivered entries, in the order of their first delivery

	waiters int           // blocked readers, and parked ones
	notify  chan struct{} // closed to wake the blocked readers; nil if none wait
	parked  []*parkedWait // the waits of fetches with Wake (park)

	deferred *dueSet // a queue's messages sent for later; nil until one is
}

func newStream() *stream {
	return &stream{entries: make(map[string]*entry)}
}

// idle reports whether s holds nothing and nobody waits on it.
func (s *stream) idle() bool {
	return len(s.entries) == 0 && s.waiters == 0 && (s.deferred == nil || len(s.deferred.byID) == 0)
}

// freshOf returns the list of the entries of priority level prio never
// delivered.
func (s *stream) freshOf(prio int) *list.List {
	switch {
	case prio > 0:
		return &s.high
	case prio < 0:
		return &s.low
	}
	return &s.fresh
}

// queued returns how many entries were never delivered, of all levels.
func (s *stream) queued() int { return s.fresh.Len() + s.high.Len() + s.low.Len() }

// oldestQueued returns when the oldest entry never delivered was added,
// of any level, and false when there is none.
func (s *stream) oldestQueued() (time.Time, bool) {
	var t time.Time
	found := false
	for _, l := range []*list.List{&s.high, &s.fresh, &s.low} {
		if f := l.Front(); f != nil && (!found || f.Value.(*entry).at.Before(t)) {
			t, found = f.Value.(*entry).at, true
		}
	}
	return t, found
}

// add appends e to the stream and wakes the readers.
func (s *stream) add(e *entry) {
	s.entries[e.ref] = e
	e.elem = s.freshOf(e.prio).PushBack(e)
	s.wake()
}

// remove deletes the entry ref, if present, and returns it.
func (s *stream) remove(ref string) *entry {
	e := s.entries[ref]
	if e == nil {
		return nil
	}
	delete(s.entries, ref)
	if e.pending {
		s.pending.Remove(e.elem)
	} else {
		s.freshOf(e.prio).Remove(e.elem)
	}
	e.elem = nil
	return e
}

// owned returns the entry ref if consumer holds it.
func (s *stream) owned(ref, consumer string) *entry {
	e := s.entries[ref]
	if e == nil || !e.pending || e.owner != consumer {
		return nil
	}
	return e
}

// deliver leases e to consumer at now.
func (s *stream) deliver(e *entry, consumer string, now time.Time, lease time.Duration) {
	if !e.pending {
		s.freshOf(e.prio).Remove(e.elem)
		e.pending = true
		e.elem = s.pending.PushBack(e)
	}
	e.owner = consumer
	e.count++
	e.delivered = now
	e.lease = lease
}

// expired yields the pending entries idle for at least their holder's lease
// at now, and those of a holder for which lapsed is true, in the order of
// their first delivery. The
// loop body may remove the entry it is given.
func (s *stream) expired(now time.Time, lapsed func(owner string) bool) iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for el := s.pending.Front(); el != nil; {
			e := el.Value.(*entry)
			el = el.Next()
			if (now.Sub(e.delivered) >= e.lease || lapsed(e.owner)) && !yield(e) {
				return
			}
		}
	}
}

// nextDue returns how long after now the first pending entry becomes
// reclaimable (its holder's lease over), or the first deferred message is
// due, whichever comes first, and false when there is neither.
func (s *stream) nextDue(now time.Time) (time.Duration, bool) {
	var first time.Time
	found := false
	for el := s.pending.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		due := e.delivered.Add(e.lease)
		if !found || due.Before(first) {
			first, found = due, true
		}
	}
	if s.deferred != nil && len(s.deferred.heap) > 0 {
		if due := s.deferred.heap[0].due; !found || due.Before(first) {
			first, found = due, true
		}
	}
	if !found {
		return 0, false
	}
	return first.Sub(now), true
}

// watch registers a blocked reader and returns the channel that wakes it.
// The reader calls unwatch when it wakes.
func (s *stream) watch() <-chan struct{} {
	if s.notify == nil {
		s.notify = make(chan struct{})
	}
	s.waiters++
	return s.notify
}

func (s *stream) unwatch() { s.waiters-- }

// wake wakes every blocked reader, which then looks again.
func (s *stream) wake() {
	if s.notify != nil {
		close(s.notify)
		s.notify = nil
	}
	for _, w := range s.parked {
		w.fire()
	}
	clear(s.parked)
	s.parked = s.parked[:0]
}
