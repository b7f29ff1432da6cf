package redisbroker

// Retained results (broker.Results): one hash per message, P:{R}:res:<id>,
// in its receiver's slot, written by the scripts that settle the message.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// luaResult defines resFinal(R, id, st, ret, keep, set): the final write
// of a record. R = {rec = its key, idx = the index P:{R}:res, n = the
// sizes P:{R}:resn, pre = the prefix of the receiver's records
// "P:{R}:res:", cap = the cap on the receiver's retained bytes}; st is
// the final state ("d" done, "x" dead-lettered, "c" cancelled, "e"
// expired, "t" timed out), written unless the record holds a final state
// already (the first final outcome stays), or "" to leave it ("t" on a
// record that holds a reply, or with a reply in keep, is written "d": its
// sender received that reply, so it did not time out); ret is the
// retention in ms (a string), or "" to use the record's (no record and no
// ret: nothing is written, returns 0); keep is a list of field, value
// pairs written unless the field is set (the reply "rep", the error "ec"
// and "et"), set a list written always. The record then expires ret from
// now, is indexed by that time, and counts its bytes; records whose time
// passed leave the index (100 at most per call), then those closest to
// their end go until the receiver's bytes are under the cap. Evicted
// records are the receiver's, named from R.pre: keys of its slot.
//
// A record of a batch's child (field bt, the batch id) that becomes final
// here gets its outcome ("d" done, "f" done with an error, or st) written
// to the receiver's batch outbox, P:{R}:resbo (named from R.idx: a key of
// its slot), in the same step, as "<batch id> <outcome>" under its id:
// the outbox is then handed to the batch (batches.go). A record whose
// reply goes to its batch (field bp, SendParams.BatchReply) that is done
// adds " <its reply>" (the encoded reply, or nothing): a reply over the
// cap makes it failed instead (CodeReplyTooLarge), and is not kept.
// resFinal returns 2
// then, else 1.
var luaResult = `
local resFinalStates = {d = true, x = true, c = true, e = true, t = true}
local function resForget(R, id, total)
  local size = tonumber(redis.call('HGET', R.n, id) or '0')
  redis.call('HDEL', R.n, id)
  redis.call('ZREM', R.idx, id)
  return total - size
end
local function resFinal(R, id, st, ret, keep, set)
  local cur = redis.call('HMGET', R.rec, 'st', 'ret', 'rep')
  if st == 't' then
    local replied = cur[3] and cur[3] ~= ''
    for i = 1, #keep, 2 do
      if keep[i] == 'rep' and keep[i + 1] ~= '' then replied = true end
    end
    if replied then st = 'd' end
  end
  if not cur[1] then
    if ret == '' then return 0 end
    redis.call('HSET', R.rec, 'ret', ret, 'st', 'r')
    cur[1] = 'r'
  elseif ret == '' then
    ret = cur[2]
  end
  if st ~= '' and not resFinalStates[cur[1]] then
    redis.call('HSET', R.rec, 'st', st)
  end
  for i = 1, #keep, 2 do
    if keep[i + 1] ~= '' then redis.call('HSETNX', R.rec, keep[i], keep[i + 1]) end
  end
  for i = 1, #set, 2 do
    redis.call('HSET', R.rec, set[i], set[i + 1])
  end
  local reported = 1
  if st ~= '' and not resFinalStates[cur[1]] then
    local f = redis.call('HMGET', R.rec, 'bt', 'ec', 'et', 'bp', 'rep')
    if f[1] then
      local o = st
      if o == 'd' and ((f[2] or '') ~= '' or (f[3] or '') ~= '') then o = 'f' end
      local entry = f[1] .. ' ' .. o
      if o == 'd' and f[4] then
        if #(f[5] or '') > tonumber(R.cap) then
          redis.call('HSET', R.rec, 'ec', '` + broker.CodeReplyTooLarge + `', 'et', ` + strconv.Quote(broker.ReplyTooLargeText) + `)
          redis.call('HDEL', R.rec, 'rep')
          entry = f[1] .. ' f'
        else
          entry = entry .. ' ' .. (f[5] or '')
        end
      end
      redis.call('HSET', R.idx .. 'bo', id, entry)
      reported = 2
    end
  end
  redis.call('HSETNX', R.rec, 'f', nowStr)
  local r = tonumber(ret)
  redis.call('PEXPIRE', R.rec, r)
  local size = 64 + #id
  for _, f in ipairs({'rep', 'p', 'et', 'w'}) do
    size = size + redis.call('HSTRLEN', R.rec, f)
  end
  local old = tonumber(redis.call('HGET', R.n, id) or '0')
  redis.call('HSET', R.n, id, size)
  local total = redis.call('HINCRBY', R.n, '#', size - old)
  redis.call('ZADD', R.idx, string.format('%.0f', now + r), id)
  for _, g in ipairs(redis.call('ZRANGEBYSCORE', R.idx, '-inf', nowStr, 'LIMIT', 0, 100)) do
    total = resForget(R, g, total)
  end
  while total > tonumber(R.cap) do
    local head = redis.call('ZRANGE', R.idx, 0, 0)[1]
    if not head then break end
    total = resForget(R, head, total)
    redis.call('DEL', R.pre .. head)
  end
  redis.call('HSET', R.n, '#', total)
  local last = redis.call('ZRANGE', R.idx, -1, -1, 'WITHSCORES')
  if last[2] then
    local at = string.format('%.0f', tonumber(last[2]) - now + 1000)
    redis.call('PEXPIRE', R.idx, at)
    redis.call('PEXPIRE', R.n, at)
  end
  return reported
end
`

