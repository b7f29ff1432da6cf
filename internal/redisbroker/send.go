package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/wire"
	"github.com/redis/rueidis"
)

// Send queues env: one XADD, or for a message with a timeout one script
// that also records the pending timeout under env.Sender (two steps on
// Redis Cluster when the names' slots differ: see sendTimedSplit).
func (b *Broker) Send(ctx context.Context, env *broker.Envelope) (time.Time, error) {
	if err := b.check(); err != nil {
		return time.Time{}, err
	}
	if err := broker.CheckSend(env, b.maxSize); err != nil {
		return time.Time{}, fmt.Errorf("redisbroker: %w", err)
	}
	defer b.leveled(ctx, env)
	data := rueidis.BinaryString(wire.Encode(env))
	switch b.sendKind(env) {
	case sendPlain:
		return time.Time{}, b.sendPlain(ctx, env, data)
	case sendSplit:
		return b.sendTimedSplit(ctx, env, data)
	case sendSched, sendSchedTimed:
		return b.sendScheduled(ctx, env, data)
	case sendSchedSplit:
		return b.sendScheduledSplit(ctx, env, data)
	}
	res, err := scriptSendTimed.Exec(ctx, b.client, b.sendTimedKeys(env), sendTimedArgs(env, data)).ToString()
	if err != nil {
		return time.Time{}, b.fail(ctx, "send", err)
	}
	return parseDeadline(res)
}

// sendPlain queues env, encoded as data, with one XADD.
func (b *Broker) sendPlain(ctx context.Context, env *broker.Envelope, data string) error {
	return b.failIf(ctx, "send", b.client.Do(ctx, b.xadd(env, data, "")).Error())
}

// leveled tells the quiet streams of every instance (see idleReclaimMax)
// that messages may have been queued at a priority level other than
// normal, if any of envs is at one: it bumps the reclaim epoch
// (keys.reclaimEpoch), which every instance's next heartbeat reads, and
// makes this broker's next fetch of the receiver's queue run the fetch
// script. The fetch script is what learns that a level stream holds
// entries, and a quiet stream runs it seldom. It costs a send at another
// level one INCR (after the send: one that failed may have queued all the
// same); should that fail, such a stream finds the message within its
// quiet period. A message at the normal level costs nothing: the blocking
// read of a quiet stream reads its queue.
func (b *Broker) leveled(ctx context.Context, envs ...*broker.Envelope) {
	for _, env := range envs {
		if env.Priority != broker.PriorityNormal {
			b.levelsChanged(ctx, env.Receiver)
			return
		}
	}
}

// levelsChanged is leveled for receiver, whose level streams may have
// been written (by a send, or RetryDeadLetters).
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

// How a message is sent.
const (
	sendPlain      = iota // no timeout: one XADD
	sendTimed             // script send_timed
	sendSplit             // on a Cluster, across slots: sendTimedSplit
	sendSched             // for later, untimed or from an inbox: script schedule
	sendSchedTimed        // for later, timed: script schedule_timed
	sendSchedSplit        // for later, timed, on a Cluster across slots: sendScheduledSplit
)

func (b *Broker) sendKind(env *broker.Envelope) int {
	if env.Scheduled() {
		switch {
		case env.Timeout <= 0 || env.FromInbox:
			return sendSched
		case b.cluster && keyslot.Of(b.keys.queue(env.Receiver)) != keyslot.Of(b.keys.timeouts(env.Sender)):
			return sendSchedSplit
		}
		return sendSchedTimed
	}
	switch {
	case env.Timeout <= 0:
		return sendPlain
	case b.cluster && keyslot.Of(b.keys.queueAt(env.Receiver, env.Priority)) != keyslot.Of(b.keys.timeouts(env.Sender)):
		return sendSplit
	}
	return sendTimed
}

// xadd returns the XADD that queues env, encoded as data, with its
// deadline (unix ms) in field d unless deadline is "".
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

