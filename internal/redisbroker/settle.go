package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/redis/rueidis"
)

// execOK returns the first error among the replies of a transaction
// (MULTI ... EXEC), including those of the commands EXEC ran.
func (b *Broker) execOK(res []rueidis.RedisResult) error {
	for _, r := range res {
		if err := r.Error(); err != nil {
			return err
		}
	}
	done, err := res[len(res)-1].ToArray()
	if err != nil {
		return err
	}
	for _, r := range done {
		if err := r.Error(); err != nil {
			return err
		}
	}
	return nil
}

// bury moves the entry ref of s to its dead-letter stream.
func (b *Broker) bury(ctx context.Context, s *streamKeys, ref, reason string, attempts int, bad bool) error {
	stream, id, _ := b.splitRef(s, ref)
	keys := []string{stream, s.dlq, s.retries, s.stream, s.high, s.low, s.holders, s.groups[0], s.groups[1], s.groups[2],
		s.retries, s.retries, s.retries}
	_, err := b.buried(ctx, s.receiver, scriptBury.Exec(ctx, b.client, keys,
		[]string{id, reason, strconv.Itoa(attempts), boolArg(bad), ref[:len(ref)-len(id)], "", "", "", ""}))
	return b.failIf(ctx, s.op, err)
}

// buried reads the answer of the bury script, r, for receiver ("" for a
// reply stream): whether it moved the entry.
func (b *Broker) buried(ctx context.Context, receiver string, r rueidis.RedisResult) (bool, error) {
	v, err := r.AsIntSlice()
	if err != nil {
		return false, err
	}
	if len(v) != 2 {
		return false, fmt.Errorf("the bury script answered %v", v)
	}
	if v[1] == 1 && receiver != "" {
		b.levelsChanged(ctx, receiver)
	}
	return v[0] == 1, nil
}

// Extend renews p.Consumer's leases of p.Refs and returns those it lost.
func (b *Broker) Extend(ctx context.Context, p *broker.ExtendParams) ([]string, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	receiver, consumer, refs := p.Receiver, p.Consumer, p.Refs
	var lost []string
	var levels [3][]string // entry ids by level, low, normal, high
	var marked map[string]bool
	for _, ref := range refs {
		if r, ok := unmarkRef(ref); ok {
			if marked == nil {
				marked = make(map[string]bool)
			}
			marked[r] = true
		}
		prio, id := refLevel(ref)
		if !validRef(id) {
			lost = append(lost, ref)
			continue
		}
		levels[prio+1] = append(levels[prio+1], id)
	}
	holders := b.keys.holders(receiver)
	for i, ids := range levels {
		prio := i - 1
		prefix := levelPrefix(prio)
		keys := []string{b.keys.queueAt(receiver, prio), holders}
		for chunk := range chunks(ids) {
			res, err := scriptExtend.Exec(ctx, b.client, keys, append([]string{consumer, msString(p.Lease)}, chunk...)).AsStrSlice()
			if err != nil {
				if isNoGroup(err) {
					res = chunk // the queue is gone, and its leases with it
				} else {
					return nil, b.fail(ctx, "extend", err)
				}
			}
			for _, id := range res {
				ref := prefix + id
				if marked[ref] {
					ref = string(groupRefMark) + ref
				}
				lost = append(lost, ref)
			}
		}
	}
	return lost, nil
}

// levelPrefix is the prefix of the refs of priority level prio.
func levelPrefix(prio int) string {
	switch {
	case prio > 0:
		return "h"
	case prio < 0:
		return "l"
	}
	return ""
}

// validRef reports whether ref has the form of a stream entry id
// ("ms-seq"); any other ref names no entry, and Redis would reject it.
func validRef(ref string) bool {
	_, _, ok := parseID(ref)
	return ok
}

// parseID splits a stream entry id "ms-seq" into its two numbers; ok is
// false when id does not have that form.
func parseID(id string) (ms, seq uint64, ok bool) {
	a, b, ok := strings.Cut(id, "-")
	ms, err1 := strconv.ParseUint(a, 10, 64)
	seq, err2 := strconv.ParseUint(b, 10, 64)
	return ms, seq, ok && err1 == nil && err2 == nil
}

