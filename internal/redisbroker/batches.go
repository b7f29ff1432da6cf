package redisbroker

// Batches (broker.Batches). A batch lives in the slot of its completion's
// receiver C (the batch id is "<C>/<unique>"): the hash P:{C}:bt:<id>
// (its state and counts, its completion and failure messages) and the
// hash P:{C}:bt:<id>:c of its children (child id -> "w<receiver>" while
// waiting, its outcome letter once settled). The step that counts the
// last settled child of a sealed batch adds the completion to C's queue:
// same slot, one script, so it is queued exactly once.
//
// A child reports in two steps, each atomic and each repeatable: the
// script that settles it (resFinal) writes "<batch id> <outcome>" under
// its id to its receiver's outbox P:{R}:resbo, in its receiver's slot;
// then it is handed to its batch (scriptBatchReport, which counts a
// child id once) and only then deleted: at once by the settling instance
// for its own entry (settleBatchChild), and by SettleBatchReports, which
// a reclaiming Fetch runs at most once a second per receiver, for any
// entry left behind (batchSweepEvery). A crash between the two steps leaves the entry in the outbox,
// and the next SettleBatchReports of the receiver, by any instance,
// hands it over again: counted once, lost never. The same two steps run
// on one server and on a Cluster, where R and C may be in two slots.

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// batch is the hash of batch id (see the file's comment).
func (k keys) batch(id string) string {
	c, u, _ := broker.ParseBatchID(id)
	return k.named(c, "bt:"+u)
}

// batchChildren is the hash of batch id's children.
func (k keys) batchChildren(id string) string { return k.batch(id) + ":c" }

// batchOutbox is receiver's batch outbox: child id -> "<batch id>
// <outcome>", written by resFinal (as its index's name + "bo").
func (k keys) batchOutbox(receiver string) string { return k.resultIndex(receiver) + "bo" }

// batchKeys are the keys of the batch scripts: the batch, its children,
// and its completion receiver's queue.
func (b *Broker) batchKeys(id string) []string {
	c, _, _ := broker.ParseBatchID(id)
	return []string{b.keys.batch(id), b.keys.batchChildren(id), b.keys.queue(c)}
}

// luaWire defines wireWithReply(env, rep): env, an encoded envelope (the
// wire package's format) with no content, with the content of rep (an
// encoded reply; "" leaves env as it is) and rep's headers merged under
// env's own (env's win on a name in both), in the canonical encoding:
// header names in ascending byte order.
const luaWire = `
local function wireUvarint(s, i)
  local n, m = 0, 1
  while true do
    local c = string.byte(s, i)
    i = i + 1
    if c < 128 then return n + c * m, i end
    n = n + (c - 128) * m
    m = m * 128
  end
end
local function wireUvarintOf(n)
  local t = {}
  while n >= 128 do
    t[#t + 1] = string.char(n % 128 + 128)
    n = math.floor(n / 128)
  end
  t[#t + 1] = string.char(n)
  return table.concat(t)
end
local function wireSkip(s, i, k)
  local n
  for _ = 1, k do
    n, i = wireUvarint(s, i)
    i = i + n
  end
  return i
end
local function wireParts(s)
  local i = wireSkip(s, 2, 3)
  local pre = string.sub(s, 1, i - 1)
  local n
  n, i = wireUvarint(s, i)
  local content = string.sub(s, i, i + n - 1)
  local m = i + n
  i = wireSkip(s, m, 3) + 1
  while string.byte(s, i) >= 128 do i = i + 1 end
  i = i + 1
  local mid = string.sub(s, m, i - 1)
  local count
  count, i = wireUvarint(s, i)
  local h = {}
  for _ = 1, 2 * count do
    n, i = wireUvarint(s, i)
    h[#h + 1] = string.sub(s, i, i + n - 1)
    i = i + n
  end
  return pre, content, mid, h, string.sub(s, i)
end
local function wireLess(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end
local function wireWithReply(env, rep)
  if rep == '' then return env end
  local pre, _, mid, own, tail = wireParts(env)
  local _, content, _, theirs = wireParts(rep)
  local h, i, j = {}, 1, 1
  while i <= #own or j <= #theirs do
    if j > #theirs or (i <= #own and not wireLess(theirs[j], own[i])) then
      if j <= #theirs and theirs[j] == own[i] then j = j + 2 end
      h[#h + 1], h[#h + 2] = own[i], own[i + 1]
      i = i + 2
    else
      h[#h + 1], h[#h + 2] = theirs[j], theirs[j + 1]
      j = j + 2
    end
  end
  local out = {pre, wireUvarintOf(#content), content, mid, wireUvarintOf(#h / 2)}
  for k = 1, #h do
    out[#out + 1] = wireUvarintOf(#h[k])
    out[#out + 1] = h[k]
  end
  out[#out + 1] = tail
  return table.concat(out)
end
`

