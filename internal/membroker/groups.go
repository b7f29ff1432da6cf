package membroker

// Keyed groups (broker.Groups): per receiver, the configuration and, per
// key with messages waiting or out, its waiting messages in order, how
// many are out, and its token bucket. A key is forgotten once it has
// neither.

import (
	"bytes"
	"container/heap"
	"container/list"
	"context"
	"sort"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// groupSet is the groups of one receiver.
type groupSet struct {
	conf broker.GroupConfig
	keys map[string]*group
	// rated are the keys that wait only for a token, by when it is due.
	rated rateHeap
}

// group is one key of a receiver.
type group struct {
	key      string
	waiting  list.List // *entry, not yet in the queue, oldest first
	out      int       // entries in the queue or delivered, not settled
	tokens   float64   // with a rate: the bucket
	refilled time.Time // when tokens was counted
	due      time.Time // in rated: when its next token is due
	index    int       // in rated, -1 when not there
}

// rateHeap orders the keys that wait for a token by its due time.
type rateHeap = byTime[*group]

func (g *group) at() time.Time  { return g.due }
func (g *group) setIndex(i int) { g.index = i }

// groups returns receiver's groups, creating them. Callers hold mu.
func (c *core) groups(receiver string) *groupSet {
	gs := c.groupSets[receiver]
	if gs == nil {
		gs = &groupSet{conf: broker.GroupConfig{Receiver: receiver, Concurrency: 1}, keys: make(map[string]*group)}
		c.groupSets[receiver] = gs
	}
	return gs
}

// ConfigureGroups sets how receiver's groups run. See broker.Groups.
func (b *Broker) ConfigureGroups(ctx context.Context, p *broker.GroupConfig) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	if b.c.groupSets[p.Receiver] == nil && p.Concurrency == 1 && p.Rate == 0 && !p.SkipRetries {
		return nil // the defaults: nothing to keep
	}
	gs := b.c.groups(p.Receiver)
	gs.conf = *p
	for _, g := range gs.keys {
		b.c.releaseGroup(p.Receiver, gs, g, b.c.now())
	}
	return nil
}

// admit queues e, a due message of key, if its key may have one more out
// (and, with a rate, has a token); else it waits behind the key's others.
// Callers hold mu.
func (c *core) admit(receiver, key string, e *entry, now time.Time) {
	e.group = key
	gs := c.groups(receiver)
	g := gs.keys[key]
	if g == nil {
		g = &group{key: key, index: -1}
		gs.keys[key] = g
	}
	g.waiting.PushBack(e)
	c.releaseGroup(receiver, gs, g, now)
}

// releaseGroup queues the waiting messages of g that its concurrency and
// rate allow, in order, and forgets g when it has nothing left. Callers
// hold mu.
func (c *core) releaseGroup(receiver string, gs *groupSet, g *group, now time.Time) {
	for g.waiting.Len() > 0 && g.out < gs.conf.Concurrency {
		if !gs.token(g, now) {
			break
		}
		e := g.waiting.Remove(g.waiting.Front()).(*entry)
		e.ref, e.at, e.counted = c.nextRef(), now, true
		g.out++
		c.queue(receiver).add(e)
	}
	if g.out == 0 && g.waiting.Len() == 0 && g.index < 0 {
		if full, ok := gs.refill(g, now); !ok {
			// Its bucket is kept until full: a key that drains at
			// once does not get a burst for each message.
			g.due = full
			heap.Push(&gs.rated, g)
			return
		}
		delete(gs.keys, g.key)
	}
}

// refill counts g's tokens at now, and reports whether its bucket is full
// (or it has none); when not, full is when it will be.
func (gs *groupSet) refill(g *group, now time.Time) (full time.Time, ok bool) {
	rate, burst := gs.conf.Rate, float64(gs.conf.Burst)
	if rate <= 0 || g.refilled.IsZero() {
		return now, true
	}
	if now.After(g.refilled) {
		g.tokens = min(burst, g.tokens+now.Sub(g.refilled).Seconds()*rate)
		g.refilled = now
	}
	if g.tokens >= burst {
		return now, true
	}
	return now.Add(time.Duration((burst - g.tokens) / rate * float64(time.Second))), false
}

