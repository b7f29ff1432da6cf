package redisbroker

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// The keys of the periodic schedules (see the README's key schema):
//
//	P:{schedules}:idx  hash: schedule name -> its receiver (the list of schedules)
//	P:{R}:schedule:NAME  hash of schedule NAME, whose messages go to receiver R:
//	                   def (the client's encoded definition), v (version),
//	                   next (next tick, unix ms), lt (last tick sent, unix ms),
//	                   ls (when it was sent, unix ms, Redis time)
//
// A schedule's hash shares its receiver's hash slot, so that the script
// that decides a tick also queues its message: one atomic step, on a
// Cluster too.

// scheduleIndex is the hash of every schedule's name and receiver.
func (k keys) scheduleIndex() string { return k.prefix + ":{schedules}:idx" }

// schedule is the hash of schedule name, whose messages go to receiver.
func (k keys) schedule(receiver, name string) string { return k.named(receiver, "schedule:"+name) }

// scriptPutSchedule stores a schedule unless it is stored as it is.
var scriptPutSchedule = rueidis.NewLuaScript(`-- schedule_put
-- KEYS[1] -> the schedule's hash P:{R}:schedule:NAME
-- ARGV[1] -> def (the encoded definition)
-- ARGV[2] -> next tick (unix ms), used when the schedule is new or replaced
-- When def equals the stored one, nothing changes; otherwise def and next
-- are set, and v becomes max(v + 1, Redis time in microseconds), greater
-- than any version the name had, even before a removal.
-- Returns {v, next, lt, ls} as stored ("" for lt and ls when none).
` + luaNow + `
local cur = redis.call('HMGET', KEYS[1], 'def', 'v', 'next', 'lt', 'ls')
if cur[1] ~= ARGV[1] then
  local v = math.max((tonumber(cur[2]) or 0) + 1, tonumber(tm[1]) * 1000000 + tonumber(tm[2]))
  cur[2] = string.format('%.0f', v)
  cur[3] = ARGV[2]
  redis.call('HSET', KEYS[1], 'def', ARGV[1], 'v', cur[2], 'next', cur[3])
end
return {cur[2], cur[3], cur[4] or '', cur[5] or ''}
`)

// scriptTickSchedule decides one tick of a schedule.
var scriptTickSchedule = rueidis.NewLuaScript(`-- schedule_tick
-- KEYS[1] -> the schedule's hash P:{R}:schedule:NAME
-- KEYS[2] -> the receiver's queue P:{R}:q
-- ARGV[1] -> the version the caller saw
-- ARGV[2] -> due: the tick decided, the next tick the caller saw (unix ms)
-- ARGV[3] -> following: the tick after due (unix ms)
-- ARGV[4] -> resume: where the schedule goes on after missed ticks (unix ms)
-- ARGV[5] -> missed after (ms): due is missed when following is due too and
--            due is at least this old
-- ARGV[6] -> the encoded message of the tick
-- ARGV[7] -> the encoded message sent in place of missed ticks; "" skips them
-- With Redis time now: no hash -> "gone"; v or next differ from ARGV ->
-- "taken"; now < due -> "not-due"; due missed -> next = resume and
-- ARGV[7] is queued ("caught-up") or nothing ("skipped"); else ARGV[6] is
-- queued ("sent") and next = following. A queued message sets lt = due,
-- ls = now.
-- Returns {outcome, next, v, now} (next and v "" when gone).
` + luaNow + `
local cur = redis.call('HMGET', KEYS[1], 'v', 'next')
if not cur[1] then
  return {'gone', '', '', nowStr}
end
if cur[1] ~= ARGV[1] or cur[2] ~= ARGV[2] then
  return {'taken', cur[2], cur[1], nowStr}
end
local due = tonumber(ARGV[2])
if now < due then
  return {'not-due', cur[2], cur[1], nowStr}
end
local outcome, nextStr, data = 'sent', ARGV[3], ARGV[6]
if now >= tonumber(ARGV[3]) and now - due >= tonumber(ARGV[5]) then
  nextStr = ARGV[4]
  if ARGV[7] == '' then
    outcome, data = 'skipped', nil
  else
    outcome, data = 'caught-up', ARGV[7]
  end
end
if data then
  redis.call('XADD', KEYS[2], '*', 'm', data)
  redis.call('HSET', KEYS[1], 'next', nextStr, 'lt', ARGV[2], 'ls', nowStr)
else
  redis.call('HSET', KEYS[1], 'next', nextStr)
end
return {outcome, nextStr, cur[1], nowStr}
`)

