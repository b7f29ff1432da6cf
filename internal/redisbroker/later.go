package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/redis/rueidis"
)

// scheduleExec returns the keys and arguments of the script schedule (or
// schedule_timed, for a timed message of a named sender) for env, encoded
// as data.
func (b *Broker) scheduleExec(env *broker.Envelope, data string) rueidis.LuaExec {
	keys := []string{b.keys.scheduled(env.Receiver), b.keys.scheduledMessages(env.Receiver), b.keys.queue(env.Receiver), b.keys.holders(env.Receiver)}
	if env.Timeout > 0 && !env.FromInbox {
		keys = append(keys, b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender))
	}
	at := ""
	if !env.DeliverAt.IsZero() {
		at = strconv.FormatInt(env.DeliverAt.UnixMilli(), 10)
	}
	timeout := "0"
	if env.Timeout > 0 {
		timeout = msString(env.Timeout)
	}
	return rueidis.LuaExec{Keys: keys, Args: []string{data, env.ID, msString(env.Delay), at, timeout}}
}

// sendScheduled sends env, encoded as data, for later: one script,
// schedule (schedule_timed for a timed message of a named sender, which
// also records the pending timeout at due + timeout). The due time is
// Redis time.
func (b *Broker) sendScheduled(ctx context.Context, env *broker.Envelope, data string) (time.Time, error) {
	script := scriptSchedule
	if env.Timeout > 0 && !env.FromInbox {
		script = scriptScheduleTimed
	}
	e := b.scheduleExec(env, data)
	return b.scheduled(ctx, script.Exec(ctx, b.client, e.Keys, e.Args))
}

// scheduled reads the answer of a schedule script: the deadline, zero if
// none.
func (b *Broker) scheduled(ctx context.Context, r rueidis.RedisResult) (time.Time, error) {
	v, err := r.AsIntSlice()
	if err != nil {
		return time.Time{}, b.fail(ctx, "send", err)
	}
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("redisbroker: send: schedule script answered %v", v)
	}
	if v[1] < 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(v[1]), nil
}

// sendScheduledSplit is sendTimedSplit for a message sent for later: the
// pending timeout is recorded first, in the sender's slot, at Redis time +
// the delay + the timeout, then the message is scheduled in the
// receiver's slot for that deadline - the timeout.
func (b *Broker) sendScheduledSplit(ctx context.Context, env *broker.Envelope, data string) (time.Time, error) {
	t, tm := b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender)
	delay := env.Delay
	if !env.DeliverAt.IsZero() {
		now, err := b.estimateNow(ctx)
		if err != nil {
			return time.Time{}, err
		}
		delay = max(env.DeliverAt.Sub(now), 0)
	}
	res, err := scriptPendTimed.Exec(ctx, b.client, []string{t, tm},
		[]string{data, env.ID, msString(delay + env.Timeout)}).ToString()
	if err != nil {
		return time.Time{}, b.fail(ctx, "send", err)
	}
	deadline, err := parseDeadline(res)
	if err != nil {
		return time.Time{}, err
	}
	at := deadline.Add(-env.Timeout)
	e := rueidis.LuaExec{
		Keys: []string{b.keys.scheduled(env.Receiver), b.keys.scheduledMessages(env.Receiver), b.keys.queue(env.Receiver), b.keys.holders(env.Receiver)},
		Args: []string{data, env.ID, "0", strconv.FormatInt(at.UnixMilli(), 10), msString(env.Timeout)},
	}
	_, err = b.scheduled(ctx, scriptSchedule.Exec(ctx, b.client, e.Keys, e.Args))
	if err == nil {
		return deadline, nil
	}
	if cerr := scriptCancel.Exec(context.WithoutCancel(ctx), b.client, []string{t, tm}, []string{env.ID}).Error(); cerr != nil {
		err = fmt.Errorf("%w (and the pending timeout could not be withdrawn: the sender gets a timeout notice for it: %v)", err, cerr)
	}
	return time.Time{}, err
}

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
