package membroker

import (
	"context"

	"github.com/diskerhq/disker/internal/broker"
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
