package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// scriptFate finds a message by id in a receiver's queue or dead letters.
var scriptFate = rueidis.NewLuaScriptReadOnly(`-- fate
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the high level stream P:{R}:qh
-- KEYS[4] -> the low level stream P:{R}:ql
-- ARGV[1] -> the start of the message's encoding (wire.IDPrefix)
-- ARGV[2] -> the first entry id to read (Since, in ms)
-- ARGV[3] -> the most entries read in each stream
-- Looks in the level streams in order (high, normal, low), then in the
-- dead letters.
-- Returns {state, ref, attempts, reason, complete}: state is 0 (not
-- found), 1 (queued), 2 (pending) or 3 (dead-lettered); ref is the entry
-- id (prefixed "h"/"l" at the high and low levels); complete is 1 when not
-- found and every scan reached the end of its stream.
local prefix, n = ARGV[1], #ARGV[1]
local function find(key)
  local start, left = ARGV[2], tonumber(ARGV[3])
  while left > 0 do
    local entries = redis.call('XRANGE', key, start, '+', 'COUNT', math.min(left, 500))
    for _, e in ipairs(entries) do
      local f = e[2]
      for i = 1, #f, 2 do
        if f[i] == 'm' and string.sub(f[i + 1], 1, n) == prefix then
          return e, true
        end
      end
    end
    if #entries < math.min(left, 500) then
      return nil, true
    end
    left = left - #entries
    start = '(' .. entries[#entries][1]
  end
  return nil, false
end
local doneQ = true
for _, l in ipairs({{KEYS[3], 'h'}, {KEYS[1], ''}, {KEYS[4], 'l'}}) do
  local e, done = find(l[1])
  doneQ = doneQ and done
  if e then
    local p = redis.pcall('XPENDING', l[1], 'g', e[1], e[1], 1)
    if type(p) == 'table' and not p.err and #p > 0 then
      return {2, l[2] .. e[1], p[1][4], '', 0}
    end
    return {1, l[2] .. e[1], 0, '', 0}
  end
end
local d, doneD = find(KEYS[2])
if d then
  local attempts, reason = 0, ''
  local f = d[2]
  for i = 1, #f, 2 do
    if f[i] == 'attempts' then attempts = tonumber(f[i + 1]) end
    if f[i] == 'reason' then reason = f[i + 1] end
  end
  return {3, d[1], attempts, reason, 0}
end
if doneQ and doneD then
  return {0, '', 0, '', 1}
end
return {0, '', 0, '', 0}
`)

// Fate finds message p.ID in p.Receiver's queue or dead letters with one
// read-only script that compares the start of each entry added since
// p.Since with the message's id, reading at most p.MaxScan entries of each.
func (b *Broker) Fate(ctx context.Context, p *broker.FateParams) (broker.Fate, error) {
	if err := b.check(); err != nil {
		return broker.Fate{}, err
	}
	if err := p.Validate(); err != nil {
		return broker.Fate{}, err
	}
	start := "-"
	if !p.Since.IsZero() {
		start = strconv.FormatInt(max(p.Since.UnixMilli(), 0), 10)
	}
	v, err := scriptFate.Exec(ctx, b.client, []string{b.keys.queue(p.Receiver), b.keys.deadLetters(p.Receiver),
		b.keys.queueAt(p.Receiver, broker.PriorityHigh), b.keys.queueAt(p.Receiver, broker.PriorityLow)},
		[]string{string(wire.IDPrefix(p.ID)), start, strconv.Itoa(p.MaxScan)}).ToArray()
	if err != nil {
		return broker.Fate{}, b.fail(ctx, "fate", err)
	}
	if len(v) != 5 {
		return broker.Fate{}, fmt.Errorf("redisbroker: fate: script answered %d values", len(v))
	}
	state, _ := v[0].AsInt64()
	ref, _ := v[1].ToString()
	attempts, _ := v[2].AsInt64()
	reason, _ := v[3].ToString()
	complete, _ := v[4].AsInt64()
	f := broker.Fate{Ref: ref, Attempts: int(attempts), Reason: reason}
	switch {
	case state == 1:
		f.State = broker.StateQueued
	case state == 2:
		f.State = broker.StatePending
	case state == 3:
		f.State = broker.StateDeadLettered
	case complete == 1:
		f.State = broker.StateGone
	}
	if _, id := refLevel(ref); id != "" {
		ref = id
	}
	if ms, _, found := strings.Cut(ref, "-"); found {
		f.At, _ = unixMS(ms) // an entry id starts with the Redis time it was added
	}
	return f, nil
}