// resultArgs are the keys of message id's record, its index and sizes,
// and the prefix of the receiver's records.
func (b *Broker) resultKeys(receiver, id string) (keys []string, prefix string) {
	return []string{b.keys.result(receiver, id), b.keys.resultIndex(receiver), b.keys.resultSizes(receiver)},
		b.keys.result(receiver, "")
}

// retentionArg is d in ms as a script argument, "" for none.
func retentionArg(d time.Duration) string {
	if d <= 0 {
		return ""
	}
	return msString(d)
}

// scriptResultStart records the start of an attempt.
var scriptResultStart = rueidis.NewLuaScript(`-- result_start
-- KEYS[1] -> the record P:{R}:res:<id>
-- ARGV[1] -> worker id
-- ARGV[2] -> attempt
-- ARGV[3] -> retention ms: creates a missing record with it; "" does not
-- ARGV[4] -> deadline, unix ms, or "" (for a record created here)
-- ARGV[5] -> how long a record lives without a final outcome, ms
-- ARGV[6] -> the route "n", "s" or "i" (for a record created here)
-- ARGV[7] -> the sender (or inbox) whose slot keeps a copy of an accepted
--            reply (acceptedCopy), written as field ro, or ""
-- A final record is left as it is. Returns 1 when written, 0 if not.
` + luaNow + `
local cur = redis.call('HMGET', KEYS[1], 'st', 'ret')
if cur[1] and cur[1] ~= 'q' and cur[1] ~= 'r' then return 0 end
local ret = cur[2]
if not cur[1] then
  if ARGV[3] == '' then return 0 end
  ret = ARGV[3]
  redis.call('HSET', KEYS[1], 'ret', ret, 'rt', ARGV[6])
  if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'd', ARGV[4]) end
end
redis.call('HSET', KEYS[1], 'st', 'r', 'w', ARGV[1], 'a', ARGV[2])
if ARGV[7] ~= '' then redis.call('HSET', KEYS[1], 'ro', ARGV[7]) end
redis.call('HSETNX', KEYS[1], 'b', nowStr)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]) + tonumber(ret))
return 1
`)

