package redisbroker

import (
	"context"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/redis/rueidis"
)

// directReads is how many blocking reads of a broker may each wait on a
// connection of their own instead of in a hub: a few receivers or reply
// streams are then served as before the hubs, each message waking its
// fetch directly, with no hop through a hub's goroutine (a wake-up across
// CPUs that costs a lone requester's round trip a fifth); beyond them,
// the hubs bound the connections.
const directReads = 4

// directRead reads w.home for consumer with a blocking XREADGROUP of its
// own, up to w.count entries until w.deadline, when one of the broker's
// direct reads is free and the consumer's hub holds nothing of w.home (it
// is not in its read, nor kept for the next, nor are entries of it parked
// or given back since w's fetch began): the stream is then read by one
// reader only. ok is false when it did not read.
func (b *Broker) directRead(ctx context.Context, consumer string, w *waiter) (read []xentry, ok bool, err error) {
	select {
	case b.direct <- struct{}{}:
	default:
		return nil, false, nil
	}
	defer func() { <-b.direct }()
	if b.hubHolds(consumer, w) {
		return nil, false, nil
	}
	bctx, release := b.blockingCtx(ctx)
	defer release.release()
	read, err = asXReadOf(b.client.Do(bctx, b.client.B().Xreadgroup().Group("g", consumer).Count(int64(w.count)).
		Block(ms(max(time.Until(w.deadline), time.Millisecond))).Streams().Key(w.home).Id(">").Build()), w.home)
	switch {
	case isNoGroup(err):
		return nil, true, errNoGroup
	case rueidis.IsRedisNil(err):
		return nil, true, nil
	case err != nil && b.closing.Err() != nil:
		return nil, true, broker.ErrClosed
	}
	return read, true, err
}

// hubHolds reports whether the hub of consumer for w.home has the stream
// in its read in progress or the next, or entries of it parked, or given
// back since w's fetch began (which only the fetch script reclaims: w's
// fetch answers empty, as join does, and the next runs it).
func (b *Broker) hubHolds(consumer string, w *waiter) bool {
	stream := w.home
	k := hubKey{consumer: consumer}
	if b.cluster {
		k.slot = keyslot.Of(stream)
	}
	b.hubsMu.Lock()
	h := b.hubs[k]
	b.hubsMu.Unlock()
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, reading := h.readSet[stream]
	_, kept := h.linger[stream]
	_, parked := h.parked[stream]
	t, gave := h.gaveBack[stream]
	if reading || kept || parked || (gave && !t.Before(w.start)) {
		return true
	}
	for _, x := range h.waiters {
		if x.home == stream {
			return true
		}
	}
	return false
}