// validLevelRefs returns the refs that have the form of a delivery's ref:
// a stream entry id, prefixed "h" or "l" at the high and low levels.
func validLevelRefs(refs []string) []string {
	out := refs[:0:0]
	for _, ref := range refs {
		if _, id := refLevel(ref); validRef(id) {
			out = append(out, ref)
		}
	}
	return out
}

// validRefs returns the refs that have the form of a stream entry id.
func validRefs(refs []string) []string {
	out := refs[:0:0]
	for _, ref := range refs {
		if validRef(ref) {
			out = append(out, ref)
		}
	}
	return out
}

// chunks yields refs in slices of at most maxBatch.
func chunks(refs []string) func(func([]string) bool) {
	return func(yield func([]string) bool) {
		for len(refs) > 0 {
			n := min(len(refs), maxBatch)
			if !yield(refs[:n:n]) {
				return
			}
			refs = refs[n:]
		}
	}
}

// Ack acknowledges and deletes the entries refs of receiver's queue.
func (b *Broker) Ack(ctx context.Context, receiver string, refs ...string) error {
	return b.settle(ctx, "ack", receiver, refs, b.ack)
}

// Drop acknowledges and deletes the entries refs of receiver's queue, not
// started because they expired, and counts them in P:{R}:expired: one
// script, drop, per level and 1,000 refs.
func (b *Broker) Drop(ctx context.Context, receiver string, refs ...string) error {
	expired := b.keys.expired(receiver)
	return b.settle(ctx, "drop", receiver, refs, func(ctx context.Context, op, stream, retries string, refs []string) error {
		for chunk := range chunks(validLevelRefs(refs)) {
			ids := make([]string, len(chunk))
			for i, ref := range chunk {
				_, ids[i] = refLevel(ref)
			}
			err := scriptDrop.Exec(ctx, b.client, []string{stream, retries, expired}, append(ids, chunk...)).Error()
			if err != nil && !isNoGroup(err) {
				return b.fail(ctx, op, err)
			}
		}
		return nil
	})
}

// settle runs end (ack, or the drop of expired entries) on receiver's refs,
// one call per priority level of them; refs of keyed messages are settled
// by settleGroup.
func (b *Broker) settle(ctx context.Context, op, receiver string, refs []string, end func(ctx context.Context, op, stream, retries string, refs []string) error) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	refs, keyed := splitKeyed(refs)
	if len(keyed) > 0 {
		if err := b.settleGroup(ctx, op, receiver, validLevelRefs(keyed), op == "drop"); err != nil {
			return err
		}
		if len(refs) == 0 {
			return nil
		}
	}
	retries := b.keys.retries(receiver)
	plain := true
	for _, ref := range refs {
		if prio, _ := refLevel(ref); prio != broker.PriorityNormal {
			plain = false
			break
		}
	}
	if plain {
		return end(ctx, op, b.keys.queue(receiver), retries, refs)
	}
	// Refs of several levels: one transaction per level.
	var levels [3][]string
	for _, ref := range refs {
		prio, _ := refLevel(ref)
		levels[prio+1] = append(levels[prio+1], ref)
	}
	for i, rs := range levels {
		if len(rs) > 0 {
			if err := end(ctx, op, b.keys.queueAt(receiver, i-1), retries, rs); err != nil {
				return err
			}
		}
	}
	return nil
}

// ack acknowledges and deletes refs of stream (all of one priority level),
// and drops them from the retries zset, in one transaction (MULTI XACK
// ZREM XDEL EXEC, one write): it costs Redis a fraction of a script call,
// and acks are the most frequent call after sends and replies.
func (b *Broker) ack(ctx context.Context, op, stream, retries string, refs []string) error {
	for chunk := range chunks(validLevelRefs(refs)) {
		ids := chunk
		if prio, _ := refLevel(chunk[0]); prio != broker.PriorityNormal {
			ids = make([]string, len(chunk))
			for i, ref := range chunk {
				_, ids[i] = refLevel(ref)
			}
		}
		res := b.client.DoMulti(ctx,
			b.client.B().Multi().Build(),
			b.client.B().Xack().Key(stream).Group("g").Id(ids...).Build(),
			b.client.B().Zrem().Key(retries).Member(chunk...).Build(),
			b.client.B().Xdel().Key(stream).Id(ids...).Build(),
			b.client.B().Exec().Build())
		if err := b.execOK(res); err != nil {
			return b.fail(ctx, op, err)
		}
	}
	return nil
}

