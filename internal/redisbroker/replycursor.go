package redisbroker

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// A read of a reply stream is an XREADGROUP (or the fetch script) that
// Redis serves by moving the entries it returns to the pending list of the
// consumer. When the connection breaks after Redis served it (a reset, a
// cut, a read cancelled), its answer is lost: the entries are delivered to
// the consumer and never reached it, and without more they stay pending
// until its lease (30 s for a sender's replies) lets a fetch reclaim them,
// holding up the reply or the timeout notice of a timed message that
// long. So ReadReplies keeps what it handed on (replyCursor) and, after a
// call that failed without an answer from Redis (Broker.lostReads), first
// reads its consumer's pending list again and hands on the entries it
// holds that were never handed on (recoverReplies).

// replyCursor is what ReadReplies handed on of one reply stream.
type replyCursor struct {
	mu sync.Mutex
	// out holds the entries ReadReplies returned that AckReplies has not
	// deleted yet: they are pending, but handed on.
	out map[string]struct{}
	// acked holds the entries AckReplies deleted while recovering is set:
	// a read of the pending list may have seen them before they went.
	acked      map[string]struct{}
	recovering bool
	// epochs holds, per consumer, Broker.lostReads as it was when its
	// pending list was last read again (or when it first read).
	epochs map[string]uint64
}

// replyCursor returns the cursor of stream, made at the first call.
func (b *Broker) replyCursor(stream string) *replyCursor {
	if v, ok := b.replyCursors.Load(stream); ok {
		return v.(*replyCursor)
	}
	v, _ := b.replyCursors.LoadOrStore(stream, &replyCursor{out: map[string]struct{}{}, epochs: map[string]uint64{}})
	return v.(*replyCursor)
}

// handed records that entries were handed on.
func (c *replyCursor) handed(entries []entry) {
	if len(entries) == 0 {
		return
	}
	c.mu.Lock()
	for _, e := range entries {
		c.out[e.id] = struct{}{}
	}
	c.mu.Unlock()
}

// deleted records that refs were acknowledged and deleted.
func (c *replyCursor) deleted(refs []string) {
	c.mu.Lock()
	for _, ref := range refs {
		delete(c.out, ref)
		if c.recovering {
			c.acked[ref] = struct{}{}
		}
	}
	c.mu.Unlock()
}

// due reports whether consumer's pending list should be read again, and
// the epoch to record once it was: lostReads moved since it last was.
func (c *replyCursor) due(consumer string, lost uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.epochs[consumer]
	if !ok {
		c.epochs[consumer] = lost // nothing of this broker's was lost before
		return false
	}
	return e != lost
}

// recoveryDue reports whether consumer's pending list of stream, a reply
// stream, is due to be read again (see replyCursor.due); false for a
// stream ReadReplies never read.
func (b *Broker) recoveryDue(stream, consumer string) bool {
	v, ok := b.replyCursors.Load(stream)
	if !ok {
		return false
	}
	c := v.(*replyCursor)
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.epochs[consumer]
	return ok && e != b.lostReads.Load()
}

// recoverReplies reads p.Consumer's pending entries of st's reply stream
// again, when a call failed without an answer since it last did (see
// replyCursor), and returns those that ReadReplies never handed on, in
// the order of their ids. done is false when there was nothing to read
// again, or it must wait: the consumer's hub holds the stream (its read in
// progress covers it, or entries of it are parked there), whose entries
// would come twice; a later call reads again. Meanwhile a blocking read of
// the stream through the hub does not linger there once answered
// (waiter.noLinger), so that the hub lets go of it.
func (b *Broker) recoverReplies(ctx context.Context, st *streamState, c *replyCursor, p *broker.ReadRepliesParams) ([]entry, bool, error) {
	stream := st.keys.stream
	lost := b.lostReads.Load()
	if !c.due(p.Consumer, lost) || b.hubHolds(p.Consumer, &waiter{home: stream, start: time.Now()}) {
		return nil, false, nil
	}
	c.mu.Lock()
	c.recovering, c.acked = true, map[string]struct{}{}
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.recovering, c.acked = false, nil
		c.mu.Unlock()
	}()
	var read []xentry
	var err error
	after := "0-0"
	complete := true
	var found []entry
	pending := make(map[string]struct{})
	for {
		// XREADGROUP with an id reads the consumer's pending list after it.
		read, err = asXReadOf(b.client.Do(ctx, b.client.B().Xreadgroup().Group("g", p.Consumer).Count(int64(p.Max)).
			Streams().Key(stream).Id(after).Build()), stream)
		switch {
		case isNoGroup(err) || rueidis.IsRedisNil(err):
			read, err = nil, nil
		case err != nil:
			return nil, true, b.fail(ctx, "read replies", err)
		}
		c.mu.Lock()
		for _, e := range read {
			pending[e.ID] = struct{}{}
			_, out := c.out[e.ID]
			_, acked := c.acked[e.ID]
			if !out && !acked && !e.deleted {
				found = append(found, entry{id: e.ID, attempt: 1, fields: e.fields})
			}
		}
		c.mu.Unlock()
		if len(read) < p.Max || len(found) >= p.Max {
			complete = len(read) < p.Max
			break
		}
		after = read[len(read)-1].ID
	}
	complete = complete && len(found) <= p.Max
	if complete {
		c.mu.Lock()
		c.epochs[p.Consumer] = lost
		if len(c.epochs) == 1 {
			// The whole pending list of the stream's one consumer was
			// read: what it no longer holds was deleted otherwise
			// (buried), or claimed away, and needs no keeping.
			for id := range c.out {
				if _, ok := pending[id]; !ok {
					delete(c.out, id)
				}
			}
		}
		c.mu.Unlock()
	}
	if len(found) == 0 {
		return nil, false, nil
	}
	if len(found) > p.Max {
		found = found[:p.Max] // the others come at the next call: not complete
	}
	return found, true, nil
}
