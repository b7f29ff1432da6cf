package redisbroker

import "github.com/redis/rueidis"

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

// luaDeadResult defines deadResult(m, reason, attempts): the final write
// (resFinal, luaResult) of the retained record of m, the encoded envelope
// of a message the fetch script dead-lettered: dead-lettered, with reason
// as its error, and attempts. It returns resFinal's answer (2: a batch
// child's outcome went to the outbox), or 0 when there is no record or m
// is not an envelope. The record is named from the records' prefix
// ARGV[9] (a key of the receiver's slot, as resFinal's evictions are),
// with the index and sizes KEYS[15..16] and the cap ARGV[10]. Its
// functions are made at its first call in a script run: a fetch that
// dead-letters nothing does not pay for them. A var, as luaResult may be.
var luaDeadResult = `
local deadResult
do
  local write
  deadResult = function(m, reason, attempts)
    if not write then
` + luaResult + `
      -- envID is the id of m (internal/wire: the version byte 1, then
      -- the id's length as a uvarint and its bytes), or nil.
      local function envID(m)
        if string.byte(m, 1) ~= 1 then return nil end
        local n, mul, i = 0, 1, 2
        while true do
          local c = string.byte(m, i)
          if not c or mul > 2 ^ 28 then return nil end
          n, i = n + (c % 128) * mul, i + 1
          if c < 128 then break end
          mul = mul * 128
        end
        if n == 0 or i + n - 1 > #m then return nil end
        return string.sub(m, i, i + n - 1)
      end
      write = function(m, reason, attempts)
        local id = envID(m)
        if not id then return 0 end
        return resFinal({rec = ARGV[9] .. id, idx = KEYS[15], n = KEYS[16], pre = ARGV[9], cap = ARGV[10]}, id, 'x', '',
          {'ec', 'dead_letter', 'et', reason}, {'a', attempts})
      end
    end
    return write(m, reason, attempts)
  end
end
`

