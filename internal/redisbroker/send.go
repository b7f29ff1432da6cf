package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/wire"
)

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
		p.Expiry > 0 || !p.ExpireAt.IsZero():
		return sendEnqueue
	}
	return sendXadd
}

// Send sends ps in runs of messages sent the same way, in order: a run of
// XADDs is one pipeline, a run of enqueue scripts one pipeline of them (at
// most maxBatch commands a round trip), and a message that needs sendSplit
// goes on its own. A lone message from an inbox, the Request's, goes
// through doInbox, which merges the writes of concurrent Requests. See
// broker.Queue.
func (b *Broker) Send(ctx context.Context, ps []broker.SendParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.ValidateAll(ps, b.maxSize); err != nil {
		return err
	}
	if len(ps) == 1 {
		b.sendRun(ctx, b.wayOf(&ps[0]), ps)
		return nil
	}
	for start := 0; start < len(ps); {
		way := b.wayOf(&ps[start])
		end := start + 1
		for way != sendSplit && end < len(ps) && end-start < maxBatch && b.wayOf(&ps[end]) == way {
			end++
		}
		b.sendRun(ctx, way, ps[start:end])
		start = end
	}
	return nil
}

// sendRun sends ps, all sent the same way, and sets their results.
func (b *Broker) sendRun(ctx context.Context, way sendWay, ps []broker.SendParams) {
	var now time.Time
	if needsDeadline(ps) {
		var err error
		if now, err = b.estimateNow(ctx); err != nil {
			for i := range ps {
				ps[i].Result = broker.SendResult{Err: err}
			}
			return
		}
	}
	// A message's deadline as estimated here (from an inbox), set before
	// it is sent: it stays with an error that leaves it unknown whether
	// the message was stored (see broker.Queue.Send).
	for i := range ps {
		ps[i].Result = broker.SendResult{Deadline: estimatedDeadline(&ps[i], now)}
	}
	switch way {
	case sendSplit:
		for i := range ps {
			b.sendSplit(ctx, &ps[i], now)
		}
	case sendEnqueue:
		if len(ps) == 1 {
			e := b.enqueueExec(&ps[0], "", true)
			b.enqueued(ctx, &ps[0], scriptEnqueue.Exec(ctx, b.client, e.Keys, e.Args))
			return
		}
		execs := make([]rueidis.LuaExec, len(ps))
		for i := range ps {
			execs[i] = b.enqueueExec(&ps[i], "", true)
		}
		for i, r := range scriptEnqueue.ExecMulti(ctx, b.client, execs...) {
			b.enqueued(ctx, &ps[i], r)
		}
	case sendXadd:
		if len(ps) == 1 {
			// Alone: one command, not a pipeline of one (which costs the
			// client a slice of commands and one of results).
			p := &ps[0]
			var err error
			if p.Env.Route == broker.RouteInbox {
				var res rueidis.RedisResult
				if res, err = b.doInbox(ctx, b.xaddOf(p)); err == nil {
					err = res.Error()
				}
			} else {
				err = b.client.Do(ctx, b.xaddOf(p)).Error()
			}
			b.xadded(ctx, p, err)
			return
		}
		cmds := make(rueidis.Commands, len(ps))
		for i := range ps {
			cmds[i] = b.xaddOf(&ps[i])
		}
		for i, r := range b.client.DoMulti(ctx, cmds...) {
			b.xadded(ctx, &ps[i], r.Error())
		}
	}
}

// needsDeadline reports whether a message of ps comes from an inbox with
// a timeout: its deadline is then computed here, from Redis time as this
// client estimates it (see estimatedDeadline).
func needsDeadline(ps []broker.SendParams) bool {
	for i := range ps {
		if ps[i].Env.Timeout > 0 && ps[i].Env.Route == broker.RouteInbox {
			return true
		}
	}
	return false
}

