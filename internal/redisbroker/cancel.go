package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// Cancel cancels message p.ID of p.Receiver with one script,
// cancel_message: a deferred message is dropped; otherwise the queue
// is read from p.Since for the message's entry, which is deleted (and, if
// a consumer held it, acknowledged and marked in P:{R}:x for its holder).
// See broker.Cancels.
func (b *Broker) Cancel(ctx context.Context, p *broker.CancelParams) (broker.Cancelled, error) {
	if err := b.check(); err != nil {
		return broker.Cancelled{}, err
	}
	if err := p.Validate(); err != nil {
		return broker.Cancelled{}, err
	}
	start := "-"
	if !p.Since.IsZero() {
		start = strconv.FormatInt(max(p.Since.UnixMilli(), 0), 10)
	}
	r := p.Receiver
	v, err := scriptCancelMessage.Exec(ctx, b.client,
		[]string{b.keys.deferred(r), b.keys.deferredMessages(r), b.keys.queue(r), b.keys.retries(r), b.keys.cancelMarks(r),
			b.keys.queueAt(r, broker.PriorityHigh), b.keys.queueAt(r, broker.PriorityLow),
			b.keys.legacyDeferred(r), b.keys.legacyDeferredMessages(r), b.keys.legacyRetries(r),
			b.keys.queue(r), b.keys.queueAt(r, broker.PriorityHigh), b.keys.queueAt(r, broker.PriorityLow), b.keys.holders(r),
			b.keys.groups(r), b.keys.groupWaits(r), b.keys.groupTimes(r),
			b.keys.result(r, p.ID), b.keys.resultIndex(r), b.keys.resultSizes(r)},
		[]string{p.ID, string(wire.IDPrefix(p.ID)), start, strconv.Itoa(p.MaxScan), msString(broker.MarkRetention),
			b.keys.result(r, ""), b.maxResults}).ToArray()
	if err != nil {
		return broker.Cancelled{}, b.fail(ctx, "cancel", err)
	}
	if len(v) != 4 && len(v) != 5 {
		return broker.Cancelled{}, fmt.Errorf("redisbroker: cancel: script answered %d values", len(v))
	}
	if first, _ := v[3].AsInt64(); first == 1 {
		b.levelsChanged(ctx, r)
	}
	state, _ := v[0].AsInt64()
	if state == 0 {
		return broker.Cancelled{State: broker.CancelNotFound}, nil
	}
	if len(v) == 5 {
		if reported, _ := v[4].AsInt64(); reported == 2 {
			// A cancelled batch child's report is in the outbox: hand it
			// over now rather than at the receiver's next sweep (see
			// SettleBatchReports).
			_ = b.SettleBatchReports(ctx, r)
		}
	}
	m, _ := v[1].ToString()
	d, _ := v[2].ToString()
	c := broker.Cancelled{State: broker.CancelState(state)}
	// An envelope that does not decode was cancelled all the same; the
	// caller gets what could be read of it.
	c.Env, _ = wire.DecodeString(m)
	if d != "" {
		c.Deadline, _ = unixMS(d)
	}
	return c, nil
}

// CancelMarks reads the marks of Cancel for receiver since since:
// ZRANGEBYSCORE P:{R}:x since +inf WITHSCORES. See broker.Cancels.
func (b *Broker) CancelMarks(ctx context.Context, receiver string, since time.Time) ([]string, time.Time, error) {
	if err := b.check(); err != nil {
		return nil, time.Time{}, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, time.Time{}, err
	}
	min := "-inf"
	if !since.IsZero() {
		min = strconv.FormatInt(since.UnixMilli(), 10)
	}
	zs, err := b.client.Do(ctx, b.client.B().Zrangebyscore().Key(b.keys.cancelMarks(receiver)).Min(min).Max("+inf").
		Withscores().Build()).AsZScores()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, time.Time{}, nil
		}
		return nil, time.Time{}, b.fail(ctx, "cancel marks", err)
	}
	var latest time.Time
	ids := make([]string, 0, len(zs))
	for _, z := range zs {
		ids = append(ids, z.Member)
		if t := time.UnixMilli(int64(z.Score)); t.After(latest) {
			latest = t
		}
	}
	return ids, latest, nil
}

