package disker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Send queues msg for msg.Receiver and returns its id once the broker has
// accepted it. A message without a Sender is fire-and-forget. Every send
// option composes with every other, and whatever they are the message is
// written in one atomic step: with its pending timeout (WithTimeout: this
// instance then watches the sender's timeouts, so that a notice reaches
// the sender's TimeoutHandler, on whichever instance registered one,
// within Config.TimeoutMonitorFrequency of the deadline), its due time
// (WithDelay, WithDeliverAt), its level (WithPriority) and its keys.
//
// With WithDedupKey, a Send within the key's window of an earlier one
// queues nothing and returns that message's id with a *DuplicateError.
// With WithIdempotencyKey, a Send whose key is in use queues nothing and
// returns the id of the key's message, with no error.
//
// Send returns a *ValidationError for bad input, an error wrapping
// ErrUnavailable when the broker cannot be reached, and ErrClosed after
// Close. It blocks for one round trip to the broker, and returns by ctx's
// end whatever Redis's connection does (down, refusing, stalled, paused),
// or, when ctx has no deadline, by SendTimeout (see "Which calls block" in
// the package documentation). When it returns so, without the broker's
// answer, its error matches ctx's (or ErrUnavailable, after SendTimeout),
// and the message may have been queued all the same.
func (d *Disker) Send(ctx context.Context, msg Message, opts ...SendOption) (string, error) {
	o := sendOptionsOf(nil, opts)
	one := oneSend.Get().(*[1]broker.SendParams)
	ps := one[:]
	if err := d.prepare(&ps[0], &msg, &o); err != nil {
		putSend(one)
		return "", err
	}
	var unsent func()
	if o.then != nil {
		var err error
		if unsent, err = d.startChain(ctx, &ps[0], &o); err != nil {
			putSend(one)
			return "", err
		}
	}
	if o.batchSet {
		if err := d.addChildren(ctx, ps); err != nil {
			putSend(one)
			return "", err
		}
	}
	detached, err := d.sendApart(ctx, ps)
	if detached {
		return "", err // the send has ps, one, still
	}
	defer putSend(one)
	if err != nil {
		return "", err
	}
	if o.batchSet {
		d.dropUnsent(ps)
	}
	switch {
	case unsent != nil && notStored(&ps[0].Result):
		// A duplicate, or refused: the chain never starts (its first batch
		// stays open, empty, until it expires), and its last step leaves
		// the batch it is a child of.
		unsent()
	case unsent != nil && ps[0].Result.Err == nil:
		if _, err := call(d, "chain", func() (broker.BatchInfo, error) { return d.b.SealBatch(ctx, ps[0].Batch) }); err != nil {
			return "", err
		}
	}
	afterSent(ps, func(int) func(string) { return o.onSent })
	return sendResult(&ps[0])
}

// oneSend holds the params of Send's one message, reused once the broker
// is done with them: when its Send returned, unless the send went on
// alone (sendApart).
var oneSend = sync.Pool{New: func() any { return new([1]broker.SendParams) }}

// putSend gives one back to oneSend, keeping nothing of its message.
func putSend(one *[1]broker.SendParams) {
	*one = [1]broker.SendParams{}
	oneSend.Put(one)
}

// SendTimeout bounds Send, SendBatch and SendEach when their context has
// no deadline: whatever Redis's connection does (down, refusing, stalled,
// paused), a call returns within SendTimeout for each 1,000 messages it
// sends (a round trip of SendBatch's), with an error wrapping
// ErrUnavailable when the broker did not answer by then. The messages may
// have been queued all the same. With a deadline in ctx, the calls return
// by it.
const SendTimeout = 10 * time.Second

