package redisbroker

// Keyed groups (broker.Groups). A receiver's groups live in three keys of
// its slot, whatever the number of keys a sender uses:
//
//	P:{R}:g   hash: "c" -> the configuration "<n> <rate> <burst> <skip>";
//	          "w" -> how many messages wait, all keys;
//	          "k:<key>" -> "<head> <tail> <out>": the key's waiting
//	          messages are at positions head..tail-1, and out of them are
//	          in the queue or delivered, not settled;
//	          "m:<pos>:<key>" -> a waiting message:
//	          "<len(id)>:<id><deferred value>" (see luaDeferred);
//	          "i:<id>" -> "<pos>:<key>", to find a waiting message by id;
//	          "r:<key>" -> the key's token bucket "<tokens> <at ms>";
//	          "u:<ref>" -> a delivery retried with SkipRetries, settled
//	          already for its key; "us" -> how many there are.
//	P:{R}:gw  zset: member key, score how many of its messages wait.
//	P:{R}:gt  zset: member key, score when the key is looked at again:
//	          when its next token is due, or when its drained bucket is
//	          full and can go.
//
// A key's fields go once it is drained (and its bucket full), so a
// million keys used once leave nothing. A message the key lets go is
// queued at its level with the fields g (its key) and i (its id), so a
// settle knows its key, and a delivery's ref is marked (groupRefMark): the
// settle of a marked ref runs the settle_group script, and an unmarked
// one costs what it did.

import (
	"context"
	"fmt"
	"strconv"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/redis/rueidis"
)

// groups is receiver's groups hash P:{R}:g (see the top of groups.go).
func (k keys) groups(receiver string) string { return k.named(receiver, "g") }

// groupWaits is receiver's zset of keys by waiting messages P:{R}:gw.
func (k keys) groupWaits(receiver string) string { return k.named(receiver, "gw") }

// groupTimes is receiver's zset of keys by when they are looked at again
// P:{R}:gt.
func (k keys) groupTimes(receiver string) string { return k.named(receiver, "gt") }

// groupKeys returns the keys a script that queues a waiting message of
// receiver needs, in luaGroups' order: the three level streams, the
// holders hash (wake entries), and the groups' three keys.
func (b *Broker) groupKeys(receiver string) []string {
	return []string{b.keys.queue(receiver), b.keys.queueAt(receiver, broker.PriorityHigh), b.keys.queueAt(receiver, broker.PriorityLow),
		b.keys.holders(receiver), b.keys.groups(receiver), b.keys.groupWaits(receiver), b.keys.groupTimes(receiver)}
}

// groupRefMark starts the ref of a delivery of a keyed message: its
// settle settles its key too (settle_group). Scripts see refs without it.
const groupRefMark = 'g'

// unmarkRef returns ref without its groupRefMark, and whether it had one.
func unmarkRef(ref string) (string, bool) {
	if ref != "" && ref[0] == groupRefMark {
		return ref[1:], true
	}
	return ref, false
}

// ConfigureGroups sets how p.Receiver's groups run: one HSET of P:{R}:g's
// field c, or HDEL of it for the defaults (so a receiver that never uses
// groups has no key for them). A key with more room than before (a higher
// concurrency, a rate lifted) takes it at its next settle or token. See
// broker.Groups.
func (b *Broker) ConfigureGroups(ctx context.Context, p *broker.GroupConfig) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	k := b.keys.groups(p.Receiver)
	if p.Concurrency == 1 && p.Rate == 0 && !p.SkipRetries {
		return b.failIf(ctx, "configure groups", b.client.Do(ctx, b.client.B().Hdel().Key(k).Field("c").Build()).Error())
	}
	conf := fmt.Sprintf("%d %s %d %s", p.Concurrency, strconv.FormatFloat(p.Rate, 'g', -1, 64), max(p.Burst, 0), boolArg(p.SkipRetries))
	err := b.client.Do(ctx, b.client.B().Hset().Key(k).FieldValue().FieldValue("c", conf).Build()).Error()
	return b.failIf(ctx, "configure groups", err)
}

// BusiestGroups returns up to n keys of receiver with the most waiting
// messages: ZRANGE P:{R}:gw 0 n-1 REV WITHSCORES. See broker.Groups.
func (b *Broker) BusiestGroups(ctx context.Context, receiver string, n int) ([]broker.GroupLoad, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, err
	}
	if err := broker.CheckBusiest(n); err != nil {
		return nil, err
	}
	zs, err := b.client.Do(ctx, b.client.B().Zrange().Key(b.keys.groupWaits(receiver)).Min("0").Max(strconv.Itoa(n-1)).
		Rev().Withscores().Build()).AsZScores()
	if err != nil {
		return nil, b.fail(ctx, "busiest groups", err)
	}
	out := make([]broker.GroupLoad, 0, len(zs))
	for _, z := range zs {
		out = append(out, broker.GroupLoad{Key: z.Member, Waiting: int64(z.Score)})
	}
	return out, nil
}