// scriptCancelMessage cancels a message of a receiver.
var scriptCancelMessage = rueidis.NewLuaScript(`-- cancel_message
-- KEYS[1] -> the deferred zset P:{R}:deferred
-- KEYS[2] -> the deferred hash P:{R}:deferred:m
-- KEYS[3] -> the queue stream P:{R}:q (the normal level)
-- KEYS[4] -> the retries zset P:{R}:retries
-- KEYS[5] -> the cancellation marks zset P:{R}:x (member message id, score
--            the mark's time, unix ms)
-- KEYS[6] -> the high level stream P:{R}:qh
-- KEYS[7] -> the low level stream P:{R}:ql
-- KEYS[8..10] -> the former names of KEYS[1], KEYS[2] and KEYS[4]
--            (migrate.go), whose leftovers are moved first
-- KEYS[11..17] -> the group keys (Broker.groupKeys)
-- ARGV[1] -> message id
-- ARGV[2] -> the start of the message's encoding (wire.IDPrefix)
-- ARGV[3] -> the first queue entry id to read
-- ARGV[4] -> the most entries read in each level stream
-- KEYS[18..20] -> the message's record P:{R}:res:<id>, the index P:{R}:res
--            and sizes P:{R}:resn (results.go)
-- ARGV[5] -> how long marks are kept, ms
-- ARGV[6] -> the records' prefix P:{R}:res:; ARGV[7] -> the cap on the
--            receiver's retained bytes
-- A deferred message is dropped (1), as is one waiting behind its key
-- (gcancel: 2); else the level streams are read
-- (normal, high, low), in chunks, for an entry whose m starts with the
-- prefix: one not delivered is deleted (2), one delivered and not
-- acknowledged is acknowledged and deleted, and marked (3); the marks
-- expire ARGV[5] after the last one. A keyed message's entry is settled
-- for its key, which may queue the key's next. Returns {state, envelope,
-- deadline or "", first, reported}, state 0 when not found; first is 1
-- when a message was queued at the high or low level whose stream held
-- nothing. A message found that has a record gets its final state there
-- (cancelled), in this step: reported is resFinal's answer (2: a batch
-- child's outcome went to the outbox).
` + luaNow + luaDeferred + luaQueueMessage + luaGroups + luaMigrate + luaResult + `
migrate(KEYS[8], KEYS[9], KEYS[10], KEYS[1], KEYS[2], KEYS[4])
local id = ARGV[1]
local function found(r)
  r[5] = resFinal({rec = KEYS[18], idx = KEYS[19], n = KEYS[20], pre = ARGV[6], cap = ARGV[7]}, id, 'c', '', {}, {})
  return r
end
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', string.format('%.0f', now - tonumber(ARGV[5])))
local v = redis.call('HGET', KEYS[2], id)
if v then
  local _, d, _, env = deferredValue(v)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return found({1, env, d, 0})
end
local G = groupsAt(11)
local waiting = gcancel(G, id)
if waiting then
  local _, d, _, env = deferredValue(waiting)
  return found({2, env, d, G.first})
end
local prefix, n = ARGV[2], #ARGV[2]
for _, level in ipairs({{KEYS[3], ''}, {KEYS[6], 'h'}, {KEYS[7], 'l'}}) do
  local stream, ref = level[1], level[2]
  local start, left = ARGV[3], tonumber(ARGV[4])
  while left > 0 do
    local entries = redis.call('XRANGE', stream, start, '+', 'COUNT', math.min(left, 500))
    for _, e in ipairs(entries) do
      local f, m, d, key = e[2], nil, '', nil
      for i = 1, #f, 2 do
        if f[i] == 'm' then m = f[i + 1] elseif f[i] == 'd' then d = f[i + 1] elseif f[i] == 'g' then key = f[i + 1] end
      end
      if m and string.sub(m, 1, n) == prefix then
        local state = 2
        local p = redis.pcall('XPENDING', stream, 'g', e[1], e[1], 1)
        if type(p) == 'table' and not p.err and #p > 0 then
          state = 3
          redis.call('XACK', stream, 'g', e[1])
          redis.call('ZREM', KEYS[4], ref .. e[1])
          redis.call('ZADD', KEYS[5], nowStr, id)
          redis.call('PEXPIRE', KEYS[5], ARGV[5])
        end
        if redis.call('XDEL', stream, e[1]) == 1 and key then
          gsettle(G, key, ref .. e[1])
        end
        return found({state, m, d, G.first})
      end
    end
    if #entries < math.min(left, 500) then
      break
    end
    left = left - #entries
    start = '(' .. entries[#entries][1]
  end
end
return {0, '', '', 0}
`)
