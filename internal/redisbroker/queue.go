package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/wire"
)

// maxBatch bounds the ids passed to one script call (Lua's unpack has a
// limit near 8000).
const maxBatch = 1000

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

func (b *Broker) failIf(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	return b.fail(ctx, op, err)
}

// entry is a stream entry as a fetch returns it.
type entry struct {
	id      string
	attempt int
	// fields are the entry's field names and values, in turns, as the
	// client holds them (see xentry).
	fields []rueidis.RedisMessage
}

// field returns the value of the entry's field name, the last if it has
// several, and whether it has one.
func (e *entry) field(name string) (string, bool) {
	for i := len(e.fields) - 2; i >= 0; i -= 2 {
		if mustString(&e.fields[i]) == name {
			return mustString(&e.fields[i+1]), true
		}
	}
	return "", false
}

// only reports whether every field of the entry is called name (and it
// has at least one).
func (e *entry) only(name string) bool {
	for i := 0; i < len(e.fields); i += 2 {
		if mustString(&e.fields[i]) != name {
			return false
		}
	}
	return len(e.fields) > 0
}

// mustString is the string that m, a string checked by asXRead or
// scriptEntry, holds.
func mustString(m *rueidis.RedisMessage) string {
	s, _ := m.ToString()
	return s
}

// xentry is a stream entry as XREAD or XREADGROUP answers it: its id, and
// its field names and values in turns as the client holds them, so that
// reading an entry copies nothing. deleted is set for an entry deleted
// after it was added (a pending one, read again).
type xentry struct {
	ID      string
	fields  []rueidis.RedisMessage
	deleted bool
}

// asXRead is rueidis's AsXRead of res, an answer of XREAD or XREADGROUP,
// with the entries as xentry: a stream entry costs no map. An error of
// res, such as a nil answer's, is returned as it is.
func asXRead(res rueidis.RedisResult) (map[string][]xentry, error) {
	read := make(map[string][]xentry, 1)
	err := eachStream(res, func(name string, es *rueidis.RedisMessage) (err error) {
		read[name], err = asXRange(es)
		return err
	})
	if err != nil {
		return nil, err
	}
	return read, nil
}

