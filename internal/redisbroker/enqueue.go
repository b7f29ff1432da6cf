package redisbroker

// The enqueue script: the one step that stores a message with every
// option of its send (see broker.SendParams), and the Go that builds its
// arguments and reads its answer.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/wire"
	"github.com/redis/rueidis"
)

// enqueueExec returns the keys and arguments of the enqueue script for p.
// given, when not empty, is p's deadline in unix ms (decided in another
// slot: sendSplit); a message from an inbox has its deadline as estimated
// (p.Result.Deadline, set by sendRun). pend says whether the script
// records the pending timeout of a timed message from a named sender.
func (b *Broker) enqueueExec(p *broker.SendParams, given string, pend bool) rueidis.LuaExec {
	env := &p.Env
	if p.DedupUntilSettled {
		env.DedupKey = p.DedupKey // it travels: see broker.SendParams
	}
	if p.Retention > 0 {
		env.Retention = p.Retention // it travels too
	}
	r := env.Receiver
	q := b.keys.queue(r)
	keys := []string{b.keys.queueAt(r, env.Priority), q, b.keys.deferred(r), b.keys.deferredMessages(r), b.keys.holders(r), q, q, q, q, q,
		q, q, q, q, q, q}
	if p.GroupKey != "" {
		keys[10], keys[11], keys[12] = b.keys.groups(r), b.keys.groupWaits(r), b.keys.groupTimes(r)
		keys[13], keys[14] = b.keys.queueAt(r, broker.PriorityHigh), b.keys.queueAt(r, broker.PriorityLow)
	}
	debounce := []string{"", ""}
	if p.DebounceKey != "" {
		keys[9] = b.keys.debounce(r, p.DebounceKey)
		debounce = []string{msString(p.DebounceWait), msString(p.DebounceMax)}
	}
	if p.DedupKey != "" {
		keys[5] = b.keys.dedup(r, p.DedupKey)
	}
	if p.Retention > 0 {
		keys[15] = b.keys.result(r, env.ID)
	}
	if env.IdempotencyKey != "" {
		keys[6] = b.keys.idempotency(r, env.IdempotencyKey)
	}
	pendArg := "0"
	if pend && env.Timeout > 0 && env.Route == broker.RouteSender {
		keys[7], keys[8], pendArg = b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender), "1"
	}
	if d := msOf(p.Result.Deadline); d != "" {
		given = d
	}
	at := ""
	if !p.DeliverAt.IsZero() {
		at = strconv.FormatInt(ceilMS(p.DeliverAt).UnixMilli(), 10)
	}
	expiry, expireAt := "", ""
	if p.Expiry > 0 {
		expiry = msString(p.Expiry)
	}
	if !p.ExpireAt.IsZero() {
		expireAt = strconv.FormatInt(p.ExpireAt.UnixMilli(), 10) // rounded down: never started after it
	}
	dedupTTL, idemTTL := "", ""
	if p.DedupKey != "" {
		dedupTTL = msString(p.DedupTTL)
	}
	if env.IdempotencyKey != "" {
		idemTTL = msString(p.IdemTTL)
	}
	route := "n"
	switch env.Route {
	case broker.RouteSender:
		route = "s"
	case broker.RouteInbox:
		route = "i"
	}
	return rueidis.LuaExec{Keys: keys, Args: []string{
		rueidis.BinaryString(wire.Encode(env)), env.ID, route, msString(max(env.Timeout, 0)), msString(p.Delay), at,
		given, levelPrefix(env.Priority), dedupTTL, idemTTL, env.Sender, pendArg, expiry, expireAt, debounce[0], debounce[1],
		p.GroupKey, retentionArg(p.Retention), msString(broker.PendingRetention), p.Batch, boolArg(p.BatchReply),
	}}
}

// enqueued sets p's result from r, the enqueue script's answer.
func (b *Broker) enqueued(ctx context.Context, p *broker.SendParams, r rueidis.RedisResult) {
	v, err := r.ToArray()
	if err != nil {
		b.sendFailed(ctx, p, err)
		return
	}
	res, err := enqueueResult(v)
	if err != nil {
		res = broker.SendResult{Err: fmt.Errorf("redisbroker: send: %w", err)}
	}
	p.Result = res
	if first, _ := v[len(v)-1].AsInt64(); first == 1 {
		b.levelsChanged(ctx, p.Env.Receiver)
	}
}

