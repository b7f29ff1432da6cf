package redisbroker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// Acquire takes or renews receiver's exclusive lock for owner for ttl.
func (b *Broker) Acquire(ctx context.Context, receiver, owner string, ttl time.Duration) (bool, error) {
	if err := b.check(); err != nil {
		return false, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return false, err
	}
	if err := broker.CheckName("owner", owner); err != nil {
		return false, err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return false, err
	}
	n, err := scriptAcquire.Exec(ctx, b.client, []string{b.keys.lock(receiver)}, []string{owner, msString(ttl)}).AsInt64()
	if err != nil {
		return false, b.fail(ctx, "acquire", err)
	}
	return n == 1, nil
}

// Release gives up owner's lock of receiver, if owner holds it.
func (b *Broker) Release(ctx context.Context, receiver, owner string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := broker.CheckName("owner", owner); err != nil {
		return err
	}
	err := scriptRelease.Exec(ctx, b.client, []string{b.keys.lock(receiver)}, []string{owner}).Error()
	return b.failIf(ctx, "release", err)
}

// Heartbeat records info as live for ttl; LastSeen becomes Redis time.
func (b *Broker) Heartbeat(ctx context.Context, info broker.WorkerInfo, ttl time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("WorkerInfo.ID", info.ID); err != nil {
		return err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return err
	}
	info.LastSeen = time.Time{}
	data, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("redisbroker: heartbeat: %w", err)
	}
	// The epoch and the departed workers as this broker last read them:
	// the script sends the departed ones again only when the epoch moved.
	known := b.reclaimEpoch.Load() - 1
	sent := time.Now()
	res, err := scriptHeartbeat.Exec(ctx, b.client, []string{b.keys.workers(), b.keys.worker(info.ID), b.keys.reclaimEpoch(), b.keys.departed()},
		[]string{info.ID, string(data), msString(ttl), msString(departedFor), strconv.FormatInt(known, 10)}).ToArray()
	got := time.Now()
	if err == nil && len(res) < 3 {
		err = fmt.Errorf("the heartbeat script answered %d values", len(res))
	}
	if err != nil {
		return b.fail(ctx, "heartbeat", err)
	}
	us, err1 := res[0].AsInt64()
	epoch, err2 := res[1].AsInt64()
	fresh, err3 := res[2].AsInt64()
	if err := errors.Join(err1, err2, err3); err != nil {
		return fmt.Errorf("redisbroker: heartbeat: %w", err)
	}
	b.offset.Measure(sent, time.UnixMicro(us), got)
	b.heartbeatTTL.Store(int64(ttl))
	if fresh == 1 {
		departed := make([]string, 0, len(res)-3)
		for i := 3; i+1 < len(res); i += 2 {
			id, err1 := res[i].ToString()
			left, err2 := res[i+1].ToString()
			if err1 == nil && err2 == nil {
				departed = append(departed, id, left)
			}
		}
		b.departed.Store(&departed)
	}
	// A worker left (its deliveries, in any stream, are reclaimable at
	// once: see the fetch script), or a message was queued at another
	// priority level: quiet streams run the fetch script at their next
	// fetch rather than at their slow period (idleReclaimMax).
	if old := b.reclaimEpoch.Swap(epoch + 1); old != 0 && old != epoch+1 {
		b.forceReclaimAll()
	}
	return nil
}

// departedFor is how long the registry remembers a worker that left: the
// fetches of the streams it held reclaim its deliveries at once meanwhile
// (their next fetch script, which a departure makes due), and after their
// lease later.
const departedFor = 10 * time.Minute

// departedWorkers returns the workers that left the registry, each
// followed by when it left (Redis time, unix ms), as this broker's last
// heartbeat saw them.
func (b *Broker) departedWorkers() []string {
	if p := b.departed.Load(); p != nil {
		return *p
	}
	return nil
}

// Deregister removes worker id from the registry.
func (b *Broker) Deregister(ctx context.Context, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("id", id); err != nil {
		return err
	}
	// The worker's entries in the holders hashes of its receivers go with
	// it: it holds nothing once it leaves.
	data, err := b.client.Do(ctx, b.client.B().Hget().Key(b.keys.worker(id)).Field("info").Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		return b.fail(ctx, "deregister", err)
	}
	var info broker.WorkerInfo
	if data != "" && json.Unmarshal([]byte(data), &info) == nil && len(info.Receivers) > 0 {
		cmds := make(rueidis.Commands, len(info.Receivers))
		for i, r := range info.Receivers {
			cmds[i] = b.client.B().Hdel().Key(b.keys.holders(r)).Field("a:"+id, "l:"+id).Build()
		}
		for _, r := range b.client.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				return b.fail(ctx, "deregister", err)
			}
		}
	}
	for _, r := range b.client.DoMulti(ctx,
		b.client.B().Del().Key(b.keys.worker(id)).Build(),
		b.client.B().Zrem().Key(b.keys.workers()).Member(id).Build(),
		b.client.B().Incr().Key(b.keys.reclaimEpoch()).Build(),
		b.client.B().Zadd().Key(b.keys.departed()).ScoreMember().ScoreMember(float64(time.Now().UnixMilli()), id).Build()) {
		if err := r.Error(); err != nil {
			return b.fail(ctx, "deregister", err)
		}
	}
	return nil
}