// scriptResultFinish settles a delivery and records its final outcome.
var scriptResultFinish = rueidis.NewLuaScript(`-- result_finish
-- KEYS[1..3] -> the record P:{R}:res:<id>, the index P:{R}:res, the sizes
--            P:{R}:resn
-- KEYS[4] -> the level's queue stream P:{R}:q, :qh or :ql
-- KEYS[5] -> the retries zset P:{R}:retries
-- KEYS[6] -> the expired count P:{R}:expired
-- ARGV[1] -> message id
-- ARGV[2] -> entry id to acknowledge, or "" for none
-- ARGV[3] -> the entry's ref (its member in KEYS[5])
-- ARGV[4] -> "1" drops the entry (counted in KEYS[6]) instead of an ack
-- ARGV[5] -> final state: "d" done, "e" expired, "t" timed out
-- ARGV[6] -> retention ms
-- ARGV[7] -> the records' prefix P:{R}:res:
-- ARGV[8] -> the cap on the receiver's retained bytes
-- ARGV[9] -> worker id; ARGV[10] -> attempt
-- ARGV[11] -> the encoded reply its sender received, or ""
-- ARGV[12], ARGV[13] -> error code and text, or ""
-- XACK, ZREM and XDEL of the entry (and INCR of the count when dropped
-- and deleted), then resFinal. Returns resFinal's answer: 2 when a batch
-- child's outcome went to the batch outbox, else 1 (0: no record).
` + luaNow + luaResult + luaFinishRecord + `
if ARGV[2] ~= '' then
  redis.call('XACK', KEYS[4], 'g', ARGV[2])
  redis.call('ZREM', KEYS[5], ARGV[3])
  local gone = redis.call('XDEL', KEYS[4], ARGV[2])
  if ARGV[4] == '1' and gone > 0 then
    redis.call('INCRBY', KEYS[6], gone)
  end
end
return finishRecord()
`)

// luaFinishRecord defines finishRecord(), resFinal of the record
// KEYS[1..3] with the final outcome of the arguments of result_finish
// (ARGV[1], ARGV[5..13]), and returns its answer. It needs luaResult
// before it.
const luaFinishRecord = `
local function finishRecord()
  local R = {rec = KEYS[1], idx = KEYS[2], n = KEYS[3], pre = ARGV[7], cap = ARGV[8]}
  local set = {'w', ARGV[9]}
  if ARGV[10] ~= '0' then set[3], set[4] = 'a', ARGV[10] end
  return resFinal(R, ARGV[1], ARGV[5], ARGV[6], {'rep', ARGV[11], 'ec', ARGV[12], 'et', ARGV[13]}, set)
end
`

// scriptResultFinishGroup settles a delivery of a keyed message for its
// key and records its final outcome, in one step: a crash cannot leave
// the key released with the record (and a batch child's report) not
// written.
var scriptResultFinishGroup = rueidis.NewLuaScript(`-- result_finish_group
-- KEYS[1..3] -> the record P:{R}:res:<id>, the index P:{R}:res, the sizes
--            P:{R}:resn
-- KEYS[4..10] -> the group keys (Broker.groupKeys)
-- KEYS[11] -> the retries zset P:{R}:retries
-- KEYS[12] -> the expired count P:{R}:expired
-- ARGV -> as result_finish's; ARGV[3], the entry's ref (without its
--            group mark), is settled
-- gsettleRefs (luaSettleGroup) of the ref (INCR of the count when dropped
-- and deleted), which may queue its key's next message, then resFinal.
-- Returns {first, reported}: first is 1 when a message was queued at the
-- high or low level whose stream held nothing; reported is resFinal's
-- answer (2: a batch child's outcome went to the batch outbox).
` + luaNow + luaDeferred + luaQueueMessage + luaGroups + luaSettleGroup + luaResult + luaFinishRecord + `
local G = groupsAt(4)
if ARGV[3] ~= '' then
  local gone = gsettleRefs(G, KEYS[11], {ARGV[3]})
  if ARGV[4] == '1' and gone > 0 then
    redis.call('INCRBY', KEYS[12], gone)
  end
end
local reported = finishRecord()
return {G.first, reported}
`)

