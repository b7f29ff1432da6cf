package membroker

// Deferred messages, sent for later (broker.SendParams.Delay, DeliverAt),
// and their cancellation (broker.Cancels).

import (
	"bytes"
	"container/heap"
	"container/list"
	"context"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// deferredMsg is a message sent for later, due at due, to be queued at
// level prio.
type deferredMsg struct {
	id       string
	due      time.Time
	deadline time.Time
	expiry   time.Time
	prio     int
	group    string
	raw      []byte
	index    int // in the heap
}

// dueSet is a queue's messages sent for later, by id and by due time.
type dueSet struct {
	byID map[string]*deferredMsg
	heap deferredHeap
}

// deferredSet returns s's dueSet, creating it. Callers hold mu.
func (s *stream) deferredSet() *dueSet {
	if s.deferred == nil {
		s.deferred = &dueSet{byID: make(map[string]*deferredMsg)}
	}
	return s.deferred
}

// put defers message m.id until m.due (replacing an earlier one of the
// id).
func (sc *dueSet) put(m *deferredMsg) {
	if old := sc.byID[m.id]; old != nil {
		sc.remove(old)
	}
	sc.byID[m.id] = m
	heap.Push(&sc.heap, m)
}

func (sc *dueSet) remove(m *deferredMsg) {
	delete(sc.byID, m.id)
	heap.Remove(&sc.heap, m.index)
}

// deferredHeap orders deferred messages by due time.
type deferredHeap = byTime[*deferredMsg]

func (m *deferredMsg) at() time.Time  { return m.due }
func (m *deferredMsg) setIndex(i int) { m.index = i }

// mark is a Cancel of a message in flight.
type mark struct {
	id string
	at time.Time
}

// Cancel cancels message p.ID of p.Receiver: dropped while deferred, removed from the
// queue, or (held by a consumer) removed and marked. See broker.Cancels.
func (b *Broker) Cancel(ctx context.Context, p *broker.CancelParams) (res broker.Cancelled, err error) {
	if err := p.Validate(); err != nil {
		return broker.Cancelled{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.Cancelled{}, err
	}
	defer b.c.mu.Unlock()
	c := b.c
	now := c.now()
	c.trimMarks(p.Receiver, now)
	defer func() {
		if res.State != broker.CancelNotFound {
			c.finalResult(p.Receiver, p.ID, broker.ResultCancelled, 0, nil, "", "", nil)
		}
	}()
	s := c.queues[p.Receiver]
	if s == nil {
		return broker.Cancelled{State: broker.CancelNotFound}, nil
	}
	defer c.tidy(p.Receiver)
	if s.deferred != nil {
		if m := s.deferred.byID[p.ID]; m != nil {
			s.deferred.remove(m)
			env, _ := decode(m.raw)
			return broker.Cancelled{State: broker.CancelDeferred, Env: env, Deadline: m.deadline}, nil
		}
	}
	prefix := wire.IDPrefix(p.ID)
	n := 0
	for _, l := range []*list.List{&s.pending, &s.fresh, &s.high, &s.low} {
		for el := l.Front(); el != nil; el = el.Next() {
			e := el.Value.(*entry)
			if e.at.Before(p.Since) {
				continue
			}
			if n++; n > p.MaxScan {
				break
			}
			if !bytes.HasPrefix(e.raw, prefix) {
				continue
			}
			state := broker.CancelQueued
			if e.pending {
				state = broker.CancelInFlight
				c.marks[p.Receiver] = append(c.marks[p.Receiver], mark{id: p.ID, at: now})
			}
			c.removeSettled(p.Receiver, s, e.ref, now)
			env, _ := decode(e.raw)
			return broker.Cancelled{State: state, Env: env, Deadline: e.deadline}, nil
		}
	}
	if e := c.cancelWaiting(p.Receiver, prefix, now); e != nil {
		env, _ := decode(e.raw)
		return broker.Cancelled{State: broker.CancelQueued, Env: env, Deadline: e.deadline}, nil
	}
	return broker.Cancelled{State: broker.CancelNotFound}, nil
}

// trimMarks drops receiver's marks older than broker.MarkRetention.
// Callers hold mu.
func (c *core) trimMarks(receiver string, now time.Time) {
	ms := c.marks[receiver]
	i := 0
	for i < len(ms) && now.Sub(ms[i].at) > broker.MarkRetention {
		i++
	}
	if i == len(ms) {
		delete(c.marks, receiver)
		return
	}
	c.marks[receiver] = ms[i:]
}

// CancelMarks returns receiver's marks at or after since. See
// broker.Cancels.
func (b *Broker) CancelMarks(ctx context.Context, receiver string, since time.Time) ([]string, time.Time, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, time.Time{}, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, time.Time{}, err
	}
	defer b.c.mu.Unlock()
	b.c.trimMarks(receiver, b.c.now())
	var ids []string
	var latest time.Time
	for _, m := range b.c.marks[receiver] {
		if m.at.Truncate(time.Millisecond).Before(since) {
			continue
		}
		ids = append(ids, m.id)
		latest = m.at.Truncate(time.Millisecond)
	}
	return ids, latest, nil
}
