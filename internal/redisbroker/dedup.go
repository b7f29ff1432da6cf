package redisbroker

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// SendDedup queues p.Env unless p.Key is taken for its receiver: one
// script, send_dedup, in the receiver's slot (the dedup key carries the
// receiver's hash tag).
func (b *Broker) SendDedup(ctx context.Context, p *broker.SendDedupParams) (string, bool, error) {
	if err := p.Validate(); err != nil {
		return "", false, err
	}
	if err := b.check(); err != nil {
		return "", false, err
	}
	if err := broker.CheckSend(p.Env, b.maxSize); err != nil {
		return "", false, fmt.Errorf("redisbroker: %w", err)
	}
	env := p.Env
	defer b.leveled(ctx, env)
	data := rueidis.BinaryString(wire.Encode(env))
	keys := []string{b.keys.queueAt(env.Receiver, env.Priority), b.keys.dedup(env.Receiver, p.Key)}
	v, err := scriptSendDedup.Exec(ctx, b.client, keys, []string{data, env.ID, msString(p.TTL)}).ToArray()
	if err != nil {
		return "", false, b.fail(ctx, "send", err)
	}
	if len(v) != 2 {
		return "", false, fmt.Errorf("redisbroker: send_dedup answered %d values", len(v))
	}
	queued, err := v[0].AsInt64()
	if err != nil {
		return "", false, fmt.Errorf("redisbroker: send_dedup: %w", err)
	}
	id, err := v[1].ToString()
	if err != nil {
		return "", false, fmt.Errorf("redisbroker: send_dedup: %w", err)
	}
	return id, queued == 0, nil
}

// scriptSendDedup queues a message unless its dedup key is taken.
var scriptSendDedup = rueidis.NewLuaScript(`-- send_dedup
-- KEYS[1] -> the receiver's queue stream P:{R}:q
-- KEYS[2] -> the dedup key P:{R}:dd:<key> (string: the id sent with it)
-- ARGV[1] -> encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> ttl in ms
-- Returns {1, id} when it queued the message and took the key for ttl,
-- {0, first id} when the key was taken (nothing written).
local first = redis.call('GET', KEYS[2])
if first then
  return {0, first}
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('XADD', KEYS[1], '*', 'm', ARGV[1])
return {1, ARGV[2]}
`)