func (b *Broker) sendTimedKeys(env *broker.Envelope) []string {
	return []string{b.keys.queueAt(env.Receiver, env.Priority), b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender)}
}

func sendTimedArgs(env *broker.Envelope, data string) []string {
	return []string{data, env.ID, msString(env.Timeout)}
}

// SendBatch sends envs in order, each as Send would, in runs of messages
// sent the same way: a run of untimed ones is one pipeline of XADDs, a run
// of timed ones one pipeline of send_timed scripts, a run of timed ones
// from an inbox one pipeline of XADDs (at most maxBatch commands a round
// trip), and a timed message that needs sendTimedSplit
// goes on its own. So a batch of one kind costs one round trip per
// maxBatch messages, and messages to one receiver queue in batch order.
func (b *Broker) SendBatch(ctx context.Context, envs []*broker.Envelope) ([]time.Time, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	for i, env := range envs {
		if err := broker.CheckSend(env, b.maxSize); err != nil {
			return nil, fmt.Errorf("redisbroker: batch message %d: %w", i, err)
		}
	}
	defer b.leveled(ctx, envs...)
	deadlines := make([]time.Time, len(envs))
	errs := make([]error, len(envs))
	failed := false
	for start := 0; start < len(envs); {
		kind := b.sendKind(envs[start])
		end := start + 1
		for kind != sendSplit && kind != sendSchedSplit && end < len(envs) && end-start < maxBatch && b.sendKind(envs[end]) == kind {
			end++
		}
		if b.sendRun(ctx, kind, envs[start:end], deadlines[start:end], errs[start:end]) {
			failed = true
		}
		start = end
	}
	if failed {
		return deadlines, &broker.BatchError{Errs: errs}
	}
	return deadlines, nil
}

// sendRun sends envs, all of kind, filling in deadlines and errs. It
// reports whether any failed.
func (b *Broker) sendRun(ctx context.Context, kind int, envs []*broker.Envelope, deadlines []time.Time, errs []error) bool {
	failed := false
	switch kind {
	case sendSplit:
		data := rueidis.BinaryString(wire.Encode(envs[0]))
		deadlines[0], errs[0] = b.sendTimedSplit(ctx, envs[0], data)
		return errs[0] != nil
	case sendSchedSplit:
		data := rueidis.BinaryString(wire.Encode(envs[0]))
		deadlines[0], errs[0] = b.sendScheduledSplit(ctx, envs[0], data)
		return errs[0] != nil
	case sendSched, sendSchedTimed:
		script := scriptSchedule
		if kind == sendSchedTimed {
			script = scriptScheduleTimed
		}
		execs := make([]rueidis.LuaExec, len(envs))
		for i, env := range envs {
			execs[i] = b.scheduleExec(env, rueidis.BinaryString(wire.Encode(env)))
		}
		for i, r := range script.ExecMulti(ctx, b.client, execs...) {
			if deadlines[i], errs[i] = b.scheduled(ctx, r); errs[i] != nil {
				failed = true
			}
		}
	case sendPlain:
		cmds := make(rueidis.Commands, len(envs))
		for i, env := range envs {
			cmds[i] = b.xadd(env, rueidis.BinaryString(wire.Encode(env)), "")
		}
		for i, r := range b.client.DoMulti(ctx, cmds...) {
			if err := r.Error(); err != nil {
				errs[i], failed = b.fail(ctx, "send", err), true
			}
		}
	case sendTimed:
		execs := make([]rueidis.LuaExec, len(envs))
		for i, env := range envs {
			execs[i] = rueidis.LuaExec{Keys: b.sendTimedKeys(env), Args: sendTimedArgs(env, rueidis.BinaryString(wire.Encode(env)))}
		}
		for i, r := range scriptSendTimed.ExecMulti(ctx, b.client, execs...) {
			res, err := r.ToString()
			if err == nil {
				deadlines[i], err = parseDeadline(res)
			} else {
				err = b.fail(ctx, "send", err)
			}
			if err != nil {
				errs[i], failed = err, true
			}
		}
	}
	return failed
}