// enqueueResult parses the enqueue script's answer {outcome, id, deadline
// or -1, stored reply or "", first at its level}.
func enqueueResult(v []rueidis.RedisMessage) (broker.SendResult, error) {
	if len(v) != 5 {
		return broker.SendResult{}, fmt.Errorf("the enqueue script answered %d values", len(v))
	}
	outcome, err1 := v[0].AsInt64()
	id, err2 := v[1].ToString()
	deadline, err3 := v[2].AsInt64()
	rep, err4 := v[3].ToString()
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return broker.SendResult{}, err
	}
	res := broker.SendResult{Outcome: broker.SendOutcome(outcome), ID: id}
	if deadline >= 0 {
		res.Deadline = time.UnixMilli(deadline)
	}
	if res.Outcome < broker.Queued || res.Outcome > broker.Joined {
		return broker.SendResult{}, fmt.Errorf("the enqueue script answered the outcome %d", outcome)
	}
	if rep != "" {
		stored, err := wire.DecodeString(rep)
		if err != nil {
			return broker.SendResult{}, fmt.Errorf("the stored reply of the idempotency key: %w", err)
		}
		res.Reply = &stored
	}
	return res, nil
}

// scriptEnqueue sends one message: the one script every send but a plain
// XADD runs, whatever its options. Each option is a step of it, in an
// order that makes them compose: a repeated idempotency key stores
// nothing (its first send is the one send of them all), a taken dedup key
// stores nothing, and otherwise the message is stored, deferred or queued
// at its level, with its deadline, its pending timeout and the keys it
// takes, all in this one step.
var scriptEnqueue = rueidis.NewLuaScript(`-- enqueue
-- KEYS[1] -> the queue stream of the message's level P:{R}:q, :qh or :ql
-- KEYS[2] -> the queue stream P:{R}:q (a wake entry for a deferred message)
-- KEYS[3] -> the deferred zset P:{R}:deferred (member message id, score
--            due ms)
-- KEYS[4] -> the deferred hash P:{R}:deferred:m (message id ->
--            "<level><deadline ms or empty>[,<expiry ms>]:<encoded
--            envelope>", level "h", "l" or empty for the normal level)
-- KEYS[5] -> the holders hash P:{R}:hold (field wakes counts wake entries)
-- KEYS[6] -> the dedup key P:{R}:dd:<key> (string: the id that took it);
--            KEYS[2] when the message has none
-- KEYS[7] -> the idempotency key P:{R}:idem:<key> (hash: id, rep,
--            w:<request id> -> "<deadline ms or 0>:<inbox>"); KEYS[2] when
--            the message has none
-- KEYS[8] -> the sender's pending timeouts P:{S}:t; KEYS[2] unless ARGV[12]
-- KEYS[9] -> the sender's timed messages P:{S}:tm; KEYS[2] unless ARGV[12]
-- KEYS[10] -> the debounce key P:{R}:db:<key> (hash: id, the message
--            deferred by the run; first, the run's first send, unix ms);
--            KEYS[2] when the message has none
-- KEYS[11..13] -> the groups hash and zsets P:{R}:g, gw and gt
--            (groups.go), for a keyed message; else KEYS[2]
-- KEYS[14..15] -> the high and low level streams P:{R}:qh and :ql, for a
--            keyed message; else KEYS[2]
-- ARGV[1] -> the encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> route: "n" none, "s" a named sender, "i" an inbox
-- ARGV[4] -> timeout ms, 0 for none
-- ARGV[5] -> delay ms, 0 for none
-- ARGV[6] -> due time, unix ms (rounded up), or empty
-- ARGV[7] -> the deadline, unix ms, decided by the caller (a message from
--            an inbox, or whose pending timeout is in another slot), or
--            empty: then due + timeout when the timeout is > 0
-- ARGV[8] -> the level's prefix in the deferred hash: "h", "l" or empty
-- ARGV[9] -> dedup window ms, or empty for no dedup key
-- ARGV[10] -> idempotency window ms after the due time, or empty for none
-- ARGV[11] -> the sender (an inbox: the waiter of the idempotency key)
-- ARGV[12] -> "1" records the pending timeout in KEYS[8..9]
-- ARGV[13] -> expiry ms after the due time, or empty
-- ARGV[14] -> expiry, unix ms, or empty (at most one of ARGV[13..14])
-- ARGV[15] -> debounce wait ms, or empty for no debounce key
-- ARGV[16] -> debounce max ms (with ARGV[15])
-- KEYS[16] -> the message's record P:{R}:res:<id> (results.go), when
--            ARGV[18] is set; else KEYS[2]
-- ARGV[17] -> the group key, or empty for none
-- ARGV[18] -> the retention ms (SendParams.Retention), or empty for none
-- ARGV[19] -> how long a record lives without a final outcome, ms
-- ARGV[20] -> the batch id (SendParams.Batch), or empty: written in the
--             record (field bt), where its settling step finds it
-- ARGV[21] -> "1" when its reply goes to the batch (SendParams.BatchReply:
--             field bp of the record), else "0"
-- The due time is now + delay, counted from Redis time rounded up to the
-- millisecond, or ARGV[6]; a message is due when its due time is not after
-- Redis time rounded down, so it is never queued early. One due now is
-- added to its level's stream; any other to the deferred zset and hash,
-- and when it comes first in the zset, a wake entry (field w, no m) is
-- queued and counted in the holders hash, so that a blocked fetch looks at
-- the new due time. A debounced message (ARGV[15]) is due the wait after
-- now, but no later than the max after the first send of its run: when
-- the run's message is still deferred, this one replaces it (it leaves
-- the deferred zset and hash: never delivered); else this send starts a
-- new run. The queued message's field d is its deadline; an
-- idempotent one's is the end of its key's window instead, so that a
-- worker starts it as long as its reply can be used. Its field x is its
-- expiry, when it has one: the due time + ARGV[13], or ARGV[14]. A keyed
-- message (ARGV[17]) due now goes behind its key (gpush), which queues it
-- if the key has room; one deferred keeps its key in its deferred value.
-- Returns {outcome, id, deadline or -1, stored reply or "", first}:
-- outcome 1 queued, 2 deferred (id ARGV[2]); 3 duplicate (id: the dedup
-- key's); 4 joined (id: the idempotency key's message, with its reply if
-- stored); a message stored with a retention has its record written
-- (state q, sent now, its route, its deadline), living PendingRetention after its
-- due time plus the retention; first is 1 when the message was queued at the high or low
-- level and that level's stream held nothing before (see levelsChanged).
` + luaNow + luaDeferred + luaQueueMessage + luaGroupsLazy + `
local env, id, route = ARGV[1], ARGV[2], ARGV[3]
local group = ARGV[17]
local timeout, delay, at, given = tonumber(ARGV[4]), tonumber(ARGV[5]), ARGV[6], ARGV[7]
local dedupTTL, idemTTL, sender = ARGV[9], ARGV[10], ARGV[11]
local due = now
if delay > 0 then
  due = nowCeil + delay
elseif at ~= '' then
  due = math.max(tonumber(at), now)
end
local deadline = -1
if given ~= '' then
  deadline = tonumber(given)
elseif timeout > 0 then
  deadline = due + timeout
end
local function fmt(n) return string.format('%.0f', n) end
local waiter = fmt(math.max(deadline, 0)) .. ':' .. sender
if idemTTL ~= '' then
  local k = redis.call('HMGET', KEYS[7], 'id', 'rep')
  if k[2] then
    return {4, k[1] or '', deadline, k[2], 0}
  end
  if k[1] then
    if route == 'i' then
      redis.call('HSET', KEYS[7], 'w:' .. id, waiter)
    end
    return {4, k[1], deadline, '', 0}
  end
end
if dedupTTL ~= '' then
  local first = redis.call('GET', KEYS[6])
  if first then
    return {3, first, -1, '', 0}
  end
  redis.call('SET', KEYS[6], id, 'PX', dedupTTL)
end
if ARGV[15] ~= '' then
  local wait, maxWait = tonumber(ARGV[15]), tonumber(ARGV[16])
  local run = redis.call('HMGET', KEYS[10], 'id', 'first')
  local first = now
  if run[1] and run[2] and redis.call('ZSCORE', KEYS[3], run[1]) then
    first = tonumber(run[2])
    redis.call('ZREM', KEYS[3], run[1])
    redis.call('HDEL', KEYS[4], run[1])
  end
  due = math.max(math.min(nowCeil + wait, first + maxWait), now)
  redis.call('HSET', KEYS[10], 'id', id, 'first', fmt(first))
  redis.call('PEXPIRE', KEYS[10], fmt(first + maxWait - now + 1000))
end
local d = deadline
if idemTTL ~= '' then
  d = due + tonumber(idemTTL)
  redis.call('HSET', KEYS[7], 'id', id)
  if route == 'i' then
    redis.call('HSET', KEYS[7], 'w:' .. id, waiter)
  end
  redis.call('PEXPIRE', KEYS[7], fmt(d - now))
end
local dField, xField = '', ''
if d >= 0 then dField = fmt(d) end
if ARGV[13] ~= '' then
  xField = fmt(due + tonumber(ARGV[13]))
elseif ARGV[14] ~= '' then
  xField = ARGV[14]
end
local outcome, first = 1, 0
local times = dField
if xField ~= '' then times = times .. ',' .. xField end
if due > now then
  outcome = 2
  local keyed = ''
  if group ~= '' then keyed = 'k' .. #group .. ':' .. group end
  redis.call('ZADD', KEYS[3], fmt(due), id)
  redis.call('HSET', KEYS[4], id, keyed .. ARGV[8] .. times .. ':' .. env)
  if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == id then
    queueWake(KEYS[2], KEYS[5])
  end
elseif group ~= '' then
  local G = {q = KEYS[2], h = KEYS[14], l = KEYS[15], hold = KEYS[5], g = KEYS[11], w = KEYS[12], t = KEYS[13], first = 0}
  groupsLib().gpush(G, group, id, ARGV[8] .. times .. ':' .. env)
  first = G.first
else
  if ARGV[8] ~= '' and redis.call('XLEN', KEYS[1]) == 0 then
    first = 1
    queueWake(KEYS[2], KEYS[5])
  end
  queueMessage(KEYS[1], env, dField, xField)
end
if ARGV[12] == '1' then
  redis.call('ZADD', KEYS[8], fmt(deadline), id)
  redis.call('HSET', KEYS[9], id, env)
end
if ARGV[18] ~= '' then
  redis.call('HSET', KEYS[16], 'st', 'q', 's', nowStr, 'ret', ARGV[18], 'rt', route)
  if deadline >= 0 then redis.call('HSET', KEYS[16], 'd', fmt(deadline)) end
  if ARGV[20] ~= '' then redis.call('HSET', KEYS[16], 'bt', ARGV[20]) end
  if ARGV[21] == '1' then redis.call('HSET', KEYS[16], 'bp', '1') end
  redis.call('PEXPIRE', KEYS[16], fmt(due - now + tonumber(ARGV[19]) + tonumber(ARGV[18])))
end
return {outcome, id, deadline, '', first}
`)