// sendApart sends ps (send) and returns its error. Over Redis the send runs
// on a goroutine of its own, which Close waits for, and sendApart returns
// by ctx's end, or by SendTimeout (for each 1,000 messages) when ctx has
// no deadline: whatever the broker's client does (a stalled connection
// holds the commands pipelined on it, a reconnection the commands that
// come meanwhile), the caller goes on. When it returns so, before the
// send ended, detached is true, with an error that matches ctx's (or
// ErrUnavailable, after SendTimeout): the send goes on alone with ps,
// which the caller must leave to it, and the messages may have been
// queued all the same. The in-memory broker answers at once: its sends
// run on the caller's goroutine.
func (d *Disker) sendApart(ctx context.Context, ps []broker.SendParams) (detached bool, err error) {
	if !d.remote {
		return false, d.send(ctx, ps)
	}
	job := d.goSend(ctx, ps)
	if job == nil {
		return false, ErrClosed
	}
	var timeout <-chan time.Time
	limit := SendTimeout * time.Duration((len(ps)+999)/1000)
	if _, ok := ctx.Deadline(); !ok {
		t := sendTimers.Get().(*time.Timer)
		t.Reset(limit)
		defer sendTimers.Put(t)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case err := <-job.done:
		job.release()
		return false, err
	case <-ctx.Done():
		return true, fmt.Errorf("disker: send: %w: the broker had not answered; the message may have been queued all the same", ctx.Err())
	case <-timeout:
		return true, fmt.Errorf("disker: send: %w: the broker did not answer within %v (SendTimeout); the message may have been queued all the same", ErrUnavailable, limit)
	}
}

// goSend starts the send of ps with ctx on a goroutine of its own, which
// Close waits for, and returns its job, whose done gets the send's error;
// nil after Close.
func (d *Disker) goSend(ctx context.Context, ps []broker.SendParams) *sendJob {
	if !d.sends.enter() {
		return nil
	}
	job := sendJobs.Get().(*sendJob)
	job.d, job.ctx, job.ps = d, ctx, ps
	go job.start()
	return job
}

// sendJob is a send run on a goroutine of its own (goSend): done gets its
// error. Jobs are reused (release), but for those whose caller left
// first.
type sendJob struct {
	d    *Disker
	ctx  context.Context
	ps   []broker.SendParams
	done chan error
	// start is run, bound to the job once: the go statement of a bound
	// func value with no arguments allocates no closure per send.
	start func()
}

// newSendJob returns a job that is not in use.
func newSendJob() *sendJob {
	j := &sendJob{done: make(chan error, 1)}
	j.start = j.run
	return j
}

func (j *sendJob) run() {
	defer j.d.sends.leave()
	j.done <- j.d.send(j.ctx, j.ps)
}

// release gives back j, whose error was read from done, for reuse.
func (j *sendJob) release() {
	*j = sendJob{done: j.done, start: j.start}
	sendJobs.Put(j)
}

var (
	sendJobs   = sync.Pool{New: func() any { return newSendJob() }}
	sendTimers = sync.Pool{New: func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}}
)

// detachedCalls counts the goroutines that run a send apart from its caller
// (goSend), which Close waits for once it closed the broker (which ends
// those whose caller left first).
type detachedCalls struct {
	mu     sync.RWMutex
	closed bool
	wg     sync.WaitGroup
}

// enter counts a goroutine in, unless Close has waited already (false).
func (c *detachedCalls) enter() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// leave counts a goroutine out.
func (c *detachedCalls) leave() { c.wg.Done() }

// close lets no goroutine in any more and waits for those in.
func (c *detachedCalls) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.wg.Wait()
}

// Outgoing is one message of SendEach, with options of its own.
type Outgoing struct {
	// Message is the message, as Send takes it.
	Message Message
	// Options apply to this message, after the options of the call.
	Options []SendOption
}

// SendBatch sends msgs, each as Send would (opts apply to every one), in as
// few round trips to the broker as it can, and returns their ids in order.
// On Redis a batch of messages sent the same way (plain, or with any
// options but a pending timeout across Cluster slots) is one pipeline per
// 1,000 messages: the way to move many messages from one producer. For
// options that differ from message to message (a due time each, a dedup
// key each), use SendEach.
//
// Every message is checked first: a bad one fails the call with a
// *ValidationError whose Field names its index (such as
// "msgs[3].Receiver"), and nothing is sent. Each message is then sent in
// its own atomic step, but the batch is not atomic: when some could not be
// sent, SendBatch returns the ids with "" in their place and a *BatchError
// that says which failed and why. A duplicate (WithDedupKey) is reported
// there too, as a *DuplicateError, with the id of the message that holds
// the key in its place. Messages to one receiver are queued in batch order.
// An empty batch sends nothing and returns no error. Like Send, it returns
// by ctx's end, or by SendTimeout for each 1,000 messages when ctx has no
// deadline, whatever Redis's connection does.
func (d *Disker) SendBatch(ctx context.Context, msgs []Message, opts ...SendOption) ([]string, error) {
	out := make([]Outgoing, len(msgs))
	for i := range msgs {
		out[i].Message = msgs[i]
	}
	return d.sendEach(ctx, out, opts, "msgs[%d].")
}

