package membroker

// Streamed requests (broker.Streams): partial replies in an inbox's reply
// stream before the final outcome, each appended, and the outcome
// settled, under the one lock with the request's state.

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// streamState is the state of one streamed request.
type streamState struct {
	attempt int       // the highest attempt that sent partials
	n       int       // how many partials it sent
	done    bool      // settled: its final reply or marker is in
	until   time.Time // it expires then, with the inbox as it was at the last call
}

// inboxStreams are the states of an inbox's streamed requests. Expired
// ones are dropped when their number has doubled since the last sweep.
type inboxStreams struct {
	states  map[string]*streamState
	sweepAt int
}

// streamOf returns the state of request id of open inbox, made at the
// first call. Callers hold mu.
func (c *core) streamOf(inbox, id string, now time.Time) *streamState {
	if c.streams == nil {
		c.streams = make(map[string]*inboxStreams)
	}
	ss := c.streams[inbox]
	if ss == nil {
		ss = &inboxStreams{states: make(map[string]*streamState), sweepAt: 64}
		c.streams[inbox] = ss
	}
	if len(ss.states) >= ss.sweepAt {
		for k, st := range ss.states {
			if !now.Before(st.until) {
				delete(ss.states, k)
			}
		}
		ss.sweepAt = max(64, 2*len(ss.states))
	}
	st := ss.states[id]
	if st == nil || !now.Before(st.until) {
		st = new(streamState)
		ss.states[id] = st
	}
	st.until = c.inboxes[inbox]
	return st
}

// Partial appends a partial reply to a streamed request (see
// broker.Streams).
func (b *Broker) Partial(ctx context.Context, p *broker.PartialParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if len(p.Data) > b.maxSize {
		return fmt.Errorf("membroker: partial of %d bytes is over the limit of %d", len(p.Data), b.maxSize)
	}
	kind := p.Kind
	if kind == 0 {
		kind = broker.PartData
	}
	raw := encode(&broker.Envelope{Receiver: p.Inbox, InReplyTo: p.RequestID, Content: p.Data})
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	if _, open := c.inboxes[p.Inbox]; !open {
		return broker.ErrLate
	}
	now := c.now()
	st := c.streamOf(p.Inbox, p.RequestID, now)
	n := 0
	switch {
	case st.done || !p.Deadline.IsZero() && !c.nextReplyAt(now).Before(p.Deadline):
		return broker.ErrLate
	case p.Attempt < st.attempt:
		return fmt.Errorf("membroker: partial: a later attempt streams request %s: %w", p.RequestID, broker.ErrLeaseLost)
	case p.Attempt == st.attempt:
		n = st.n
	}
	if n >= p.Max {
		return broker.ErrPartialCap
	}
	e := c.appendReply(p.Inbox, raw, broker.KindPartial, p.RequestID, now)
	e.attempt, e.part = p.Attempt, kind
	st.attempt, st.n = p.Attempt, n+1
	return nil
}

// ReplyStream appends the final reply to a streamed request and settles
// it (see broker.Streams); an accepted reply with a Retention is recorded
// on its request's record (receiver reply.Sender) in the same step, as
// ReplyInbox records one.
func (b *Broker) ReplyStream(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	raw, err := b.encodeReply(reply)
	if err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	if _, open := c.inboxes[reply.Receiver]; !open {
		return broker.ErrLate
	}
	now := c.now()
	st := c.streamOf(reply.Receiver, reply.InReplyTo, now)
	if st.done || !deadline.IsZero() && !c.nextReplyAt(now).Before(deadline) {
		return broker.ErrLate
	}
	c.appendReply(reply.Receiver, raw, broker.KindReply, reply.InReplyTo, now)
	st.done = true
	c.recordReply(reply, raw)
	return nil
}

// GiveUpStream appends the marker of a streamed request and settles it
// (see broker.Streams).
func (b *Broker) GiveUpStream(ctx context.Context, inbox, id string) (broker.Reply, error) {
	return b.giveUp(ctx, inbox, id, true)
}

// nextReplyAt is the time appendReply gives an entry appended now.
// Callers hold mu.
func (c *core) nextReplyAt(now time.Time) time.Time {
	if now.Before(c.lastReplyAt) {
		return c.lastReplyAt
	}
	return now
}
