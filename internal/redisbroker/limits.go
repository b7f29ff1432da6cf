package redisbroker

import (
	"context"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/redis/rueidis"
)

// TakeTokens takes tokens from p.Receiver's bucket with one script
// (tokens), on Redis time. See broker.Limits.
func (b *Broker) TakeTokens(ctx context.Context, p *broker.TokensParams) (int, time.Duration, error) {
	if err := b.check(); err != nil {
		return 0, 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	res, err := scriptTokens.Exec(ctx, b.client, []string{b.keys.rate(p.Receiver)},
		[]string{strconv.FormatFloat(p.Rate, 'g', -1, 64), strconv.Itoa(p.Burst), strconv.Itoa(p.Want)}).AsIntSlice()
	if err != nil {
		return 0, 0, b.fail(ctx, "take tokens", err)
	}
	if len(res) != 2 {
		return 0, 0, b.fail(ctx, "take tokens", errMalformed("tokens"))
	}
	return int(res[0]), time.Duration(res[1]) * time.Millisecond, nil
}

// Slots changes p.Holder's share of p.Receiver's global concurrency slots
// with one script (slots), on Redis time. See broker.Limits.
func (b *Broker) Slots(ctx context.Context, p *broker.SlotsParams) (int, int, error) {
	if err := b.check(); err != nil {
		return 0, 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	res, err := scriptSlots.Exec(ctx, b.client, []string{b.keys.slots(p.Receiver), b.keys.slotCounts(p.Receiver)},
		[]string{p.Holder, strconv.Itoa(p.Delta), strconv.Itoa(p.Limit), msString(p.Lease)}).AsIntSlice()
	if err != nil {
		return 0, 0, b.fail(ctx, "slots", err)
	}
	if len(res) != 2 {
		return 0, 0, b.fail(ctx, "slots", errMalformed("slots"))
	}
	return int(res[0]), int(res[1]), nil
}

type errMalformed string

func (e errMalformed) Error() string {
	return "the " + string(e) + " script answered a malformed reply"
}

// scriptTokens takes tokens from a receiver's bucket (WithRateLimit).
var scriptTokens = rueidis.NewLuaScript(`-- tokens
-- KEYS[1] -> the bucket P:{R}:rate ("t" tokens, "at" unix ms)
-- ARGV[1] -> rate: tokens per second (> 0, may be fractional)
-- ARGV[2] -> burst: the most tokens the bucket holds (>= 1)
-- ARGV[3] -> want: tokens to take (> 0), or to put back (< 0)
-- The bucket refills by rate x the Redis time elapsed since "at", up to
-- burst; a missing bucket is full. The key expires once the bucket would be
-- full again, so an idle receiver leaves nothing.
-- Returns {took, wait ms}: wait is how long until the next token when
-- took is 0, else 0.
` + luaNow + `
local rate, burst, want = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local v = redis.call('HMGET', KEYS[1], 't', 'at')
local tokens, at = tonumber(v[1]), tonumber(v[2])
if tokens == nil or at == nil then
  tokens, at = burst, now
end
if now > at then
  tokens = math.min(burst, tokens + (now - at) * rate / 1000)
  at = now
end
local took, wait = 0, 0
if want > 0 then
  took = math.min(want, math.floor(tokens))
  tokens = tokens - took
  if took == 0 then
    wait = math.ceil((1 - tokens) * 1000 / rate)
  end
else
  tokens = math.min(burst, tokens - want)
end
redis.call('HSET', KEYS[1], 't', string.format('%.6f', tokens), 'at', string.format('%.0f', at))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * 1000 / rate) + 1000)
return {took, wait}
`)

// scriptSlots takes, gives back or renews a holder's global concurrency
// slots (WithGlobalConcurrency).
var scriptSlots = rueidis.NewLuaScript(`-- slots
-- KEYS[1] -> the holders zset P:{R}:slots (member holder, score lease end)
-- KEYS[2] -> the counts hash P:{R}:slotn (holder -> slots held)
-- ARGV[1] -> holder
-- ARGV[2] -> delta: > 0 takes up to that many more, < 0 gives back, 0 none
-- ARGV[3] -> limit: how many the holders may hold together
-- ARGV[4] -> lease ms
-- First frees the slots of holders whose lease ended (Redis time). Takes
-- only while the holders together hold fewer than the limit. Renews the
-- holder's lease to now + lease. The keys expire with the latest lease.
-- Returns {held, had}: how many slots the holder holds after, and how
-- many it held as the call began (0 when its lease had ended).
` + luaNow + `
local zs, hs, holder = KEYS[1], KEYS[2], ARGV[1]
local delta, limit, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for _, h in ipairs(redis.call('ZRANGEBYSCORE', zs, '-inf', nowStr)) do
  redis.call('ZREM', zs, h)
  redis.call('HDEL', hs, h)
end
local mine = tonumber(redis.call('HGET', hs, holder)) or 0
local had = mine
if delta > 0 then
  local total = 0
  for _, n in ipairs(redis.call('HVALS', hs)) do total = total + tonumber(n) end
  mine = mine + math.max(0, math.min(delta, limit - total))
elseif delta < 0 then
  mine = math.max(0, mine + delta)
end
if mine > 0 then
  redis.call('HSET', hs, holder, mine)
  redis.call('ZADD', zs, string.format('%.0f', now + lease), holder)
else
  redis.call('HDEL', hs, holder)
  redis.call('ZREM', zs, holder)
end
local last = redis.call('ZRANGE', zs, -1, -1, 'WITHSCORES')
if last[2] then
  local ttl = math.max(1, tonumber(last[2]) - now + 1000)
  redis.call('PEXPIRE', zs, ttl)
  redis.call('PEXPIRE', hs, ttl)
end
return {mine, had}
`)
