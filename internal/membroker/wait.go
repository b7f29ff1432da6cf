package membroker

import (
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// parkedWait is the wait of a fetch with broker.FetchParams.Wake that found
// nothing (broker.Wait): registered on its stream, whose next entry, or
// its timer (the block time, or the first pending entry's or deferred
// message's due time, if sooner), or Close, wakes it. The next fetch looks
// as usual.
type parkedWait struct {
	b    *Broker
	name string
	s    *stream
	wake func()
	t    *time.Timer
	done bool // woken or cancelled; guarded by c.mu
}

// park leaves p's wait on s, the stream of name, for up to d. Callers
// hold mu.
func (b *Broker) park(name string, s *stream, p *broker.FetchParams, d time.Duration) {
	w := &parkedWait{b: b, name: name, s: s, wake: p.Wake}
	s.waiters++
	s.parked = append(s.parked, w)
	if b.parked == nil {
		b.parked = make(map[*parkedWait]struct{})
	}
	b.parked[w] = struct{}{}
	w.t = time.AfterFunc(d, func() {
		b.c.mu.Lock()
		defer b.c.mu.Unlock()
		w.wakeAlone()
	})
	p.Wait = w
}

// wakeAlone wakes w, unless it ended, and removes it from its stream's
// parked: woken by its timer or Close, not with its stream's others.
// Callers hold mu.
func (w *parkedWait) wakeAlone() {
	if w.done {
		return
	}
	w.s.parked = removeWait(w.s.parked, w)
	w.fire()
	w.b.c.tidy(w.name)
}

// fire ends w and calls its wake, unless it ended. The caller removes it
// from its stream's parked. Callers hold mu.
func (w *parkedWait) fire() {
	if w.end() {
		w.wake()
	}
}

// end ends w, but for its place in its stream's parked; it reports
// whether w was still waiting. Callers hold mu.
func (w *parkedWait) end() bool {
	if w.done {
		return false
	}
	w.done = true
	w.t.Stop()
	w.s.waiters--
	delete(w.b.parked, w)
	return true
}

// Cancel ends the wait (broker.Wait).
func (w *parkedWait) Cancel() {
	c := w.b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if w.end() {
		w.s.parked = removeWait(w.s.parked, w)
		c.tidy(w.name)
	}
}

// removeWait returns ws without w.
func removeWait(ws []*parkedWait, w *parkedWait) []*parkedWait {
	for i, x := range ws {
		if x == w {
			last := len(ws) - 1
			ws[i], ws[last] = ws[last], nil
			return ws[:last]
		}
	}
	return ws
}