// sendTimedSplit sends a timed message on Redis Cluster when the sender's
// and the receiver's keys live in different slots, where no script may touch
// both: first one script in the sender's slot records the pending timeout
// (so that a reply can never find the request missing), then an XADD in the
// receiver's slot queues the message with that deadline. If the XADD fails,
// the pending timeout is cancelled again; should that fail too, or should
// the process die between the two steps, the sender gets a timeout notice
// at the deadline for a message that was never queued (and whose Send
// returned no id): the sender still sees exactly one outcome.
func (b *Broker) sendTimedSplit(ctx context.Context, env *broker.Envelope, data string) (time.Time, error) {
	t, tm := b.keys.timeouts(env.Sender), b.keys.timedMessages(env.Sender)
	res, err := scriptPendTimed.Exec(ctx, b.client, []string{t, tm},
		[]string{data, env.ID, msString(env.Timeout)}).ToString()
	if err != nil {
		return time.Time{}, b.fail(ctx, "send", err)
	}
	deadline, err := parseDeadline(res)
	if err != nil {
		return time.Time{}, err
	}
	err = b.client.Do(ctx, b.xadd(env, data, res)).Error()
	if err == nil {
		return deadline, nil
	}
	// Undo the pending timeout, even if ctx has ended (bounded by the
	// client's I/O timeout).
	if cerr := scriptCancel.Exec(context.WithoutCancel(ctx), b.client, []string{t, tm}, []string{env.ID}).Error(); cerr != nil {
		err = fmt.Errorf("%w (and the pending timeout could not be withdrawn: the sender gets a timeout notice for it: %v)", err, cerr)
	}
	return time.Time{}, b.fail(ctx, "send", err)
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

// scriptSendTimed queues a message with a timeout.
var scriptSendTimed = rueidis.NewLuaScript(`-- send_timed
-- KEYS[1] -> the receiver's queue stream P:{R}:q
-- KEYS[2] -> the sender's pending timeouts P:{S}:t (zset: id -> deadline ms)
-- KEYS[3] -> the sender's timed messages P:{S}:tm (hash: id -> envelope)
-- ARGV[1] -> encoded envelope
-- ARGV[2] -> message id
-- ARGV[3] -> timeout in ms
-- The only script that touches two names' keys (R and S): on Redis Cluster
-- it runs only when both hash to one slot (else pend_timed, then an XADD).
-- Returns the deadline, unix ms.
` + luaNow + `
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
redis.call('XADD', KEYS[1], '*', 'm', ARGV[1], 'd', deadline)
local pt, pm = KEYS[2], KEYS[3]
` + luaPend + `
return deadline
`)

// luaPend records the pending timeout of message ARGV[2] (envelope
// ARGV[1]) with deadline in the sender's keys pt (t) and pm (tm).
const luaPend = `
redis.call('ZADD', pt, deadline, ARGV[2])
redis.call('HSET', pm, ARGV[2], ARGV[1])
`

// scriptPendTimed records a pending timeout without queueing the message:
// the first step of a timed send on Redis Cluster across slots.
var scriptPendTimed = rueidis.NewLuaScript(`-- pend_timed
-- KEYS[1] -> the sender's pending timeouts P:{S}:t (zset: id -> deadline ms)
-- KEYS[2] -> the sender's timed messages P:{S}:tm (hash: id -> envelope)
-- ARGV as send_timed. The caller then queues the message (XADD with d set
-- to the deadline) in the receiver's slot, or cancels on failure.
-- Returns the deadline, unix ms.
` + luaNow + `
local deadline = string.format('%.0f', now + tonumber(ARGV[3]))
local pt, pm = KEYS[1], KEYS[2]
` + luaPend + `
return deadline
`)
