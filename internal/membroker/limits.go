package membroker

import (
	"context"
	"math"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// bucket is a receiver's token bucket: tokens as counted at at.
type bucket struct {
	tokens float64
	at     time.Time
}

// slotHold is how many global concurrency slots a holder holds, until when.
type slotHold struct {
	n       int
	expires time.Time
}

// TakeTokens takes tokens from p.Receiver's bucket. See broker.Limits.
func (b *Broker) TakeTokens(ctx context.Context, p *broker.TokensParams) (int, time.Duration, error) {
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, 0, err
	}
	defer b.c.mu.Unlock()
	now, burst := b.c.now(), float64(p.Burst)
	bk := b.c.buckets[p.Receiver]
	if bk == nil {
		bk = &bucket{tokens: burst, at: now}
		b.c.buckets[p.Receiver] = bk
	}
	if now.After(bk.at) {
		bk.tokens = math.Min(burst, bk.tokens+now.Sub(bk.at).Seconds()*p.Rate)
		bk.at = now
	}
	if p.Want < 0 {
		bk.tokens = math.Min(burst, bk.tokens-float64(p.Want))
		b.dropFullBucket(p.Receiver, bk, burst)
		return 0, 0, nil
	}
	took := int(math.Min(float64(p.Want), math.Floor(bk.tokens)))
	bk.tokens -= float64(took)
	if took == 0 {
		return 0, time.Duration(math.Ceil((1-bk.tokens)*1000/p.Rate)) * time.Millisecond, nil
	}
	return took, 0, nil
}

// dropFullBucket forgets a full bucket: a missing one is full.
func (b *Broker) dropFullBucket(receiver string, bk *bucket, burst float64) {
	if bk.tokens >= burst {
		delete(b.c.buckets, receiver)
	}
}

// Slots changes p.Holder's share of p.Receiver's global concurrency slots.
// See broker.Limits.
func (b *Broker) Slots(ctx context.Context, p *broker.SlotsParams) (int, int, error) {
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	if err := b.lock(ctx); err != nil {
		return 0, 0, err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	holders := b.c.slots[p.Receiver]
	if holders == nil {
		holders = make(map[string]slotHold)
		b.c.slots[p.Receiver] = holders
	}
	total := 0
	for h, s := range holders {
		if !now.Before(s.expires) {
			delete(holders, h)
			continue
		}
		total += s.n
	}
	mine := holders[p.Holder].n
	had := mine
	switch {
	case p.Delta > 0:
		mine += max(0, min(p.Delta, p.Limit-total))
	case p.Delta < 0:
		mine = max(0, mine+p.Delta)
	}
	if mine > 0 {
		holders[p.Holder] = slotHold{n: mine, expires: now.Add(p.Lease)}
	} else {
		delete(holders, p.Holder)
	}
	if len(holders) == 0 {
		delete(b.c.slots, p.Receiver)
	}
	return mine, had, nil
}