// Retry makes p.Ref, held by p.Consumer, reclaimable after p.Delay. A delay
// shorter than the lease ages the entry (idle = lease - delay); a longer one
// parks it in the retries zset until it is due.
func (b *Broker) Retry(ctx context.Context, p *broker.RetryParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	receiver, consumer, delay, lease := p.Receiver, p.Consumer, p.Delay, p.Lease
	ref, keyed := unmarkRef(p.Ref)
	prio, id := refLevel(ref)
	if !validRef(id) {
		return broker.ErrLeaseLost
	}
	retries := b.keys.retries(receiver)
	keys := []string{b.keys.queueAt(receiver, prio), retries, retries, retries, retries, retries, retries, retries, retries}
	if keyed {
		copy(keys[2:], b.groupKeys(receiver))
	}
	v, err := scriptRetry.Exec(ctx, b.client, keys,
		[]string{consumer, id, strconv.FormatInt(delay.Milliseconds(), 10), msString(lease), boolArg(p.Uncounted), ref, boolArg(keyed)}).AsIntSlice()
	if err != nil {
		if isNoGroup(err) {
			return broker.ErrLeaseLost
		}
		return b.fail(ctx, "retry", err)
	}
	if len(v) != 2 {
		return fmt.Errorf("redisbroker: retry: the script answered %v", v)
	}
	if v[0] == 0 {
		return broker.ErrLeaseLost
	}
	if v[1] == 1 {
		b.levelsChanged(ctx, receiver)
	}
	b.forceReclaim(b.keys.queue(receiver))
	return nil
}

// DeadLetter moves d.Ref from receiver's queue to its dead-letter stream
// with reason; the stored message is the queue entry's. It returns
// broker.ErrLeaseLost when the entry is no longer in the queue.
func (b *Broker) DeadLetter(ctx context.Context, receiver string, d broker.Delivery, reason string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := broker.CheckName("Delivery.Ref", d.Ref); err != nil {
		return err
	}
	prio, id := refLevel(d.Ref)
	if !validRef(id) {
		return broker.ErrLeaseLost
	}
	keys := append([]string{b.keys.queueAt(receiver, prio), b.keys.deadLetters(receiver), b.keys.retries(receiver)}, b.groupKeys(receiver)...)
	res, prefix := b.resultKeys(receiver, d.Env.ID)
	if d.Env.Retention <= 0 {
		res = []string{keys[2], keys[2], keys[2]}
	}
	keys = append(keys, res...)
	moved, err := b.buried(ctx, receiver, scriptBury.Exec(ctx, b.client, keys,
		[]string{id, reason, strconv.Itoa(d.Attempt), "0", levelPrefix(prio), retentionArg(d.Env.Retention), prefix, b.maxResults, d.Env.ID}))
	if err != nil {
		if isNoGroup(err) {
			return broker.ErrLeaseLost
		}
		return b.fail(ctx, "dead-letter", err)
	}
	if !moved {
		return broker.ErrLeaseLost
	}
	if d.Env.Retention > 0 {
		// A batch child's report is in the outbox already: handing it over
		// now is only sooner (see SettleBatchReports).
		_ = b.SettleBatchReports(ctx, receiver)
	}
	return nil
}

func boolArg(v bool) string {
	if v {
		return "1"
	}
	return "0"
}

