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

// BeginIdempotent starts an idempotent request: one script, idem_begin,
// in the receiver's slot (the idempotency key carries the receiver's hash
// tag). The request's deadline is computed as SendRequest computes it,
// from this client's estimate of Redis time, and recorded with the waiter.
func (b *Broker) BeginIdempotent(ctx context.Context, p *broker.BeginIdempotentParams) (time.Time, *broker.Envelope, error) {
	if err := p.Validate(); err != nil {
		return time.Time{}, nil, err
	}
	if err := b.check(); err != nil {
		return time.Time{}, nil, err
	}
	env := p.Env
	if err := broker.CheckSend(env, b.maxSize); err != nil {
		return time.Time{}, nil, fmt.Errorf("redisbroker: %w", err)
	}
	env.FromInbox = true
	env.IdempotencyKey = p.Key
	var deadline time.Time
	if env.Timeout > 0 {
		now, err := b.estimateNow(ctx)
		if err != nil {
			return time.Time{}, nil, err
		}
		deadline = now.Add(env.Timeout).Truncate(time.Millisecond)
	}
	waiter := "0:" + env.Sender
	if !deadline.IsZero() {
		waiter = strconv.FormatInt(deadline.UnixMilli(), 10) + ":" + env.Sender
	}
	defer b.leveled(ctx, env)
	data := rueidis.BinaryString(wire.Encode(env))
	keys := []string{b.keys.queueAt(env.Receiver, env.Priority), b.keys.idempotency(env.Receiver, p.Key)}
	rep, err := scriptIdemBegin.Exec(ctx, b.client, keys, []string{data, env.ID, waiter, msString(p.TTL)}).ToString()
	if err != nil {
		if !mayHaveRun(err) {
			deadline = time.Time{}
		}
		return deadline, nil, b.fail(ctx, "send", err) // see broker.Inbox.SendRequest
	}
	if rep == "" {
		return deadline, nil, nil
	}
	stored, err := wire.DecodeString(rep)
	if err != nil {
		return deadline, nil, fmt.Errorf("redisbroker: the stored reply of idempotency key %q: %w", p.Key, err)
	}
	return deadline, &stored, nil
}

// SettleIdempotent stores reply as the reply of receiver's key unless one
// is stored (script idem_settle), and returns the stored one and the
// waiters.
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
	if err := b.checkReply(reply); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	data := rueidis.BinaryString(wire.Encode(reply))
	v, err := scriptIdemSettle.Exec(ctx, b.client, []string{b.keys.idempotency(receiver, key)}, []string{data}).ToArray()
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

// scriptIdemBegin starts an idempotent request.
var scriptIdemBegin = rueidis.NewLuaScript(`-- idem_begin
-- KEYS[1] -> the receiver's queue stream P:{R}:q
-- KEYS[2] -> the idempotency key P:{R}:idem:<key> (hash: id, rep, w:<request id>)
-- ARGV[1] -> encoded envelope (carrying the key)
-- ARGV[2] -> request id
-- ARGV[3] -> "<deadline ms>:<inbox>", the waiter (deadline 0: none)
-- ARGV[4] -> ttl in ms
-- The key's stored reply, if any, is returned and nothing is written.
-- Else the request becomes a waiter of the key; if the key did not exist,
-- it is created (expiring in ttl) and the message is queued with deadline
-- d = now + ttl, the end of the key's window.
-- Returns the stored reply, or "" (no envelope encodes as "").
local rep = redis.call('HGET', KEYS[2], 'rep')
if rep then
  return rep
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'w:' .. ARGV[2], ARGV[3])
  return ''
end
` + luaNow + `
redis.call('HSET', KEYS[2], 'id', ARGV[2], 'w:' .. ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
redis.call('XADD', KEYS[1], '*', 'm', ARGV[1], 'd', string.format('%.0f', now + tonumber(ARGV[4])))
return ''
`)

// scriptIdemSettle stores the reply of an idempotency key.
var scriptIdemSettle = rueidis.NewLuaScript(`-- idem_settle
-- KEYS[1] -> the idempotency key P:{R}:idem:<key>
-- ARGV[1] -> encoded reply envelope
-- Stores ARGV[1] as the key's reply unless one is stored already (the
-- first stays). Waiters stay too: a redelivered message sends the same
-- reply to the same waiters, who take the first they read.
-- Returns {} when the key is gone, else {stored reply, then pairs of
-- request id, "<deadline ms>:<inbox>" for each waiter}.
local all = redis.call('HGETALL', KEYS[1])
if #all == 0 then
  return {}
end
local rep
for i = 1, #all, 2 do
  if all[i] == 'rep' then rep = all[i + 1] end
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
