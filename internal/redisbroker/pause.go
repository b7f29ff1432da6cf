package redisbroker

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// Pause sets receiver's pause flag, P:{R}:paused, then bumps the pause
// epoch (bumpPauseEpoch).
func (b *Broker) Pause(ctx context.Context, receiver string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	if err := b.client.Do(ctx, b.client.B().Set().Key(b.keys.paused(receiver)).Value("1").Build()).Error(); err != nil {
		return b.fail(ctx, "pause", err)
	}
	return b.bumpPauseEpoch(ctx, "pause")
}

// Resume deletes receiver's pause flag, then bumps the pause epoch.
func (b *Broker) Resume(ctx context.Context, receiver string) error {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := b.check(); err != nil {
		return err
	}
	if err := b.client.Do(ctx, b.client.B().Del().Key(b.keys.paused(receiver)).Build()).Error(); err != nil {
		return b.fail(ctx, "resume", err)
	}
	return b.bumpPauseEpoch(ctx, "resume")
}

// bumpPauseEpoch sets the pause epoch, P:{pause}:epoch, to a new random
// value, after the flag was written (a separate command: on a Cluster the
// two keys live in different slots). A random value rather than a counter:
// a counter restarts from 1 after Redis lost its data, and could then
// repeat the value a reader saw before.
func (b *Broker) bumpPauseEpoch(ctx context.Context, op string) error {
	var buf [12]byte
	_, _ = rand.Read(buf[:]) // never fails (crypto/rand)
	err := b.client.Do(ctx, b.client.B().Set().Key(b.keys.pauseEpoch()).Value(hex.EncodeToString(buf[:])).Build()).Error()
	return b.failIf(ctx, op, err)
}

// PauseEpoch reads the pause epoch: one GET; "" when the key is missing.
func (b *Broker) PauseEpoch(ctx context.Context) (string, error) {
	if err := b.check(); err != nil {
		return "", err
	}
	v, err := b.client.Do(ctx, b.client.B().Get().Key(b.keys.pauseEpoch()).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	if err != nil {
		return "", b.fail(ctx, "pause epoch", err)
	}
	return v, nil
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
