package membroker

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// promote queues the deferred messages of s that are due at now, each at
// its priority level. Callers hold mu.
func (c *core) promote(receiver string, s *stream, now time.Time) {
	if s.deferred == nil {
		return
	}
	for len(s.deferred.heap) > 0 && !s.deferred.heap[0].due.After(now) {
		it := s.deferred.heap[0]
		s.deferred.remove(it)
		c.place(s, receiver, it.group, &entry{ref: c.nextRef(), raw: it.raw, deadline: it.deadline, expiry: it.expiry, prio: it.prio, at: now}, now)
	}
}

func (b *Broker) checkSize(env *broker.Envelope) error {
	if err := broker.CheckSize(env, b.maxSize); err != nil {
		return fmt.Errorf("membroker: %w", err)
	}
	return nil
}

// InjectRaw appends raw to receiver's queue as an entry's encoded message,
// as a foreign or corrupt writer might. It exists for tests of undecodable
// entries (it implements brokertest.RawInjector).
func (b *Broker) InjectRaw(ctx context.Context, receiver string, raw []byte) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	b.c.queue(receiver).add(&entry{ref: b.c.nextRef(), raw: append([]byte(nil), raw...), at: b.c.now()})
	return nil
}

// Fetch leases up to p.Max messages of p.Receiver to p.Consumer: first
// pending ones idle for at least p.Lease (their lease expired, or their
// retry delay passed), then new ones, blocking up to p.Block when there are
// none. A message that would be delivered more than p.MaxAttempts times (0
// means no limit), or that does not decode, goes to the dead-letter list
// instead.
func (b *Broker) Fetch(ctx context.Context, p *broker.FetchParams) ([]broker.Delivery, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p.Wait != nil {
		// Nothing is read ahead here: the fetch looks as usual.
		p.Wait.Cancel()
		p.Wait = nil
	}
	receiver, consumer, max, lease, maxAttempts := p.Receiver, p.Consumer, p.Max, p.Lease, p.MaxAttempts
	c := b.c
	out := []broker.Delivery{}
	// Priority levels, highest first: in each, reclaimed entries, then
	// new ones.
	take := func(s *stream, now time.Time) int {
		c.promote(receiver, s, now)
		c.releaseRated(receiver, now)
		lapsed := func(owner string) bool { return c.lapsed(receiver, consumer, owner, now) }
		for _, prio := range [...]int{broker.PriorityHigh, broker.PriorityNormal, broker.PriorityLow} {
			for e := range s.expired(now, lapsed) {
				if len(out) == max {
					return len(out)
				}
				if e.prio != prio {
					continue
				}
				if maxAttempts > 0 && e.count >= maxAttempts {
					c.removeSettled(receiver, s, e.ref, now)
					reason := fmt.Sprintf("gave up after %d deliveries (max attempts %d): lease expired or retried", e.count, maxAttempts)
					c.deadLetter(receiver, e, reason, now)
					c.deadResult(receiver, e, reason)
					continue
				}
				if d, ok := c.lease(receiver, s, e, grant{consumer, now, lease}); ok {
					out = append(out, d)
				}
			}
			fresh := s.freshOf(prio)
			for len(out) < max && fresh.Len() > 0 {
				if d, ok := c.lease(receiver, s, fresh.Front().Value.(*entry), grant{consumer, now, lease}); ok {
					out = append(out, d)
				}
			}
		}
		return len(out)
	}
	err := b.read(ctx, receiver, c.queue, p.Block, p, take)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// deadResult writes the final state of the retained record of e's
// message, if it has one: dead-lettered (by Fetch, after its attempts),
// with reason as its error, and its attempts. Callers hold mu.
func (c *core) deadResult(receiver string, e *entry, reason string) {
	env, err := decode(e.raw)
	if err != nil {
		return
	}
	c.finalResult(receiver, env.ID, broker.ResultDeadLettered, 0, nil, "dead_letter", reason,
		func(r *broker.ResultRecord) { r.Attempts = e.count })
}

// grant is a delivery's terms: to whom, when, and for how long.
type grant struct {
	consumer string
	now      time.Time
	lease    time.Duration
}

// lease delivers e on g's terms and returns the delivery, or dead-letters
// e when its message does not decode. Callers hold mu.
func (c *core) lease(receiver string, s *stream, e *entry, g grant) (broker.Delivery, bool) {
	s.deliver(e, g.consumer, g.now, g.lease)
	env, err := decode(e.raw)
	if err != nil {
		c.removeSettled(receiver, s, e.ref, g.now)
		c.deadLetter(receiver, e, "undecodable message: "+err.Error(), g.now)
		return broker.Delivery{}, false
	}
	env.Priority = e.prio
	return broker.Delivery{Env: env, Ref: e.ref, Deadline: e.deadline, Expiry: e.expiry, GroupKey: e.group, Attempt: e.count}, true
}

// read runs take on the stream of name (got by get, which creates it) until
// take delivers something or block is over. Between tries it waits for a
// new entry, for the first pending entry to become reclaimable, for ctx or
// for Close; never by polling. A fetch with Wake (p, nil for others) does
// not wait: it leaves the wait as p.Wait (park).
func (b *Broker) read(ctx context.Context, name string, get func(string) *stream, block time.Duration, p *broker.FetchParams, take func(*stream, time.Time) int) error {
	c := b.c
	var blockTimer *time.Timer
	for {
		if err := b.lock(ctx); err != nil {
			return err
		}
		s := get(name)
		now := c.now()
		if n := take(s, now); n > 0 || block <= 0 {
			c.tidy(name)
			c.mu.Unlock()
			return nil
		}
		due, hasDue := s.nextDue(now)
		if at, ok := c.nextRated(name); ok && (!hasDue || at.Sub(now) < due) {
			due, hasDue = at.Sub(now), true // a key's token: see releaseRated
		}
		if p != nil && p.Wake != nil {
			if hasDue {
				block = min(block, max(due, 0))
			}
			b.park(name, s, p, block)
			c.mu.Unlock()
			return nil
		}
		if blockTimer == nil {
			blockTimer = time.NewTimer(block)
			defer blockTimer.Stop()
		}
		// The reader learns of every lease taken while it waits: the entry
		// was added after it began to wait, which woke it, and it looks
		// again under the lock before it waits once more.
		ch := s.watch()
		c.mu.Unlock()

		again, err := b.wait(ctx, ch, due, hasDue, blockTimer)

		c.mu.Lock()
		s.unwatch()
		c.tidy(name)
		c.mu.Unlock()
		if err != nil || !again {
			return err
		}
	}
}

// Extend renews the leases of the refs p.Consumer holds and returns the
// refs it no longer holds.
func (b *Broker) Extend(ctx context.Context, p *broker.ExtendParams) ([]string, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	receiver, consumer, refs := p.Receiver, p.Consumer, p.Refs
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	var lost []string
	s := b.c.queues[receiver]
	now := b.c.now()
	for _, ref := range refs {
		var e *entry
		if s != nil {
			e = s.owned(ref, consumer)
		}
		if e == nil {
			lost = append(lost, ref)
			continue
		}
		e.delivered, e.lease = now, p.Lease
	}
	return lost, nil
}

// Ack removes the entries refs from receiver's queue for good. Unknown refs
// are ignored.
func (b *Broker) Ack(ctx context.Context, receiver string, refs ...string) error {
	_, err := b.remove(ctx, receiver, refs)
	return err
}

// Drop removes refs of receiver's queue as Ack does, and counts those it
// removed as expired (ReceiverStats.Expired).
func (b *Broker) Drop(ctx context.Context, receiver string, refs ...string) error {
	n, err := b.remove(ctx, receiver, refs)
	if n > 0 {
		b.c.mu.Lock()
		b.c.expired[receiver] += int64(n)
		b.c.mu.Unlock()
	}
	return err
}

// ReleaseDedup frees receiver's dedup key if message id holds it. See
// broker.Queue.
func (b *Broker) ReleaseDedup(ctx context.Context, receiver, key, id string) error {
	for _, a := range [][2]string{{"receiver", receiver}, {"key", key}, {"id", id}} {
		if err := broker.CheckName(a[0], a[1]); err != nil {
			return err
		}
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	k := keyOf(receiver, key)
	if e, ok := b.c.dedups[k]; ok && e.id == id {
		delete(b.c.dedups, k)
	}
	return nil
}

// remove deletes refs of receiver's queue and returns how many it found.
func (b *Broker) remove(ctx context.Context, receiver string, refs []string) (int, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, err
	}
	defer b.c.mu.Unlock()
	n := 0
	if s := b.c.queues[receiver]; s != nil {
		now := b.c.now()
		for _, ref := range refs {
			if b.c.removeSettled(receiver, s, ref, now) != nil {
				n++
			}
		}
		b.c.tidy(receiver)
	}
	return n, nil
}

// removeSettled deletes the entry ref of s, the queue of receiver, settled
// for good, and returns it (nil if absent): its group, if any, may queue
// its next. Callers hold mu.
func (c *core) removeSettled(receiver string, s *stream, ref string, now time.Time) *entry {
	e := s.remove(ref)
	if e != nil {
		c.settleGroup(receiver, e, now)
	}
	return e
}

// place queues e in s, the queue of receiver, or, when it has a group
// key, in its group (see admit). Callers hold mu.
func (c *core) place(s *stream, receiver, group string, e *entry, now time.Time) {
	if group != "" {
		c.admit(receiver, group, e, now)
		return
	}
	s.add(e)
}

// Retry makes p.Ref, which p.Consumer holds, reclaimable by a Fetch with
// p.Lease after p.Delay: as if it had last been delivered Lease-Delay ago.
// It returns broker.ErrLeaseLost when the consumer does not hold the ref.
func (b *Broker) Retry(ctx context.Context, p *broker.RetryParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	receiver, consumer, ref, delay, lease := p.Receiver, p.Consumer, p.Ref, p.Delay, p.Lease
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	s := b.c.queues[receiver]
	if s == nil || s.owned(ref, consumer) == nil {
		return broker.ErrLeaseLost
	}
	e := s.entries[ref]
	e.delivered, e.lease = b.c.now().Add(delay-lease), lease
	if p.Uncounted && e.count > 0 {
		e.count--
	}
	if gs := b.c.groupSets[receiver]; gs != nil && gs.conf.SkipRetries && !p.Uncounted {
		b.c.settleGroup(receiver, e, b.c.now()) // its key goes on: see broker.GroupConfig
	}
	s.wake() // blocked readers must re-arm for the new due time
	return nil
}

// DeadLetter removes d.Ref from receiver's queue and appends its message to
// the receiver's dead letters with reason. It returns broker.ErrLeaseLost
// when the entry is no longer in the queue (acknowledged or dead-lettered
// already).
func (b *Broker) DeadLetter(ctx context.Context, receiver string, d broker.Delivery, reason string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := broker.CheckName("Delivery.Ref", d.Ref); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	s := b.c.queues[receiver]
	if s == nil {
		return broker.ErrLeaseLost
	}
	e := b.c.removeSettled(receiver, s, d.Ref, b.c.now())
	if e == nil {
		return broker.ErrLeaseLost
	}
	b.c.deadLetter(receiver, e, reason, b.c.now())
	b.c.tidy(receiver)
	if d.Env.Retention > 0 {
		b.c.finalResult(receiver, d.Env.ID, broker.ResultDeadLettered, d.Env.Retention, nil, "dead_letter", reason,
			func(r *broker.ResultRecord) { r.Attempts = d.Attempt })
	}
	return nil
}