// How a message is sent: chosen by the fields of its broker.SendParams,
// never by a name.
type sendWay uint8

const (
	// sendXadd: a message due now at the normal level, with no key to
	// take and no pending timeout: one XADD (a timed one from an inbox
	// carries its deadline, estimated here: see broker.Inbox).
	sendXadd sendWay = iota
	// sendEnqueue: any other message, one enqueue script in the
	// receiver's slot (which also records the pending timeout of a timed
	// message from a named sender, in the same slot).
	sendEnqueue
	// sendSplit: a timed message from a named sender whose pending
	// timeout lives in another slot than the receiver's queue, on a
	// Cluster: see sendSplit.
	sendSplit
)

// wayOf returns how p is sent.
func (b *Broker) wayOf(p *broker.SendParams) sendWay {
	env := &p.Env
	pend := env.Timeout > 0 && env.Route == broker.RouteSender
	switch {
	case pend && b.cluster && keyslot.Of(b.keys.queue(env.Receiver)) != keyslot.Of(b.keys.timeouts(env.Sender)):
		return sendSplit
	case pend || p.Deferred() || p.DedupKey != "" || env.IdempotencyKey != "" || env.Priority != broker.PriorityNormal ||
		p.Expiry > 0 || !p.ExpireAt.IsZero() || p.GroupKey != "" || p.Retention > 0:
		return sendEnqueue
	}
	return sendXadd
}
