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
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the scheduled zset P:{R}:s
-- KEYS[4] -> the holders hash P:{R}:hold (field wakes: the wake entries
--            of the queue, which are not messages)
-- Returns {length, pending, dead letters, oldest queued, scheduled}:
-- length leaves out the wake entries; oldest queued is the Unix ms of the
-- first message after the group's last-delivered id (its entry id is the
-- Redis time it was added), -1 when none waits.
local pending = 0
local p = redis.pcall('XPENDING', KEYS[1], 'g')
if type(p) == 'table' and not p.err then
  pending = p[1]
end
local start = '-'
local groups = redis.pcall('XINFO', 'GROUPS', KEYS[1])
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
local first = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 4)
for _, e in ipairs(first) do
  if e[2][1] ~= 'w' then
    oldest = tonumber(string.match(e[1], '^(%d+)'))
    break
  end
end
local wakes = tonumber(redis.call('HGET', KEYS[4], 'wakes') or '0')
local length = redis.call('XLEN', KEYS[1]) - wakes
if length < 0 then length = 0 end
return {length, pending, redis.call('XLEN', KEYS[2]), oldest, redis.call('ZCARD', KEYS[3])}
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
		cmds[i] = b.client.B().EvalshaRo().Sha1(statsSHA1).Numkeys(4).Key(b.statsKeys(r)...).Build()
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
		cmds = append(cmds, b.client.B().EvalRo().Script(statsSource).Numkeys(4).Key(b.statsKeys(receivers[i])...).Build())
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
	return []string{b.keys.queue(receiver), b.keys.deadLetters(receiver), b.keys.scheduled(receiver), b.keys.holders(receiver)}
}

// statsOf reads the stats script's answer v.
func statsOf(receiver string, v []int64) (broker.ReceiverStats, error) {
	if len(v) != 5 {
		return broker.ReceiverStats{}, fmt.Errorf("redisbroker: stats: script answered %v", v)
	}
	st := broker.ReceiverStats{
		Receiver:    receiver,
		Length:      v[0],
		Pending:     v[1],
		Queued:      max(v[0]-v[1], 0),
		DeadLetters: v[2],
		Scheduled:   v[4],
	}
	if v[3] >= 0 {
		st.OldestQueued = time.UnixMilli(v[3])
	}
	return st, nil
}