// scriptResultReply records a reply its requester accepted.
var scriptResultReply = rueidis.NewLuaScript(`-- result_reply
-- KEYS[1..3] -> the record P:{R}:res:<id>, the index P:{R}:res, the sizes
--            P:{R}:resn
-- ARGV[1] -> message id
-- ARGV[2] -> the encoded reply its requester accepted
-- ARGV[3] -> the records' prefix P:{R}:res:
-- ARGV[4] -> the cap on the receiver's retained bytes
-- ARGV[5] -> retention ms
-- resFinal with no state: the reply is kept unless one is recorded.
-- Returns resFinal's answer.
` + luaNow + luaResult + `
return resFinal({rec = KEYS[1], idx = KEYS[2], n = KEYS[3], pre = ARGV[3], cap = ARGV[4]}, ARGV[1], '', ARGV[5],
  {'rep', ARGV[2]}, {})
`)

// scriptResultProgress records the latest progress of a message.
var scriptResultProgress = rueidis.NewLuaScript(`-- result_progress
-- KEYS[1] -> the record P:{R}:res:<id>
-- ARGV[1] -> the progress
-- ARGV[2] -> how long a record lives without a final outcome, ms
-- Returns 1 when recorded, 0 when there is no record, -1 when it is final.
local cur = redis.call('HMGET', KEYS[1], 'st', 'ret')
if not cur[1] then return 0 end
if cur[1] ~= 'q' and cur[1] ~= 'r' then return -1 end
redis.call('HSET', KEYS[1], 'p', ARGV[1])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + tonumber(cur[2]))
return 1
`)

// StartResult records the start of an attempt with one script.
func (b *Broker) StartResult(ctx context.Context, p *broker.StartResultParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	copyKey, owner := b.acceptedCopy(p.Receiver, p.ReplyTo, p.ID), ""
	if copyKey != "" {
		owner = p.ReplyTo
	}
	err := scriptResultStart.Exec(ctx, b.client, []string{b.keys.result(p.Receiver, p.ID)},
		[]string{p.Worker, strconv.Itoa(p.Attempt), retentionArg(p.Retention), msOf(p.Deadline), msString(broker.PendingRetention), routeArg(p.Route), owner}).Error()
	if err == nil && copyKey != "" && p.Attempt > 1 {
		err = b.takeAccepted(ctx, p, copyKey)
	}
	return b.failIf(ctx, "start result", err)
}

// FinishResult acknowledges (or drops) p.Ref and records the final
// outcome with one script: result_finish, or for a keyed message's ref
// result_finish_group, which settles it for its key in the same step.
func (b *Broker) FinishResult(ctx context.Context, p *broker.FinishResultParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	ref, keyed := unmarkRef(p.Ref)
	prio, id := refLevel(ref)
	if ref != "" && !validRef(id) {
		return broker.ErrLeaseLost
	}
	keys, prefix := b.resultKeys(p.Receiver, p.ID)
	script := scriptResultFinish
	if keyed {
		script = scriptResultFinishGroup
		keys = append(append(keys, b.groupKeys(p.Receiver)...), b.keys.retries(p.Receiver), b.keys.expired(p.Receiver))
	} else {
		keys = append(keys, b.keys.queueAt(p.Receiver, prio), b.keys.retries(p.Receiver), b.keys.expired(p.Receiver))
	}
	var rep, copyKey string
	if p.Reply != nil {
		rep = rueidis.BinaryString(wire.Encode(p.Reply))
		copyKey = b.acceptedCopy(p.Receiver, p.Reply.Receiver, p.ID)
	} else if copyKey = b.acceptedCopy(p.Receiver, p.ReplyTo, p.ID); copyKey != "" && p.Attempt > 1 {
		// An earlier attempt's reply, accepted and not recorded. Should
		// this read fail, Result still finds the copy (readAccepted).
		if data, err := b.acceptedReply(ctx, copyKey); err == nil {
			rep = data
		}
	}
	st := map[broker.ResultState]string{broker.ResultDone: "d", broker.ResultExpired: "e", broker.ResultTimedOut: "t"}[p.State]
	r := script.Exec(ctx, b.client, keys, []string{p.ID, id, ref, boolArg(p.State == broker.ResultExpired), st,
		msString(p.Retention), prefix, b.maxResults, p.Worker, strconv.Itoa(p.Attempt), rep, p.ErrorCode, p.ErrorText})
	n, err := b.finished(ctx, p.Receiver, r, keyed)
	if err != nil && !isNoGroup(err) {
		return b.fail(ctx, "finish result", err)
	}
	if err == nil && rep != "" {
		b.dropAccepted(ctx, copyKey)
	}
	if n == 2 {
		// A batch child settled: its report is in the outbox already;
		// handing it over now is only sooner (see SettleBatchReports).
		// One that failed is left to the receiver's next fetch.
		if b.settleBatchChild(ctx, p.Receiver, p.ID) != nil {
			b.forgetBatchSweep(p.Receiver)
		}
	}
	return nil
}

