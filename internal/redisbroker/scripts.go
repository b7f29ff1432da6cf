package redisbroker

import "github.com/redis/rueidis"

// Every state change that must be atomic is one of these Lua scripts, run by
// EVALSHA with a fallback to EVAL on NOSCRIPT. Each touches only the keys it
// is given, all of one name's hash tag except sendTimed (see its header).
// Time is Redis server time (TIME); Redis 7 replicates scripts by effects.
//
// Every stream has one consumer group, "g". Stream entries have the fields:
//
//	queue:        m (encoded envelope), d (deadline, unix ms; timed messages only)
//	reply stream: k ("rep" for a reply, "to" for a timeout notice), i (request id), m
//	dead letters: m (envelope, or the raw entry), reason, attempts, at (unix ms),
//	              bad ("1" when m does not decode, else "0"), d (when the message had it)

// luaNow sets now (a number) and nowStr (its decimal string) to Redis time
// in unix milliseconds. Redis 7 replicates scripts by their effects; on 6.2
// replicate_commands asks for that, so that reading TIME before writing is
// allowed.
const luaNow = `
if redis.replicate_commands then redis.replicate_commands() end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local nowStr = string.format('%.0f', now)
`

// luaBury defines bury(stream, dlq, id, reason, attempts, bad, prio): it
// moves entry id of stream to the dead-letter stream dlq (XADD + XACK +
// XDEL) and returns 1, or 0 when the entry is no longer in the stream (it
// is then only removed from the group's pending list). bad forces the
// entry to be marked undecodable. An entry without an m field is kept
// whole, as JSON. prio ("h", "l", or "" for the normal level) is kept in
// field p, so that a retried dead letter goes back to its level.
const luaBury = `
local function bury(stream, dlq, id, reason, attempts, bad, prio)
  local e = redis.call('XRANGE', stream, id, id)
  redis.call('XACK', stream, 'g', id)
  if not e[1] then
    return 0
  end
  local f = e[1][2]
  local m, d
  for j = 1, #f, 2 do
    if f[j] == 'm' then m = f[j + 1] elseif f[j] == 'd' then d = f[j + 1] end
  end
  if m == nil then
    m = cjson.encode(f)
    bad = '1'
  end
  local args = {dlq, '*', 'm', m, 'reason', reason, 'attempts', attempts, 'at', nowStr, 'bad', bad}
  if d then
    args[#args + 1] = 'd'
    args[#args + 1] = d
  end
  if prio and prio ~= '' then
    args[#args + 1] = 'p'
    args[#args + 1] = prio
  end
  redis.call('XADD', unpack(args))
  redis.call('XDEL', stream, id)
  return 1
end
`

// luaPromote defines promote(sched, schedMsgs, stream): it queues the
// scheduled messages that are due by now (at most 1000), each with its
// deadline if it has one, and returns the due time (unix ms) of the first
// one still scheduled, or -1. A hash value is "<deadline ms or empty>:"
// followed by the encoded envelope.
const luaPromote = `
local function promote(sched, msgs, stream)
  local due = redis.call('ZRANGEBYSCORE', sched, '-inf', nowStr, 'LIMIT', 0, 1000)
  for _, id in ipairs(due) do
    local v = redis.call('HGET', msgs, id)
    if v then
      local c = string.find(v, ':', 1, true)
      local d = string.sub(v, 1, c - 1)
      if d == '' then
        redis.call('XADD', stream, '*', 'm', string.sub(v, c + 1))
      else
        redis.call('XADD', stream, '*', 'm', string.sub(v, c + 1), 'd', d)
      end
    end
  end
  if #due > 0 then
    redis.call('ZREM', sched, unpack(due))
    redis.call('HDEL', msgs, unpack(due))
  end
  local head = redis.call('ZRANGE', sched, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return -1
end
`