// PutSchedule stores s: it removes the schedule of that name from its
// former receiver if it moved, stores it under its receiver (one script,
// which leaves an unchanged schedule alone), then lists it in the index.
// On a Cluster the index is in another slot, so these are three steps; a
// crash between them leaves a schedule that ListSchedules does not show
// (until it is put again) or one that it shows as it was.
func (b *Broker) PutSchedule(ctx context.Context, s *broker.ScheduleRecord) (broker.ScheduleRecord, error) {
	if err := b.check(); err != nil {
		return broker.ScheduleRecord{}, err
	}
	if err := s.Validate(); err != nil {
		return broker.ScheduleRecord{}, err
	}
	old, err := b.client.Do(ctx, b.client.B().Hget().Key(b.keys.scheduleIndex()).Field(s.Name).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return broker.ScheduleRecord{}, b.fail(ctx, "put schedule", err)
	}
	if old != "" && old != s.Receiver {
		if err := b.client.Do(ctx, b.client.B().Del().Key(b.keys.schedule(old, s.Name), b.keys.legacySchedule(old, s.Name)).Build()).Error(); err != nil {
			return broker.ScheduleRecord{}, b.fail(ctx, "put schedule", err)
		}
	}
	if _, err := b.migrateSchedule(ctx, s.Receiver, s.Name); err != nil {
		return broker.ScheduleRecord{}, b.fail(ctx, "put schedule", err)
	}
	res, err := scriptPutSchedule.Exec(ctx, b.client, []string{b.keys.schedule(s.Receiver, s.Name)},
		[]string{rueidis.BinaryString(s.Def), strconv.FormatInt(s.Next.UnixMilli(), 10)}).AsStrSlice()
	if err != nil {
		return broker.ScheduleRecord{}, b.fail(ctx, "put schedule", err)
	}
	if err := b.client.Do(ctx, b.client.B().Hset().Key(b.keys.scheduleIndex()).FieldValue().FieldValue(s.Name, s.Receiver).Build()).Error(); err != nil {
		return broker.ScheduleRecord{}, b.fail(ctx, "put schedule", err)
	}
	out := broker.ScheduleRecord{Name: s.Name, Receiver: s.Receiver, Def: s.Def}
	if len(res) != 4 || !setScheduleState(&out, res[0], res[1], res[2], res[3]) {
		return broker.ScheduleRecord{}, fmt.Errorf("redisbroker: put schedule: script answered %q", res)
	}
	return out, nil
}

// setScheduleState parses a schedule's stored v, next, lt and ls into r.
func setScheduleState(r *broker.ScheduleRecord, v, next, lt, ls string) bool {
	var err error
	if r.Version, err = strconv.ParseInt(v, 10, 64); err != nil {
		return false
	}
	var ok bool
	if r.Next, ok = unixMS(next); !ok {
		return false
	}
	r.LastTick, _ = unixMS(lt)
	r.LastSent, _ = unixMS(ls)
	return true
}

