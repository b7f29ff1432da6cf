package redisbroker

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
// in unix milliseconds, rounded down, and nowCeil to it rounded up. Redis 7
// replicates scripts by their effects; on 6.2 replicate_commands asks for
// that, so that reading TIME before writing is allowed.
const luaNow = `
if redis.replicate_commands then redis.replicate_commands() end
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local nowCeil = tonumber(tm[1]) * 1000 + math.ceil(tonumber(tm[2]) / 1000)
local nowStr = string.format('%.0f', now)
`

// luaBury defines bury(stream, dlq, id, reason, attempts, bad, prio): it
// moves entry id of stream to the dead-letter stream dlq (XADD + XACK +
// XDEL) and returns 1, the entry's group key (field g, or nil) and the
// message it moved (field m), or 0 when the entry is no longer in the
// stream (it is then only removed from the group's pending list). bad forces the entry to be marked
// undecodable. The entry's deadline, expiry, group key and id (fields d,
// x, g and i) are kept. An entry without an m field is kept whole, as
// JSON. prio ("h", "l", or "" for the normal level) is kept in field p,
// so that a retried dead letter goes back to its level.
const luaBury = `
local function bury(stream, dlq, id, reason, attempts, bad, prio)
  local e = redis.call('XRANGE', stream, id, id)
  redis.call('XACK', stream, 'g', id)
  if not e[1] then
    return 0
  end
  local f = e[1][2]
  local m, kept = nil, {}
  for j = 1, #f, 2 do
    local k = f[j]
    if k == 'm' then
      m = f[j + 1]
    elseif k == 'd' or k == 'x' or k == 'g' or k == 'i' then
      kept[k] = f[j + 1]
    end
  end
  if m == nil then
    m = cjson.encode(f)
    bad = '1'
  end
  local args = {dlq, '*', 'm', m, 'reason', reason, 'attempts', attempts, 'at', nowStr, 'bad', bad}
  for _, k in ipairs({'d', 'x', 'g', 'i'}) do
    if kept[k] then
      args[#args + 1] = k
      args[#args + 1] = kept[k]
    end
  end
  if prio and prio ~= '' then
    args[#args + 1] = 'p'
    args[#args + 1] = prio
  end
  redis.call('XADD', unpack(args))
  redis.call('XDEL', stream, id)
  return 1, kept.g, m
end
`

// luaQueueMessage defines queueMessage(stream, env, d, x, g, i): it adds a
// message to a queue stream, with its deadline (field d), its expiry
// (field x), and its group key and id (fields g and i: a keyed message,
// see groups.go) when they are not empty (or nil). queueWake(q, hold)
// adds a wake entry (field w, no m) to the normal level's stream q and
// counts it in the holders hash hold: the entry wakes a fetch blocked on
// q, which then runs the fetch script (Fetch's forceSchedule).
const luaQueueMessage = `
local function queueWake(q, hold)
  redis.call('XADD', q, '*', 'w', '1')
  redis.call('HINCRBY', hold, 'wakes', 1)
end
local function queueMessage(stream, env, d, x, g, i)
  local args = {stream, '*', 'm', env}
  if d ~= '' then
    args[#args + 1] = 'd'
    args[#args + 1] = d
  end
  if x ~= '' then
    args[#args + 1] = 'x'
    args[#args + 1] = x
  end
  if g and g ~= '' then
    args[#args + 1] = 'g'
    args[#args + 1] = g
    args[#args + 1] = 'i'
    args[#args + 1] = i
  end
  redis.call('XADD', unpack(args))
end
`

// luaDeferred defines deferredValue(v): the level ("h", "l" or ""), the
// deadline field ("" for none), the expiry field ("" for none), the
// encoded envelope and the group key ("" for none) of v, a value of the
// deferred hash: "[k<len>:<group key>]<level><deadline ms or
// empty>[,<expiry ms>]:<envelope>". Values without a level are of the
// normal level. keyedValue(v) splits v into its group key and the rest.
const luaDeferred = `
local function keyedValue(v)
  if string.sub(v, 1, 1) ~= 'k' then return '', v end
  local c = string.find(v, ':', 1, true)
  local n = tonumber(string.sub(v, 2, c - 1))
  return string.sub(v, c + 1, c + n), string.sub(v, c + n + 1)
end
local function deferredValue(v)
  local key
  key, v = keyedValue(v)
  local level = ''
  local c1 = string.sub(v, 1, 1)
  if c1 == 'h' or c1 == 'l' then
    level = c1
    v = string.sub(v, 2)
  end
  local c = string.find(v, ':', 1, true)
  local times, x = string.sub(v, 1, c - 1), ''
  local comma = string.find(times, ',', 1, true)
  if comma then
    times, x = string.sub(times, 1, comma - 1), string.sub(times, comma + 1)
  end
  return level, times, x, string.sub(v, c + 1), key
end
`

// luaPromote defines promote(deferred, msgs, G): it queues the deferred
// messages that are due by now (at most 1000), each at its level (the
// streams of G, see luaGroups) with its deadline and expiry, or, a keyed
// one, behind its key (gpush); it looks at the keys whose time came
// (gdue, only when one has: the groups' functions are made lazily,
// luaGroupsLazy); and it returns the first time still to come of either (unix ms),
// or -1. See luaDeferred for the hash's values.
const luaPromote = luaDeferred + luaQueueMessage + luaGroupsLazy + `
local function promote(deferred, msgs, G)
  local due = redis.call('ZRANGEBYSCORE', deferred, '-inf', nowStr, 'LIMIT', 0, 1000)
  local streams = {h = G.h, l = G.l}
  for _, id in ipairs(due) do
    local v = redis.call('HGET', msgs, id)
    if v then
      local key, rest = keyedValue(v)
      if key ~= '' then
        groupsLib().gpush(G, key, id, rest)
      else
        local level, d, x, env = deferredValue(rest)
        queueMessage(streams[level] or G.q, env, d, x)
      end
    end
  end
  if #due > 0 then
    redis.call('ZREM', deferred, unpack(due))
    redis.call('HDEL', msgs, unpack(due))
  end
  -- The keys' first time to look at again: gdue only when it has come.
  local next = -1
  local first = redis.call('ZRANGE', G.t, 0, 0, 'WITHSCORES')
  if first[2] then
    next = tonumber(first[2])
    if next <= now then next = groupsLib().gdue(G) end
  end
  local head = redis.call('ZRANGE', deferred, 0, 0, 'WITHSCORES')
  if head[2] and (next < 0 or tonumber(head[2]) < next) then
    next = tonumber(head[2])
  end
  return next
end
`