// settleGroup settles refs of receiver, marked keyed (their marks taken
// off): with drop, as Drop does (counted as expired), else as Ack does.
// One settle_group script per 1,000 refs.
func (b *Broker) settleGroup(ctx context.Context, op, receiver string, refs []string, drop bool) error {
	keys := append(b.groupKeys(receiver), b.keys.retries(receiver), b.keys.expired(receiver))
	for chunk := range chunks(refs) {
		first, err := scriptSettleGroup.Exec(ctx, b.client, keys, append([]string{boolArg(drop)}, chunk...)).AsInt64()
		if err != nil && !isNoGroup(err) {
			return b.fail(ctx, op, err)
		}
		if first == 1 {
			b.levelsChanged(ctx, receiver)
		}
	}
	return nil
}

// splitKeyed returns the refs without a groupRefMark, and those with one,
// the mark taken off; keyed is nil when there are none.
func splitKeyed(refs []string) (plain, keyed []string) {
	for i, ref := range refs {
		if ref != "" && ref[0] == groupRefMark {
			plain = append(refs[:i:i], plain...)
			for _, ref := range refs[i:] {
				if r, ok := unmarkRef(ref); ok {
					keyed = append(keyed, r)
				} else {
					plain = append(plain, ref)
				}
			}
			return plain, keyed
		}
	}
	return refs, nil
}

