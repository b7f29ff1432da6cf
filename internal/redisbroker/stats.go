package redisbroker

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// statsSource reads a consistent snapshot of a receiver's queue.
const statsSource = `-- stats
-- KEYS[1] -> the queue stream P:{R}:q (the normal level)
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the high level stream P:{R}:qh
-- KEYS[4] -> the low level stream P:{R}:ql
-- KEYS[5] -> the pause flag P:{R}:paused
-- KEYS[6] -> the deferred zset P:{R}:deferred
-- KEYS[7] -> the holders hash P:{R}:hold (field wakes: the wake entries
--            of the normal level, which are not messages)
-- KEYS[8] -> the expired count P:{R}:expired
-- KEYS[9] -> the groups hash P:{R}:g (field w: the keyed messages waiting)
-- KEYS[10] -> the groups' zset of keys with waiting messages P:{R}:gw
-- Returns {length, pending, dead letters, oldest queued, high length,
-- high pending, low length, low pending, paused, deferred, expired, group
-- waiting, group keys}: length and
-- pending are those of
-- the normal level, length without the wake entries; oldest queued is the
-- Unix ms of the first message after
-- the group's last-delivered id (its entry id is the Redis time it was
-- added) of any level, -1 when none waits; paused is 1 when the flag
-- exists.
local function level(q)
  if redis.call('EXISTS', q) == 0 then
    return 0, 0, -1
  end
  local pending = 0
  local p = redis.pcall('XPENDING', q, 'g')
  if type(p) == 'table' and not p.err then
    pending = p[1]
  end
  local start = '-'
  local groups = redis.pcall('XINFO', 'GROUPS', q)
  if type(groups) == 'table' and not groups.err then
    for _, g in ipairs(groups) do
      local name, last
      for i = 1, #g, 2 do
        if g[i] == 'name' then name = g[i + 1] end
        if g[i] == 'last-delivered-id' then last = g[i + 1] end
      end
      if name == 'g' and last then start = '(' .. last end
    end
  end
  local oldest = -1
  local first = redis.call('XRANGE', q, start, '+', 'COUNT', 4)
  for _, e in ipairs(first) do
    if e[2][1] ~= 'w' then
      oldest = tonumber(string.match(e[1], '^(%d+)'))
      break
    end
  end
  return redis.call('XLEN', q), pending, oldest
end
local n, np, oldest = level(KEYS[1])
n = n - tonumber(redis.call('HGET', KEYS[7], 'wakes') or '0')
if n < 0 then n = 0 end
local h, hp, ho = level(KEYS[3])
local l, lp, lo = level(KEYS[4])
for _, o in ipairs({ho, lo}) do
  if o >= 0 and (oldest < 0 or o < oldest) then oldest = o end
end
return {n, np, redis.call('XLEN', KEYS[2]), oldest, h, hp, l, lp, redis.call('EXISTS', KEYS[5]), redis.call('ZCARD', KEYS[6]),
  tonumber(redis.call('GET', KEYS[8]) or '0'), tonumber(redis.call('HGET', KEYS[9], 'w') or '0'), redis.call('ZCARD', KEYS[10])}
`

var (
	scriptStats = rueidis.NewLuaScriptReadOnly(statsSource)
	statsSHA1   = func() string { h := sha1.Sum([]byte(statsSource)); return hex.EncodeToString(h[:]) }()
)

// Stats returns a snapshot of receiver's queue, read in one script.
// Acknowledged entries are deleted, so every entry in the queue is either
// waiting or pending: Queued is Length - Pending.
func (b *Broker) Stats(ctx context.Context, receiver string) (broker.ReceiverStats, error) {
	if err := b.check(); err != nil {
		return broker.ReceiverStats{}, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return broker.ReceiverStats{}, err
	}
	v, err := scriptStats.Exec(ctx, b.client, b.statsKeys(receiver), nil).AsIntSlice()
	if err != nil {
		return broker.ReceiverStats{}, b.fail(ctx, "stats", err)
	}
	return statsOf(receiver, v)
}

// StatsMany returns the stats of each receiver, in order: one EVALSHA_RO
// of the stats script per receiver, all in one pipeline (rueidis sends a
// Cluster's to each node in parallel). Entries whose node does not know
// the script yet (NOSCRIPT, after a restart) are sent again with EVAL_RO,
// together.
func (b *Broker) StatsMany(ctx context.Context, receivers []string) ([]broker.ReceiverStats, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for _, r := range receivers {
		if err := broker.CheckName("receiver", r); err != nil {
			return nil, err
		}
	}
	out := make([]broker.ReceiverStats, len(receivers))
	if len(receivers) == 0 {
		return out, nil
	}
	cmds := make(rueidis.Commands, len(receivers))
	for i, r := range receivers {
		keys := b.statsKeys(r)
		cmds[i] = b.client.B().EvalshaRo().Sha1(statsSHA1).Numkeys(int64(len(keys))).Key(keys...).Build()
	}
	var again []int
	for i, res := range b.client.DoMulti(ctx, cmds...) {
		v, err := res.AsIntSlice()
		if re, ok := rueidis.IsRedisErr(err); ok && re.IsNoScript() {
			again = append(again, i)
			continue
		}
		if err != nil {
			return nil, b.fail(ctx, "stats", err)
		}
		if out[i], err = statsOf(receivers[i], v); err != nil {
			return nil, err
		}
	}
	if len(again) == 0 {
		return out, nil
	}
	cmds = cmds[:0]
	for _, i := range again {
		keys := b.statsKeys(receivers[i])
		cmds = append(cmds, b.client.B().EvalRo().Script(statsSource).Numkeys(int64(len(keys))).Key(keys...).Build())
	}
	for j, res := range b.client.DoMulti(ctx, cmds...) {
		v, err := res.AsIntSlice()
		if err != nil {
			return nil, b.fail(ctx, "stats", err)
		}
		i := again[j]
		if out[i], err = statsOf(receivers[i], v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (b *Broker) statsKeys(receiver string) []string {
	return []string{b.keys.queue(receiver), b.keys.deadLetters(receiver),
		b.keys.queueAt(receiver, broker.PriorityHigh), b.keys.queueAt(receiver, broker.PriorityLow),
		b.keys.paused(receiver), b.keys.deferred(receiver), b.keys.holders(receiver), b.keys.expired(receiver),
		b.keys.groups(receiver), b.keys.groupWaits(receiver)}
}

// statsOf reads the stats script's answer v.
func statsOf(receiver string, v []int64) (broker.ReceiverStats, error) {
	if len(v) != 13 {
		return broker.ReceiverStats{}, fmt.Errorf("redisbroker: stats: script answered %v", v)
	}
	st := broker.ReceiverStats{
		Receiver:     receiver,
		Length:       v[0] + v[4] + v[6],
		Pending:      v[1] + v[5] + v[7],
		DeadLetters:  v[2],
		QueuedHigh:   max(v[4]-v[5], 0),
		QueuedLow:    max(v[6]-v[7], 0),
		Paused:       v[8] == 1,
		Deferred:     v[9],
		Expired:      v[10],
		GroupWaiting: v[11],
		GroupKeys:    v[12],
	}
	st.Queued = max(v[0]-v[1], 0) + st.QueuedHigh + st.QueuedLow
	if v[3] >= 0 {
		st.OldestQueued = time.UnixMilli(v[3])
	}
	return st, nil
}
