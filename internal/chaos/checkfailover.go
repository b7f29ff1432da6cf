package chaos

// How a Sentinel failover explains a departure from a feature's promise
// (CheckOptions.FailoverLoss).
//
// A failover promotes a replica that Redis fed asynchronously: the writes
// the old master acknowledged and had not passed on are gone. A feature's
// state (a holder's global or group slots, a dedup or idempotency key, an
// idempotent message's stored reply, a retained result) is such a write,
// and its loss breaks the feature's promise for as long as the state
// should have lived: a lost slot while the handlers it admitted run, a
// lost key until its window ends, a lost result for good. A departure is
// explained by a failover only when the state it needed was written no
// earlier than failoverWindowMax before the failover began and no later
// than its end (a write after it went to the new master), and the
// departure was seen after the failover began (before it, the state was
// still there). Each check bounds the departure by the state's lifetime
// itself (two messages of a key are judged only within the key's window,
// handlers at once only while they run), so the failover need only fall
// between the state's write and the departure.

import "time"

// lossSpan is what a failover must have lost for a departure: state
// written from written to writtenTo, its loss seen at seen.
type lossSpan struct {
	written, writtenTo int64
	seen               int64
}

// at is the span of state written at t whose loss may show at any time: a
// departure judged by the time of its write alone.
func at(t int64) lossSpan {
	return lossSpan{written: t, writtenTo: t, seen: 1<<63 - 1}
}

// failoverSpan returns when a failover may have been under way for fault
// f: a sentinel_failover from its start to its end, and a CLIENT PAUSE of
// the master longer than the sentinel's down-after time, which makes the
// sentinel fail over by itself in the seconds after it, to
// pauseFailoverTail after its end.
func failoverSpan(f Event) (begin, end int64, ok bool) {
	switch f.Fault {
	case FaultSentinelFailover:
		return f.T, f.End, true
	case FaultClientPause:
		return f.T, f.End + int64(pauseFailoverTail), true
	}
	return 0, 0, false
}

// failoverLost reports whether a failover may have lost the state of s:
// one that began at most failoverWindowMax after the state's last write,
// ended after its first, and began before the departure was seen. It
// returns the time from the state's last write to the start of the
// nearest such failover (negative: written during it).
func (fi faultIndex) failoverLost(s lossSpan) (best time.Duration, found bool) {
	for _, f := range fi.faults {
		begin, end, ok := failoverSpan(f)
		if ok && s.written <= end && s.writtenTo > begin-int64(failoverWindowMax) && s.seen >= begin {
			if w := time.Duration(begin - s.writtenTo); !found || w < best {
				best, found = w, true
			}
		}
	}
	return best, found
}

// brokeState counts a departure from invariant that no fault explains
// unless, in a Sentinel run, a failover may have lost the state of s.
func (c *features) brokeState(invariant string, s lossSpan, format string, args ...any) {
	if !c.opts.FailoverLoss {
		c.f.Broken[invariant]++
		c.r.violate(invariant+": "+format, args...)
		return
	}
	if w, ok := c.fi.failoverLost(s); ok {
		c.f.Explained[invariant+":failover"]++
		if c.f.FailoverWindow == nil {
			c.f.FailoverWindow = map[string]time.Duration{}
		}
		if prev, seen := c.f.FailoverWindow[invariant]; !seen || w > prev {
			c.f.FailoverWindow[invariant] = w // negative: written during the failover
		}
		return
	}
	c.f.Broken[invariant]++
	c.r.violate(invariant+": "+format, args...)
}

// slotsSpan is the span of the slots of running, over their limit at t: a
// holder takes a slot at its fetch, which precedes its handler's start by
// up to a lease (the answer held by a stalled connection, the worker
// stopped), and renews it until the handler ends; the loss shows at t.
func (c *features) slotsSpan(running []*run, t int64) lossSpan {
	from := t
	for _, ru := range running {
		from = min(from, ru.start-int64(c.opts.Lease))
	}
	return lossSpan{written: from, writtenTo: t, seen: t}
}

// keySpan is the span of the key that a and b (accepted within its
// window) both found free: the one accepted first stored it, between its
// send's start and its acceptance, and the other was accepted by its
// upper bound. When the order is not known, either may have stored it.
func keySpan(a, b acceptance) lossSpan {
	if a.upper < b.lower {
		return lossSpan{written: a.lower, writtenTo: a.upper, seen: b.upper}
	}
	if b.upper < a.lower {
		return lossSpan{written: b.lower, writtenTo: b.upper, seen: a.upper}
	}
	return lossSpan{written: min(a.lower, b.lower), writtenTo: max(a.upper, b.upper), seen: max(a.upper, b.upper)}
}
