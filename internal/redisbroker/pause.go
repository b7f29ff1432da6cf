package redisbroker

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// Pause sets receiver's pause flag, P:{R}:paused.
func (b *Broker) Pause(ctx context.Context, receiver string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	return b.failIf(ctx, "pause", b.client.Do(ctx, b.client.B().Set().Key(b.keys.paused(receiver)).Value("1").Build()).Error())
}

// Resume deletes receiver's pause flag.
func (b *Broker) Resume(ctx context.Context, receiver string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	return b.failIf(ctx, "resume", b.client.Do(ctx, b.client.B().Del().Key(b.keys.paused(receiver)).Build()).Error())
}

// Paused reads the pause flags of receivers: one EXISTS each, in one
// pipeline (a Cluster client sends each node its part).
func (b *Broker) Paused(ctx context.Context, receivers []string) ([]bool, error) {
	for _, r := range receivers {
		if err := broker.CheckName("receiver", r); err != nil {
			return nil, err
		}
	}
	if err := b.check(); err != nil {
		return nil, err
	}
	out := make([]bool, len(receivers))
	if len(receivers) == 0 {
		return out, nil
	}
	cmds := make(rueidis.Commands, len(receivers))
	for i, r := range receivers {
		cmds[i] = b.client.B().Exists().Key(b.keys.paused(r)).Build()
	}
	for i, res := range b.client.DoMulti(ctx, cmds...) {
		n, err := res.AsInt64()
		if err != nil {
			return nil, b.fail(ctx, "paused", err)
		}
		out[i] = n > 0
	}
	return out, nil
}
