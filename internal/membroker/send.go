package membroker

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Send sends each message of ps in one step under the core's mutex, so
// every message is one atomic step as in Redis, and a call of many is one
// too: in one process nothing fails half way, so it sets every Result or
// returns an error and sends nothing. See broker.Queue.
func (b *Broker) Send(ctx context.Context, ps []broker.SendParams) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	if err := broker.ValidateAll(ps, b.maxSize); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	for i := range ps {
		b.c.send(&ps[i])
	}
	return nil
}

// send carries out p and sets p.Result: the idempotency key first (a send
// that repeats one in use stores nothing), then the dedup key, then the
// message, deferred or queued at its level, with its pending timeout and
// the keys it takes. Callers hold mu.
func (c *core) send(p *broker.SendParams) {
	env, r := &p.Env, &p.Result
	now := c.now()
	due := now
	switch {
	case p.Delay > 0:
		due = now.Add(p.Delay)
	case p.DeliverAt.After(now):
		due = p.DeliverAt
	}
	var deadline time.Time
	switch {
	case env.Timeout > 0 && env.Route == broker.RouteInbox:
		deadline = due.Add(p.TimeoutLeft()) // see broker.SendParams.TimeoutFrom
	case env.Timeout > 0:
		deadline = due.Add(env.Timeout)
	}
	*r = broker.SendResult{ID: env.ID, Deadline: deadline}
	if c.joined(p, deadline, now) || c.duplicate(p, now) {
		return
	}
	c.sweepKeys(now)
	if p.DedupKey != "" {
		c.dedups[keyOf(env.Receiver, p.DedupKey)] = dedupEntry{id: env.ID, expires: now.Add(p.DedupTTL)}
		if p.DedupUntilSettled {
			env.DedupKey = p.DedupKey // it travels: see broker.SendParams
		}
	}
	if p.DebounceKey != "" {
		due = c.debounce(p, now)
	}
	if p.Retention > 0 {
		env.Retention = p.Retention // it travels: see broker.SendParams
		c.recordSent(p, deadline, due, now)
	}
	// An idempotent message lives as long as its key: a worker starts it
	// while its reply can still be used.
	msgDeadline := deadline
	if k := env.IdempotencyKey; k != "" {
		e := &idemEntry{id: env.ID, expires: due.Add(p.IdemTTL)}
		if env.Route == broker.RouteInbox {
			e.waiters = []broker.IdempotentWaiter{{Inbox: env.Sender, RequestID: env.ID, Deadline: deadline}}
		}
		c.idems[keyOf(env.Receiver, k)] = e
		msgDeadline = e.expires
	}
	var expiry time.Time
	switch {
	case p.Expiry > 0:
		expiry = due.Add(p.Expiry)
	case !p.ExpireAt.IsZero():
		expiry = p.ExpireAt
	}
	raw := encode(env)
	if env.Timeout > 0 && env.Route == broker.RouteSender {
		c.pendingTimeouts(env.Sender).put(env.ID, deadline, raw)
	}
	s := c.queue(env.Receiver)
	if due.After(now) {
		s.deferredSet().put(&deferredMsg{id: env.ID, due: due, deadline: msgDeadline, expiry: expiry, prio: env.Priority, group: p.GroupKey, raw: raw})
		s.wake() // blocked readers re-arm for the new due time
		r.Outcome = broker.Deferred
		return
	}
	c.place(s, env.Receiver, p.GroupKey, &entry{ref: c.nextRef(), raw: raw, deadline: msgDeadline, expiry: expiry, prio: env.Priority, at: now}, now)
	r.Outcome = broker.Queued
}

// debounce returns the due time of p, a debounced message sent at now:
// the wait after now, but no later than the max after the first send of
// its run. When the run's message is still deferred, p replaces it (it is
// dropped, never delivered); else p starts a new run. Callers hold mu.
func (c *core) debounce(p *broker.SendParams, now time.Time) time.Time {
	k := keyOf(p.Env.Receiver, p.DebounceKey)
	first := now
	if run, ok := c.debounces[k]; ok {
		if ds := c.queue(p.Env.Receiver).deferred; ds != nil {
			if m := ds.byID[run.id]; m != nil {
				ds.remove(m)
				first = run.first
			}
		}
	}
	c.debounces[k] = debounceRun{id: p.Env.ID, first: first, expires: first.Add(p.DebounceMax)}
	due := now.Add(p.DebounceWait)
	if limit := first.Add(p.DebounceMax); limit.Before(due) {
		due = limit
	}
	if due.Before(now) {
		due = now
	}
	return due
}

// joined reports whether p's idempotency key is in use, and if so sets
// p.Result: Joined, with the key's message id and its stored reply, if
// any; a send from an inbox becomes one of the key's waiters until then.
// Callers hold mu.
func (c *core) joined(p *broker.SendParams, deadline, now time.Time) bool {
	env, r := &p.Env, &p.Result
	if env.IdempotencyKey == "" {
		return false
	}
	e, ok := c.idems[keyOf(env.Receiver, env.IdempotencyKey)]
	if !ok || !now.Before(e.expires) {
		return false
	}
	r.Outcome, r.ID = broker.Joined, e.id
	switch {
	case e.reply != nil:
		stored, err := decode(e.reply)
		if err != nil {
			r.Outcome, r.Err = broker.SendFailed, fmt.Errorf("membroker: the stored reply of idempotency key %q: %w", env.IdempotencyKey, err)
			return true
		}
		r.Reply = &stored
	case env.Route == broker.RouteInbox:
		e.waiters = append(e.waiters, broker.IdempotentWaiter{Inbox: env.Sender, RequestID: env.ID, Deadline: deadline})
	}
	return true
}

// duplicate reports whether p's dedup key is taken, and if so sets
// p.Result: Duplicate, with the id of the message that took it. Callers
// hold mu.
func (c *core) duplicate(p *broker.SendParams, now time.Time) bool {
	if p.DedupKey == "" {
		return false
	}
	e, ok := c.dedups[keyOf(p.Env.Receiver, p.DedupKey)]
	if !ok || !now.Before(e.expires) {
		return false
	}
	p.Result.Outcome, p.Result.ID = broker.Duplicate, e.id
	return true
}