// luaSchedule defines schedule(sched, msgs, stream, hold, env, id, delay,
// at, timeout): the message's due time is at (unix ms) when at is not
// empty, else now + delay, and never before now; its deadline is due +
// timeout when timeout > 0. A message due now is queued at once (XADD); any
// other is added to the scheduled zset and hash, and when it comes first in
// the zset, a wake entry (field w, no m) is queued, and counted in the
// holders hash (field wakes, which Stats subtracts), so that a blocked
// fetch looks at the new due time. Returns due, deadline (or -1).
const luaSchedule = `
local function schedule(sched, msgs, stream, hold, env, id, delay, at, timeout)
  local due = now + tonumber(delay)
  if at ~= '' then due = tonumber(at) end
  if due < now then due = now end
  local deadline, d = -1, ''
  if tonumber(timeout) > 0 then
    deadline = due + tonumber(timeout)
    d = string.format('%.0f', deadline)
  end
  if due <= now then
    if d == '' then
      redis.call('XADD', stream, '*', 'm', env)
    else
      redis.call('XADD', stream, '*', 'm', env, 'd', d)
    end
    return {due, deadline}
  end
  redis.call('ZADD', sched, string.format('%.0f', due), id)
  redis.call('HSET', msgs, id, d .. ':' .. env)
  if redis.call('ZRANGE', sched, 0, 0)[1] == id then
    redis.call('XADD', stream, '*', 'w', '1')
    redis.call('HINCRBY', hold, 'wakes', 1)
  end
  return {due, deadline}
end
`

// scriptSchedule sends a message for later.
var scriptSchedule = rueidis.NewLuaScript(`-- schedule
-- KEYS[1] -> the scheduled zset P:{R}:s
-- KEYS[2] -> the scheduled hash P:{R}:sm
-- KEYS[3] -> the queue stream P:{R}:q (a message due now, a wake entry)
-- KEYS[4] -> the holders hash P:{R}:hold (field wakes counts wake entries)
-- ARGV[1] -> the encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> delay ms (used when ARGV[4] is empty)
-- ARGV[4] -> due time, unix ms, or empty
-- ARGV[5] -> timeout ms, 0 for none (the deadline is due + timeout)
-- See luaSchedule. Returns {due, deadline or -1}.
` + luaNow + luaSchedule + `
return schedule(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
`)

// scriptScheduleTimed sends a timed message of a named sender for later.
var scriptScheduleTimed = rueidis.NewLuaScript(`-- schedule_timed
-- KEYS[1..4] -> as schedule (of the receiver R)
-- KEYS[5] -> the pending timeouts zset P:{S}:t of the sender S
-- KEYS[6] -> the pending messages hash P:{S}:tm
-- ARGV as schedule; ARGV[5] > 0.
-- schedule, then the pending timeout at its deadline, in one step (both
-- names in one slot, as send_timed). Returns {due, deadline}.
` + luaNow + luaSchedule + `
local r = schedule(KEYS[1], KEYS[2], KEYS[3], KEYS[4], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[5], string.format('%.0f', r[2]), ARGV[2])
redis.call('HSET', KEYS[6], ARGV[2], ARGV[1])
return r
`)

// scriptDropWakes drops wake entries a fetch read.
var scriptDropWakes = rueidis.NewLuaScript(`-- drop_wakes
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the holders hash P:{R}:hold (field wakes counts wake entries)
-- ARGV -> the wake entries' ids
-- Acknowledges and deletes the entries, and takes off the count only those
-- it deleted: a consumer whose lease on a wake entry ended may drop it after
-- the consumer that reclaimed it did. Returns how many it deleted.
redis.call('XACK', KEYS[1], 'g', unpack(ARGV))
local n = redis.call('XDEL', KEYS[1], unpack(ARGV))
if n > 0 then
  redis.call('HINCRBY', KEYS[2], 'wakes', -n)
end
return n
`)