// Workers lists the live workers, sorted by id.
func (b *Broker) Workers(ctx context.Context) ([]broker.WorkerInfo, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	ids, err := b.client.Do(ctx, b.client.B().Zrange().Key(b.keys.workers()).Min("0").Max("-1").Build()).AsStrSlice()
	if err != nil {
		return nil, b.fail(ctx, "workers", err)
	}
	out := []broker.WorkerInfo{}
	if len(ids) == 0 {
		return out, nil
	}
	cmds := make(rueidis.Commands, len(ids))
	for i, id := range ids {
		cmds[i] = b.client.B().Hmget().Key(b.keys.worker(id)).Field("info", "seen").Build()
	}
	for _, r := range b.client.DoMulti(ctx, cmds...) {
		v, err := r.ToArray()
		if err != nil {
			return nil, b.fail(ctx, "workers", err)
		}
		if len(v) != 2 || v[0].IsNil() {
			continue // expired since the ZRANGE
		}
		data, _ := v[0].ToString()
		seen, _ := v[1].ToString()
		var info broker.WorkerInfo
		if err := json.Unmarshal([]byte(data), &info); err != nil {
			return nil, fmt.Errorf("redisbroker: workers: a worker's info does not decode: %w", err)
		}
		info.LastSeen, _ = unixMS(seen)
		out = append(out, info)
	}
	slices.SortFunc(out, func(x, y broker.WorkerInfo) int { return strings.Compare(x.ID, y.ID) })
	return out, nil
}

// Receivers lists, sorted, the receivers served by a live worker or holding
// messages or dead letters. It scans the keyspace (SCAN, on every node of a
// cluster), so it is for tools, not for hot paths.
func (b *Broker) Receivers(ctx context.Context) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	workers, err := b.Workers(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range workers {
		for _, r := range w.Receivers {
			set[r] = true
		}
	}
	var streams []string
	for _, node := range b.client.Nodes() {
		for _, suffix := range []string{"q", "qh", "ql", "dlq"} {
			var cursor uint64
			for {
				e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(b.keys.pattern(suffix)).Count(1000).Type("stream").Build()).AsScanEntry()
				if err != nil {
					return nil, b.fail(ctx, "receivers", err)
				}
				for _, key := range e.Elements {
					if name, ok := b.keys.name(key, suffix); ok && !set[name] {
						streams = append(streams, key)
					}
				}
				if cursor = e.Cursor; cursor == 0 {
					break
				}
			}
		}
	}
	// A receiver with deferred messages: a zset exists only
	// while it holds something.
	for _, node := range b.client.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(b.keys.pattern("deferred")).Count(1000).Type("zset").Build()).AsScanEntry()
			if err != nil {
				return nil, b.fail(ctx, "receivers", err)
			}
			for _, key := range e.Elements {
				if name, ok := b.keys.name(key, "deferred"); ok {
					set[name] = true
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	if len(streams) > 0 {
		// Streams outlive their entries (the group stays): count only
		// those that hold something.
		cmds := make(rueidis.Commands, len(streams))
		for i, key := range streams {
			cmds[i] = b.client.B().Xlen().Key(key).Build()
		}
		for i, r := range b.client.DoMulti(ctx, cmds...) {
			n, err := r.AsInt64()
			if err != nil {
				return nil, b.fail(ctx, "receivers", err)
			}
			if n > 0 {
				for _, suffix := range []string{"q", "qh", "ql", "dlq"} {
					if name, ok := b.keys.name(streams[i], suffix); ok {
						set[name] = true
						break
					}
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for name := range set {
		out = append(out, name)
	}
	slices.Sort(out)
	return out, nil
}

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
-- KEYS[3] -> the reclaim epoch P:{workers}:reclaim (a counter: see keys.go)
-- KEYS[4] -> the departed workers P:{workers}:departed (zset: id -> when
--            it left, ms)
-- ARGV[1] -> worker id
-- ARGV[2] -> worker info, JSON
-- ARGV[3] -> ttl in ms
-- ARGV[4] -> how long a departed worker is remembered, ms
-- ARGV[5] -> the reclaim epoch the caller knows (-1: none)
-- Stores the info with seen = Redis time, expiring after ttl; moves the
-- expired ids of the registry to the departed set, adding how many to
-- KEYS[3]; when this worker was not in the registry (its first heartbeat,
-- or it is back after it lapsed or deregistered), takes it out of the
-- departed set, and if it was there adds 1 to KEYS[3], so that the other
-- workers read the departed ids again and stop reclaiming its deliveries.
-- When the epoch is not the caller's (a worker left or came back since),
-- it forgets the departures older than ARGV[4] and answers the departed
-- ids, each with when it left. One script per worker, whatever the number
-- of its receivers, and five commands while nobody leaves. Returns {Redis
-- time (unix µs), the reclaim epoch, 1 when the departed ids follow (else
-- 0), a departed id, when it left (unix ms), ...}.
` + luaNow + `
redis.call('HSET', KEYS[2], 'info', ARGV[2], 'seen', nowStr)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
local back = 0
if redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[3])), ARGV[1]) == 1 then
  back = redis.call('ZREM', KEYS[4], ARGV[1])
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. nowStr)
local epoch
if #expired > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. nowStr)
  for _, id in ipairs(expired) do
    redis.call('ZADD', KEYS[4], nowStr, id)
  end
end
if #expired + back > 0 then
  epoch = redis.call('INCRBY', KEYS[3], #expired + back)
else
  epoch = tonumber(redis.call('GET', KEYS[3]) or '0')
end
local us = tm[1] .. string.rep('0', 6 - #tm[2]) .. tm[2]
if tostring(epoch) == ARGV[5] then
  return {us, epoch, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%.0f', now - tonumber(ARGV[4])))
local out = {us, epoch, 1}
for _, v in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1, 'WITHSCORES')) do
  out[#out + 1] = v
end
return out
`)