// token takes a token of g's bucket, or, without one, puts g among the
// keys that wait for one (until it is due) and reports false. Without a
// rate every message has one.
func (gs *groupSet) token(g *group, now time.Time) bool {
	rate, burst := gs.conf.Rate, float64(gs.conf.Burst)
	if rate <= 0 {
		return true
	}
	if g.refilled.IsZero() {
		g.tokens, g.refilled = burst, now
	}
	gs.refill(g, now)
	if g.tokens >= 1 {
		g.tokens--
		return true
	}
	g.due = now.Add(time.Duration((1 - g.tokens) / rate * float64(time.Second)))
	if g.index < 0 {
		heap.Push(&gs.rated, g)
	} else {
		heap.Fix(&gs.rated, g.index)
	}
	return false
}

// releaseRated releases the keys of receiver whose token came due by now.
// Callers hold mu.
func (c *core) releaseRated(receiver string, now time.Time) {
	gs := c.groupSets[receiver]
	if gs == nil {
		return
	}
	for len(gs.rated) > 0 && !gs.rated[0].due.After(now) {
		g := heap.Pop(&gs.rated).(*group)
		g.index = -1
		c.releaseGroup(receiver, gs, g, now)
	}
}

// nextRated returns when the first token that a key of receiver waits for
// is due, and false when none waits. Callers hold mu.
func (c *core) nextRated(receiver string) (time.Time, bool) {
	gs := c.groupSets[receiver]
	if gs == nil || len(gs.rated) == 0 {
		return time.Time{}, false
	}
	return gs.rated[0].due, true
}

// settleGroup counts e, a message of receiver settled for good (or, with
// skip, given back for a retry when the groups skip retries), off its
// key, and queues what the key may have next. Callers hold mu.
func (c *core) settleGroup(receiver string, e *entry, now time.Time) {
	if e.group == "" || !e.counted {
		return
	}
	e.counted = false
	gs := c.groups(receiver)
	if g := gs.keys[e.group]; g != nil {
		g.out--
		c.releaseGroup(receiver, gs, g, now)
	}
}

// cancelWaiting removes the message of receiver waiting behind its key
// whose encoding starts with prefix, and returns it (nil if none). Callers
// hold mu.
func (c *core) cancelWaiting(receiver string, prefix []byte, now time.Time) *entry {
	gs := c.groupSets[receiver]
	if gs == nil {
		return nil
	}
	for _, g := range gs.keys {
		for el := g.waiting.Front(); el != nil; el = el.Next() {
			if e := el.Value.(*entry); bytes.HasPrefix(e.raw, prefix) {
				g.waiting.Remove(el)
				c.releaseGroup(receiver, gs, g, now)
				return e
			}
		}
	}
	return nil
}

// groupStats sets the group counts of st. Callers hold mu.
func (c *core) groupStats(receiver string, st *broker.ReceiverStats) {
	if gs := c.groupSets[receiver]; gs != nil {
		for _, g := range gs.keys {
			if n := int64(g.waiting.Len()); n > 0 {
				st.GroupWaiting += n
				st.GroupKeys++
			}
		}
	}
}

// BusiestGroups returns up to n keys of receiver with the most waiting
// messages. See broker.Groups.
func (b *Broker) BusiestGroups(ctx context.Context, receiver string, n int) ([]broker.GroupLoad, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, err
	}
	if err := broker.CheckBusiest(n); err != nil {
		return nil, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	var loads []broker.GroupLoad
	if gs := b.c.groupSets[receiver]; gs != nil {
		for k, g := range gs.keys {
			if w := int64(g.waiting.Len()); w > 0 {
				loads = append(loads, broker.GroupLoad{Key: k, Waiting: w})
			}
		}
	}
	sort.Slice(loads, func(i, j int) bool {
		if loads[i].Waiting != loads[j].Waiting {
			return loads[i].Waiting > loads[j].Waiting
		}
		return loads[i].Key > loads[j].Key
	})
	return loads[:min(len(loads), n)], nil
}