// scriptCancelMessage cancels a message of a receiver.
var scriptCancelMessage = rueidis.NewLuaScript(`-- cancel_message
-- KEYS[1] -> the scheduled zset P:{R}:s
-- KEYS[2] -> the scheduled hash P:{R}:sm
-- KEYS[3] -> the queue stream P:{R}:q (the normal level)
-- KEYS[4] -> the delayed zset P:{R}:delay
-- KEYS[5] -> the cancellation marks zset P:{R}:x (member message id, score
--            the mark's time, unix ms)
-- KEYS[6] -> the high level stream P:{R}:qh
-- KEYS[7] -> the low level stream P:{R}:ql
-- ARGV[1] -> message id
-- ARGV[2] -> the start of the message's encoding (wire.IDPrefix)
-- ARGV[3] -> the first queue entry id to read
-- ARGV[4] -> the most entries read in each level stream
-- ARGV[5] -> how long marks are kept, ms
-- A scheduled message is unscheduled (1); else the level streams are read
-- (normal, high, low), in chunks, for an entry whose m starts with the
-- prefix: one not delivered is deleted (2), one delivered and not
-- acknowledged is acknowledged and deleted, and marked (3); the marks
-- expire ARGV[5] after the last one. Returns {state, envelope, deadline or
-- ""}, state 0 when not found.
` + luaNow + `
local id = ARGV[1]
redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', string.format('%.0f', now - tonumber(ARGV[5])))
local v = redis.call('HGET', KEYS[2], id)
if v then
  local c = string.find(v, ':', 1, true)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  return {1, string.sub(v, c + 1), string.sub(v, 1, c - 1)}
end
local prefix, n = ARGV[2], #ARGV[2]
for _, level in ipairs({{KEYS[3], ''}, {KEYS[6], 'h'}, {KEYS[7], 'l'}}) do
  local stream, ref = level[1], level[2]
  local start, left = ARGV[3], tonumber(ARGV[4])
  while left > 0 do
    local entries = redis.call('XRANGE', stream, start, '+', 'COUNT', math.min(left, 500))
    for _, e in ipairs(entries) do
      local f, m, d = e[2], nil, ''
      for i = 1, #f, 2 do
        if f[i] == 'm' then m = f[i + 1] elseif f[i] == 'd' then d = f[i + 1] end
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
        redis.call('XDEL', stream, e[1])
        return {state, m, d}
      end
    end
    if #entries < math.min(left, 500) then
      break
    end
    left = left - #entries
    start = '(' .. entries[#entries][1]
  end
end
return {0, '', ''}
`)

