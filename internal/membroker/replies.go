package membroker

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// timeout is a pending timeout: a timed message not yet settled.
type timeout struct {
	id       string
	deadline time.Time
	raw      []byte // the original message, for the timeout notice
	index    int    // in the heap
}

// timeoutSet is a sender's pending timeouts, by id and by deadline.
type timeoutSet struct {
	byID map[string]*timeout
	heap timeoutHeap
}

// pendingTimeouts returns sender's pending timeouts, creating them. Callers
// hold mu.
func (c *core) pendingTimeouts(sender string) *timeoutSet {
	t := c.timeouts[sender]
	if t == nil {
		t = &timeoutSet{byID: make(map[string]*timeout)}
		c.timeouts[sender] = t
	}
	return t
}

// put records (or replaces) the pending timeout of id.
func (t *timeoutSet) put(id string, deadline time.Time, raw []byte) {
	if old := t.byID[id]; old != nil {
		old.deadline, old.raw = deadline, raw
		heap.Fix(&t.heap, old.index)
		return
	}
	to := &timeout{id: id, deadline: deadline, raw: raw}
	t.byID[id] = to
	heap.Push(&t.heap, to)
}

func (t *timeoutSet) remove(to *timeout) {
	delete(t.byID, to.id)
	heap.Remove(&t.heap, to.index)
}

// timeoutHeap orders pending timeouts by deadline.
type timeoutHeap = byTime[*timeout]

func (to *timeout) at() time.Time  { return to.deadline }
func (to *timeout) setIndex(i int) { to.index = i }

// Reply appends reply to the reply stream of its receiver (the original
// sender), as mode says. ReplyTimed settles the request in the same step:
// the reply is accepted only while the request's timeout is pending and
// broker-now is before its deadline; otherwise it is dropped with
// broker.ErrLate.
func (b *Broker) Reply(ctx context.Context, reply *broker.Envelope, mode broker.ReplyMode) error {
	if mode != broker.ReplyUntimed && mode != broker.ReplyTimed {
		return fmt.Errorf("membroker: reply mode %d is not a broker.ReplyMode", mode)
	}
	raw, err := b.encodeReply(reply)
	if err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	now := c.now()
	sender := reply.Receiver
	if mode == broker.ReplyTimed {
		t := c.timeouts[sender]
		var to *timeout
		if t != nil {
			to = t.byID[reply.InReplyTo]
		}
		if to == nil || !now.Before(to.deadline) {
			return broker.ErrLate
		}
		t.remove(to)
		c.tidy(sender)
		if reply.Retention > 0 && reply.Sender != "" {
			// Recorded in the step that accepts it, as Redis does.
			c.finalResult(reply.Sender, reply.InReplyTo, 0, reply.Retention, raw, "", "", nil)
		}
	}
	c.appendReply(sender, raw, broker.KindReply, reply.InReplyTo, now)
	return nil
}

// encodeReply checks reply and encodes it.
func (b *Broker) encodeReply(reply *broker.Envelope) ([]byte, error) {
	if reply != nil {
		if err := broker.CheckName("Envelope.Receiver", reply.Receiver); err != nil {
			return nil, err
		}
	}
	return b.encodeStored(reply)
}

// encodeStored checks and encodes a reply to be stored for others (an
// idempotency key's), whose receiver each of them sets.
func (b *Broker) encodeStored(reply *broker.Envelope) ([]byte, error) {
	if reply == nil {
		return nil, errors.New("membroker: reply is nil")
	}
	if err := broker.CheckName("Envelope.InReplyTo", reply.InReplyTo); err != nil {
		return nil, err
	}
	if err := b.checkSize(reply); err != nil {
		return nil, err
	}
	return encode(reply), nil
}

// appendReply appends an entry to sender's reply stream, at now (the
// broker-now its caller judged the entry by) or the previous entry's time
// if that is later (nextReplyAt), and returns it. Callers hold mu.
func (c *core) appendReply(sender string, raw []byte, kind broker.ReplyKind, requestID string, now time.Time) *entry {
	at := c.nextReplyAt(now)
	c.lastReplyAt = at
	e := &entry{ref: c.nextRef(), raw: raw, kind: kind, requestID: requestID, at: at}
	c.replyStream(sender).add(e)
	return e
}

// ExpireTimeouts settles up to max pending timeouts of sender whose deadline
// is not after broker-now, earliest first, appending a timeout notice for
// each to the sender's reply stream. It returns how many it settled.
func (b *Broker) ExpireTimeouts(ctx context.Context, sender string, max int) (int, error) {
	if err := broker.CheckName("sender", sender); err != nil {
		return 0, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, err
	}
	defer b.c.mu.Unlock()
	c := b.c
	t := c.timeouts[sender]
	if t == nil {
		return 0, nil
	}
	now := c.now()
	n := 0
	for n < max && t.heap.Len() > 0 && !t.heap[0].deadline.After(now) {
		to := t.heap[0]
		t.remove(to)
		c.appendReply(sender, to.raw, broker.KindTimeout, to.id, now)
		n++
	}
	c.tidy(sender)
	return n, nil
}

// ReadReplies leases up to p.Max entries of p.Sender's reply stream to
// p.Consumer: first those whose lease expired, then new ones, blocking up
// to p.Block when there are none.
func (b *Broker) ReadReplies(ctx context.Context, p *broker.ReadRepliesParams) ([]broker.Reply, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return b.readReplies(ctx, p, false)
}

// readReplies reads p.Sender's reply stream; an inbox's entries are
// delivered once, in order: none is delivered again.
func (b *Broker) readReplies(ctx context.Context, p *broker.ReadRepliesParams, inbox bool) ([]broker.Reply, error) {
	sender, consumer, max, lease := p.Sender, p.Consumer, p.Max, p.Lease
	out := []broker.Reply{}
	take := func(s *stream, now time.Time) int {
		if !inbox {
			for e := range s.expired(now, func(string) bool { return false }) {
				if len(out) == max {
					return len(out)
				}
				out = b.c.leaseReply(s, e, grant{consumer, now, lease}, out)
			}
		}
		for len(out) < max && s.fresh.Len() > 0 {
			out = b.c.leaseReply(s, s.fresh.Front().Value.(*entry), grant{consumer, now, lease}, out)
		}
		return len(out)
	}
	if err := b.read(ctx, sender, b.c.replyStream, p.Block, nil, take); err != nil {
		return nil, err
	}
	return out, nil
}

// leaseReply delivers the reply entry e on g's terms and appends it to
// out. Callers hold mu.
func (c *core) leaseReply(s *stream, e *entry, g grant, out []broker.Reply) []broker.Reply {
	s.deliver(e, g.consumer, g.now, g.lease)
	env, err := decode(e.raw)
	if err != nil {
		// Only the broker writes reply entries, from envelopes it encoded.
		panic("membroker: a reply entry does not decode: " + err.Error())
	}
	return append(out, broker.Reply{Ref: e.ref, Kind: e.kind, RequestID: e.requestID, Env: env, At: e.at, Attempt: e.attempt, Part: e.part})
}

// AckReplies removes the entries refs of sender's reply stream. Unknown
// refs are ignored.
func (b *Broker) AckReplies(ctx context.Context, sender string, refs ...string) error {
	if err := broker.CheckName("sender", sender); err != nil {
		return err
	}
	return b.ackReplies(ctx, sender, refs)
}

func (b *Broker) ackReplies(ctx context.Context, sender string, refs []string) error {
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	if s := b.c.replies[sender]; s != nil {
		for _, ref := range refs {
			s.remove(ref)
		}
		b.c.tidy(sender)
	}
	return nil
}