// scriptFetch reclaims and reads entries of a receiver's queue (its
// priority levels, highest first) or of a reply stream for a consumer.
var scriptFetch = rueidis.NewLuaScript(`-- fetch
-- KEYS[1] -> the stream: P:{R}:q (queue; its normal level) or P:{S}:r (reply stream)
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the retries zset P:{R}:retries (retries longer than the lease;
--            members are refs: entry ids, prefixed "h"/"l" for the high
--            and low levels)
-- KEYS[4] -> the holders hash P:{R}:hold ("l:<consumer>" -> its lease ms)
-- KEYS[5] -> the high level stream P:{R}:qh (for a reply stream, a key
--            never written)
-- KEYS[6] -> the low level stream P:{R}:ql (likewise)
-- ARGV[1] -> consumer name
-- ARGV[2] -> max entries to return (> 0)
-- ARGV[3] -> lease in ms, recorded as this consumer's: a pending entry is
--            reclaimed once idle for its holder's lease (this one when the
--            holder recorded none), or at once when its holder left the
--            registry of workers (ARGV[11..])
-- ARGV[4] -> max attempts: an entry already delivered this many times is
--            dead-lettered instead of reclaimed; 0 means no limit
-- ARGV[5] -> prune idle ms: when > 0, first delete the group's consumers that
--            hold nothing and were idle this long; 0 skips it
-- ARGV[6] -> "1" records the consumer's lease in the holders hash; "0"
--            (a reply stream) leaves the hash alone
-- ARGV[7] -> "1" reclaims (expired leases, lapsed holders, due retries)
--            before reading new entries; "0" only reads new entries
-- KEYS[7] -> the deferred zset P:{R}:deferred (member message id, score due ms)
-- KEYS[8] -> the deferred hash P:{R}:deferred:m (message id ->
--            "<level><deadline>:<envelope>": see luaDeferred)
-- KEYS[9..11] -> the former names of KEYS[7], KEYS[8] and KEYS[3]
--            (migrate.go), whose leftovers are moved first when ARGV[8]
--            is "1"
-- KEYS[12..14] -> the groups hash and zsets P:{R}:g, gw and gt
--            (groups.go): promote queues the keyed messages due behind
--            their keys, and a keyed entry dead-lettered is settled for
--            its key (for a reply stream, keys never written)
-- KEYS[15..16] -> the results' index P:{R}:res and sizes P:{R}:resn
--            (results.go); for a reply stream, keys never written
-- ARGV[9] -> the records' prefix P:{R}:res: (a reply stream: "", no
--            records); ARGV[10] -> the receiver's cap on retained bytes
-- ARGV[11..] -> the workers that left the registry (their heartbeat lapsed,
--            or they deregistered), each followed by when it left (unix
--            ms), as the caller's last heartbeat saw them: the entries
--            they were delivered in a millisecond before the one they left
--            in are reclaimable at
--            once (one delivered since came to a worker that is back,
--            which keeps it for its lease: reclaimable once idle for it)
-- ARGV[8] -> "1" first queues the deferred messages that are due, each at
--            its level (at most 1000 a call, ZRANGEBYSCORE ... LIMIT:
--            the cost does not grow with the set); "0" (a reply stream)
--            leaves KEYS[7..8] alone
-- Serves the levels in order, high, normal, low (a level stream that holds
-- nothing is skipped): in each, reclaimed entries then new ones, until max.
-- Creates the group "g" of a stream (from its start, MKSTREAM) if missing.
-- An entry dead-lettered whose message has a retained record gets its
-- final state there in this step (deadResult: dead-lettered, with the
-- reason as its error, and the attempts), and a batch child's outcome goes
-- to the batch outbox.
-- Returns {dead, levels, next, busy, e1, e2, ...}: dead is how many entries
-- were dead-lettered; levels is 1 when the high level stream holds entries,
-- +2 when the low one does, +4 when a key queued a message at a level
-- whose stream held nothing (see levelsChanged), +8 when a batch child's
-- outcome went to the batch outbox; next is the due time
-- (unix ms) of the first message still deferred or key to look at again
-- (-1 when none); busy is 1 when, after this run,
-- the stream has pending entries (leased to any consumer, these e
-- included) or retries wait (levels not 0 counts as busy too),
-- else 0: a stream that is not busy needs no reclaim until something is
-- delivered from it; each e is {ref, attempt, field1, value1, ...}, where
-- ref is the entry id, prefixed "h" or "l" at those levels.
` + luaNow + luaBury + luaPromote + luaMigrate + luaDeadResult + `
local base, dlq, retries, hold = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local reported = false
local consumer, max, lease = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local maxAttempts, pruneIdle = tonumber(ARGV[4]), tonumber(ARGV[5])
local reclaim = ARGV[7] == '1'
local out = {0, 0, -1, 0}
local G = {q = base, h = KEYS[5], l = KEYS[6], hold = hold, g = KEYS[12], w = KEYS[13], t = KEYS[14], first = 0, nowake = true}
if ARGV[8] == '1' then
  migrate(KEYS[9], KEYS[10], KEYS[11], KEYS[7], KEYS[8], retries)
  out[3] = promote(KEYS[7], KEYS[8], G)
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
-- The holders' leases, the least of them, and the holders that left the
-- registry (dead, or cut off from Redis): theirs are reclaimable at once.
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
    end
  end
  for j = 11, #ARGV - 1, 2 do
    local who = ARGV[j]
    if leases[who] and who ~= consumer and not lapsed[who] then
      dead[#dead + 1] = who
      lapsed[who] = tonumber(ARGV[j + 1])
      heldBy[who] = 0
    end
  end
  -- Delayed retries that came due become reclaimable now.
  for _, ref in ipairs(redis.call('ZRANGEBYSCORE', retries, '-inf', nowStr, 'LIMIT', 0, max)) do
    local stream, id = splitRef(ref)
    redis.call('ZREM', retries, ref)
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
      -- An entry was delivered its idle time before XPENDING ran: the
      -- time after it less the idle time is never before the delivery
      -- (now, read when the script started, would put it earlier by as
      -- long as the script has run).
      local t = redis.call('TIME')
      local after = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
      heldBy[who] = heldBy[who] + #held
      -- One delivered since it left went to it back in the registry: it
      -- keeps it for its lease, as any holder; should it have died again
      -- before a heartbeat told of its return, the lease ends all the same.
      for _, p in ipairs(held) do
        if after - p[3] < lapsed[who] or p[3] >= ownerLease(who) then take(p) end
      end
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
            redis.call('HDEL', hold, 'a:' .. name, 'l:' .. name) -- a: of version 0.1
          end
        end
      end
    end
  end
  for _, p in ipairs(pend) do
    local id, owner, count = p[1], p[2], p[4]
    local ref = prefix .. id
    local wait = redis.call('ZSCORE', retries, ref)
    if wait and tonumber(wait) > now then
      -- A retry delay longer than the lease: keep it with its owner.
      redis.call('XCLAIM', stream, 'g', owner, 0, id, 'IDLE', 0, 'JUSTID')
    else
      if wait then
        redis.call('ZREM', retries, ref)
      end
      if maxAttempts > 0 and count >= maxAttempts and stream == base and isWake(base, id) then
        -- A wake entry its readers did not drop (they died first), which
        -- this run's promote has already served: drop it.
        redis.call('XACK', base, 'g', id)
        redis.call('HINCRBY', hold, 'wakes', -redis.call('XDEL', base, id))
      elseif maxAttempts > 0 and count >= maxAttempts then
        local reason = 'gave up after ' .. count .. ' deliveries (max attempts ' .. maxAttempts .. '): lease expired or retried'
        local n, key, m = bury(stream, dlq, id, reason, count, '0', prefix)
        out[1] = out[1] + n
        if key then groupsLib().gsettle(G, key, ref) end
        if n == 1 and ARGV[9] ~= '' and deadResult(m, reason, tostring(count)) == 2 then
          reported = true
        end
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
      redis.call('HDEL', hold, 'a:' .. who, 'l:' .. who) -- a: of version 0.1
    end
  end
end
local levelsNow = out[2]
if G.first == 1 then out[2] = out[2] + 4 end
if reported then out[2] = out[2] + 8 end
if levelsNow ~= 0 or #out > 4 or redis.call('ZCARD', retries) > 0 then
  out[4] = 1
else
  local sum = redis.pcall('XPENDING', base, 'g')
  if type(sum) ~= 'table' or sum.err or sum[1] > 0 then
    out[4] = 1
  end
end
return out
`)
