package membroker

import (
	"bytes"
	"container/list"
	"context"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// StatsMany returns the stats of each receiver, in order, under one lock.
func (b *Broker) StatsMany(ctx context.Context, receivers []string) ([]broker.ReceiverStats, error) {
	for _, r := range receivers {
		if err := broker.CheckName("receiver", r); err != nil {
			return nil, err
		}
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	out := make([]broker.ReceiverStats, len(receivers))
	for i, r := range receivers {
		out[i] = b.c.stats(r)
	}
	return out, nil
}

// Fate finds message p.ID in p.Receiver's queue or dead letters, reading
// at most p.MaxScan entries of each added since p.Since, as the Redis
// broker does.
func (b *Broker) Fate(ctx context.Context, p *broker.FateParams) (broker.Fate, error) {
	if err := p.Validate(); err != nil {
		return broker.Fate{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.Fate{}, err
	}
	defer b.c.mu.Unlock()
	prefix := wire.IDPrefix(p.ID)
	complete := true
	if s := b.c.queues[p.Receiver]; s != nil {
		var found *entry
		n := 0
		for _, l := range []*list.List{&s.pending, &s.high, &s.fresh, &s.low} {
			for el := l.Front(); el != nil && found == nil; el = el.Next() {
				e := el.Value.(*entry)
				if e.at.Before(p.Since) {
					continue
				}
				if n++; n > p.MaxScan {
					break
				}
				if bytes.HasPrefix(e.raw, prefix) {
					found = e
				}
			}
		}
		switch {
		case found != nil && found.pending:
			return broker.Fate{State: broker.StatePending, Ref: found.ref, Attempts: found.count, At: found.at}, nil
		case found != nil:
			return broker.Fate{State: broker.StateQueued, Ref: found.ref, At: found.at}, nil
		}
		complete = n < p.MaxScan
	}
	if d := b.c.dead[p.Receiver]; d != nil {
		n := 0
		for el := d.order.Front(); el != nil; el = el.Next() {
			de := el.Value.(*deadEntry)
			if de.at.Before(p.Since) {
				continue
			}
			if n++; n > p.MaxScan {
				break
			}
			if bytes.HasPrefix(de.raw, prefix) {
				return broker.Fate{State: broker.StateDeadLettered, Ref: de.ref, Attempts: de.attempts, Reason: de.reason, At: de.at}, nil
			}
		}
		complete = complete && n < p.MaxScan
	}
	if complete {
		return broker.Fate{State: broker.StateGone}, nil
	}
	return broker.Fate{State: broker.StateUnknown}, nil
}