// finished reads r, the answer of result_finish (keyed false) or
// result_finish_group for receiver: resFinal's answer; a message queued
// at a level whose stream held nothing is told to levelsChanged.
func (b *Broker) finished(ctx context.Context, receiver string, r rueidis.RedisResult, keyed bool) (int64, error) {
	if !keyed {
		return r.AsInt64()
	}
	v, err := r.AsIntSlice()
	if err != nil {
		return 0, err
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("the result_finish_group script answered %v", v)
	}
	if v[0] == 1 {
		b.levelsChanged(ctx, receiver)
	}
	return v[1], nil
}

// SetProgress records data as the latest progress of message id.
func (b *Broker) SetProgress(ctx context.Context, receiver, id string, data []byte) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckName("id", id), broker.CheckProgress(data)); err != nil {
		return err
	}
	n, err := scriptResultProgress.Exec(ctx, b.client, []string{b.keys.result(receiver, id)},
		[]string{rueidis.BinaryString(data), msString(broker.PendingRetention)}).AsInt64()
	switch {
	case err != nil:
		return b.fail(ctx, "progress", err)
	case n == 0:
		return broker.ErrNoResult
	case n < 0:
		return broker.ErrResultFinal
	}
	return nil
}

// Result reads message id's record, its time to live and Redis time in
// one round trip.
func (b *Broker) Result(ctx context.Context, receiver, id string) (broker.ResultRecord, error) {
	if err := b.check(); err != nil {
		return broker.ResultRecord{}, err
	}
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckName("id", id)); err != nil {
		return broker.ResultRecord{}, err
	}
	recs, err := b.readResults(ctx, receiver, []string{id})
	if err != nil {
		return broker.ResultRecord{}, err
	}
	if recs[0].State == 0 {
		return broker.ResultRecord{}, broker.ErrNoResult
	}
	return recs[0], nil
}

