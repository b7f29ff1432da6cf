package membroker

// The inbox: the private reply address of a requester (broker.Inbox), an
// open reply stream with an expiry, read once in order.

import (
	"context"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// ReplyInbox appends reply to its inbox's reply stream while the inbox is
// open, and accepts it when its time is before deadline (or deadline is
// zero); an accepted reply with a Retention is recorded on its request's
// record (receiver reply.Sender) in the same step. See broker.Broker.
func (b *Broker) ReplyInbox(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	raw, err := b.encodeReply(reply)
	if err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	if _, open := b.c.inboxes[reply.Receiver]; !open {
		return broker.ErrLate
	}
	e := b.c.appendReply(reply.Receiver, raw, broker.KindReply, reply.InReplyTo, b.c.now())
	if !deadline.IsZero() && !e.at.Before(deadline) {
		return broker.ErrLate
	}
	b.c.recordReply(reply, raw)
	return nil
}

// recordReply records reply, encoded raw, which its inbox accepted, on its
// request's record (receiver reply.Sender) when it has a Retention, as the
// Redis broker does in the step that accepts it. Callers hold mu.
func (c *core) recordReply(reply *broker.Envelope, raw []byte) {
	if reply.Retention > 0 && reply.Sender != "" {
		c.finalResult(reply.Sender, reply.InReplyTo, 0, reply.Retention, raw, "", "", nil)
	}
}

// GiveUp appends a marker for request id to inbox's reply stream while the
// inbox is open. See broker.Broker.
func (b *Broker) GiveUp(ctx context.Context, inbox, id string) (broker.Reply, error) {
	return b.giveUp(ctx, inbox, id, false)
}

// giveUp is GiveUp, which also settles the streamed request id when
// stream is set (GiveUpStream).
func (b *Broker) giveUp(ctx context.Context, inbox, id string, stream bool) (broker.Reply, error) {
	if err := broker.CheckName("inbox", inbox); err != nil {
		return broker.Reply{}, err
	}
	if err := broker.CheckName("id", id); err != nil {
		return broker.Reply{}, err
	}
	env := broker.Envelope{ID: id, Sender: inbox}
	raw := encode(&env)
	if err := b.lock(ctx); err != nil {
		return broker.Reply{}, err
	}
	defer b.c.mu.Unlock()
	if _, open := b.c.inboxes[inbox]; !open {
		return broker.Reply{}, broker.ErrLate
	}
	e := b.c.appendReply(inbox, raw, broker.KindTimeout, id, b.c.now())
	if stream {
		b.c.streamOf(inbox, id, e.at).done = true
	}
	return broker.Reply{Ref: e.ref, Kind: e.kind, RequestID: id, Env: env, At: e.at}, nil
}

// KeepInbox opens inbox for ReplyInbox and GiveUp, or renews it, until
// ttl from now (broker clock); then its reply stream is deleted. Expired
// state is deleted by the next call through any handle.
func (b *Broker) KeepInbox(ctx context.Context, inbox string, ttl time.Duration) error {
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	at := c.now().Add(ttl)
	c.inboxes[inbox] = at
	if c.nextExpiry.IsZero() || at.Before(c.nextExpiry) {
		c.nextExpiry = at
	}
	return nil
}

// CloseInbox deletes inbox's reply stream now and closes it.
func (b *Broker) CloseInbox(ctx context.Context, inbox string) error {
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	b.c.dropInbox(inbox)
	return nil
}

// expireInboxes deletes the state of the inboxes whose expiry is not after
// now. Callers hold mu.
func (c *core) expireInboxes(now time.Time) {
	if now.Before(c.nextExpiry) {
		return
	}
	c.nextExpiry = time.Time{}
	for s, at := range c.inboxes {
		if !now.Before(at) {
			c.dropInbox(s)
			continue
		}
		if c.nextExpiry.IsZero() || at.Before(c.nextExpiry) {
			c.nextExpiry = at
		}
	}
}

// dropInbox deletes inbox's reply stream and closes it. Readers blocked
// on the stream wake and find a new, empty one. Callers hold mu.
func (c *core) dropInbox(inbox string) {
	delete(c.inboxes, inbox)
	delete(c.streams, inbox)
	if s := c.replies[inbox]; s != nil {
		delete(c.replies, inbox)
		s.wake()
	}
}

// inboxLease is the lease of an inbox's entries as its reader holds them:
// they are never delivered again, so it only bounds how long the reader
// waits before it looks again at the stream.
const inboxLease = time.Minute

// ReadInbox delivers up to p.Max entries of inbox's reply stream, each
// once, in order, blocking up to block when there are none.
func (b *Broker) ReadInbox(ctx context.Context, inbox string, max int, block time.Duration) ([]broker.Reply, error) {
	if err := broker.CheckName("inbox", inbox); err != nil {
		return nil, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return nil, err
	}
	return b.readReplies(ctx, &broker.ReadRepliesParams{Sender: inbox, Consumer: "inbox", Max: max, Block: block, Lease: inboxLease}, true)
}

// AckInbox removes the entries refs of inbox's reply stream. Unknown refs
// are ignored.
func (b *Broker) AckInbox(ctx context.Context, inbox string, refs ...string) error {
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	return b.ackReplies(ctx, inbox, refs)
}