// SendEach sends each of msgs with its own options (after opts, which apply
// to every one) as SendBatch sends its messages: in as few round trips as
// it can, each in its own atomic step, in order per receiver. A bad message
// or option fails the call with a *ValidationError whose Field names its
// index (such as "msgs[3].Message.Receiver", or the option, "WithDelay",
// with the index in its Reason), and nothing is sent.
func (d *Disker) SendEach(ctx context.Context, msgs []Outgoing, opts ...SendOption) ([]string, error) {
	return d.sendEach(ctx, msgs, opts, "msgs[%d].Message.")
}

// sendEach is SendBatch and SendEach; msgField is the format of a message
// field's prefix in errors.
func (d *Disker) sendEach(ctx context.Context, msgs []Outgoing, opts []SendOption, msgField string) ([]string, error) {
	if len(msgs) == 0 {
		if d.closed.Load() {
			return nil, ErrClosed
		}
		return []string{}, nil
	}
	base := sendOptionsOf(nil, opts)
	ps := make([]broker.SendParams, len(msgs))
	hooks := make([]func(string), len(msgs))
	for i := range msgs {
		o := sendOptionsOf(&base, msgs[i].Options)
		if o.then != nil {
			return nil, indexed(invalid("WithThen", "goes with Send and Batch.Send, not with SendBatch or SendEach"), fmt.Sprintf(msgField, i), fmt.Sprintf("msgs[%d]", i))
		}
		if err := d.prepare(&ps[i], &msgs[i].Message, &o); err != nil {
			return nil, indexed(err, fmt.Sprintf(msgField, i), fmt.Sprintf("msgs[%d]", i))
		}
		hooks[i] = o.onSent
	}
	if err := d.addChildren(ctx, ps); err != nil {
		return nil, err
	}
	if _, err := d.sendApart(ctx, ps); err != nil {
		return nil, err
	}
	d.dropUnsent(ps)
	afterSent(ps, func(i int) func(string) { return hooks[i] })
	ids := make([]string, len(ps))
	errs := make([]error, len(ps))
	failed := false
	for i := range ps {
		id, err := sendResult(&ps[i])
		if err != nil {
			failed = true
			errs[i] = err
			if ps[i].Result.Outcome != broker.Duplicate {
				id = ""
			}
		}
		ids[i] = id
	}
	if failed {
		return ids, &BatchError{Errs: errs}
	}
	return ids, nil
}

// indexed names the message that err, a *ValidationError of one message,
// is about: a field of the message gets msgField in place of "Message.",
// and an option's reason begins with the message, msg.
func indexed(err error, msgField, msg string) error {
	var ve *ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	if f, ok := strings.CutPrefix(ve.Field, "Message."); ok {
		return invalid(msgField+f, "%s", ve.Reason)
	}
	return invalid(ve.Field, "%s: %s", msg, ve.Reason)
}

// prepare checks m, sent with o, and sets p to its send: a message of its
// own id, whose reply goes to m.Sender (nowhere without one).
func (d *Disker) prepare(p *broker.SendParams, m *Message, o *sendOptions) error {
	if err := d.checkContent(m); err != nil {
		return err
	}
	route := broker.RouteNone
	if m.Sender != "" {
		if err := checkName("Message.Sender", m.Sender); err != nil {
			return err
		}
		route = broker.RouteSender
	}
	if err := o.check(route != broker.RouteNone); err != nil {
		return err
	}
	o.params(p, m, route)
	return nil
}