// luaBatchFire defines batchFire(meta, children, q, cap): when the batch
// is sealed ("s") and every child settled, it queues the completion (or,
// in all-succeed mode with a child that did not succeed, the failure
// message, if any) to q, marks the batch completed ("f", field fired
// "c", "f" or "n") and lets both keys expire after its retention. A
// completion that takes its child's reply (field rac,
// CreateBatchParams.ReplyAsContent) is queued with it (field rin, see
// scriptBatchReport; a reply that does not decode leaves the completion
// as given). A completion with a retention (field cret: a
// chain's step, a nested batch's completion) gets its retained record
// P:{C}:res:<cid> (named from q, a key of its slot), with the batch it is
// a child of (field cbt, "" for none; and field bp when its reply goes
// there, field cbp), as enqueue writes a child's; when it is not queued,
// the record is written cancelled by resFinal (cap: the cap on C's
// retained bytes), which puts its outcome in C's batch outbox when it is
// a child. Returns 2 then (C's outbox has an entry to hand over), 1 when
// the batch completed, else 0.
var luaBatchFire = luaWire + luaResult + `
local function batchFire(meta, children, q, cap)
  local m = redis.call('HMGET', meta, 'st', 'n', 's', 'all', 'd', 'cenv', 'fenv', 'ret', 'rac', 'rin')
  if m[1] ~= 's' or tonumber(m[2]) ~= tonumber(m[3]) then return 0 end
  local fired = 'c'
  if m[4] == '1' and tonumber(m[5] or '0') ~= tonumber(m[2]) then fired = 'f' end
  local c = redis.call('HMGET', meta, 'cbt', 'cret', 'cid', 'cbp')
  local base = string.sub(q, 1, -2) .. 'res'
  local out = 1
  if fired == 'c' then
    local env = m[6]
    if m[9] == '1' then
      local ok, spliced = pcall(wireWithReply, env, m[10] or '')
      if ok then env = spliced end
    end
    redis.call('XADD', q, '*', 'm', env)
    if c[2] and c[2] ~= '' then
      local rec = base .. ':' .. c[3]
      redis.call('HSET', rec, 'st', 'q', 's', nowStr, 'ret', c[2])
      if c[1] ~= '' then redis.call('HSET', rec, 'bt', c[1]) end
      if c[4] == '1' then redis.call('HSET', rec, 'bp', '1') end
      redis.call('PEXPIRE', rec, tonumber(c[2]) + ` + msString(broker.PendingRetention) + `)
    end
  else
    if m[7] ~= '' then
      redis.call('XADD', q, '*', 'm', m[7])
    else
      fired = 'n'
    end
    if c[2] and c[2] ~= '' then
      local R = {rec = base .. ':' .. c[3], idx = base, n = base .. 'n', pre = base .. ':', cap = cap}
      local set = {}
      if c[1] ~= '' then set = {'bt', c[1]} end
      out = resFinal(R, c[3], 'c', c[2], {'ec', '` + broker.CodeCancelled + `', 'et', ` + strconv.Quote(broker.NotSentText) + `}, set)
    end
  end
  redis.call('HSET', meta, 'st', 'f', 'fired', fired, 'at', nowStr)
  redis.call('HDEL', meta, 'rin')
  redis.call('PEXPIRE', meta, m[8])
  redis.call('PEXPIRE', children, m[8])
  return out
end
`

