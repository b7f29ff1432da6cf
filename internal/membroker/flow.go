package membroker

// Flow control: dedup keys (broker.SendParams.DedupKey, taken by send.go),
// paused receivers (broker.Pauses) and idempotency keys
// (broker.Idempotency), each under the core's mutex, so each call is one
// atomic step as in Redis.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// dedupEntry is a dedup key: the id of the message sent with it, and when
// it expires (broker time).
type dedupEntry struct {
	id      string
	expires time.Time
}

// idemEntry is an idempotency key: the id of its message, the stored reply
// once settled, its waiters in the order they came, and when it expires
// (broker time).
type idemEntry struct {
	id      string
	reply   []byte // encoded; nil until settled
	waiters []broker.IdempotentWaiter
	expires time.Time
}

// debounceRun is a debounce key's run: the message it defers, the run's
// first send, and when the key expires (broker time).
type debounceRun struct {
	id      string
	first   time.Time
	expires time.Time
}

// keyOf is the map key of key of receiver.
func keyOf(receiver, key string) string { return receiver + "\x00" + key }

// sweepKeys drops the expired dedup and idempotency keys once their maps
// have doubled since the last sweep, so that keys nobody looks up again do
// not pile up. Callers hold mu.
func (c *core) sweepKeys(now time.Time) {
	n := len(c.dedups) + len(c.idems) + len(c.debounces)
	if n < 2*c.keysSwept+64 {
		return
	}
	for k, e := range c.debounces {
		if !now.Before(e.expires) {
			delete(c.debounces, k)
		}
	}
	for k, e := range c.dedups {
		if !now.Before(e.expires) {
			delete(c.dedups, k)
		}
	}
	for k, e := range c.idems {
		if !now.Before(e.expires) {
			delete(c.idems, k)
		}
	}
	c.keysSwept = len(c.dedups) + len(c.idems) + len(c.debounces)
}

// Pause marks receiver paused.
func (b *Broker) Pause(ctx context.Context, receiver string) error {
	return b.setPaused(ctx, receiver, true)
}

// Resume marks receiver not paused.
func (b *Broker) Resume(ctx context.Context, receiver string) error {
	return b.setPaused(ctx, receiver, false)
}

func (b *Broker) setPaused(ctx context.Context, receiver string, paused bool) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	if paused {
		b.c.paused[receiver] = true
	} else {
		delete(b.c.paused, receiver)
	}
	b.c.pauseEpoch++
	return nil
}

// PauseEpoch reads the count of Pause and Resume calls ("" for none).
func (b *Broker) PauseEpoch(ctx context.Context) (string, error) {
	if err := b.lock(ctx); err != nil {
		return "", err
	}
	defer b.c.mu.Unlock()
	if b.c.pauseEpoch == 0 {
		return "", nil
	}
	return strconv.FormatUint(b.c.pauseEpoch, 10), nil
}

// Paused reports whether each of receivers is paused.
func (b *Broker) Paused(ctx context.Context, receivers []string) ([]bool, error) {
	for _, r := range receivers {
		if err := broker.CheckName("receiver", r); err != nil {
			return nil, err
		}
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	out := make([]bool, len(receivers))
	for i, r := range receivers {
		out[i] = b.c.paused[r]
	}
	return out, nil
}

// SettleIdempotent stores reply as the reply of receiver's key unless one
// is stored, and returns the stored one and the waiters; found is false
// when the key is gone or holds another message than reply.InReplyTo. See
// broker.Idempotency.
func (b *Broker) SettleIdempotent(ctx context.Context, receiver, key string, reply *broker.Envelope) (broker.Envelope, []broker.IdempotentWaiter, bool, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := broker.CheckName("key", key); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	raw, err := b.encodeStored(reply)
	if err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	defer b.c.mu.Unlock()
	c := b.c
	e, ok := c.idems[keyOf(receiver, key)]
	if !ok || !c.now().Before(e.expires) || e.id != reply.InReplyTo {
		return broker.Envelope{}, nil, false, nil // gone, or another message's
	}
	if e.reply == nil {
		e.reply = raw
	}
	stored, err := decode(e.reply)
	if err != nil {
		return broker.Envelope{}, nil, false, fmt.Errorf("membroker: the stored reply of idempotency key %q: %w", key, err)
	}
	return stored, append([]broker.IdempotentWaiter(nil), e.waiters...), true, nil
}