// scriptFetch reclaims and reads entries of a receiver's queue (its
// priority levels, highest first) or of a reply stream for a consumer.
var scriptFetch = rueidis.NewLuaScript(`-- fetch
-- KEYS[1] -> the stream: P:{R}:q (queue; its normal level) or P:{S}:r (reply stream)
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the delayed zset P:{R}:delay (retries longer than the lease;
--            members are refs: entry ids, prefixed "h"/"l" for the high
--            and low levels)
-- KEYS[4] -> the holders hash P:{R}:hold ("l:<consumer>" -> its lease ms,
--            "a:<consumer>" -> until when its heartbeat vouches, unix ms)
-- KEYS[5] -> the high level stream P:{R}:qh (for a reply stream, a key
--            never written)
-- KEYS[6] -> the low level stream P:{R}:ql (likewise)
-- ARGV[1] -> consumer name
-- ARGV[2] -> max entries to return (> 0)
-- ARGV[3] -> lease in ms, recorded as this consumer's: a pending entry is
--            reclaimed once idle for its holder's lease (this one when the
--            holder recorded none), or at once when its holder's heartbeat
--            lapsed
-- ARGV[4] -> max attempts: an entry already delivered this many times is
--            dead-lettered instead of reclaimed; 0 means no limit
-- ARGV[5] -> prune idle ms: when > 0, first delete the group's consumers that
--            hold nothing and were idle this long; 0 skips it
-- ARGV[6] -> "1" records the consumer's lease in the holders hash; "0"
--            (a reply stream) leaves the hash alone
-- ARGV[7] -> "1" reclaims (expired leases, lapsed holders, due retries)
--            before reading new entries; "0" only reads new entries
-- KEYS[7] -> the scheduled zset P:{R}:s (member message id, score due ms)
-- KEYS[8] -> the scheduled hash P:{R}:sm (message id -> "<deadline>:<envelope>")
-- ARGV[8] -> "1" first queues the scheduled messages that are due at the
--            normal level (at most 1000 a call, ZRANGEBYSCORE ... LIMIT:
--            the cost does not grow with the set); "0" (a reply stream)
--            leaves KEYS[7..8] alone
-- Serves the levels in order, high, normal, low (a level stream that holds
-- nothing is skipped): in each, reclaimed entries then new ones, until max.
-- Creates the group "g" of a stream (from its start, MKSTREAM) if missing.
-- Returns {dead, levels, next, busy, e1, e2, ...}: dead is how many entries
-- were dead-lettered; levels is 1 when the high level stream holds entries,
-- +2 when the low one does; next is the due time (unix ms) of the first
-- message still scheduled (-1 when none); busy is 1 when, after this run,
-- the stream has pending entries (leased to any consumer, these e
-- included) or delayed retries wait (levels not 0 counts as busy too),
-- else 0: a stream that is not busy needs no reclaim until something is
-- delivered from it; each e is {ref, attempt, field1, value1, ...}, where
-- ref is the entry id, prefixed "h" or "l" at those levels.
` + luaNow + luaBury + luaPromote + `
local base, dlq, delayed, hold = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local consumer, max, lease = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local maxAttempts, pruneIdle = tonumber(ARGV[4]), tonumber(ARGV[5])
local reclaim = ARGV[7] == '1'
local out = {0, 0, -1, 0}
if ARGV[8] == '1' then
  out[3] = promote(KEYS[7], KEYS[8], base)
end
if ARGV[6] == '1' then
  redis.call('HSET', hold, 'l:' .. consumer, lease)
end
local levels = {}
if redis.call('XLEN', KEYS[5]) > 0 then
  levels[#levels + 1] = {KEYS[5], 'h'}
  out[2] = 1
end
levels[#levels + 1] = {base, ''}
if redis.call('XLEN', KEYS[6]) > 0 then
  levels[#levels + 1] = {KEYS[6], 'l'}
  out[2] = out[2] + 2
end
local streamOf = {h = KEYS[5], l = KEYS[6]}
-- isWake reports whether entry id of stream is a wake entry (field w only).
local function isWake(stream, id)
  local e = redis.call('XRANGE', stream, id, id)[1]
  return e ~= nil and #e[2] == 2 and e[2][1] == 'w'
end
-- splitRef returns the stream and entry id of a ref.
local function splitRef(ref)
  local c = string.sub(ref, 1, 1)
  if c == 'h' or c == 'l' then
    return streamOf[c], string.sub(ref, 2), c
  end
  return base, ref, ''
end
local function ensureGroup(stream, err)
  if string.find(err, 'NOGROUP', 1, true) == nil then
    error(err)
  end
  redis.call('XGROUP', 'CREATE', stream, 'g', '0', 'MKSTREAM')
end
-- The holders' leases, the least of them, and the holders whose heartbeat
-- lapsed (dead, or cut off from Redis): theirs are reclaimable at once.
local leases, dead, lapsed, minLease = {}, {}, {}, tonumber(lease)
local heldBy = {}
local dueBy = {}
if reclaim then
  local h = redis.call('HGETALL', hold)
  for j = 1, #h, 2 do
    local kind, who, v = string.sub(h[j], 1, 2), string.sub(h[j], 3), tonumber(h[j + 1])
    if kind == 'l:' then
      leases[who] = v
      if v < minLease then minLease = v end
    elseif kind == 'a:' and v <= now and who ~= consumer then
      dead[#dead + 1] = who
      lapsed[who] = true
      heldBy[who] = 0
    end
  end
  -- Delayed retries that came due become reclaimable now.
  for _, ref in ipairs(redis.call('ZRANGEBYSCORE', delayed, '-inf', nowStr, 'LIMIT', 0, max)) do
    local stream, id = splitRef(ref)
    redis.call('ZREM', delayed, ref)
    if redis.call('XCLAIM', stream, 'g', consumer, 0, id, 'IDLE', lease, 'JUSTID')[1] then
      dueBy[stream] = dueBy[stream] or {}
      table.insert(dueBy[stream], redis.call('XPENDING', stream, 'g', id, id, 1)[1])
    end
  end
end
local function ownerLease(owner)
  return leases[owner] or tonumber(lease)
end
local scanned = 0
local function serve(stream, prefix)
  local room = max - (#out - 4)
  local taken, pend = {}, {}
  local function take(p)
    if p and #pend < room and not taken[p[1]] then
      taken[p[1]] = true
      pend[#pend + 1] = p
    end
  end
  if reclaim then
    scanned = scanned + 1
    for _, p in ipairs(dueBy[stream] or {}) do take(p) end
    local scan = redis.pcall('XPENDING', stream, 'g', 'IDLE', string.format('%.0f', minLease), '-', '+', room + 100)
    if type(scan) == 'table' and scan.err then
      ensureGroup(stream, scan.err)
      scan = {}
    end
    for _, who in ipairs(dead) do
      local held = redis.call('XPENDING', stream, 'g', '-', '+', room, who)
      heldBy[who] = heldBy[who] + #held
      for _, p in ipairs(held) do take(p) end
    end
    for _, p in ipairs(scan) do
      if not lapsed[p[2]] and p[3] >= ownerLease(p[2]) then take(p) end
    end
    if pruneIdle > 0 then
      for _, c in ipairs(redis.call('XINFO', 'CONSUMERS', stream, 'g')) do
        local name, pending, idle
        for j = 1, #c, 2 do
          if c[j] == 'name' then name = c[j + 1]
          elseif c[j] == 'pending' then pending = c[j + 1]
          elseif c[j] == 'idle' then idle = c[j + 1] end
        end
        if pending == 0 and idle >= pruneIdle and name ~= consumer then
          redis.call('XGROUP', 'DELCONSUMER', stream, 'g', name)
          if stream == base then
            redis.call('HDEL', hold, 'a:' .. name, 'l:' .. name)
          end
        end
      end
    end
  end
  for _, p in ipairs(pend) do
    local id, owner, count = p[1], p[2], p[4]
    local ref = prefix .. id
    local wait = redis.call('ZSCORE', delayed, ref)
    if wait and tonumber(wait) > now then
      -- A retry delay longer than the lease: keep it with its owner.
      redis.call('XCLAIM', stream, 'g', owner, 0, id, 'IDLE', 0, 'JUSTID')
    else
      if wait then
        redis.call('ZREM', delayed, ref)
      end
      if maxAttempts > 0 and count >= maxAttempts and stream == base and isWake(base, id) then
        -- A wake entry its readers did not drop (they died first), which
        -- this run's promote has already served: drop it.
        redis.call('XACK', base, 'g', id)
        redis.call('HINCRBY', hold, 'wakes', -redis.call('XDEL', base, id))
      elseif maxAttempts > 0 and count >= maxAttempts then
        out[1] = out[1] + bury(stream, dlq, id, 'gave up after ' .. count .. ' deliveries (max attempts ' .. maxAttempts .. '): lease expired or retried', count, '0', prefix)
      else
        local c = redis.call('XCLAIM', stream, 'g', consumer, 0, id)
        if c[1] then
          local e = {ref, count + 1}
          for _, v in ipairs(c[1][2]) do e[#e + 1] = v end
          out[#out + 1] = e
        else
          redis.call('XACK', stream, 'g', id)
        end
      end
    end
  end
  local n = #out - 4
  if n < max then
    local r = redis.pcall('XREADGROUP', 'GROUP', 'g', consumer, 'COUNT', max - n, 'STREAMS', stream, '>')
    if type(r) == 'table' and r.err then
      ensureGroup(stream, r.err)
      r = redis.call('XREADGROUP', 'GROUP', 'g', consumer, 'COUNT', max - n, 'STREAMS', stream, '>')
    end
    if r then
      for _, entry in ipairs(r[1][2]) do
        local e = {prefix .. entry[1], 1}
        for _, v in ipairs(entry[2]) do e[#e + 1] = v end
        out[#out + 1] = e
      end
    end
  end
end
for _, l in ipairs(levels) do
  if #out - 4 >= max then break end
  serve(l[1], l[2])
end
if scanned == #levels then
  -- Every level was looked at: a lapsed holder that holds nothing is gone.
  for _, who in ipairs(dead) do
    if heldBy[who] == 0 then
      redis.call('HDEL', hold, 'a:' .. who, 'l:' .. who)
    end
  end
end
if out[2] ~= 0 or #out > 4 or redis.call('ZCARD', delayed) > 0 then
  out[4] = 1
else
  local sum = redis.pcall('XPENDING', base, 'g')
  if type(sum) ~= 'table' or sum.err or sum[1] > 0 then
    out[4] = 1
  end
end
return out
`)

