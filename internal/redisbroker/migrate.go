package redisbroker

// The keys of version 0.1 that were renamed, so that none could be taken
// for another: a receiver's deferred messages (P:{R}:s and P:{R}:sm, now
// P:{R}:deferred and P:{R}:deferred:m), its retries (P:{R}:delay, now
// P:{R}:retries) and its periodic schedules (P:{R}:s:NAME, now
// P:{R}:schedule:NAME). What an instance of 0.1 left under the former
// names, or writes there during a rolling upgrade, is moved to the current
// ones when this broker meets it: by the fetch script and the cancel
// script of a receiver (luaMigrate), and by ListSchedules of a schedule.
// Nothing reads the former names otherwise.

// legacyDeferred is the former deferred zset of receiver.
func (k keys) legacyDeferred(receiver string) string { return k.named(receiver, "s") }

// legacyDeferredMessages is the former deferred hash of receiver.
func (k keys) legacyDeferredMessages(receiver string) string { return k.named(receiver, "sm") }

// legacyRetries is the former retries zset of receiver.
func (k keys) legacyRetries(receiver string) string { return k.named(receiver, "delay") }

// legacySchedule is the former hash of schedule name of receiver.
func (k keys) legacySchedule(receiver, name string) string { return k.named(receiver, "s:"+name) }

// luaMigrate defines migrate(oldDeferred, oldMsgs, oldRetries, deferred,
// msgs, retries): it moves what the former keys of a receiver hold into
// the current ones, keeping an entry the current ones already have (the
// earlier due time of a member in both), and deletes the former keys. One
// EXISTS when there is nothing to move.
const luaMigrate = `
local function migrate(oldDeferred, oldMsgs, oldRetries, deferred, msgs, retries)
  if redis.call('EXISTS', oldDeferred, oldMsgs, oldRetries) == 0 then
    return
  end
  for _, z in ipairs({{oldDeferred, deferred}, {oldRetries, retries}}) do
    if redis.call('EXISTS', z[1]) == 1 then
      redis.call('ZUNIONSTORE', z[2], 2, z[2], z[1], 'AGGREGATE', 'MIN')
      redis.call('DEL', z[1])
    end
  end
  local h = redis.call('HGETALL', oldMsgs)
  for i = 1, #h, 2 do
    redis.call('HSETNX', msgs, h[i], h[i + 1])
  end
  redis.call('DEL', oldMsgs)
end
`