// dueOf returns the due time of p sent at now (Redis time as estimated):
// now, or the time it is deferred to, in whole milliseconds rounded up.
func dueOf(p *broker.SendParams, now time.Time) time.Time {
	switch {
	case p.Delay > 0:
		return ceilMS(now.Add(p.Delay))
	case p.DeliverAt.After(now):
		return ceilMS(p.DeliverAt)
	}
	return now
}

// ceilMS rounds t up to a whole millisecond, so that a due time in unix ms
// is never before t.
func ceilMS(t time.Time) time.Time {
	if r := t.Truncate(time.Millisecond); r.Before(t) {
		return r.Add(time.Millisecond)
	}
	return t
}

// estimatedDeadline is the deadline of p, from an inbox, sent at now (Redis
// time as estimated): its due time plus its timeout; zero for none. It only
// needs to be one value that the requester, the worker and the replier
// share: the outcome is decided by Redis time, the ids of the inbox's
// entries (see broker.Inbox).
func estimatedDeadline(p *broker.SendParams, now time.Time) time.Time {
	if p.Env.Timeout <= 0 || p.Env.Route != broker.RouteInbox {
		return time.Time{}
	}
	return dueOf(p, now).Add(p.Env.Timeout).Truncate(time.Millisecond)
}

// ReleaseDedup frees receiver's dedup key if message id holds it: one
// script, release_dedup (compare and delete). See broker.Queue.
func (b *Broker) ReleaseDedup(ctx context.Context, receiver, key, id string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	if err := broker.CheckName("key", key); err != nil {
		return err
	}
	if err := broker.CheckName("id", id); err != nil {
		return err
	}
	return b.failIf(ctx, "release dedup", scriptReleaseDedup.Exec(ctx, b.client, []string{b.keys.dedup(receiver, key)}, []string{id}).Error())
}