// luaGroups defines the functions of keyed groups over G, the table that
// groupsAt(i) makes of KEYS[i..i+6] (Broker.groupKeys' order): G.q, G.h
// and G.l, the level streams; G.hold, the holders hash (wake entries);
// G.g, G.w and G.t, the groups' hash and zsets (see the top of groups.go).
// G.first is set to 1 when a message is queued at the high or low level
// whose stream held nothing (see levelsChanged); G.nowake set, the
// functions add no wake entries (the fetch script learns the due time
// itself).
//
//   - gpush(G, key, id, value) adds a message (value: its deferred value)
//     at the tail of key, and queues what key may have out.
//   - gsettle(G, key, ref) counts a settled delivery off its key (but not
//     twice: see u:<ref>), and queues what key may have out.
//   - gskip(G, key, ref) settles a delivery retried with SkipRetries.
//   - gcancel(G, id) removes a waiting message and returns its deferred
//     value, or nil.
//   - gdue(G) looks at the keys of G.t whose time came (at most 1000) and
//     returns the time of the next, or -1.
const luaGroups = `
local function groupsAt(i)
  return {q = KEYS[i], h = KEYS[i + 1], l = KEYS[i + 2], hold = KEYS[i + 3], g = KEYS[i + 4], w = KEYS[i + 5], t = KEYS[i + 6], first = 0}
end
local function gfmt(n) return string.format('%.0f', n) end
local function gconf(G)
  if G.n then return end
  G.n, G.rate, G.burst, G.skip = 1, 0, 0, false
  local c = redis.call('HGET', G.g, 'c')
  if c then
    local n, rate, burst, skip = string.match(c, '^(%d+) (%S+) (%d+) (%d)$')
    if n then
      G.n, G.rate, G.burst, G.skip = tonumber(n), tonumber(rate) or 0, tonumber(burst), skip == '1'
    end
  end
end
local function gstate(G, key)
  local v = redis.call('HGET', G.g, 'k:' .. key)
  if not v then return 0, 0, 0 end
  local h, t, o = string.match(v, '^(%d+) (%d+) (%d+)$')
  return tonumber(h), tonumber(t), tonumber(o)
end
-- gwaiting adds delta to key's count of waiting messages, and the total.
local function gwaiting(G, key, delta)
  if delta == 0 then return end
  if redis.call('HINCRBY', G.g, 'w', delta) <= 0 then
    redis.call('HDEL', G.g, 'w')
  end
  if tonumber(redis.call('ZINCRBY', G.w, delta, key)) <= 0 then
    redis.call('ZREM', G.w, key)
  end
end
-- gat makes G.t look at key at t (or earlier, if it would already), and
-- wakes a blocked fetch when key comes first.
local function gat(G, key, t, wake)
  redis.call('ZADD', G.t, 'LT', gfmt(t), key)
  if wake and not G.nowake and redis.call('ZRANGE', G.t, 0, 0)[1] == key then
    queueWake(G.q, G.hold)
  end
end
local function gbucket(G, key)
  local v = redis.call('HGET', G.g, 'r:' .. key)
  if not v then return G.burst, now end
  local t, at = string.match(v, '^(%S+) (%S+)$')
  t, at = tonumber(t), tonumber(at)
  if now > at then
    t, at = math.min(G.burst, t + (now - at) * G.rate / 1000), now
  end
  return t, at
end
-- gtoken takes a token of key's bucket; without one, it makes G.t look at
-- key when one is due, and returns false.
local function gtoken(G, key)
  if G.rate <= 0 then return true end
  local t, at = gbucket(G, key)
  if t >= 1 then
    redis.call('HSET', G.g, 'r:' .. key, string.format('%.6f ', t - 1) .. gfmt(at))
    return true
  end
  redis.call('HSET', G.g, 'r:' .. key, string.format('%.6f ', t) .. gfmt(at))
  gat(G, key, at + math.ceil((1 - t) * 1000 / G.rate), true)
  return false
end
-- gforget drops key's bucket once it is full (it is as good as none), or
-- makes G.t look at key then. Without a rate there is none to drop (one
-- left from a rate since lifted goes when G.t looks at its key).
local function gforget(G, key)
  if G.rate <= 0 or redis.call('HEXISTS', G.g, 'r:' .. key) == 0 then return end
  local t, at = gbucket(G, key)
  if t >= G.burst then
    redis.call('HDEL', G.g, 'r:' .. key)
  else
    gat(G, key, at + math.ceil((G.burst - t) * 1000 / G.rate), false)
  end
end
local function gsave(G, key, head, tail, out)
  if head >= tail and out <= 0 then
    redis.call('HDEL', G.g, 'k:' .. key)
    gforget(G, key)
  else
    redis.call('HSET', G.g, 'k:' .. key, gfmt(head) .. ' ' .. gfmt(tail) .. ' ' .. gfmt(out))
  end
end
-- gqueue queues a message of key (its id and deferred value) at its level.
local function gqueue(G, key, id, value)
  local level, d, x, env = deferredValue(value)
  local stream = G.q
  if level == 'h' then stream = G.h elseif level == 'l' then stream = G.l end
  if level ~= '' and redis.call('XLEN', stream) == 0 then
    G.first = 1
    if not G.nowake then queueWake(G.q, G.hold) end
  end
  queueMessage(stream, env, d, x, key, id)
end
-- grelease queues key's waiting messages, in order, while it has fewer
-- than n out and a token for each.
local function grelease(G, key, head, tail, out)
  gconf(G)
  local moved = 0
  while head < tail and out < G.n do
    local f = 'm:' .. gfmt(head) .. ':' .. key
    local v = redis.call('HGET', G.g, f)
    if v then
      if not gtoken(G, key) then break end
      local c = string.find(v, ':', 1, true)
      local n = tonumber(string.sub(v, 1, c - 1))
      local id = string.sub(v, c + 1, c + n)
      redis.call('HDEL', G.g, f, 'i:' .. id)
      gqueue(G, key, id, string.sub(v, c + n + 1))
      out = out + 1
      moved = moved + 1
    end
    head = head + 1
  end
  gwaiting(G, key, -moved)
  gsave(G, key, head, tail, out)
end
-- gpush adds a message at the tail of key; one that may go at once (none
-- waits before it, the key has room and a token) is queued straight away.
local function gpush(G, key, id, value)
  local head, tail, out = gstate(G, key)
  gconf(G)
  if head >= tail and out < G.n and gtoken(G, key) then
    gqueue(G, key, id, value)
    gsave(G, key, tail, tail, out + 1)
    return
  end
  redis.call('HSET', G.g, 'm:' .. gfmt(tail) .. ':' .. key, #id .. ':' .. id .. value, 'i:' .. id, gfmt(tail) .. ':' .. key)
  gwaiting(G, key, 1)
  grelease(G, key, head, tail + 1, out)
end
local function gsettle(G, key, ref)
  if G.skipped == nil then
    G.skipped = tonumber(redis.call('HGET', G.g, 'us') or '0') > 0
  end
  if G.skipped and redis.call('HDEL', G.g, 'u:' .. ref) == 1 then
    if redis.call('HINCRBY', G.g, 'us', -1) <= 0 then redis.call('HDEL', G.g, 'us') end
    return
  end
  local head, tail, out = gstate(G, key)
  grelease(G, key, head, tail, out - 1)
end
local function gskip(G, key, ref)
  if redis.call('HSETNX', G.g, 'u:' .. ref, '1') == 0 then return end
  redis.call('HINCRBY', G.g, 'us', 1)
  local head, tail, out = gstate(G, key)
  grelease(G, key, head, tail, out - 1)
end
local function gcancel(G, id)
  local p = redis.call('HGET', G.g, 'i:' .. id)
  if not p then return nil end
  local c = string.find(p, ':', 1, true)
  local key = string.sub(p, c + 1)
  local f = 'm:' .. p
  local v = redis.call('HGET', G.g, f)
  redis.call('HDEL', G.g, f, 'i:' .. id)
  if not v then return nil end
  gwaiting(G, key, -1)
  local head, tail, out = gstate(G, key)
  grelease(G, key, head, tail, out)
  local n = string.find(v, ':', 1, true)
  return string.sub(v, n + tonumber(string.sub(v, 1, n - 1)) + 1)
end
local function gdue(G)
  local keys = redis.call('ZRANGEBYSCORE', G.t, '-inf', nowStr, 'LIMIT', 0, 1000)
  if #keys > 0 then
    gconf(G)
    redis.call('ZREM', G.t, unpack(keys))
    for _, key in ipairs(keys) do
      local head, tail, out = gstate(G, key)
      if head < tail or out > 0 then
        grelease(G, key, head, tail, out)
      elseif G.rate <= 0 then
        redis.call('HDEL', G.g, 'r:' .. key) -- a bucket of a rate since lifted
      else
        gforget(G, key)
      end
    end
  end
  local first = redis.call('ZRANGE', G.t, 0, 0, 'WITHSCORES')
  if first[2] then return tonumber(first[2]) end
  return -1
end
`