// scriptBury dead-letters one entry.
var scriptBury = rueidis.NewLuaScript(`-- bury
-- KEYS[1] -> the stream: P:{R}:q, or a level stream P:{R}:qh / P:{R}:ql
--            (or P:{S}:r for an unreadable reply entry)
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the delayed zset P:{R}:delay
-- ARGV[1] -> entry id
-- ARGV[2] -> reason
-- ARGV[3] -> attempts so far
-- ARGV[4] -> "1" if the entry does not decode, else "0"
-- ARGV[5] -> the level's prefix: "h", "l", or "" (the normal level)
-- Returns 1 when moved, 0 when the entry was no longer in the stream.
` + luaNow + luaBury + `
redis.call('ZREM', KEYS[3], ARGV[5] .. ARGV[1])
return bury(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
`)

// scriptExtend renews the leases a consumer holds.
var scriptExtend = rueidis.NewLuaScript(`-- extend
-- KEYS[1] -> the queue stream P:{R}:q, or a level stream P:{R}:qh / P:{R}:ql
-- KEYS[2] -> the holders hash P:{R}:hold
-- ARGV[1] -> consumer name
-- ARGV[2] -> lease in ms, recorded as the consumer's
-- ARGV[3..] -> entry ids
-- Resets the idle time of each entry the consumer holds (XCLAIM JUSTID does
-- not count a delivery). Returns the ids the consumer no longer holds.
redis.call('HSET', KEYS[2], 'l:' .. ARGV[1], ARGV[2])
local lost = {}
for i = 3, #ARGV do
  local id = ARGV[i]
  local p = redis.call('XPENDING', KEYS[1], 'g', id, id, 1)
  local held = false
  if p[1] and p[1][2] == ARGV[1] then
    held = redis.call('XCLAIM', KEYS[1], 'g', ARGV[1], 0, id, 'JUSTID')[1] ~= nil
  end
  if not held then
    lost[#lost + 1] = id
  end
end
return lost
`)