// RemoveSchedule deletes the schedule's hash, which stops its ticks (the
// tick script finds it gone), then its entry in the index.
func (b *Broker) RemoveSchedule(ctx context.Context, name string) (bool, error) {
	if err := b.check(); err != nil {
		return false, err
	}
	if err := broker.CheckName("name", name); err != nil {
		return false, err
	}
	r, err := b.client.Do(ctx, b.client.B().Hget().Key(b.keys.scheduleIndex()).Field(name).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	if err != nil {
		return false, b.fail(ctx, "remove schedule", err)
	}
	n, err := b.client.Do(ctx, b.client.B().Del().Key(b.keys.schedule(r, name), b.keys.legacySchedule(r, name)).Build()).AsInt64()
	if err != nil {
		return false, b.fail(ctx, "remove schedule", err)
	}
	if err := b.client.Do(ctx, b.client.B().Hdel().Key(b.keys.scheduleIndex()).Field(name).Build()).Error(); err != nil {
		return false, b.fail(ctx, "remove schedule", err)
	}
	return n > 0, nil
}

// ListSchedules reads the index, then every schedule's hash in one
// pipeline. A name of the index whose hash is missing (a removal under
// way) is left out.
func (b *Broker) ListSchedules(ctx context.Context) ([]broker.ScheduleRecord, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	idx, err := b.client.Do(ctx, b.client.B().Hgetall().Key(b.keys.scheduleIndex()).Build()).AsStrMap()
	if err != nil {
		return nil, b.fail(ctx, "list schedules", err)
	}
	names := make([]string, 0, len(idx))
	for n := range idx {
		names = append(names, n)
	}
	sort.Strings(names)
	cmds := make(rueidis.Commands, len(names))
	for i, n := range names {
		cmds[i] = b.client.B().Hmget().Key(b.keys.schedule(idx[n], n)).Field("def", "v", "next", "lt", "ls").Build()
	}
	out := make([]broker.ScheduleRecord, 0, len(names))
	for i, r := range b.client.DoMulti(ctx, cmds...) {
		f, err := scheduleFields(r)
		if err != nil {
			return nil, b.fail(ctx, "list schedules", err)
		}
		if f[0] == "" {
			// Not found: perhaps stored under its former name (migrate.go).
			if f, err = b.migrateSchedule(ctx, idx[names[i]], names[i]); err != nil {
				return nil, b.fail(ctx, "list schedules", err)
			}
		}
		if f[0] == "" {
			continue
		}
		rec := broker.ScheduleRecord{Name: names[i], Receiver: idx[names[i]], Def: []byte(f[0])}
		if !setScheduleState(&rec, f[1], f[2], f[3], f[4]) {
			continue // not a schedule this broker wrote: left out
		}
		out = append(out, rec)
	}
	return out, nil
}

// scheduleFields returns the fields def, v, next, lt and ls of r, the
// answer of a schedule hash's HMGET ("" for a missing one).
func scheduleFields(r rueidis.RedisResult) ([5]string, error) {
	var f [5]string
	vals, err := r.ToArray()
	if err != nil || len(vals) != len(f) {
		return f, err
	}
	for j, v := range vals {
		f[j], _ = v.ToString() // nil -> ""
	}
	return f, nil
}

// migrateSchedule moves the hash of schedule name of receiver from its
// former name, if it is there and the current one is not (RENAMENX, in
// the receiver's slot), and returns its fields as ListSchedules reads
// them (def "" when there was none).
func (b *Broker) migrateSchedule(ctx context.Context, receiver, name string) ([5]string, error) {
	key := b.keys.schedule(receiver, name)
	err := b.client.Do(ctx, b.client.B().Renamenx().Key(b.keys.legacySchedule(receiver, name)).Newkey(key).Build()).Error()
	if err != nil {
		if msg, ok := rueidis.IsRedisErr(err); ok && strings.Contains(msg.Error(), "no such key") {
			return [5]string{}, nil
		}
		return [5]string{}, err
	}
	return scheduleFields(b.client.Do(ctx, b.client.B().Hmget().Key(key).Field("def", "v", "next", "lt", "ls").Build()))
}

// TickSchedule decides p.Due with one script in the receiver's slot, which
// also queues the tick's message.
func (b *Broker) TickSchedule(ctx context.Context, p *broker.TickParams) (broker.TickResult, error) {
	if err := b.check(); err != nil {
		return broker.TickResult{}, err
	}
	if err := p.Validate(); err != nil {
		return broker.TickResult{}, err
	}
	if err := b.checkSize(p.Env); err != nil {
		return broker.TickResult{}, err
	}
	missed := ""
	if p.MissedEnv != nil {
		if err := b.checkSize(p.MissedEnv); err != nil {
			return broker.TickResult{}, err
		}
		missed = rueidis.BinaryString(wire.Encode(p.MissedEnv))
	}
	ms := func(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }
	res, err := scriptTickSchedule.Exec(ctx, b.client,
		[]string{b.keys.schedule(p.Receiver, p.Name), b.keys.queue(p.Receiver)},
		[]string{strconv.FormatInt(p.Version, 10), ms(p.Due), ms(p.Following), ms(p.Resume),
			msString(p.MissedAfter), rueidis.BinaryString(wire.Encode(p.Env)), missed}).AsStrSlice()
	if err != nil {
		return broker.TickResult{}, b.fail(ctx, "tick schedule", err)
	}
	if len(res) != 4 {
		return broker.TickResult{}, fmt.Errorf("redisbroker: tick schedule: script answered %q", res)
	}
	var out broker.TickResult
	switch res[0] {
	case "sent":
		out.Outcome = broker.TickSent
	case "caught-up":
		out.Outcome = broker.TickCaughtUp
	case "skipped":
		out.Outcome = broker.TickSkipped
	case "not-due":
		out.Outcome = broker.TickNotDue
	case "taken":
		out.Outcome = broker.TickTaken
	case "gone":
		out.Outcome = broker.TickGone
	default:
		return broker.TickResult{}, fmt.Errorf("redisbroker: tick schedule: script answered %q", res)
	}
	out.Next, _ = unixMS(res[1])
	out.Version, _ = strconv.ParseInt(res[2], 10, 64)
	out.Now, _ = unixMS(res[3])
	return out, nil
}