// luaGroupsLazy defines groupsLib(), which makes luaGroups' functions at
// its first call in a script run and returns gpush, gdue and gsettle: a
// script that needs them only for keyed messages does not pay for making
// them (sixteen closures) on every call. It needs luaDeferred and
// luaQueueMessage before it.
const luaGroupsLazy = `
local groupsLib
do
  local lib
  groupsLib = function()
    if not lib then
` + luaGroups + `
      lib = {gpush = gpush, gdue = gdue, gsettle = gsettle}
    end
    return lib
  end
end
`

// luaSettleGroup defines gsettleRefs(G, retries, refs), which settles
// deliveries of keyed messages (refs: entry ids, prefixed "h"/"l" at
// those levels; G as luaGroups makes it): XACK and ZREM from the retries
// zset of them all, then for each entry XDEL; one that XDEL deleted (not
// settled before) is settled for its key (field g, gsettle), which may
// queue the key's next message. It returns how many XDEL deleted. It
// needs luaGroups before it.
const luaSettleGroup = `
local function gsettleRefs(G, retries, refs)
  local gone = 0
  local byStream = {}
  for _, ref in ipairs(refs) do
    local stream, id = G.q, ref
    local c = string.sub(ref, 1, 1)
    if c == 'h' then stream, id = G.h, string.sub(ref, 2) elseif c == 'l' then stream, id = G.l, string.sub(ref, 2) end
    byStream[stream] = byStream[stream] or {}
    table.insert(byStream[stream], {id, ref})
  end
  redis.call('ZREM', retries, unpack(refs))
  for stream, es in pairs(byStream) do
    local ids = {}
    for j, e in ipairs(es) do ids[j] = e[1] end
    redis.pcall('XACK', stream, 'g', unpack(ids))
    for _, e in ipairs(es) do
      local entry = redis.call('XRANGE', stream, e[1], e[1])[1]
      if entry and redis.call('XDEL', stream, e[1]) == 1 then
        gone = gone + 1
        local f = entry[2]
        for j = 1, #f, 2 do
          if f[j] == 'g' then gsettle(G, f[j + 1], e[2]) end
        end
      end
    end
  end
  return gone
end
`

// scriptSettleGroup acknowledges and deletes deliveries of keyed
// messages, and settles them for their keys.
var scriptSettleGroup = rueidis.NewLuaScript(`-- settle_group
-- KEYS[1..7] -> the group keys (Broker.groupKeys)
-- KEYS[8] -> the retries zset P:{R}:retries
-- KEYS[9] -> the expired count P:{R}:expired
-- ARGV[1] -> "1": the deliveries expired unstarted (Queue.Drop): counted
--            in KEYS[9]; "0": they were acknowledged
-- ARGV[2..] -> refs (entry ids, prefixed "h"/"l" at those levels)
-- gsettleRefs (luaSettleGroup) of the refs. Returns 1 when a message was
-- queued at the high or low level whose stream held nothing, else 0.
` + luaNow + luaDeferred + luaQueueMessage + luaGroups + luaSettleGroup + `
local G = groupsAt(1)
local gone = gsettleRefs(G, KEYS[8], {unpack(ARGV, 2)})
if ARGV[1] == '1' and gone > 0 then
  redis.call('INCRBY', KEYS[9], gone)
end
return G.first
`)