// asXReadOf is asXRead of a read of one stream: its entries alone, with
// no map of the streams.
func asXReadOf(res rueidis.RedisResult, stream string) ([]xentry, error) {
	var read []xentry
	err := eachStream(res, func(name string, es *rueidis.RedisMessage) (err error) {
		if name == stream {
			read, err = asXRange(es)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return read, nil
}

// eachStream calls f with the name and the entries of each stream of res,
// an answer of XREAD or XREADGROUP (a map of the streams on RESP3, an
// array of pairs on RESP2), and returns the first error.
func eachStream(res rueidis.RedisResult, f func(name string, es *rueidis.RedisMessage) error) error {
	m, err := res.ToMessage()
	if err != nil {
		return err
	}
	if m.IsMap() {
		kv, err := m.ToMap()
		if err != nil {
			return err
		}
		for name, es := range kv {
			if err := f(name, &es); err != nil {
				return err
			}
		}
		return nil
	}
	streams, err := m.ToArray()
	if err != nil {
		return err
	}
	for i := range streams {
		name, es, err := namedPair(&streams[i], "a stream of a read")
		if err != nil {
			return err
		}
		if err := f(name, es); err != nil {
			return err
		}
	}
	return nil
}

// namedPair returns the elements of m, what (for errors) that must be an
// array of a string and another element.
func namedPair(m *rueidis.RedisMessage, what string) (string, *rueidis.RedisMessage, error) {
	pair, err := m.ToArray()
	if err != nil {
		return "", nil, err
	}
	if len(pair) != 2 {
		return "", nil, fmt.Errorf("redisbroker: %s has %d elements, wanted 2", what, len(pair))
	}
	name, err := pair[0].ToString()
	if err != nil {
		return "", nil, err
	}
	return name, &pair[1], nil
}

// asXRange returns the entries of one stream of a read.
func asXRange(m *rueidis.RedisMessage) ([]xentry, error) {
	es, err := m.ToArray()
	if err != nil {
		return nil, err
	}
	out := make([]xentry, 0, len(es))
	for i := range es {
		id, fv, err := namedPair(&es[i], "a stream entry")
		if err != nil {
			return nil, err
		}
		if fv.IsNil() {
			out = append(out, xentry{ID: id, deleted: true})
			continue
		}
		fields, err := fv.ToArray()
		if err != nil {
			return nil, err
		}
		if err := checkFields(fields); err != nil {
			return nil, err
		}
		out = append(out, xentry{ID: id, fields: fields})
	}
	return out, nil
}

// checkFields checks that fields are names and values in turns, all strings.
func checkFields(fields []rueidis.RedisMessage) error {
	if len(fields)%2 != 0 {
		return fmt.Errorf("redisbroker: a stream entry has %d field names and values", len(fields))
	}
	for i := range fields {
		if !fields[i].IsString() {
			return errors.New("redisbroker: a stream entry has a field that is not a string")
		}
	}
	return nil
}

// streamKeys are the keys a fetch of one stream touches, and the name of
// the operation for errors.
type streamKeys struct {
	op      string
	stream  string // the queue or reply stream
	dlq     string // its dead-letter stream
	delayed string // its delayed zset
	holders string // its holders hash
	// high and low are the streams of the high and low priority levels
	// (for a reply stream, keys of its slot that are never written).
	high, low string
	// record: the fetch records the consumer's lease in holders (queues;
	// a reply stream's readers all read with one lease).
	record bool
	// sched, schedMsgs: the scheduled zset and hash whose due messages the
	// fetch script queues (queues only: promote).
	sched, schedMsgs string
	promote          bool
}

// queueKeys returns the streamKeys of receiver's queue, made once per
// receiver. They are shared: read only.
func (b *Broker) queueKeys(receiver string) *streamKeys {
	return b.queueStreams.get(receiver, b.makeQueueKeys)
}

func (b *Broker) makeQueueKeys(receiver string) *streamKeys {
	return &streamKeys{op: "fetch", stream: b.keys.queue(receiver), dlq: b.keys.deadLetters(receiver), delayed: b.keys.delayed(receiver), holders: b.keys.holders(receiver),
		high: b.keys.queueAt(receiver, broker.PriorityHigh), low: b.keys.queueAt(receiver, broker.PriorityLow), record: true,
		sched: b.keys.scheduled(receiver), schedMsgs: b.keys.scheduledMessages(receiver), promote: true}
}

// fetch returns up to p.Max entries of s.stream for p.Consumer. At most every
// reclaimEvery per stream (and at once after this broker's Retry, or when
// the group is missing) it runs the fetch script, which reclaims expired
// leases and due retries, dead-letters entries past maxAttempts and reads
// new entries; of a quiet stream (see idleReclaimMax), at most once per
// lease or idleReclaimMax, and at once when the reclaim epoch changed (a
// worker left the registry, or a message was sent at another priority
// level: see Heartbeat).
// Otherwise it reads new entries with one pipelined
// XREADGROUP without BLOCK, or, when block > 0, the stream was drained at
// the last fetch and one of the broker's direct reads is free, with one
// blocking XREADGROUP on a connection of its own (fetchDirect). When that (or the script) found nothing and
// block > 0, it waits for new entries in the hub of p.Consumer, which
// multiplexes the blocking reads of all of the consumer's streams on one
// dedicated connection (blockingRead, hub.go).
//
// Priorities: the script also answers whether the high or low level
// streams of a queue hold entries (two XLENs), which this broker remembers
// per queue. While they do, every fetch runs the script, which serves the
// levels highest first (reclaiming only when due), and a blocking read
// reads every level stream that holds entries, keeping the highest p.Max
// entries and giving any others back at once (blockingRead). While they do
// not, which is the case of a receiver that never uses priorities, a
// fetch is exactly what it was without them.
func (b *Broker) fetch(ctx context.Context, s *streamKeys, p *broker.FetchParams) ([]entry, error) {
	entries, err := b.fetchEntries(ctx, s, p)
	if len(entries) > 0 {
		b.markBusy(s.stream)
	}
	return entries, err
}

// fetchEntries is fetch, but for the stream's quiet state.
func (b *Broker) fetchEntries(ctx context.Context, s *streamKeys, p *broker.FetchParams) ([]entry, error) {
	op, stream, consumer, max, block := s.op, s.stream, p.Consumer, p.Max, p.Block
	start := time.Now() // before it looks: see waiter.start
	var entries []entry
	levels := 0
	if s.record {
		if v, ok := b.levels.Load(stream); ok {
			levels = v.(int)
		}
	}
	changed := b.leaseChanged(stream, consumer, p.Lease) // recorded even when due
	due := b.reclaimDue(stream, p.Lease) || changed
	script := due || levels != 0 || (s.promote && b.scheduleDue(stream))
	drained := b.drainedFlag(stream)
	if !script && block > 0 && drained.Load() {
		entries, done, err := b.fetchDirect(ctx, s, p, start)
		if done && err == nil {
			drained.Store(len(entries) < 2)
		}
		switch {
		case errors.Is(err, errNoGroup):
			script, due = true, true // the script creates the group
		case done || err != nil:
			return entries, err
		}
	}
	// A stream whose last blocking read timed out with nothing skips the
	// read without BLOCK: the blocking read below answers at once if
	// entries came since, and an idle stream costs Redis no read but its
	// share of the hub's.
	idle := block > 0 && drained.Load() && b.reclaimOf(stream).idle.Load()
	if !script && !idle {
		read, err := asXReadOf(b.client.Do(ctx, b.client.B().Xreadgroup().Group("g", consumer).Count(int64(max)).
			Streams().Key(stream).Id(">").Build()), stream)
		switch {
		case isNoGroup(err):
			script, due = true, true // the script creates the group
		case rueidis.IsRedisNil(err):
		case err != nil:
			return nil, b.fail(ctx, op, err)
		}
		entries = appendRead(entries, read, "")
	}
	if script {
		var dead int64
		var err error
		entries, dead, levels, err = b.reclaim(ctx, s, p, due)
		if err != nil || dead > 0 {
			return entries, err
		}
	}
	if len(entries) > 0 || block <= 0 {
		return entries, nil
	}
	drained.Store(true)
	if err := ctx.Err(); err != nil {
		return nil, b.fail(ctx, op, err)
	}
	if s.promote {
		var sleep time.Duration
		if block, sleep = b.blockUntilDue(stream, block); sleep > 0 {
			// The first scheduled message is due sooner than Redis's
			// timeout of a blocking read is precise: wait here, and the
			// next fetch runs the script.
			t := time.NewTimer(sleep)
			defer t.Stop()
			select {
			case <-t.C:
				return entries, nil
			case <-ctx.Done():
				return nil, b.fail(ctx, op, ctx.Err())
			case <-b.closing.Done():
				return nil, broker.ErrClosed
			}
		}
	}
	return b.blockingRead(ctx, s, p, levels, block, start)
}

// drainedFlag returns the flag that says whether stream was found drained
// at its last fetch through this broker: the read without BLOCK found
// nothing, or the last direct read (fetchDirect) returned at most one entry.
// While it is set, a fetch that needs no script reads with fetchDirect; a
// stream with a backlog is read without BLOCK on the pipelined connections,
// which carry many reads at the cost of one.
func (b *Broker) drainedFlag(stream string) *atomic.Bool {
	if v, ok := b.drained.Load(stream); ok {
		return v.(*atomic.Bool)
	}
	v, _ := b.drained.LoadOrStore(stream, new(atomic.Bool))
	return v.(*atomic.Bool)
}

// fetchDirect is the read of a fetch that needs no script, of a drained
// stream, when one of the broker's direct reads is free (directRead): a
// blocking read answers at once when entries wait, so the fetch makes one
// read instead of a read without BLOCK and then a blocking one, which
// saves a lone requester a round trip. done is false when it did not
// read: no direct read was free, the hub holds the stream, the first
// scheduled message is due sooner than a blocking read's timeout is
// precise, or the group is missing (err is errNoGroup).
func (b *Broker) fetchDirect(ctx context.Context, s *streamKeys, p *broker.FetchParams, start time.Time) (entries []entry, done bool, err error) {
	block := p.Block
	if s.promote {
		var sleep time.Duration
		if block, sleep = b.blockUntilDue(s.stream, block); sleep > 0 {
			return nil, false, nil
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, true, b.fail(ctx, s.op, err)
	}
	w := &waiter{home: s.stream, count: p.Max, deadline: time.Now().Add(block), start: start}
	read, ok, err := b.directRead(ctx, p.Consumer, w)
	switch {
	case !ok:
		return nil, false, nil
	case errors.Is(err, errNoGroup):
		return nil, false, err
	case err != nil:
		return nil, true, b.fail(ctx, s.op, err)
	}
	return appendRead(nil, read, ""), true, nil
}

// blockingRead is the blocking read of a fetch that found nothing: it
// reads s.stream (and, when levels says the high or low level streams
// hold entries, those too) for p.Consumer through the consumer's hub
// (hub.go), waiting up to block; start is when the fetch began to look
// for entries. With levels it keeps the p.Max highest
// entries and gives the others back at once, as if never delivered
// (XCLAIM IDLE lease RETRYCOUNT 0: the next reclaim takes them, as
// attempt 1).
func (b *Broker) blockingRead(ctx context.Context, s *streamKeys, p *broker.FetchParams, levels int, block time.Duration, start time.Time) ([]entry, error) {
	w := &waiter{home: s.stream, lease: p.Lease, count: p.Max, deadline: time.Now().Add(block), start: start}
	prefixes := []string{""}
	w.streams = []string{s.stream}
	if levels != 0 {
		w.streams, prefixes = w.streams[:0], prefixes[:0]
		if levels&1 != 0 {
			w.streams, prefixes = append(w.streams, s.high), append(prefixes, "h")
		}
		w.streams, prefixes = append(w.streams, s.stream), append(prefixes, "")
		if levels&2 != 0 {
			w.streams, prefixes = append(w.streams, s.low), append(prefixes, "l")
		}
	}
	var read map[string][]xentry
	var home []xentry // a direct read's, of s.stream alone (levels is 0)
	direct, err := false, error(nil)
	if levels == 0 {
		home, direct, err = b.directRead(ctx, p.Consumer, w)
	}
	if !direct {
		read, err = b.hubRead(ctx, p.Consumer, w)
	}
	switch {
	case errors.Is(err, errNoGroup):
		// The group is missing: Redis lost its data (a restart without
		// persistence) or the stream was deleted. The fetch script creates
		// it again and reads what is there, such as messages sent since.
		entries, _, _, err := b.reclaim(ctx, s, p, true)
		return entries, err
	case err != nil:
		return nil, b.fail(ctx, s.op, err)
	}
	entries := appendRead(nil, home, "")
	for i, stream := range w.streams {
		entries = appendRead(entries, read[stream], prefixes[i])
	}
	if len(entries) == 0 {
		b.reclaimOf(s.stream).idle.Store(true)
	}
	if len(entries) <= p.Max {
		return entries, nil
	}
	for _, e := range entries[p.Max:] {
		stream, id, _ := b.splitRef(s, e.id)
		if err := b.giveBack(ctx, stream, p.Consumer, p.Lease, []string{id}); err != nil {
			// It stays with p.Consumer until its lease ends.
			b.forceReclaim(s.stream)
			return entries[:p.Max], b.fail(ctx, s.op, err)
		}
	}
	b.forceReclaim(s.stream)
	return entries[:p.Max], nil
}

// splitRef returns the stream of s, the entry id and the priority level
// of a delivery's ref: the entry id, prefixed "h" or "l" at the high and
// low levels.
func (b *Broker) splitRef(s *streamKeys, ref string) (stream, id string, prio int) {
	if ref != "" {
		switch ref[0] {
		case 'h':
			return s.high, ref[1:], broker.PriorityHigh
		case 'l':
			return s.low, ref[1:], broker.PriorityLow
		}
	}
	return s.stream, ref, broker.PriorityNormal
}

// refLevel returns the priority level of ref and its entry id.
func refLevel(ref string) (prio int, id string) {
	if ref != "" {
		switch ref[0] {
		case 'h':
			return broker.PriorityHigh, ref[1:]
		case 'l':
			return broker.PriorityLow, ref[1:]
		}
	}
	return broker.PriorityNormal, ref
}

// blockingCtx returns the context of a blocking read under ctx, and what
// releases it. rueidis cannot cancel a command whose context has a
// deadline (it only sets the connection's deadline), so the read gets a
// context without one, cancelled when ctx ends or the broker closes; the
// connection of a read cancelled that way is closed. A ctx without a
// deadline, such as a fetching loop's, is the read's parent as it is.
func (b *Broker) blockingCtx(ctx context.Context) (context.Context, blockingRelease) {
	parent := ctx
	if _, ok := ctx.Deadline(); ok {
		parent = context.WithoutCancel(ctx)
	}
	bctx, cancel := context.WithCancel(parent)
	r := blockingRelease{cancel: cancel, stopClosing: context.AfterFunc(b.closing, cancel)}
	if parent != ctx {
		r.stopCtx = context.AfterFunc(ctx, cancel)
	}
	return bctx, r
}

// blockingRelease releases the context of a blocking read (blockingCtx).
type blockingRelease struct {
	cancel               context.CancelFunc
	stopCtx, stopClosing func() bool // stopCtx is nil when ctx is the parent
}

func (r blockingRelease) release() {
	r.stopClosing()
	if r.stopCtx != nil {
		r.stopCtx()
	}
	r.cancel()
}

// reclaim runs the fetch script; with due, it reclaims before it reads.
// It returns the script's answer of which level streams hold entries, and
// remembers it for s's fetches, as it does its answer of whether the
// stream is quiet (setQuiet).
func (b *Broker) reclaim(ctx context.Context, s *streamKeys, p *broker.FetchParams, due bool) ([]entry, int64, int, error) {
	op, stream := s.op, s.stream
	prune := "0"
	if due && b.dueForPrune(stream) {
		prune = msString(b.pruneIdle)
	}
	sched, schedMsgs := s.delayed, s.delayed
	if s.promote {
		sched, schedMsgs = s.sched, s.schedMsgs
	}
	start := time.Now()
	res, err := scriptFetch.Exec(ctx, b.client, []string{stream, s.dlq, s.delayed, s.holders, s.high, s.low, sched, schedMsgs},
		[]string{p.Consumer, strconv.Itoa(p.Max), msString(p.Lease), strconv.Itoa(max0(p.MaxAttempts)), prune, boolArg(s.record), boolArg(due), boolArg(s.promote)}).ToArray()
	if err != nil {
		b.forceReclaim(stream)
		return nil, 0, 0, b.fail(ctx, op, err)
	}
	if len(res) < 4 {
		return nil, 0, 0, fmt.Errorf("redisbroker: %s: the fetch script answered nothing", op)
	}
	busy, _ := res[3].AsInt64()
	b.setQuiet(stream, busy == 0, start, p.Lease)
	levels, _ := res[1].AsInt64()
	if s.record {
		if levels != 0 {
			b.levels.Store(stream, int(levels))
		} else {
			b.levels.Delete(stream)
		}
	}
	if s.promote {
		next, _ := res[2].AsInt64()
		b.setNextDue(stream, next)
	}
	entries := make([]entry, 0, len(res)-4)
	for _, r := range res[4:] {
		e, err := scriptEntry(r)
		if err != nil {
			return nil, 0, 0, fmt.Errorf("redisbroker: %s: %w", op, err)
		}
		entries = append(entries, e)
	}
	dead, _ := res[0].AsInt64()
	return entries, dead, int(levels), nil
}

// appendRead appends the entries of an XREADGROUP of one stream, whose
// refs are their ids with prefix (that of the stream's priority level).
func appendRead(entries []entry, read []xentry, prefix string) []entry {
	for _, e := range read {
		if e.deleted {
			continue // deleted after it was added
		}
		entries = append(entries, entry{id: prefix + e.ID, attempt: 1, fields: e.fields})
	}
	return entries
}

func max0(n int) int { return max(n, 0) }

// reclaimState is what a broker keeps of one stream for the fetch
// script's reclaim.
type reclaimState struct {
	// next is when the next reclaim is due, unix ns (0: at the next fetch).
	next atomic.Int64
	// quiet: at the last run of the script the stream was not busy (see
	// its answer), and this broker has fetched nothing of it since.
	quiet atomic.Bool
	// idle: the last blocking read of the stream through this broker
	// ended with nothing, and this broker has fetched nothing of it since.
	idle atomic.Bool
}

// reclaimOf returns the reclaimState of stream.
func (b *Broker) reclaimOf(stream string) *reclaimState {
	if v, ok := b.reclaimed.Load(stream); ok {
		return v.(*reclaimState)
	}
	v, _ := b.reclaimed.LoadOrStore(stream, new(reclaimState))
	return v.(*reclaimState)
}

// reclaimDue reports whether the fetch script should run for stream now,
// and if so counts it as run: the next is due reclaimEvery later, or, for
// a quiet stream, idleReclaim(lease) later.
func (b *Broker) reclaimDue(stream string, lease time.Duration) bool {
	st := b.reclaimOf(stream)
	now := time.Now().UnixNano()
	due := st.next.Load()
	every := b.reclaimEvery
	if st.quiet.Load() {
		every = b.idleReclaim(lease)
	}
	return now >= due && st.next.CompareAndSwap(due, now+int64(every))
}

// idleReclaim is the period of the reclaim of a quiet stream fetched with
// lease: the lease, between reclaimEvery and idleReclaimMax. An entry that
// another broker's consumer took since the last reclaim, and whose lease
// then expired, is reclaimed at most this much after it expired.
func (b *Broker) idleReclaim(lease time.Duration) time.Duration {
	return min(max(lease, b.reclaimEvery), idleReclaimMax)
}

// setQuiet records the answer of the fetch script that began at start:
// whether stream is quiet. A quiet stream's next reclaim moves to
// idleReclaim(lease) after start, unless one was forced meanwhile; a busy
// one's comes back to reclaimEvery after start.
func (b *Broker) setQuiet(stream string, quiet bool, start time.Time, lease time.Duration) {
	st := b.reclaimOf(stream)
	st.quiet.Store(quiet)
	if quiet {
		at := start.Add(b.idleReclaim(lease)).UnixNano()
		for {
			cur := st.next.Load()
			if cur == 0 || cur >= at || st.next.CompareAndSwap(cur, at) {
				return
			}
		}
	}
	b.reclaimWithin(st, start.Add(b.reclaimEvery).UnixNano())
}

// markBusy records that this broker fetched entries of stream: it is no
// longer quiet, and its next reclaim is due within reclaimEvery.
func (b *Broker) markBusy(stream string) {
	st := b.reclaimOf(stream)
	if st.idle.Load() {
		st.idle.Store(false)
	}
	if st.quiet.Load() && st.quiet.Swap(false) {
		b.reclaimWithin(st, time.Now().Add(b.reclaimEvery).UnixNano())
	}
}

// reclaimWithin brings st's next reclaim to at, unless it is due sooner.
func (b *Broker) reclaimWithin(st *reclaimState, at int64) {
	for {
		cur := st.next.Load()
		if cur <= at || st.next.CompareAndSwap(cur, at) {
			return
		}
	}
}

// leaseChanged reports whether consumer fetches stream with another lease
// than at its last fetch through this broker, which the fetch script then
// records (the holders hash).
func (b *Broker) leaseChanged(stream, consumer string, lease time.Duration) bool {
	// The lease is kept in an atomic of its own, so that a fetch with the
	// lease of the last one stores nothing in the map.
	k := leaseKey{stream, consumer}
	v, ok := b.leases.Load(k)
	if !ok {
		v, ok = b.leases.LoadOrStore(k, new(atomic.Int64))
	}
	old := v.(*atomic.Int64).Swap(int64(lease))
	return !ok || old != int64(lease)
}

// leaseKey is the key of Broker.leases.
type leaseKey struct{ stream, consumer string }

// scheduleDue reports whether the first scheduled message of stream's
// receiver, as this broker last saw it, is due by the local clock
// corrected to Redis time (see setNextDue).
func (b *Broker) scheduleDue(stream string) bool {
	v, ok := b.nextDue.Load(stream)
	return ok && time.Now().UnixNano() >= v.(*atomic.Int64).Load()
}

// setNextDue records the due time (unix ms, Redis time; -1 for none) of
// the first message scheduled for stream's receiver, as the fetch script
// answered it, in local unix ns.
func (b *Broker) setNextDue(stream string, ms int64) {
	at := int64(math.MaxInt64)
	if ms >= 0 {
		at = b.offset.Local(time.UnixMilli(ms)).UnixNano()
	}
	v, _ := b.nextDue.LoadOrStore(stream, new(atomic.Int64))
	v.(*atomic.Int64).Store(at)
}

// forceSchedule makes the next fetch of stream run the fetch script, which
// queues the due scheduled messages and reads the next due time: a wake
// entry said that a message was scheduled before the one known.
func (b *Broker) forceSchedule(stream string) {
	v, _ := b.nextDue.LoadOrStore(stream, new(atomic.Int64))
	v.(*atomic.Int64).Store(0)
}

// blockUntilDue bounds block, the time a fetch of stream blocks in Redis,
// by the due time of the first scheduled message, so that the fetch after
// it queues that message. Redis ends a blocking read's timeout only at its
// next cron tick (every 100ms at the default hz 10), so the read is made
// to end redisTimerSlack before the due time; when the due time is closer
// than that, it returns no block but how long to wait here instead.
func (b *Broker) blockUntilDue(stream string, block time.Duration) (time.Duration, time.Duration) {
	v, ok := b.nextDue.Load(stream)
	if !ok {
		return block, 0
	}
	at := v.(*atomic.Int64).Load()
	if at == math.MaxInt64 {
		return block, 0
	}
	wait := time.Duration(at - time.Now().UnixNano())
	if wait <= redisTimerSlack+minDueBlock {
		return block, min(max(wait, minDueBlock), block)
	}
	return min(block, wait-redisTimerSlack), 0
}

// minDueBlock is the least wait of a fetch whose scheduled message is due
// (by the local clock, which may be ahead of Redis's by a little).
const minDueBlock = 2 * time.Millisecond

// redisTimerSlack is how late Redis may end a blocking read past its
// timeout: one period of its cron at the default hz (10).
const redisTimerSlack = 100 * time.Millisecond

// forceReclaim makes the next fetch of stream run the fetch script.
func (b *Broker) forceReclaim(stream string) {
	if v, ok := b.reclaimed.Load(stream); ok {
		v.(*reclaimState).next.Store(0)
	}
}

// forceReclaimAll makes the next fetch of every stream run the fetch
// script: a worker left the registry (see Heartbeat), whose deliveries
// may be in any of them.
func (b *Broker) forceReclaimAll() {
	b.reclaimed.Range(func(_, v any) bool {
		v.(*reclaimState).next.Store(0)
		return true
	})
}

func (b *Broker) dueForPrune(stream string) bool {
	now := time.Now()
	last, ok := b.pruned.Load(stream)
	if ok && now.Sub(last.(time.Time)) < b.pruneEvery {
		return false
	}
	b.pruned.Store(stream, now)
	return true
}

// scriptEntry parses {id, attempt, field1, value1, ...}.
func scriptEntry(m rueidis.RedisMessage) (entry, error) {
	a, err := m.ToArray()
	if err != nil || len(a) < 2 || len(a)%2 != 0 {
		return entry{}, fmt.Errorf("fetch script answered a malformed entry: %v", err)
	}
	id, err := a[0].ToString()
	if err != nil {
		return entry{}, err
	}
	attempt, err := a[1].AsInt64()
	if err != nil {
		return entry{}, err
	}
	if checkFields(a[2:]) != nil {
		return entry{}, errors.New("fetch script answered a malformed field")
	}
	return entry{id: id, attempt: int(attempt), fields: a[2:]}, nil
}

// Fetch leases up to p.Max messages of p.Receiver to p.Consumer. See
// broker.Broker. maxAttempts 0 means no limit. A message retried with a
// delay, or whose lease expired, is reclaimed by a Fetch at most
// reclaimEvery (100ms) after that moment, or right after a Retry through
// this broker; a Fetch blocked in Redis notices it when its block time
// ends. From a stream that was quiet for this broker (see idleReclaimMax),
// an entry another broker's consumer took since is reclaimed up to the
// quiet period after its lease expired, or at the first Fetch after the
// heartbeat that saw its holder leave the registry.
func (b *Broker) Fetch(ctx context.Context, p *broker.FetchParams) ([]broker.Delivery, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	s := b.queueKeys(p.Receiver)
	entries, err := b.fetch(ctx, s, p)
	if err != nil {
		return nil, err
	}
	out := make([]broker.Delivery, 0, len(entries))
	var wakes []string
	for _, e := range entries {
		if e.only("w") {
			wakes = append(wakes, e.id)
			continue
		}
		d, err := delivery(&e)
		d.Env.Priority, _ = refLevel(e.id)
		if err != nil {
			if err := b.bury(ctx, s, e.id, "undecodable message: "+err.Error(), e.attempt, true); err != nil {
				return nil, err
			}
			continue
		}
		out = append(out, d)
	}
	if len(wakes) > 0 {
		// A message was scheduled before the first one known: the next
		// fetch runs the script, which queues what is due and reads the
		// new due time.
		b.forceSchedule(s.stream)
		err := scriptDropWakes.Exec(ctx, b.client, []string{s.stream, s.holders}, wakes).Error()
		if err != nil {
			return nil, b.fail(ctx, "fetch", err)
		}
	}
	return out, nil
}

// delivery decodes queue entry e: its message (field m) and its deadline
// (field d, unix ms, if any). An entry whose deadline does not parse is
// as undecodable as one whose message does not.
func delivery(e *entry) (broker.Delivery, error) {
	m, ok := e.field("m")
	if !ok {
		return broker.Delivery{}, errors.New("the entry has no m field")
	}
	env, err := wire.DecodeString(m)
	if err != nil {
		return broker.Delivery{}, err
	}
	d := broker.Delivery{Env: env, Ref: e.id, Attempt: e.attempt}
	if s, ok := e.field("d"); ok {
		if d.Deadline, ok = unixMS(s); !ok {
			return broker.Delivery{}, fmt.Errorf("its deadline (field d) %q is not unix milliseconds", s)
		}
	}
	return d, nil
}

// bury moves the entry ref of s to its dead-letter stream.
func (b *Broker) bury(ctx context.Context, s *streamKeys, ref, reason string, attempts int, bad bool) error {
	stream, id, _ := b.splitRef(s, ref)
	err := scriptBury.Exec(ctx, b.client, []string{stream, s.dlq, s.delayed},
		[]string{id, reason, strconv.Itoa(attempts), boolArg(bad), ref[:len(ref)-len(id)]}).Error()
	return b.failIf(ctx, s.op, err)
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
	for _, ref := range refs {
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
				lost = append(lost, prefix+id)
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
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return err
	}
	delayed := b.keys.delayed(receiver)
	plain := true
	for _, ref := range refs {
		if prio, _ := refLevel(ref); prio != broker.PriorityNormal {
			plain = false
			break
		}
	}
	if plain {
		return b.ack(ctx, "ack", b.keys.queue(receiver), delayed, refs)
	}
	// Refs of several levels: one transaction per level.
	var levels [3][]string
	for _, ref := range refs {
		prio, _ := refLevel(ref)
		levels[prio+1] = append(levels[prio+1], ref)
	}
	for i, rs := range levels {
		if len(rs) > 0 {
			if err := b.ack(ctx, "ack", b.keys.queueAt(receiver, i-1), delayed, rs); err != nil {
				return err
			}
		}
	}
	return nil
}

// ack acknowledges and deletes refs of stream (all of one priority level),
// and drops them from the delayed zset, in one transaction (MULTI XACK
// ZREM XDEL EXEC, one write): it costs Redis a fraction of a script call,
// and acks are the most frequent call after sends and replies.
func (b *Broker) ack(ctx context.Context, op, stream, delayed string, refs []string) error {
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
			b.client.B().Zrem().Key(delayed).Member(chunk...).Build(),
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
// parks it in the delayed zset until it is due.
func (b *Broker) Retry(ctx context.Context, p *broker.RetryParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	receiver, consumer, ref, delay, lease := p.Receiver, p.Consumer, p.Ref, p.Delay, p.Lease
	prio, id := refLevel(ref)
	if !validRef(id) {
		return broker.ErrLeaseLost
	}
	n, err := scriptRetry.Exec(ctx, b.client, []string{b.keys.queueAt(receiver, prio), b.keys.delayed(receiver)},
		[]string{consumer, id, strconv.FormatInt(delay.Milliseconds(), 10), msString(lease), boolArg(p.Uncounted), ref}).AsInt64()
	if err != nil {
		if isNoGroup(err) {
			return broker.ErrLeaseLost
		}
		return b.fail(ctx, "retry", err)
	}
	if n == 0 {
		return broker.ErrLeaseLost
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
	n, err := scriptBury.Exec(ctx, b.client,
		[]string{b.keys.queueAt(receiver, prio), b.keys.deadLetters(receiver), b.keys.delayed(receiver)},
		[]string{id, reason, strconv.Itoa(d.Attempt), "0", levelPrefix(prio)}).AsInt64()
	if err != nil {
		if isNoGroup(err) {
			return broker.ErrLeaseLost
		}
		return b.fail(ctx, "dead-letter", err)
	}
	if n == 0 {
		return broker.ErrLeaseLost
	}
	return nil
}

func boolArg(v bool) string {
	if v {
		return "1"
	}
	return "0"
}