// scriptBatchCreate creates a batch.
var scriptBatchCreate = rueidis.NewLuaScript(`-- batch_create
-- KEYS[1] -> the batch P:{C}:bt:<id>; KEYS[2] -> C's index of batches P:{C}:bts
-- ARGV[1] -> "1" in all-succeed mode, else "0"
-- ARGV[2], ARGV[3] -> the encoded completion and failure ("" for none)
-- ARGV[4] -> retention ms; ARGV[5] -> the life of a batch not completed, ms
-- ARGV[6], ARGV[7] -> the completion's and the failure's ids
-- ARGV[8], ARGV[9] -> the batch of the completion ("" for none) and the
--                     completion's retention ms
-- ARGV[10] -> "1" when the completion's reply goes to that batch
-- ARGV[11] -> "1" when the completion takes its child's reply
-- ARGV[12..14] -> the batch id, the index's cap and life ms (batchIndex)
-- Returns 1, or 0 when the batch exists.
` + luaNow + luaBatchIndex + `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'st', 'o', 'all', ARGV[1], 'cenv', ARGV[2], 'fenv', ARGV[3], 'ret', ARGV[4],
  'n', 0, 's', 0, 'cid', ARGV[6], 'fid', ARGV[7], 'c0', nowStr, 'cbt', ARGV[8], 'cret', ARGV[9],
  'cbp', ARGV[10], 'rac', ARGV[11])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[4]) + tonumber(ARGV[5]))
batchIndex(KEYS[2], ARGV[12], ARGV[13], ARGV[14])
return 1
`)

// scriptBatchAdd registers children.
var scriptBatchAdd = rueidis.NewLuaScript(`-- batch_add
-- KEYS[1], KEYS[2] -> the batch and its children
-- ARGV[1] -> the life of a batch not completed, ms
-- ARGV[2..] -> child id, receiver pairs
-- Returns 1; -1 when there is no batch, -2 when it is not open.
local st = redis.call('HMGET', KEYS[1], 'st', 'ret')
if not st[1] then return -1 end
if st[1] ~= 'o' then return -2 end
local n = 0
for i = 2, #ARGV, 2 do
  n = n + redis.call('HSETNX', KEYS[2], ARGV[i], 'w' .. ARGV[i + 1])
end
redis.call('HINCRBY', KEYS[1], 'n', n)
local life = tonumber(ARGV[1]) + tonumber(st[2])
redis.call('PEXPIRE', KEYS[1], life)
redis.call('PEXPIRE', KEYS[2], life)
return 1
`)

// scriptBatchRemove forgets a waiting child that was not sent.
var scriptBatchRemove = rueidis.NewLuaScript(`-- batch_remove
-- KEYS[1..3] -> the batch, its children, the completion's queue
-- ARGV[1] -> child id; ARGV[2] -> the cap on C's retained bytes
-- Returns batchFire's answer when removed (2: C's outbox has an entry),
-- else 0.
` + luaNow + luaBatchFire + `
local v = redis.call('HGET', KEYS[2], ARGV[1])
if not v or string.sub(v, 1, 1) ~= 'w' then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'n', -1)
return math.max(batchFire(KEYS[1], KEYS[2], KEYS[3], ARGV[2]), 1)
`)

// scriptBatchReport records a child's outcome: once per child id.
var scriptBatchReport = rueidis.NewLuaScript(`-- batch_report
-- KEYS[1..3] -> the batch, its children, the completion's queue
-- ARGV[1] -> child id; ARGV[2] -> its outcome: d, f, x, c, e or t
-- ARGV[3] -> its encoded reply (SendParams.BatchReply), or ""
-- ARGV[4] -> the cap on C's retained bytes
-- A child counted already is not counted again; a child not registered
-- (its registration was lost) is counted as added. The reply of a child
-- done is kept for the completion (field rin). Then batchFire.
-- Returns batchFire's answer (2: C's outbox has an entry) or 1, or 0 when
-- the batch is gone.
` + luaNow + luaBatchFire + `
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v and string.sub(v, 1, 1) ~= 'w' then return 1 end
if not v then redis.call('HINCRBY', KEYS[1], 'n', 1) end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('HINCRBY', KEYS[1], 's', 1)
redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
if ARGV[2] == 'd' and ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'rin', ARGV[3]) end
return math.max(batchFire(KEYS[1], KEYS[2], KEYS[3], ARGV[4]), 1)
`)