// scriptRetry schedules a held entry for redelivery.
var scriptRetry = rueidis.NewLuaScript(`-- retry
-- KEYS[1] -> the queue stream P:{R}:q, or a level stream P:{R}:qh / P:{R}:ql
-- KEYS[2] -> the delayed zset P:{R}:delay
-- ARGV[1] -> consumer name
-- ARGV[2] -> entry id
-- ARGV[3] -> delay in ms
-- ARGV[4] -> lease in ms
-- ARGV[5] -> "1": the delivery does not count as an attempt (its delivery
--            count goes back by one); "0": it does
-- ARGV[6] -> the entry's ref (its member in the delayed zset: the id,
--            prefixed "h"/"l" at the high and low levels)
-- Ages the entry so that a Fetch with this lease reclaims it once the delay
-- has passed: idle = lease - delay. A delay of at least the lease is kept in
-- the delayed zset (score: due time) with the entry idle 0; fetch promotes it.
-- Returns 1, or 0 when the consumer does not hold the entry.
` + luaNow + `
local stream, id = KEYS[1], ARGV[2]
local delay, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local p = redis.call('XPENDING', stream, 'g', id, id, 1)
if not p[1] or p[1][2] ~= ARGV[1] then
  return 0
end
if ARGV[5] == '1' then
  -- Uncounted: the next delivery counts as this one again.
  redis.call('XCLAIM', stream, 'g', ARGV[1], 0, id, 'RETRYCOUNT', math.max(p[1][4] - 1, 0), 'JUSTID')
end
if delay >= lease then
  redis.call('ZADD', KEYS[2], string.format('%.0f', now + delay), ARGV[6])
  redis.call('XCLAIM', stream, 'g', ARGV[1], 0, id, 'IDLE', 0, 'JUSTID')
else
  redis.call('ZREM', KEYS[2], ARGV[6])
  redis.call('XCLAIM', stream, 'g', ARGV[1], 0, id, 'IDLE', string.format('%.0f', lease - delay), 'JUSTID')
end
return 1
`)

