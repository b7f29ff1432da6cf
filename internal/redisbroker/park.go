package redisbroker

import (
	"context"
	"time"
)

// parkedEntries are entries of one stream read with no waiter to take
// them.
type parkedEntries struct {
	es []xentry
	r  readStream
	at time.Time // when they were parked
}

// parkFor is how long a hub keeps entries read with no waiter for them
// (see hub.parked; Broker.parkFor): the consumer loop whose stream it is
// is usually between two fetches, and its next one takes them; past this,
// they are given back, for any consumer's next reclaim. It is also the
// period of the fetch script's reclaim (reclaimEvery).
const parkFor = 100 * time.Millisecond

// unpark takes the parked entries of w's streams, up to w.count per
// stream, under h.mu; nil if there are none.
func (h *hub) unpark(w *waiter) map[string][]xentry {
	var a map[string][]xentry
	for _, s := range w.streams {
		p, ok := h.parked[s]
		if !ok {
			continue
		}
		n := min(len(p.es), w.count)
		if a == nil {
			a = make(map[string][]xentry, len(w.streams))
		}
		a[s] = p.es[:n:n]
		if p.es = p.es[n:]; len(p.es) == 0 {
			delete(h.parked, s)
		}
	}
	return a
}

// park keeps es, read for stream s with no waiter to take them, under h.mu.
func (h *hub) park(s string, es []xentry, r readStream, now time.Time) {
	if h.parked == nil {
		h.parked = make(map[string]*parkedEntries)
	}
	if p, ok := h.parked[s]; ok {
		p.es = append(p.es, es...)
		return
	}
	h.parked[s] = &parkedEntries{es: es, r: r, at: now}
}

// unparkExpired takes the parked entries older than parkFor (all, with
// all), and returns the earliest time at which the others expire (zero
// if none are left).
func (h *hub) unparkExpired(now time.Time, all bool) (map[string]*parkedEntries, time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out map[string]*parkedEntries
	var next time.Time
	for s, p := range h.parked {
		end := p.at.Add(h.b.parkFor)
		if all || !now.Before(end) {
			if out == nil {
				out = make(map[string]*parkedEntries)
			}
			out[s] = p
			delete(h.parked, s)
			continue
		}
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	return out, next
}

// giveBackParked gives back entries taken from h.parked. A waiter of
// their queue or reply stream gets an empty answer, for its next fetch to
// reclaim them (so does one that joins later, but whose fetch began
// before: see join).
func (h *hub) giveBackParked(ps map[string]*parkedEntries) {
	if len(ps) == 0 {
		return
	}
	homes := make(map[string]bool, len(ps))
	for s, p := range ps {
		h.b.giveBackRead(context.Background(), h.key.consumer, p.r.lease, p.r.home, map[string][]xentry{s: p.es})
		homes[p.r.home] = true
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gaveBack == nil {
		h.gaveBack = make(map[string]time.Time)
	}
	for home, t := range h.gaveBack {
		if now.Sub(t) > 2*h.b.ioTimeout {
			delete(h.gaveBack, home) // any fetch that began before has joined
		}
	}
	for home := range homes {
		h.gaveBack[home] = now
	}
	for _, w := range h.waiters {
		if homes[w.home] {
			h.answer(w, hubAnswer{})
		}
	}
	h.drop()
}
