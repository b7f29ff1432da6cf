package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// SettleIdempotent stores reply as the reply of receiver's key unless one
// is stored (script idem_settle), and returns the stored one and the
// waiters; found is false when the key is gone or holds another message
// than reply.InReplyTo.
func (b *Broker) SettleIdempotent(ctx context.Context, receiver, key string, reply *broker.Envelope) (broker.Envelope, []broker.IdempotentWaiter, bool, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := broker.CheckName("key", key); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := b.check(); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := b.checkStored(reply); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	data := rueidis.BinaryString(wire.Encode(reply))
	v, err := scriptIdemSettle.Exec(ctx, b.client, []string{b.keys.idempotency(receiver, key)}, []string{data, reply.InReplyTo}).ToArray()
	if err != nil {
		return broker.Envelope{}, nil, false, b.fail(ctx, "reply", err)
	}
	if len(v) == 0 {
		return broker.Envelope{}, nil, false, nil
	}
	raw, err := v[0].ToString()
	if err != nil {
		return broker.Envelope{}, nil, false, fmt.Errorf("redisbroker: idem_settle: %w", err)
	}
	stored, err := wire.DecodeString(raw)
	if err != nil {
		return broker.Envelope{}, nil, false, fmt.Errorf("redisbroker: the stored reply of idempotency key %q: %w", key, err)
	}
	waiters := make([]broker.IdempotentWaiter, 0, (len(v)-1)/2)
	for i := 1; i+1 < len(v); i += 2 {
		id, _ := v[i].ToString()
		w, _ := v[i+1].ToString()
		ms, inbox, ok := strings.Cut(w, ":")
		if !ok || id == "" || inbox == "" {
			continue // not written by idem_begin
		}
		wt := broker.IdempotentWaiter{Inbox: inbox, RequestID: id}
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
			wt.Deadline = time.UnixMilli(n)
		}
		waiters = append(waiters, wt)
	}
	return stored, waiters, true, nil
}

// scriptIdemSettle stores the reply of an idempotency key.
var scriptIdemSettle = rueidis.NewLuaScript(`-- idem_settle
-- KEYS[1] -> the idempotency key P:{R}:idem:<key>
-- ARGV[1] -> encoded reply envelope
-- ARGV[2] -> the id of the message it answers
-- Stores ARGV[1] as the key's reply unless one is stored already (the
-- first stays). Waiters stay too: a redelivered message sends the same
-- reply to the same waiters, who take the first they read. Only the key's
-- own message (field id) stores or reads its reply: a run of an earlier
-- message, whose window passed while it ran and whose key a later send
-- took, finds the key gone.
-- Returns {} when the key is gone or holds another message, else {stored
-- reply, then pairs of request id, "<deadline ms>:<inbox>" for each
-- waiter}.
local all = redis.call('HGETALL', KEYS[1])
local rep, id
for i = 1, #all, 2 do
  if all[i] == 'rep' then rep = all[i + 1] end
  if all[i] == 'id' then id = all[i + 1] end
end
if id ~= ARGV[2] then
  return {}
end
if not rep then
  redis.call('HSET', KEYS[1], 'rep', ARGV[1])
  rep = ARGV[1]
end
local out = {rep}
for i = 1, #all, 2 do
  if string.sub(all[i], 1, 2) == 'w:' then
    out[#out + 1] = string.sub(all[i], 3)
    out[#out + 1] = all[i + 1]
  end
end
return out
`)