// ListResults reads the index of receiver's final records, the latest
// ending first, then the records.
func (b *Broker) ListResults(ctx context.Context, receiver string, max int) ([]broker.ResultRecord, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckPositive("max", max)); err != nil {
		return nil, err
	}
	ids, err := b.client.Do(ctx, b.client.B().Zrange().Key(b.keys.resultIndex(receiver)).Min("+inf").Max("-inf").
		Byscore().Rev().Limit(0, int64(max)).Build()).AsStrSlice()
	if err != nil {
		return nil, b.fail(ctx, "list results", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	recs, err := b.readResults(ctx, receiver, ids)
	if err != nil {
		return nil, err
	}
	out := recs[:0]
	for _, r := range recs {
		if r.State != 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// readResults reads the records of ids (State 0: none).
func (b *Broker) readResults(ctx context.Context, receiver string, ids []string) ([]broker.ResultRecord, error) {
	cmds := make(rueidis.Commands, 0, 2*len(ids)+1)
	cmds = append(cmds, b.client.B().Time().Build())
	for _, id := range ids {
		key := b.keys.result(receiver, id)
		cmds = append(cmds, b.client.B().Hgetall().Key(key).Build(), b.client.B().Pttl().Key(key).Build())
	}
	res := b.client.DoMulti(ctx, cmds...)
	tm, err := res[0].AsStrSlice()
	if err != nil || len(tm) != 2 {
		return nil, b.fail(ctx, "result", errors.Join(err, errors.New("TIME answered badly")))
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	now := time.UnixMilli(sec*1000 + usec/1000)
	out := make([]broker.ResultRecord, len(ids))
	hs, ttls := make([]map[string]string, len(ids)), make([]int64, len(ids))
	for i := range ids {
		h, err := res[1+2*i].AsStrMap()
		if err != nil {
			return nil, b.fail(ctx, "result", err)
		}
		ttls[i], err = res[2+2*i].AsInt64()
		if err != nil {
			return nil, b.fail(ctx, "result", err)
		}
		if len(h) == 0 {
			continue
		}
		hs[i] = h
	}
	b.readAccepted(ctx, receiver, ids, hs)
	for i, id := range ids {
		h := hs[i]
		if h == nil {
			continue
		}
		rec, err := decodeResult(receiver, id, h)
		if err != nil {
			return nil, fmt.Errorf("redisbroker: result %s: %w", id, err)
		}
		rec.Now = now
		if ttl := ttls[i]; ttl > 0 {
			rec.Expires = now.Add(time.Duration(ttl) * time.Millisecond)
		}
		out[i] = rec
	}
	return out, nil
}

// routeArg is route as the scripts write it: "n", "s" or "i".
func routeArg(route broker.Route) string {
	switch route {
	case broker.RouteSender:
		return "s"
	case broker.RouteInbox:
		return "i"
	}
	return "n"
}

// resultRoutes are the routes of a record's field rt.
var resultRoutes = map[string]broker.Route{"s": broker.RouteSender, "i": broker.RouteInbox}

// resultStates are the states of a record's field st.
var resultStates = map[string]broker.ResultState{"q": broker.ResultQueued, "r": broker.ResultRunning, "d": broker.ResultDone,
	"x": broker.ResultDeadLettered, "c": broker.ResultCancelled, "e": broker.ResultExpired, "t": broker.ResultTimedOut}

// decodeResult reads a record's hash.
func decodeResult(receiver, id string, h map[string]string) (broker.ResultRecord, error) {
	rec := broker.ResultRecord{ID: id, Receiver: receiver, State: resultStates[h["st"]], Worker: h["w"],
		ErrorCode: h["ec"], ErrorText: h["et"], Batch: h["bt"]}
	if rec.State == 0 {
		return rec, fmt.Errorf("unknown state %q", h["st"])
	}
	rec.Attempts, _ = strconv.Atoi(h["a"])
	rec.Sent, _ = unixMS(h["s"])
	rec.Started, _ = unixMS(h["b"])
	rec.Finished, _ = unixMS(h["f"])
	rec.Deadline, _ = unixMS(h["d"])
	rec.Route = resultRoutes[h["rt"]]
	if ret, err := strconv.ParseInt(h["ret"], 10, 64); err == nil {
		rec.Retention = time.Duration(ret) * time.Millisecond
	}
	if p, ok := h["p"]; ok {
		rec.Progress = []byte(p)
	}
	if rep := h["rep"]; rep != "" {
		env, err := wire.DecodeString(rep)
		if err != nil {
			return rec, fmt.Errorf("the reply: %w", err)
		}
		rec.Reply = &env
	}
	// A record that is not final has a finish time only with the reply
	// its sender received (the timed reply script writes both, before the
	// worker's FinishResult); a start after a final write of resFinal's
	// would not clear it.
	if !rec.State.Final() && rec.Reply == nil {
		rec.Finished = time.Time{}
	}
	return rec, nil
}