// scriptBury dead-letters one entry.
var scriptBury = rueidis.NewLuaScript(`-- bury
-- KEYS[1] -> the stream: P:{R}:q, or a level stream P:{R}:qh / P:{R}:ql
--            (or P:{S}:r for an unreadable reply entry)
-- KEYS[2] -> the dead-letter stream P:{R}:dlq
-- KEYS[3] -> the retries zset P:{R}:retries
-- KEYS[4..10] -> the group keys (Broker.groupKeys; for a reply stream,
--            keys of its slot never written)
-- ARGV[1] -> entry id
-- ARGV[2] -> reason
-- ARGV[3] -> attempts so far
-- ARGV[4] -> "1" if the entry does not decode, else "0"
-- ARGV[5] -> the level's prefix: "h", "l", or "" (the normal level)
-- KEYS[11..13] -> the message's record P:{R}:res:<id>, the index P:{R}:res
--            and sizes P:{R}:resn (results.go), when ARGV[6] is set
-- ARGV[6] -> the message's retention ms, or "" (no record written)
-- ARGV[7] -> the records' prefix P:{R}:res:; ARGV[8] -> the receiver's
--            cap on retained bytes; ARGV[9] -> the message id
-- A keyed entry (field g) is settled for its key. A message moved with a
-- retention has its record's final state written (dead-lettered, with
-- the reason as its error, and the attempts). Returns {moved, first}:
-- moved is 1 when moved, 0 when the entry was no longer in the stream;
-- first is 1 when its key queued a message at the high or low level whose
-- stream held nothing.
` + luaNow + luaBury + luaDeferred + luaQueueMessage + luaGroups + luaResult + `
redis.call('ZREM', KEYS[3], ARGV[5] .. ARGV[1])
local G = groupsAt(4)
local n, key = bury(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if key then gsettle(G, key, ARGV[5] .. ARGV[1]) end
if n == 1 and ARGV[6] ~= '' then
  resFinal({rec = KEYS[11], idx = KEYS[12], n = KEYS[13], pre = ARGV[7], cap = ARGV[8]}, ARGV[9], 'x', ARGV[6],
    {'ec', 'dead_letter', 'et', ARGV[2]}, {'a', ARGV[3]})
end
return {n, G.first}
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
-- KEYS[2] -> the retries zset P:{R}:retries
-- KEYS[3..9] -> the group keys (Broker.groupKeys), for a keyed entry
--            (ARGV[7]); else KEYS[2], unused
-- ARGV[1] -> consumer name
-- ARGV[2] -> entry id
-- ARGV[3] -> delay in ms
-- ARGV[4] -> lease in ms
-- ARGV[5] -> "1": the delivery does not count as an attempt (its delivery
--            count goes back by one); "0": it does
-- ARGV[6] -> the entry's ref (its member in the retries zset: the id,
--            prefixed "h"/"l" at the high and low levels)
-- ARGV[7] -> "1": the entry is of a keyed message (field g)
-- Ages the entry so that a Fetch with this lease reclaims it once the delay
-- has passed: idle = lease - delay. A delay of at least the lease is kept in
-- the retries zset (score: due time) with the entry idle 0; fetch promotes it.
-- A counted retry of a keyed entry whose groups skip retries settles it
-- for its key (gskip), which may queue the key's next message.
-- Returns {held, first}: held is 1, or 0 when the consumer does not hold
-- the entry; first is 1 when a message was queued at the high or low
-- level whose stream held nothing.
` + luaNow + luaDeferred + luaQueueMessage + luaGroups + `
local stream, id = KEYS[1], ARGV[2]
local delay, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
local p = redis.call('XPENDING', stream, 'g', id, id, 1)
if not p[1] or p[1][2] ~= ARGV[1] then
  return {0, 0}
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
local first = 0
if ARGV[7] == '1' and ARGV[5] ~= '1' then
  local G = groupsAt(3)
  gconf(G)
  local e = redis.call('XRANGE', stream, id, id)[1]
  if G.skip and e then
    for j = 1, #e[2], 2 do
      if e[2][j] == 'g' then gskip(G, e[2][j + 1], ARGV[6]) end
    end
  end
  first = G.first
end
return {1, first}
`)

// giveBackRead gives back the entries of read, read by consumer for the
// queue or reply stream home, as if never delivered: XCLAIM ... IDLE lease
// RETRYCOUNT 0 JUSTID, per stream; the next fetch of home reclaims them
// (as attempt 1), and so does any instance's fetch that reads the give-back
// wake entry queued behind those of a queue's normal level (giveBack). An
// entry that cannot be given back stays with consumer until its lease ends.
func (b *Broker) giveBackRead(ctx context.Context, consumer string, lease time.Duration, home string, read map[string][]xentry) {
	for s, es := range read {
		ids := make([]string, 0, len(es))
		for _, e := range es {
			ids = append(ids, e.ID)
		}
		_ = b.giveBack(ctx, s, consumer, lease, ids, true)
	}
	b.forceReclaim(home)
}