// scriptBatchSeal seals a batch, or cancels it.
var scriptBatchSeal = rueidis.NewLuaScript(`-- batch_seal
-- KEYS[1..3] -> the batch, its children, the completion's queue
-- ARGV[1] -> "1" cancels too: marks the batch cancelled
-- ARGV[2] -> the cap on C's retained bytes
-- Seals an open batch, then batchFire. Returns batchFire's answer (2: C's
-- outbox has an entry) or 1, or 0 when there is no batch; when
-- cancelling, {batchFire's answer, then the waiting children as id,
-- receiver pairs}.
` + luaNow + luaBatchFire + `
local st = redis.call('HGET', KEYS[1], 'st')
if not st then return 0 end
if ARGV[1] == '1' then redis.call('HSET', KEYS[1], 'cx', '1') end
if st == 'o' then redis.call('HSET', KEYS[1], 'st', 's') end
local fired = math.max(batchFire(KEYS[1], KEYS[2], KEYS[3], ARGV[2]), 1)
if ARGV[1] ~= '1' then return fired end
local out = {tostring(fired)}
local h = redis.call('HGETALL', KEYS[2])
for i = 1, #h, 2 do
  if string.sub(h[i + 1], 1, 1) == 'w' then
    out[#out + 1] = h[i]
    out[#out + 1] = string.sub(h[i + 1], 2)
  end
end
return out
`)

// CreateBatch creates an open batch with one script.
func (b *Broker) CreateBatch(ctx context.Context, p *broker.CreateBatchParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	fenv, fid := "", ""
	if p.Failure != nil {
		fenv, fid = rueidis.BinaryString(wire.Encode(p.Failure)), p.Failure.ID
	}
	c, _, _ := broker.ParseBatchID(p.ID)
	n, err := scriptBatchCreate.Exec(ctx, b.client, []string{b.keys.batch(p.ID), b.keys.batchIndex(c)}, append([]string{boolArg(p.OnlyIfAllSucceed),
		rueidis.BinaryString(wire.Encode(&p.Completion)), fenv, msString(p.Retention), msString(broker.PendingRetention),
		p.Completion.ID, fid, p.CompletionBatch, retentionArg(p.Completion.Retention),
		boolArg(p.CompletionBatchReply), boolArg(p.ReplyAsContent)}, batchIndexArgs(p.ID)...)).AsInt64()
	switch {
	case err != nil:
		return b.fail(ctx, "create batch", err)
	case n == 0:
		return broker.ErrBatchExists
	}
	return nil
}

// AddBatchChildren registers children with one script.
func (b *Broker) AddBatchChildren(ctx context.Context, id string, children []broker.BatchChild) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckBatchChildren(id, children); err != nil {
		return err
	}
	args := make([]string, 1, 1+2*len(children))
	args[0] = msString(broker.PendingRetention)
	for _, c := range children {
		args = append(args, c.ID, c.Receiver)
	}
	n, err := scriptBatchAdd.Exec(ctx, b.client, b.batchKeys(id)[:2], args).AsInt64()
	switch {
	case err != nil:
		return b.fail(ctx, "add to batch", err)
	case n == -1:
		return broker.ErrNoBatch
	case n == -2:
		return broker.ErrBatchSealed
	}
	return nil
}

// RemoveBatchChild forgets a waiting child with one script.
func (b *Broker) RemoveBatchChild(ctx context.Context, id, childID string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := errors.Join(broker.CheckBatchID("batch id", id), broker.CheckName("child id", childID)); err != nil {
		return err
	}
	n, err := scriptBatchRemove.Exec(ctx, b.client, b.batchKeys(id), []string{childID, b.maxResults}).AsInt64()
	if err != nil {
		return b.fail(ctx, "remove from batch", err)
	}
	return b.handOnward(ctx, id, n)
}

// SealBatch seals batch id with one script, then reads it.
func (b *Broker) SealBatch(ctx context.Context, id string) (broker.BatchInfo, error) {
	if err := b.check(); err != nil {
		return broker.BatchInfo{}, err
	}
	if err := broker.CheckBatchID("batch id", id); err != nil {
		return broker.BatchInfo{}, err
	}
	n, err := scriptBatchSeal.Exec(ctx, b.client, b.batchKeys(id), []string{"0", b.maxResults}).AsInt64()
	switch {
	case err != nil:
		return broker.BatchInfo{}, b.fail(ctx, "seal batch", err)
	case n == 0:
		return broker.BatchInfo{}, broker.ErrNoBatch
	}
	if err := b.handOnward(ctx, id, n); err != nil {
		return broker.BatchInfo{}, err
	}
	return b.Batch(ctx, id)
}