// scriptSendTimed queues a message with a timeout.
var scriptSendTimed = rueidis.NewLuaScript(`-- send_timed
-- KEYS[1] -> the receiver's queue stream P:{R}:q
-- KEYS[2] -> the sender's pending timeouts P:{S}:t (zset: id -> deadline ms)
-- KEYS[3] -> the sender's timed messages P:{S}:tm (hash: id -> envelope)
-- ARGV[1] -> encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> timeout in ms
-- The only script that touches two names' keys (R and S): on Redis Cluster
-- it runs only when both hash to one slot (else pend_timed, then an XADD).
-- Returns the deadline, unix ms.
` + luaNow + `
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('XADD', KEYS[1], '*', 'm', ARGV[1], 'd', deadline)
local pt, pm = KEYS[2], KEYS[3]
` + luaPend + `
return deadline
`)

// luaPend records the pending timeout of message ARGV[2] (envelope
// ARGV[1]) with deadline in the sender's keys pt (t) and pm (tm).
const luaPend = `
redis.call('ZADD', pt, deadline, ARGV[2])
redis.call('HSET', pm, ARGV[2], ARGV[1])
`

// scriptPendTimed records a pending timeout without queueing the message:
// the first step of a timed send on Redis Cluster across slots.
var scriptPendTimed = rueidis.NewLuaScript(`-- pend_timed
-- KEYS[1] -> the sender's pending timeouts P:{S}:t (zset: id -> deadline ms)
-- KEYS[2] -> the sender's timed messages P:{S}:tm (hash: id -> envelope)
-- ARGV as send_timed. The caller then queues the message (XADD with d set
-- to the deadline) in the receiver's slot, or cancels on failure.
-- Returns the deadline, unix ms.
` + luaNow + `
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local pt, pm = KEYS[1], KEYS[2]
` + luaPend + `
return deadline
`)

// scriptExpireInbox bounds the life of an inbox's state.
var scriptExpireInbox = rueidis.NewLuaScript(`-- inbox_expire
-- KEYS[1] -> the inbox's reply stream P:{I}:r
-- ARGV[1] -> ttl in ms; "0" deletes the stream now
-- With a ttl, creates the reply stream (with a group "g", the way to create
-- an empty stream) if missing, which opens the inbox, and sets it to
-- expire ttl from now.
-- Returns 1.
if ARGV[1] == '0' then
  redis.call('DEL', KEYS[1])
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], 'g', '0', 'MKSTREAM')
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
`)

// scriptReplyTimed settles timed requests of one sender with their replies.
var scriptReplyTimed = rueidis.NewLuaScript(`-- reply_timed
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- KEYS[3] -> the sender's reply stream P:{S}:r
-- ARGV    -> pairs: request id, encoded reply envelope
-- Accepts each reply only if its request is pending and Redis time is before
-- its deadline, and only the first of two replies to one request; the
-- timeout monitor (expire) is the only other remover.
-- Returns one number per pair: 1 when accepted, 0 when late.
` + luaNow + `
local ids = {}
for i = 1, #ARGV, 2 do
  ids[#ids + 1] = ARGV[i]
end
local deadlines = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local out, won, seen = {}, {}, {}
for i, id in ipairs(ids) do
  local d = deadlines[i]
  if d and not seen[id] and now < tonumber(d) then
    seen[id] = true
    won[#won + 1] = id
    out[i] = 1
  else
    out[i] = 0
  end
end
if #won > 0 then
  redis.call('ZREM', KEYS[1], unpack(won))
  redis.call('HDEL', KEYS[2], unpack(won))
  for i, id in ipairs(ids) do
    if out[i] == 1 then
      redis.call('XADD', KEYS[3], '*', 'k', 'rep', 'i', id, 'm', ARGV[2 * i])
    end
  end
end
return out
`)

// scriptExpire turns expired pending timeouts into timeout notices.
var scriptExpire = rueidis.NewLuaScript(`-- expire
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- KEYS[3] -> the sender's reply stream P:{S}:r
-- ARGV[1] -> max notices
-- Settles up to ARGV[1] requests whose deadline <= Redis time: removes them
-- and appends a timeout notice (k=to, i=id, m=original envelope) for each.
-- Returns how many it settled.
` + luaNow + `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nowStr, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local orig = redis.call('HGET', KEYS[2], id) or ''
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('XADD', KEYS[3], '*', 'k', 'to', 'i', id, 'm', orig)
end
return #ids
`)