// giveBack gives back ids of stream, held by consumer, as if never
// delivered: one XCLAIM ... IDLE lease RETRYCOUNT 0 JUSTID. With wake, of
// a queue's normal level stream whose state this broker keeps, it is the
// give_back script instead, which also queues a give-back wake entry
// behind them (see scriptGiveBack): any instance's fetch that reads it
// reclaims them before it serves what was queued after them (Fetch). The
// priority read, which gives back what it read beyond its count and
// reclaims at its next fetch, passes no wake.
func (b *Broker) giveBack(ctx context.Context, stream, consumer string, lease time.Duration, ids []string, wake bool) error {
	if len(ids) == 0 {
		return nil
	}
	if st := b.streams.byStream(stream); wake && st != nil && st.keys.record && st.keys.stream == stream {
		return scriptGiveBack.Exec(ctx, b.client, []string{stream, st.keys.holders},
			append([]string{consumer, msString(lease)}, ids...)).Error()
	}
	return b.client.Do(ctx, b.client.B().Xclaim().Key(stream).Group("g").Consumer(consumer).MinIdleTime("0").
		Id(ids...).Idle(lease.Milliseconds()).Retrycount(0).Justid().Build()).Error()
}

// scriptGiveBack gives back entries of a queue's normal level stream.
var scriptGiveBack = rueidis.NewLuaScript(`-- give_back
-- KEYS[1] -> the queue stream P:{R}:q
-- KEYS[2] -> the holders hash P:{R}:hold (field wakes counts wake entries)
-- ARGV[1] -> consumer name; ARGV[2] -> lease in ms; ARGV[3..] -> entry ids
-- Gives back the entries the consumer holds as if never delivered (XCLAIM
-- IDLE lease RETRYCOUNT 0 JUSTID: the next reclaim takes them, as attempt
-- 1), and, when it gave back any, appends a give-back wake entry (field w,
-- value r) and counts it in the holders hash: a fetch that reads it, on any
-- instance, reclaims them before it serves entries queued after them.
-- Returns how many it gave back.
local ids = {}
for i = 3, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], 'g', ARGV[i], ARGV[i], 1)[1]
  if p and p[2] == ARGV[1] then ids[#ids + 1] = ARGV[i] end
end
if #ids == 0 then return 0 end
local args = {'XCLAIM', KEYS[1], 'g', ARGV[1], 0}
for _, id in ipairs(ids) do args[#args + 1] = id end
for _, a in ipairs({'IDLE', ARGV[2], 'RETRYCOUNT', 0, 'JUSTID'}) do args[#args + 1] = a end
redis.call(unpack(args))
redis.call('XADD', KEYS[1], '*', 'w', 'r')
redis.call('HINCRBY', KEYS[2], 'wakes', 1)
return #ids
`)

// scriptDrop acknowledges, deletes and counts expired entries.
var scriptDrop = rueidis.NewLuaScript(`-- drop
-- KEYS[1] -> the queue stream of one level P:{R}:q, :qh or :ql
-- KEYS[2] -> the retries zset P:{R}:retries
-- KEYS[3] -> the expired count P:{R}:expired (a counter)
-- ARGV    -> the entry ids, then as many refs (their members in KEYS[2])
-- XACK, ZREM and XDEL of the entries, and INCRBY of the count by the
-- entries XDEL deleted (one dropped twice, by two consumers whose leases
-- overlapped, counts once). Returns how many it counted.
local n = #ARGV / 2
local ids, refs = {}, {}
for i = 1, n do
  ids[i], refs[i] = ARGV[i], ARGV[n + i]
end
redis.call('XACK', KEYS[1], 'g', unpack(ids))
redis.call('ZREM', KEYS[2], unpack(refs))
local gone = redis.call('XDEL', KEYS[1], unpack(ids))
if gone > 0 then
  redis.call('INCRBY', KEYS[3], gone)
end
return gone
`)