// scriptReleaseDedup frees a dedup key held until its message is settled.
var scriptReleaseDedup = rueidis.NewLuaScript(`-- release_dedup
-- KEYS[1] -> the dedup key P:{R}:dd:<key>
-- ARGV[1] -> the id of the message settled
-- Deletes the key if it holds the id. Returns 1 when it did, else 0.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// xaddOf returns the XADD that queues p, a message due now with nothing
// to record but itself, with its deadline (p.Result.Deadline, set by
// sendRun), if any.
func (b *Broker) xaddOf(p *broker.SendParams) rueidis.Completed {
	return b.xadd(&p.Env, rueidis.BinaryString(wire.Encode(&p.Env)), msOf(p.Result.Deadline))
}

// msOf is t in unix ms, "" for the zero time.
func msOf(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return strconv.FormatInt(t.UnixMilli(), 10)
}

// sendFailed sets p's result after its send failed with err: the deadline
// set before the send stays only if the send may have been made all the
// same (see mayHaveRun).
func (b *Broker) sendFailed(ctx context.Context, p *broker.SendParams, err error) {
	deadline := p.Result.Deadline
	if !mayHaveRun(err) {
		deadline = time.Time{}
	}
	p.Result = broker.SendResult{Deadline: deadline, Err: b.fail(ctx, "send", err)}
}

// xadded sets p's result after its XADD ended with err.
func (b *Broker) xadded(ctx context.Context, p *broker.SendParams, err error) {
	if err != nil {
		b.sendFailed(ctx, p, err)
		return
	}
	p.Result.Outcome, p.Result.ID = broker.Queued, p.Env.ID
}

// xadd returns the XADD that queues env, encoded as data, at its level,
// with its deadline (unix ms) in field d unless deadline is "".
func (b *Broker) xadd(env *broker.Envelope, data, deadline string) rueidis.Completed {
	queue := b.sendQueues.get(env.Receiver, b.keys.queue)
	if env.Priority != broker.PriorityNormal {
		queue = b.keys.queueAt(env.Receiver, env.Priority)
	}
	c := b.client.B().Xadd().Key(queue).Id("*").FieldValue().FieldValue("m", data)
	if deadline != "" {
		c = c.FieldValue("d", deadline)
	}
	return c.Build()
}

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
	r := env.Receiver
	q := b.keys.queue(r)
	keys := []string{b.keys.queueAt(r, env.Priority), q, b.keys.deferred(r), b.keys.deferredMessages(r), b.keys.holders(r), q, q, q, q, q}
	debounce := []string{"", ""}
	if p.DebounceKey != "" {
		keys[9] = b.keys.debounce(r, p.DebounceKey)
		debounce = []string{msString(p.DebounceWait), msString(p.DebounceMax)}
	}
	if p.DedupKey != "" {
		keys[5] = b.keys.dedup(r, p.DedupKey)
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

// sendSplit sends p, a timed message from a named sender, on a Cluster
// where the sender's pending timeouts and the receiver's queue live in
// different slots, where no script may touch both: first one script in the
// sender's slot records the pending timeout at Redis time + the lead to
// the due time + the timeout (so that a reply can never find the request
// missing), then the enqueue script in the receiver's slot stores the
// message with that deadline. If that stores nothing (a taken dedup key, an
// idempotency key in use) or fails, the pending timeout is withdrawn
// again; should that fail too, or should the process die between the two
// steps, the sender gets a timeout notice at the deadline for a message
// that was never stored (and whose Send returned no id): the sender still
// sees exactly one outcome.
func (b *Broker) sendSplit(ctx context.Context, p *broker.SendParams, now time.Time) {
	env := &p.Env
	lead := p.Delay
	if !p.DeliverAt.IsZero() {
		if now.IsZero() {
			var err error
			if now, err = b.estimateNow(ctx); err != nil {
				p.Result = broker.SendResult{Err: err}
				return
			}
		}
		lead = max(ceilMS(p.DeliverAt).Sub(now), 0)
	}
	t, tm := b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender)
	data := rueidis.BinaryString(wire.Encode(env))
	res, err := scriptPendTimed.Exec(ctx, b.client, []string{t, tm}, []string{data, env.ID, msString(lead + env.Timeout)}).ToString()
	if err != nil {
		p.Result = broker.SendResult{Err: b.fail(ctx, "send", err)}
		return
	}
	deadline, err := parseDeadline(res)
	if err != nil {
		p.Result = broker.SendResult{Err: err}
		return
	}
	q := *p
	if p.Later() {
		// Due at the deadline less the timeout, by the clock of the
		// sender's slot.
		q.Delay, q.DeliverAt = 0, deadline.Add(-env.Timeout)
	}
	p.Result.Deadline = deadline
	e := b.enqueueExec(&q, res, false)
	b.enqueued(ctx, p, scriptEnqueue.Exec(ctx, b.client, e.Keys, e.Args))
	if p.Result.Outcome == broker.Queued || p.Result.Outcome == broker.Deferred {
		return
	}
	// Undo the pending timeout, even if ctx has ended (bounded by the
	// client's I/O timeout).
	if cerr := scriptCancel.Exec(context.WithoutCancel(ctx), b.client, []string{t, tm}, []string{env.ID}).Error(); cerr != nil && p.Result.Err != nil {
		p.Result.Err = fmt.Errorf("%w (and the pending timeout could not be withdrawn: the sender gets a timeout notice for it: %v)", p.Result.Err, cerr)
	}
}

// levelsChanged tells the quiet streams of every instance (see
// idleReclaimMax) that receiver's stream of a priority level other than
// normal holds entries again: the enqueue script found it empty before the
// message it queued there, or RetryDeadLetters wrote to one. It bumps the
// reclaim epoch (keys.reclaimEpoch), which every instance's next heartbeat
// reads, and makes this broker's next fetch of the receiver's queue run
// the fetch script. The fetch script is what learns that a level stream
// holds entries, and a quiet stream runs it seldom. It costs the first
// message at a level one INCR (after the send); should that fail, such a
// stream finds the message within its quiet period. Later messages at the
// level, and every message at the normal level, cost nothing: the blocking
// read of a quiet stream reads its queue, and a stream whose levels hold
// entries reads them all. A deferred message reaches its level in the
// fetch script, which learns it there.
func (b *Broker) levelsChanged(ctx context.Context, receiver string) {
	b.forceReclaim(b.keys.queue(receiver))
	_ = b.client.Do(context.WithoutCancel(ctx), b.client.B().Incr().Key(b.keys.reclaimEpoch()).Build()).Error()
}

// mayHaveRun reports whether a command that failed with err may have run
// all the same: its connection broke after the command was written, and
// the answer was lost. A dial that failed wrote nothing, and an error reply
// is Redis refusing the command.
func mayHaveRun(err error) bool {
	if _, ok := rueidis.IsRedisErr(err); ok {
		return false
	}
	var op *net.OpError
	return !errors.As(err, &op) || op.Op != "dial"
}

func parseDeadline(res string) (time.Time, error) {
	deadline, ok := unixMS(res)
	if !ok {
		return time.Time{}, fmt.Errorf("redisbroker: send: script answered %q", res)
	}
	return deadline, nil
}

func (b *Broker) checkSize(env *broker.Envelope) error {
	if err := broker.CheckSize(env, b.maxSize); err != nil {
		return fmt.Errorf("redisbroker: %w", err)
	}
	return nil
}

// InjectRaw appends an entry whose m field is raw to receiver's queue, as a
// foreign or corrupt writer might. It exists for tests of undecodable
// entries (it implements brokertest.RawInjector).
func (b *Broker) InjectRaw(ctx context.Context, receiver string, raw []byte) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	err := b.client.Do(ctx, b.client.B().Xadd().Key(b.keys.queue(receiver)).Id("*").FieldValue().
		FieldValue("m", rueidis.BinaryString(raw)).Build()).Error()
	return b.failIf(ctx, "inject", err)
}

// scriptPendTimed records a pending timeout without queueing the message:
// the first step of sendSplit.
var scriptPendTimed = rueidis.NewLuaScript(`-- pend_timed
-- KEYS[1] -> the sender's pending timeouts P:{S}:t (zset: id -> deadline ms)
-- KEYS[2] -> the sender's timed messages P:{S}:tm (hash: id -> envelope)
-- ARGV[1] -> encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> ms from now to the deadline (the lead to the due time + the
--            timeout)
-- The caller then stores the message (the enqueue script) in the
-- receiver's slot with that deadline, or withdraws it (cancel).
-- Returns the deadline, unix ms.
` + luaNow + `
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('ZADD', KEYS[1], deadline, ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[1])
return deadline
`)

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
-- expiry, when it has one: the due time + ARGV[13], or ARGV[14].
-- Returns {outcome, id, deadline or -1, stored reply or "", first}:
-- outcome 1 queued, 2 deferred (id ARGV[2]); 3 duplicate (id: the dedup
-- key's); 4 joined (id: the idempotency key's message, with its reply if
-- stored); first is 1 when the message was queued at the high or low
-- level and that level's stream held nothing before (see levelsChanged).
` + luaNow + luaQueueMessage + `
local env, id, route = ARGV[1], ARGV[2], ARGV[3]
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
if due > now then
  outcome = 2
  local times = dField
  if xField ~= '' then times = times .. ',' .. xField end
  redis.call('ZADD', KEYS[3], fmt(due), id)
  redis.call('HSET', KEYS[4], id, ARGV[8] .. times .. ':' .. env)
  if redis.call('ZRANGE', KEYS[3], 0, 0)[1] == id then
    redis.call('XADD', KEYS[2], '*', 'w', '1')
    redis.call('HINCRBY', KEYS[5], 'wakes', 1)
  end
else
  if ARGV[8] ~= '' and redis.call('XLEN', KEYS[1]) == 0 then
    first = 1
  end
  queueMessage(KEYS[1], env, dField, xField)
end
if ARGV[12] == '1' then
  redis.call('ZADD', KEYS[8], fmt(deadline), id)
  redis.call('HSET', KEYS[9], id, env)
end
return {outcome, id, deadline, '', first}
`)