// params sets p to the send of m with o, under a new id, with the reply
// route given: each option is a plain field of the broker's send.
func (o *sendOptions) params(p *broker.SendParams, m *Message, route broker.Route) {
	*p = broker.SendParams{
		Env: broker.Envelope{
			ID:       newID(),
			Sender:   m.Sender,
			Receiver: m.Receiver,
			Content:  m.Content,
			Headers:  m.Headers,
			Route:    route,
			Timeout:  o.timeout,
			Priority: int(o.priority),
		},
		Delay:     o.delay,
		DeliverAt: o.at,
	}
	if o.dedup {
		p.DedupKey, p.DedupTTL, p.DedupUntilSettled = o.dedupKey, o.dedupTTL, o.dedupSettled
	}
	if o.debounce {
		p.DebounceKey, p.DebounceWait, p.DebounceMax = o.debounceKey, o.debounceWait, o.debounceMax
	}
	if o.idempotent {
		p.Env.IdempotencyKey, p.IdemTTL = o.idemKey, o.idemTTLOrDefault()
	}
	if o.expirySet {
		p.Expiry = o.expiry
	}
	p.GroupKey = o.group
	if o.expireAtSet {
		p.ExpireAt = o.expireAt
	}
	p.Retention = o.retention
	if o.batchSet {
		p.Batch = o.batch
		if p.Retention == 0 {
			p.Retention = DefaultBatchRetention
		}
	}
}

// checkContent checks m's Receiver and Content, which every send needs.
func (d *Disker) checkContent(m *Message) error {
	if err := checkName("Message.Receiver", m.Receiver); err != nil {
		return err
	}
	if len(m.Content) > d.cfg.MaxMessageSize {
		return invalid("Message.Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(m.Content), d.cfg.MaxMessageSize)
	}
	return nil
}

// send sends ps, prepared, in one call to the broker (through call, for
// the closed check and the broker's health), with what every send does
// around it: the watch of a timed message's sender by the timeout monitor
// (before the send: the monitor must know the sender by the time the
// deadline passes), and for each message stored the count and the event
// (its WithOnSent hook is the caller's: afterSent). It returns the error
// of the call as a whole; each message's outcome is its Result, whose Err
// is then wrapped as the operation's.
func (d *Disker) send(ctx context.Context, ps []broker.SendParams) error {
	called := false // the broker took the call: each message's outcome is its Result
	_, err := call(d, "send", func() (struct{}, error) {
		now := time.Now()
		for i := range ps {
			if env := &ps[i].Env; env.Timeout > 0 && env.Route == broker.RouteSender {
				d.monitor.watch(env.Sender, localDeadline(&ps[i], now))
			}
		}
		if err := d.b.Send(ctx, ps); err != nil {
			return struct{}{}, err
		}
		called = true
		return struct{}{}, noneStored(ps)
	})
	if !called {
		return err
	}
	for i := range ps {
		r, env := &ps[i].Result, &ps[i].Env
		if r.Err != nil {
			r.Err = wrapBroker("send", r.Err)
			continue
		}
		if r.Outcome == broker.Queued || r.Outcome == broker.Deferred {
			d.sent.Add(1)
			if d.onEvent != nil {
				d.emit(Event{Kind: EventSent, Receiver: env.Receiver, Sender: env.Sender, MessageID: env.ID})
			}
		}
	}
	return nil
}

// afterSent calls the WithOnSent hook of each message of ps, sent, that
// the broker stored or answered for (not a duplicate): hook(i), which may
// be nil, on the caller's goroutine.
func afterSent(ps []broker.SendParams, hook func(i int) func(string)) {
	for i := range ps {
		r := &ps[i].Result
		if f := hook(i); f != nil && r.Err == nil && r.Outcome != broker.Duplicate {
			f(r.ID)
		}
	}
}

// noneStored is, for the broker's health, the outcome of the call that
// sent ps: nil when the broker stored (or answered for) at least one of
// them, else the first message's error.
func noneStored(ps []broker.SendParams) error {
	for i := range ps {
		if ps[i].Result.Err == nil {
			return nil
		}
	}
	if len(ps) == 0 {
		return nil
	}
	return ps[0].Result.Err
}

// localDeadline is the local estimate of the deadline of p sent at now:
// its due time plus its timeout.
func localDeadline(p *broker.SendParams, now time.Time) time.Time {
	due := now.Add(p.Delay)
	if p.DeliverAt.After(now) {
		due = p.DeliverAt
	}
	return due.Add(p.Env.Timeout)
}

// sendResult is what Send returns for p, sent.
func sendResult(p *broker.SendParams) (string, error) {
	r := &p.Result
	switch r.Outcome {
	case broker.SendFailed:
		return "", r.Err
	case broker.Duplicate:
		return r.ID, &DuplicateError{ID: r.ID, Receiver: p.Env.Receiver, Key: p.DedupKey}
	}
	return r.ID, nil
}
