package membroker

import (
	"container/list"
	"context"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// deadEntry is one dead letter.
type deadEntry struct {
	ref      string
	raw      []byte
	deadline time.Time
	expiry   time.Time
	prio     int    // the message's priority level
	group    string // the message's group key, "" if none
	reason   string
	attempts int
	at       time.Time
	elem     *list.Element
}

// deadList is a receiver's dead letters, oldest first.
type deadList struct {
	byRef map[string]*deadEntry
	order list.List
}

// deadLetter appends the queue entry e (already removed from its queue) to
// receiver's dead letters. Callers hold mu.
func (c *core) deadLetter(receiver string, e *entry, reason string, now time.Time) {
	d := c.dead[receiver]
	if d == nil {
		d = &deadList{byRef: make(map[string]*deadEntry)}
		c.dead[receiver] = d
	}
	de := &deadEntry{ref: c.nextRef(), raw: e.raw, deadline: e.deadline, expiry: e.expiry, prio: e.prio, group: e.group, reason: reason, attempts: e.count, at: now}
	de.elem = d.order.PushBack(de)
	d.byRef[de.ref] = de
}

// pick returns the dead letters refs (all when refs is empty), oldest first
// when all.
func (d *deadList) pick(refs []string) []*deadEntry {
	var out []*deadEntry
	if len(refs) == 0 {
		for el := d.order.Front(); el != nil; el = el.Next() {
			out = append(out, el.Value.(*deadEntry))
		}
		return out
	}
	seen := make(map[string]bool, len(refs))
	for _, ref := range refs {
		if de := d.byRef[ref]; de != nil && !seen[ref] {
			seen[ref] = true
			out = append(out, de)
		}
	}
	return out
}

func (d *deadList) remove(de *deadEntry) {
	delete(d.byRef, de.ref)
	d.order.Remove(de.elem)
}

// DeadLetters lists up to max dead letters of receiver, oldest first.
func (b *Broker) DeadLetters(ctx context.Context, receiver string, max int) ([]broker.DeadLetter, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return nil, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	return b.c.deadLettersAfter(receiver, 0, max), nil
}

// DeadLettersAfter lists up to p.Max dead letters of p.Receiver whose ref
// comes after p.After, oldest first.
func (b *Broker) DeadLettersAfter(ctx context.Context, p *broker.DeadLettersParams) ([]broker.DeadLetter, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	var after uint64
	if p.After != "" {
		n, err := strconv.ParseUint(p.After, 10, 64)
		if err != nil {
			return nil, broker.ErrBadRef
		}
		after = n
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	return b.c.deadLettersAfter(p.Receiver, after, p.Max), nil
}

// deadLettersAfter lists up to max dead letters of receiver whose ref is
// greater than after, oldest first. Callers hold mu.
func (c *core) deadLettersAfter(receiver string, after uint64, max int) []broker.DeadLetter {
	out := []broker.DeadLetter{}
	d := c.dead[receiver]
	if d == nil {
		return out
	}
	for el := d.order.Front(); el != nil && len(out) < max; el = el.Next() {
		de := el.Value.(*deadEntry)
		if ref, _ := strconv.ParseUint(de.ref, 10, 64); ref <= after {
			continue
		}
		dl := broker.DeadLetter{Ref: de.ref, Reason: de.reason, Attempts: de.attempts, At: de.at}
		env, err := decode(de.raw)
		if err != nil {
			dl.Raw = append([]byte(nil), de.raw...)
		} else {
			dl.Env = env
			dl.Env.Priority = de.prio
		}
		out = append(out, dl)
	}
	return out
}

// RetryDeadLetters moves the dead letters refs (all when refs is empty) of
// receiver back to its queue as new entries, so their attempts start again
// at 1; a message keeps its deadline. Entries that do not decode stay. It
// returns how many moved.
func (b *Broker) RetryDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, err
	}
	defer b.c.mu.Unlock()
	d := b.c.dead[receiver]
	if d == nil {
		return 0, nil
	}
	n := 0
	for _, de := range d.pick(refs) {
		if _, err := decode(de.raw); err != nil {
			continue
		}
		d.remove(de)
		now := b.c.now()
		b.c.place(b.c.queue(receiver), receiver, de.group, &entry{ref: b.c.nextRef(), raw: de.raw, deadline: de.deadline, expiry: de.expiry, prio: de.prio, at: now}, now)
		n++
	}
	b.c.tidy(receiver)
	return n, nil
}

// PurgeDeadLetters deletes the dead letters refs (all when refs is empty)
// of receiver and returns how many it deleted.
func (b *Broker) PurgeDeadLetters(ctx context.Context, receiver string, refs ...string) (int, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, err
	}
	defer b.c.mu.Unlock()
	d := b.c.dead[receiver]
	if d == nil {
		return 0, nil
	}
	picked := d.pick(refs)
	for _, de := range picked {
		d.remove(de)
	}
	b.c.tidy(receiver)
	return len(picked), nil
}