// scriptCancel withdraws a pending timeout without a notice
// (sendTimedSplit's undo).
var scriptCancel = rueidis.NewLuaScript(`-- cancel
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- ARGV[1] -> request id
-- Returns 1 when the request was pending (now settled), 0 when it was not.
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
`)

// scriptRequeue moves dead letters back to the queue.
var scriptRequeue = rueidis.NewLuaScript(`-- requeue
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the high level stream P:{R}:qh
-- KEYS[4] -> the low level stream P:{R}:ql
-- ARGV    -> dead-letter ids
-- Each decodable dead letter becomes a new queue entry (m, and d if it had
-- one; deliveries start again from 1) at its level (field p) and leaves
-- the dead-letter stream.
-- Undecodable ones (bad=1) and unknown ids are left alone.
-- Returns how many moved.
local n = 0
for _, id in ipairs(ARGV) do
  local e = redis.call('XRANGE', KEYS[2], id, id)
  if e[1] then
    local f = e[1][2]
    local m, d, bad, q = nil, nil, nil, KEYS[1]
    for j = 1, #f, 2 do
      if f[j] == 'm' then m = f[j + 1]
      elseif f[j] == 'd' then d = f[j + 1]
      elseif f[j] == 'bad' then bad = f[j + 1]
      elseif f[j] == 'p' and f[j + 1] == 'h' then q = KEYS[3]
      elseif f[j] == 'p' and f[j + 1] == 'l' then q = KEYS[4] end
    end
    if m and bad ~= '1' then
      if d then
        redis.call('XADD', q, '*', 'm', m, 'd', d)
      else
        redis.call('XADD', q, '*', 'm', m)
      end
      redis.call('XDEL', KEYS[2], id)
      n = n + 1
    end
  end
end
return n
`)

// scriptPurgeAll deletes a dead-letter stream.
var scriptPurgeAll = rueidis.NewLuaScript(`-- purge_all
-- KEYS[1] -> the dead-letter stream P:{R}:dlq
-- Returns how many entries it held.
local n = redis.call('XLEN', KEYS[1])
redis.call('DEL', KEYS[1])
return n
`)

// scriptAcquire takes or renews a lock.
var scriptAcquire = rueidis.NewLuaScript(`-- acquire
-- KEYS[1] -> the lock P:{R}:lock
-- ARGV[1] -> owner
-- ARGV[2] -> ttl in ms
-- Returns 1 when the owner holds the lock for ttl from now, 0 when another
-- owner holds it.
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// scriptRelease gives up a lock.
var scriptRelease = rueidis.NewLuaScript(`-- release
-- KEYS[1] -> the lock P:{R}:lock
-- ARGV[1] -> owner
-- Returns 1 when the owner held the lock (now deleted), else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// scriptHeartbeat records a live worker.
var scriptHeartbeat = rueidis.NewLuaScript(`-- heartbeat
-- KEYS[1] -> the registry P:{workers}:ids (zset: id -> expiry ms)
-- KEYS[2] -> the worker P:{workers}:w:<id> (hash: info, seen)
-- ARGV[1] -> worker id
-- ARGV[2] -> worker info, JSON
-- KEYS[3] -> the reclaim epoch P:{workers}:reclaim (a counter: see keys.go)
-- ARGV[3] -> ttl in ms
-- Stores the info with seen = Redis time, expiring after ttl, and drops
-- expired ids from the registry, adding how many to KEYS[3]. Returns
-- {seen (unix ms), the reclaim epoch}.
` + luaNow + `
redis.call('HSET', KEYS[2], 'info', ARGV[2], 'seen', nowStr)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[3])), ARGV[1])
local n = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. nowStr)
local gone
if n > 0 then
  gone = redis.call('INCRBY', KEYS[3], n)
else
  gone = tonumber(redis.call('GET', KEYS[3]) or '0')
end
return {nowStr, gone}
`)

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
-- Returns how many slots the holder holds after.
` + luaNow + `
local zs, hs, holder = KEYS[1], KEYS[2], ARGV[1]
local delta, limit, lease = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for _, h in ipairs(redis.call('ZRANGEBYSCORE', zs, '-inf', nowStr)) do
  redis.call('ZREM', zs, h)
  redis.call('HDEL', hs, h)
end
local mine = tonumber(redis.call('HGET', hs, holder)) or 0
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
return mine
`)