// CancelBatch marks batch id cancelled and sealed with one script, and
// returns its waiting children.
func (b *Broker) CancelBatch(ctx context.Context, id string) ([]broker.BatchChild, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := broker.CheckBatchID("batch id", id); err != nil {
		return nil, err
	}
	res := scriptBatchSeal.Exec(ctx, b.client, b.batchKeys(id), []string{"1", b.maxResults})
	if n, err := res.AsInt64(); err == nil && n == 0 {
		return nil, broker.ErrNoBatch
	}
	v, err := res.AsStrSlice()
	if err == nil && len(v) == 0 {
		err = errors.New("redisbroker: the cancel script answered nothing")
	}
	if err != nil {
		return nil, b.fail(ctx, "cancel batch", err)
	}
	out := make([]broker.BatchChild, 0, len(v)/2)
	for i := 1; i+1 < len(v); i += 2 {
		out = append(out, broker.BatchChild{ID: v[i], Receiver: v[i+1]})
	}
	if err := b.handOnward(ctx, id, map[string]int64{"2": 2}[v[0]]); err != nil {
		return nil, err
	}
	return out, nil
}

// Batch reads batch id and Redis time.
func (b *Broker) Batch(ctx context.Context, id string) (broker.BatchInfo, error) {
	if err := b.check(); err != nil {
		return broker.BatchInfo{}, err
	}
	if err := broker.CheckBatchID("batch id", id); err != nil {
		return broker.BatchInfo{}, err
	}
	h, err := b.client.Do(ctx, b.client.B().Hgetall().Key(b.keys.batch(id)).Build()).AsStrMap()
	if err != nil {
		return broker.BatchInfo{}, b.fail(ctx, "batch", err)
	}
	if len(h) == 0 {
		return broker.BatchInfo{}, broker.ErrNoBatch
	}
	return decodeBatch(id, h), nil
}

// batchStates are the states of a batch's field st.
var batchStates = map[string]broker.BatchState{"o": broker.BatchOpen, "s": broker.BatchSealed, "f": broker.BatchCompleted}

// batchFired are the values of a batch's field fired.
var batchFired = map[string]broker.BatchFired{"c": broker.FiredCompletion, "f": broker.FiredFailure}

// decodeBatch reads a batch's hash.
func decodeBatch(id string, h map[string]string) broker.BatchInfo {
	num := func(f string) int { n, _ := strconv.Atoi(h[f]); return n }
	info := broker.BatchInfo{ID: id, State: batchStates[h["st"]], OnlyIfAllSucceed: h["all"] == "1", Cancelled: h["cx"] == "1",
		Fired: batchFired[h["fired"]], CompletionID: h["cid"], FailureID: h["fid"],
		Counts: broker.BatchCounts{Children: num("n"), Succeeded: num("d"), Failed: num("f"), DeadLettered: num("x"),
			Cancelled: num("c"), Expired: num("e"), TimedOut: num("t")}}
	info.Created, _ = unixMS(h["c0"])
	info.Completed, _ = unixMS(h["at"])
	return info
}

// batchOutboxScan is the most outbox entries SettleBatchReports reads at
// once.
const batchOutboxScan = 500

// reportBatchEntry hands child's outbox entry v, "<batch id> <outcome>"
// and for a chain step whose next step takes it, " <reply>", to its batch
// (batch_report, which counts a child id once). It returns the batch id
// when the batch completed as another batch's child that handOnward must
// report in turn, or "". An entry that does not read as one is skipped.
func (b *Broker) reportBatchEntry(ctx context.Context, child, v string) (string, error) {
	id, rest, ok := strings.Cut(v, " ")
	if !ok || broker.CheckBatchID("batch id", id) != nil {
		return "", nil
	}
	outcome, rep, _ := strings.Cut(rest, " ")
	n, err := scriptBatchReport.Exec(ctx, b.client, b.batchKeys(id), []string{child, outcome, rep, b.maxResults}).AsInt64()
	if err != nil {
		return "", b.fail(ctx, "batch report", err)
	}
	if n == 2 {
		return id, nil
	}
	return "", nil
}

