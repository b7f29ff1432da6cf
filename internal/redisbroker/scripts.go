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
// XDEL) and returns 1, or 0 when the entry is no longer in the stream (it
// is then only removed from the group's pending list). bad forces the
// entry to be marked undecodable. The entry's deadline and expiry (fields
// d and x) are kept. An entry without an m field is kept whole, as JSON. prio ("h", "l", or "" for the normal level) is kept in
// field p, so that a retried dead letter goes back to its level.
const luaBury = `
local function bury(stream, dlq, id, reason, attempts, bad, prio)
  local e = redis.call('XRANGE', stream, id, id)
  redis.call('XACK', stream, 'g', id)
  if not e[1] then
    return 0
  end
  local f = e[1][2]
  local m, d, x
  for j = 1, #f, 2 do
    if f[j] == 'm' then m = f[j + 1] elseif f[j] == 'd' then d = f[j + 1] elseif f[j] == 'x' then x = f[j + 1] end
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
  if x then
    args[#args + 1] = 'x'
    args[#args + 1] = x
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

// luaQueueMessage defines queueMessage(stream, env, d, x): it adds a
// message to a queue stream, with its deadline (field d) and its expiry
// (field x) when they are not empty.
const luaQueueMessage = `
local function queueMessage(stream, env, d, x)
  local args = {stream, '*', 'm', env}
  if d ~= '' then
    args[#args + 1] = 'd'
    args[#args + 1] = d
  end
  if x ~= '' then
    args[#args + 1] = 'x'
    args[#args + 1] = x
  end
  redis.call('XADD', unpack(args))
end
`

// luaDeferred defines deferredValue(v): the level ("h", "l" or ""), the
// deadline field ("" for none), the expiry field ("" for none) and the
// encoded envelope of v, a value of the deferred hash:
// "<level><deadline ms or empty>[,<expiry ms>]:<envelope>". Values
// without a level are of the normal level.
const luaDeferred = `
local function deferredValue(v)
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
  return level, times, x, string.sub(v, c + 1)
end
`

// luaPromote defines promote(deferred, msgs, normal, high, low): it queues
// the deferred messages that are due by now (at most 1000), each at its
// level (the stream normal, high or low) with its deadline and expiry,
// and returns the due time (unix ms) of the first one still deferred, or
// -1. See luaDeferred for the hash's values.
const luaPromote = luaDeferred + luaQueueMessage + `
local function promote(deferred, msgs, normal, high, low)
  local due = redis.call('ZRANGEBYSCORE', deferred, '-inf', nowStr, 'LIMIT', 0, 1000)
  local streams = {h = high, l = low}
  for _, id in ipairs(due) do
    local v = redis.call('HGET', msgs, id)
    if v then
      local level, d, x, env = deferredValue(v)
      queueMessage(streams[level] or normal, env, d, x)
    end
  end
  if #due > 0 then
    redis.call('ZREM', deferred, unpack(due))
    redis.call('HDEL', msgs, unpack(due))
  end
  local head = redis.call('ZRANGE', deferred, 0, 0, 'WITHSCORES')
  if head[2] then
    return tonumber(head[2])
  end
  return -1
end
`
