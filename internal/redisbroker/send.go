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
	"github.com/diskerhq/disker/internal/wire"
)

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
			enc, data, deadline := encodeWithMS(&p.Env, p.Result.Deadline)
			cmd := b.xadd(&p.Env, data, deadline)
			var res rueidis.RedisResult
			var err error
			if p.Env.Route == broker.RouteInbox {
				res, err = b.doInbox(ctx, cmd)
			} else {
				res = b.client.Do(ctx, cmd)
			}
			enc.release(err == nil && res.NonRedisError() == nil)
			if err == nil {
				err = res.Error()
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
// time as estimated): its due time plus what is left of its timeout
// (SendParams.TimeoutLeft: a Request's counts from when it was measured,
// so that the deadline is the sender's whatever held the send up); zero
// for none. It only
// needs to be one value that the requester, the worker and the replier
// share: the outcome is decided by Redis time, the ids of the inbox's
// entries (see broker.Inbox).
func estimatedDeadline(p *broker.SendParams, now time.Time) time.Time {
	if p.Env.Timeout <= 0 || p.Env.Route != broker.RouteInbox {
		return time.Time{}
	}
	return dueOf(p, now).Add(p.TimeoutLeft()).Truncate(time.Millisecond)
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
// normal holds entries again: a script found it empty before the message
// it queued there (a send, a settle that released a key's next, a retry
// of dead letters). It bumps the reclaim epoch (keys.reclaimEpoch), which
// every instance's next heartbeat reads, and makes this broker's next
// fetch of the receiver's queue run the fetch script. The fetch script is
// what learns that a level stream holds entries, and a quiet stream runs
// it seldom. The epoch spreads the news to every instance; it is not what
// the message's delivery rests on: the script that queued it also added a
// wake entry to the receiver's normal stream (queueWake) in the same
// step, which wakes one blocked fetch, so that a caller stopped before
// this INCR (or whose INCR failed) loses nothing. Later messages at the
// level, and every message at the normal level, cost nothing: the
// blocking read of a quiet stream reads its queue, and a stream whose
// levels hold entries reads them all. A deferred message reaches its
// level in the fetch script, which learns it there.
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