// SettleBatchReports hands receiver's outbox entries to their batches:
// for each, the batch's report script (which counts a child once), then
// HDEL of the entry. See the file's comment.
func (b *Broker) SettleBatchReports(ctx context.Context, receiver string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	out := b.keys.batchOutbox(receiver)
	for {
		kv, err := b.client.Do(ctx, b.client.B().Hscan().Key(out).Cursor(0).Count(batchOutboxScan).Build()).AsScanEntry()
		if err != nil {
			return b.fail(ctx, "batch reports", err)
		}
		if len(kv.Elements) == 0 {
			return nil
		}
		done := make([]string, 0, len(kv.Elements)/2)
		var onward []string
		for i := 0; i+1 < len(kv.Elements); i += 2 {
			child := kv.Elements[i]
			id, err := b.reportBatchEntry(ctx, child, kv.Elements[i+1])
			if err != nil {
				return err
			}
			if id != "" {
				onward = append(onward, id)
			}
			done = append(done, child)
		}
		if err := b.client.Do(ctx, b.client.B().Hdel().Key(out).Field(done...).Build()).Error(); err != nil {
			return b.fail(ctx, "batch reports", err)
		}
		for _, id := range onward {
			if err := b.handOnward(ctx, id, 2); err != nil {
				return err
			}
		}
		if kv.Cursor == 0 && len(kv.Elements) < 2*batchOutboxScan {
			return nil
		}
	}
}

// settleBatchChild hands child's outbox entry, if any, to its batch: the
// prompt handover of the instance that settled child. Other entries are
// left to their own settlers and to the sweep (SettleBatchReports), so
// that handlers settling side by side do not each hand over all of them.
func (b *Broker) settleBatchChild(ctx context.Context, receiver, child string) error {
	out := b.keys.batchOutbox(receiver)
	v, err := b.client.Do(ctx, b.client.B().Hget().Key(out).Field(child).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return nil
	}
	if err != nil {
		return b.fail(ctx, "batch report", err)
	}
	onward, err := b.reportBatchEntry(ctx, child, v)
	if err != nil {
		return err
	}
	if err := b.client.Do(ctx, b.client.B().Hdel().Key(out).Field(child).Build()).Error(); err != nil {
		return b.fail(ctx, "batch report", err)
	}
	if onward != "" {
		return b.handOnward(ctx, onward, 2)
	}
	return nil
}

// handOnward hands over the outbox of batch id's completion receiver when
// n, a batch script's answer, is 2: the batch completed without queueing
// its completion, a child of another batch, whose outcome (cancelled) is
// in that outbox (see luaBatchFire). Should that fail, the receiver's
// sweep hands it over.
func (b *Broker) handOnward(ctx context.Context, id string, n int64) error {
	if n != 2 {
		return nil
	}
	c, _, _ := broker.ParseBatchID(id)
	return b.SettleBatchReports(ctx, c)
}

// batchSweepEvery is how often, at most, a Fetch that reclaims hands its
// receiver's batch outbox over: the entries a settling instance left
// there when it stopped between its two steps. Like the reclaim of the
// leases that instance held, it comes with the reclaiming fetches: of a
// busy receiver every reclaimEvery, of a quiet one after a worker left
// the registry (the reclaim epoch), or after a hand-over of this broker
// failed (forgetBatchSweep). An idle receiver so costs no scan of its
// outbox by time.
const batchSweepEvery = time.Second

// batchSweeps is when each receiver's outbox was last handed over by this
// broker (local time: it only paces the work).
type batchSweeps struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// sweepBatchReports runs SettleBatchReports for st's receiver at most
// once per batchSweepEvery; one that fails is tried again at the next
// fetch of the receiver (forgetBatchSweep).
func (b *Broker) sweepBatchReports(ctx context.Context, st *streamState) {
	receiver := st.keys.receiver
	now := time.Now()
	s := &b.batchSweeps
	s.mu.Lock()
	if s.last == nil {
		s.last = make(map[string]time.Time)
	}
	due := now.Sub(s.last[receiver]) >= batchSweepEvery
	if due {
		s.last[receiver] = now
	}
	s.mu.Unlock()
	if due && b.SettleBatchReports(ctx, receiver) != nil {
		b.forgetBatchSweep(receiver)
	}
}

// forgetBatchSweep makes the next fetch of receiver reclaim, and hand its
// batch outbox over then, however recent the last hand-over: one failed
// (a report may wait in the outbox).
func (b *Broker) forgetBatchSweep(receiver string) {
	s := &b.batchSweeps
	s.mu.Lock()
	delete(s.last, receiver)
	s.mu.Unlock()
	b.forceReclaim(b.keys.queue(receiver))
}
