package membroker

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// lockEntry is a receiver's exclusive lock.
type lockEntry struct {
	owner   string
	expires time.Time
}

// workerEntry is a worker's registration.
type workerEntry struct {
	info    broker.WorkerInfo
	expires time.Time
}

// Acquire takes or renews the exclusive lock of receiver for owner for ttl.
// It returns false while another owner holds an unexpired lock.
func (b *Broker) Acquire(ctx context.Context, receiver, owner string, ttl time.Duration) (bool, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return false, err
	}
	if err := broker.CheckName("owner", owner); err != nil {
		return false, err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return false, err
	}
	if err := b.lock(ctx); err != nil {
		return false, err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	if l, ok := b.c.locks[receiver]; ok && l.owner != owner && now.Before(l.expires) {
		return false, nil
	}
	b.c.locks[receiver] = lockEntry{owner: owner, expires: now.Add(ttl)}
	return true, nil
}

// Release gives up owner's lock of receiver, if owner holds it.
func (b *Broker) Release(ctx context.Context, receiver, owner string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := broker.CheckName("owner", owner); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	if l, ok := b.c.locks[receiver]; ok && l.owner == owner {
		delete(b.c.locks, receiver)
	}
	return nil
}

// Heartbeat records info as live for ttl, with LastSeen set to broker-now.
// It also forgets expired workers and locks.
func (b *Broker) Heartbeat(ctx context.Context, info broker.WorkerInfo, ttl time.Duration) error {
	if err := broker.CheckName("WorkerInfo.ID", info.ID); err != nil {
		return err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	sent := time.Now()
	now := b.c.now()
	b.offset.Measure(sent, now, time.Now())
	b.c.sweep(now)
	info = copyInfo(info)
	info.LastSeen = now
	b.c.workers[info.ID] = workerEntry{info: info, expires: now.Add(ttl)}
	for _, r := range info.Receivers {
		b.c.vouched[vouchKey(r, info.ID)] = now.Add(ttl)
	}
	return nil
}

// vouchKey is the key of core.vouched for worker id's deliveries of
// receiver.
func vouchKey(receiver, id string) string { return receiver + "\x00" + id }

// lapsed reports whether the heartbeat of owner, a holder of receiver's
// deliveries other than consumer, has stopped vouching for them at now.
// Callers hold mu.
func (c *core) lapsed(receiver, consumer, owner string, now time.Time) bool {
	until, ok := c.vouched[vouchKey(receiver, owner)]
	return ok && owner != consumer && !now.Before(until)
}

// sweep forgets expired workers and locks. Callers hold mu.
func (c *core) sweep(now time.Time) {
	for id, w := range c.workers {
		if !now.Before(w.expires) {
			delete(c.workers, id)
		}
	}
	for r, l := range c.locks {
		if !now.Before(l.expires) {
			delete(c.locks, r)
		}
	}
}

// Deregister removes worker id from the registry.
func (b *Broker) Deregister(ctx context.Context, id string) error {
	if err := broker.CheckName("id", id); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	delete(b.c.workers, id)
	return nil
}

// Workers lists the live workers, by id.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	b.c.sweep(b.c.now())
	out := make([]broker.WorkerInfo, 0, len(b.c.workers))
	for _, id := range slices.Sorted(maps.Keys(b.c.workers)) {
		out = append(out, copyInfo(b.c.workers[id].info))
	}
	return out, nil
}

func copyInfo(info broker.WorkerInfo) broker.WorkerInfo {
	info.Receivers = slices.Clone(info.Receivers)
	info.Concurrency = maps.Clone(info.Concurrency)
	return info
}

// Receivers lists, sorted, the receivers served by a live worker or holding
// messages or dead letters.
func (b *Broker) Receivers(ctx context.Context) ([]string, error) {
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	c := b.c
	c.sweep(c.now())
	set := make(map[string]struct{})
	for r, s := range c.queues {
		if len(s.entries) > 0 || s.deferred != nil && len(s.deferred.byID) > 0 {
			set[r] = struct{}{}
		}
	}
	for r := range c.dead {
		set[r] = struct{}{}
	}
	for r, gs := range c.groupSets {
		if len(gs.keys) > 0 {
			set[r] = struct{}{}
		}
	}
	for _, w := range c.workers {
		for _, r := range w.info.Receivers {
			set[r] = struct{}{}
		}
	}
	return slices.Sorted(maps.Keys(set)), nil
}

// Stats returns a snapshot of receiver's queue.
func (b *Broker) Stats(ctx context.Context, receiver string) (broker.ReceiverStats, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return broker.ReceiverStats{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.ReceiverStats{}, err
	}
	defer b.c.mu.Unlock()
	return b.c.stats(receiver), nil
}

// stats returns a snapshot of receiver's queue. Callers hold mu.
func (c *core) stats(receiver string) broker.ReceiverStats {
	st := broker.ReceiverStats{Receiver: receiver}
	if s := c.queues[receiver]; s != nil {
		st.Queued = int64(s.queued())
		st.QueuedHigh, st.QueuedLow = int64(s.high.Len()), int64(s.low.Len())
		st.Pending = int64(s.pending.Len())
		st.Length = st.Queued + st.Pending
		if at, ok := s.oldestQueued(); ok {
			st.OldestQueued = at
		}
		if s.deferred != nil {
			st.Deferred = int64(len(s.deferred.byID))
		}
	}
	if d := c.dead[receiver]; d != nil {
		st.DeadLetters = int64(d.order.Len())
	}
	st.Paused = c.paused[receiver]
	c.groupStats(receiver, &st)
	st.Expired = c.expired[receiver]
	return st
}
