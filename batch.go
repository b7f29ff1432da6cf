package disker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/pool"
)

// DefaultBatchSize is the most messages a batch handler gets at once,
// unless WithBatchSize says otherwise.
const DefaultBatchSize = 100

// BatchHandler handles the messages of a receiver a batch at a time
// (HandleBatch).
//
// HandleBatch returns one Outcome per message, in the order of msgs: what
// a Handler would have returned for that message, so that one bad message
// does not fail the others. A non-nil error fails every message of the
// batch with it instead, as a Handler's error does (the outcomes are then
// not looked at): each is retried after its backoff, and dead-lettered
// after its last attempt or at once when the error is marked with NoRetry;
// ErrReplyLater acknowledges them all without a reply. A panic
// (*PanicError) and a number of outcomes other than len(msgs) fail every
// message the same way.
//
// ctx does not end at the messages' deadlines, which are theirs alone: a
// message's Deadline field says it, and one whose deadline or expiry
// passed before the batch started is not in the batch (see Handler). ctx
// ends at the last of the deadlines when every message of the batch has
// one; when none of its messages is held any more, each having lost its
// lease (the cause is then ErrLeaseLost) or been cancelled (ErrCancelled);
// and on Close or Unhandle once their grace period is over. HandleBatch
// must return soon after ctx ends: what it has not finished is delivered
// again.
//
// A message of the batch cancelled while the batch runs (Cancel) leaves
// ctx alone while other messages are held: its sender is told at once
// that it was cancelled, and the outcome returned for it is dropped, as
// is that of a message whose lease was lost.
//
// The handler may keep msgs and the messages after it returned, to Reply
// later (ErrReplyLater), as a Handler may.
type BatchHandler interface {
	HandleBatch(ctx context.Context, msgs []*Message) ([]Outcome, error)
}

// BatchHandlerFunc adapts a function to a BatchHandler.
type BatchHandlerFunc func(ctx context.Context, msgs []*Message) ([]Outcome, error)

// HandleBatch calls f(ctx, msgs).
func (f BatchHandlerFunc) HandleBatch(ctx context.Context, msgs []*Message) ([]Outcome, error) {
	return f(ctx, msgs)
}

// Outcome is what becomes of one message of a batch (BatchHandler). The
// zero Outcome acknowledges the message without a reply, as a Handler
// that returns nil, nil does.
type Outcome struct {
	// Reply is the reply to the message, as a Handler's response: sent to
	// its sender, unless it is nil or the message is fire-and-forget (a
	// message sent by Request always gets a reply: nil is sent empty).
	Reply []byte
	// ReplyError, when set, is the reply instead of Reply: the sender gets
	// it as an error (Request returns it as a *RemoteError, a ReplyHandler
	// finds it in Message.Error), and the message is handled, not
	// retried. Its Code must not be empty, and Reply must be nil; its
	// MessageID is not sent.
	ReplyError *RemoteError
	// Err fails the message as a Handler's error does: it is retried after
	// its backoff, the attempt counted, and dead-lettered after the last
	// attempt or at once when Err is marked with NoRetry. ErrReplyLater
	// acknowledges it without a reply instead. Reply and ReplyError are
	// then not sent.
	Err error
}

// check returns why out cannot settle a message: a *ValidationError, with
// which the message then fails; nil when it can.
func (out *Outcome) check() error {
	switch {
	case out.ReplyError == nil:
	case out.ReplyError.Code == "":
		return invalid("Outcome.ReplyError.Code", "must not be empty: an error reply is known by its code")
	case out.Reply != nil:
		return invalid("Outcome", "Reply and ReplyError are both set: a reply is one or the other")
	}
	return nil
}

// WithBatchSize sets the most messages a batch handler (HandleBatch) gets
// at once; default DefaultBatchSize. n must be >= 1. Handle refuses it.
func WithBatchSize(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 1 {
			o.setErr(invalid("WithBatchSize", "must be >= 1, got %d", n))
		}
		o.batchSize = n
		o.batchOption = cmp.Or(o.batchOption, "WithBatchSize")
	}
}

// WithBatchWait sets how long a batch of a batch handler (HandleBatch)
// waits for more messages after its first, unless it fills up first;
// default 0, no wait: a batch starts as soon as a handler slot is free,
// with the messages that have come, and while every slot is busy the next
// batch gathers what comes meanwhile. A wait trades the latency of the
// first message of a batch for fuller batches when messages trickle in.
// d must be >= 0. Handle refuses it.
func WithBatchWait(d time.Duration) HandleOption {
	return func(o *handleOptions) {
		if d < 0 {
			o.setErr(invalid("WithBatchWait", "must be >= 0, got %v", d))
		}
		o.batchWait = d
		o.batchOption = cmp.Or(o.batchOption, "WithBatchWait")
	}
}

// HandleBatch starts serving receiver with h, a batch at a time: this
// instance fetches the receiver's messages, gathers them into batches of
// up to WithBatchSize's (default DefaultBatchSize), and calls h with each.
// A batch starts when it is full, or once WithBatchWait has passed since
// its first message came (at once by default) and a handler slot is
// free. Each message of a batch is settled by its own Outcome, and leaves
// the batch on its own: a message whose deadline or expiry passed before
// the batch started is dropped, and one cancelled or whose lease was lost
// is left out (see BatchHandler). Any number of instances may serve the
// same receiver, each with Handle or HandleBatch; each message goes to one
// of them at a time.
//
// The options are Handle's, and mean for a batch handler:
//   - WithConcurrency(n): how many batches run at a time on this instance;
//     default 1.
//   - WithPrefetch(n): n messages fetched beyond the batches that the
//     handler slots hold, so that the next batch is ready when one ends.
//   - WithMaxAttempts, WithBackoff and WithLease count for each message;
//     the lease of each message of a running or gathering batch is
//     extended, as a Handler's.
//   - WithExclusive: as for Handle, one instance at a time.
//   - WithGlobalConcurrency(n): a message of a batch takes a slot, from
//     when it is fetched until it is settled, so that n counts messages
//     across instances, not batches: with n below the batch size, no batch
//     holds more than n messages.
//   - WithRateLimit: a message of a batch takes a token, so that a batch
//     holds what the rate allows since the last one.
//   - WithGroupConcurrency(n), for keyed messages (WithGroup): a batch
//     holds at most n messages of one key (1 by default), since no more
//     are out at a time, so that each key's messages run in order, one
//     batch after another; WithGroupRate and WithGroupSkipRetries as for
//     Handle.
//
// Pause stops the batches from starting, on every instance; the running
// ones finish. A batch handler has no pool of its own (HandleWithPool
// hands one worker to each message): one that needs a pooled resource
// takes it for the whole batch, with pool.Pool.Do.
//
// It returns what Handle returns, with a *ValidationError naming
// "BatchHandler" for a nil h.
func (d *Disker) HandleBatch(receiver string, h BatchHandler, opts ...HandleOption) error {
	if err := checkName("receiver", receiver); err != nil {
		return err
	}
	if h == nil {
		return invalid("BatchHandler", "must not be nil")
	}
	o, err := handleOptionsOf(1, opts)
	if err != nil {
		return err
	}
	o.batch = h
	o.batchSize = cmp.Or(o.batchSize, DefaultBatchSize)
	return d.serve(receiver, nil, o)
}

// batchSettlers is how many deliveries of a batch are settled at a time:
// their round trips to the broker (a reply, a retry) overlap.
const batchSettlers = 16

// errNotHanded marks the deliveries of a batch that its handler did not
// get (they were dropped, or lost before it started).
var errNotHanded = errors.New("disker: not handed to the batch handler")

// batcher gathers a batch handler's deliveries into batches and starts
// each once it is full, or once its wait is over and a handler slot is
// free.
type batcher struct {
	c      *consumer
	mu     sync.Mutex
	open   *batch      // the batch being gathered; nil when none
	busy   int         // batches started and not finished
	timer  *time.Timer // ends the open batch's wait
	closed bool        // the consumer stopped: the open batch starts now
}

// batch is one call of a batch handler: its deliveries, and why some are
// no longer held.
type batch struct {
	tasks []*task
	due   time.Time // when it may start without being full

	mu     sync.Mutex
	gone   map[*task]error         // why a delivery is no longer held
	live   int                     // deliveries handed over and still held
	cancel context.CancelCauseFunc // ends the handler's ctx; nil until it starts
}

func newBatcher(c *consumer) *batcher {
	b := &batcher{c: c}
	b.timer = time.AfterFunc(time.Hour, b.waited)
	b.timer.Stop()
	return b
}

// add gathers the deliveries of a fetch into batches, after dropping
// those whose deadline or expiry passed (see tooLate).
func (b *batcher) add(ds []broker.Delivery) {
	c := b.c
	now := time.Now()
	n := 0
	for i := range ds {
		if !c.tooLate(&ds[i], now) {
			ds[n] = ds[i]
			n++
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range ds[:n] {
		if b.open == nil {
			b.open = &batch{tasks: make([]*task, 0, min(c.o.batchSize, n-i)), due: now.Add(c.o.batchWait)}
		}
		bt := b.open
		bt.join(c, ds[i])
		if len(bt.tasks) == c.o.batchSize {
			b.start()
		}
	}
	b.startDue(now)
}

// startDue starts the open batch when its wait is over and a handler
// slot is free (or the consumer stopped), and otherwise sets the timer
// for the end of its wait. A slot that frees calls it again (finishBatch).
func (b *batcher) startDue(now time.Time) {
	switch {
	case b.open == nil:
	case b.closed || !now.Before(b.open.due) && b.busy < b.c.o.concurrency:
		b.start()
	case now.Before(b.open.due):
		b.timer.Reset(b.open.due.Sub(now))
	}
}

// start runs the open batch on the executor, whose queue has room for a
// task per delivery held.
func (b *batcher) start() {
	c, bt := b.c, b.open
	b.open = nil
	b.timer.Stop()
	b.busy++
	if err := c.executor().Submit(context.Background(), func() { c.runBatch(bt) }); err != nil {
		// The executor is closed only after the batches stopped: this is a
		// bug, but the messages are safe (unacknowledged).
		c.d.log.Error("disker: cannot run a batch handler", "receiver", c.name, "count", len(bt.tasks), "error", err)
		b.busy--
		for _, t := range bt.tasks {
			c.finish(t)
		}
	}
}

// waited is the timer's: the open batch's wait is over.
func (b *batcher) waited() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.startDue(time.Now())
}

// close starts the open batch, if any, when the consumer stops fetching:
// it is drained as the running ones are.
func (b *batcher) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.startDue(time.Now())
}

// join makes dl a task of bt, counted in flight.
func (bt *batch) join(c *consumer, dl broker.Delivery) {
	t := &task{dl: dl}
	t.cancel = func(cause error) { bt.lose(t, cause) }
	bt.tasks = append(bt.tasks, t)
	c.track(t)
}

// lose records that t is no longer held, for cause (ErrLeaseLost,
// ErrCancelled): it is t's cancel. When it was handed to the handler and
// no other delivery handed over is held, the handler's ctx ends with
// cause. A nil cause (t finished) changes nothing.
func (bt *batch) lose(t *task, cause error) {
	if cause == nil {
		return
	}
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if !bt.setGone(t, cause) || bt.cancel == nil {
		return
	}
	if bt.live--; bt.live == 0 {
		bt.cancel(cause)
	}
}

// setGone records why t is no longer held, unless it was recorded
// already (false). Call it under bt.mu.
func (bt *batch) setGone(t *task, cause error) bool {
	if _, ok := bt.gone[t]; ok {
		return false
	}
	if bt.gone == nil {
		bt.gone = make(map[*task]error)
	}
	bt.gone[t] = cause
	return true
}

// goneCause is why t is no longer held; nil while it is.
func (bt *batch) goneCause(t *task) error {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	return bt.gone[t]
}

// runBatch handles a batch and settles each of its deliveries.
func (c *consumer) runBatch(bt *batch) {
	defer c.finishBatch(bt)
	if c.paused.Load() && !c.waitResumed(c.hardCtx.Done(), c.fetchCtx.Done()) {
		return // stopped while paused: left for another delivery
	}
	if c.hardCtx.Err() != nil {
		return // it waited for a slot until the instance stopped
	}
	if c.lim != nil {
		if !c.lim.start(c.d.opCtx, len(bt.tasks)) {
			// Their global concurrency slots lapsed (or cannot be
			// renewed) while they waited: they go to an instance that
			// holds some.
			for _, t := range bt.tasks {
				c.giveBack(t, c.d.messageOf(&t.dl.Env, t.dl.Deadline, t.dl.Attempt), errSlotLapsed)
			}
			return
		}
		defer c.lim.end(len(bt.tasks))
	}
	handed, msgs, ctx, end := c.startBatch(bt)
	if len(msgs) == 0 {
		return
	}
	defer end()
	d := c.d
	if d.onEvent != nil {
		for _, m := range msgs {
			d.emit(Event{Kind: EventStarted, Receiver: c.name, Sender: m.Sender, MessageID: m.ID, Attempt: m.Attempt})
		}
	}
	began := time.Now()
	outs, err := c.callBatch(ctx, msgs)
	took := time.Since(began)
	if err == nil && len(outs) != len(msgs) {
		err = fmt.Errorf("disker: the batch handler returned %d outcomes for %d messages", len(outs), len(msgs))
	}
	c.settleBatch(bt, handed, outs, err, took)
}

// finishBatch ends the bookkeeping of a batch that ended, its handler
// slot and its deliveries at once, so that the fetch loop, which it wakes,
// fetches all that the batch freed in one go: a full batch, under a
// backlog.
func (c *consumer) finishBatch(bt *batch) {
	c.mu.Lock()
	for _, t := range bt.tasks {
		delete(c.inflight, t.dl.Ref)
	}
	c.mu.Unlock()
	b := c.batches
	b.mu.Lock()
	b.busy--
	b.startDue(time.Now())
	b.mu.Unlock()
	c.mu.Lock()
	c.n.Add(-int64(len(bt.tasks)))
	freed := c.freed
	c.mu.Unlock()
	signal(freed)
	c.tasks.Add(-len(bt.tasks))
}

// drainBatches is the test kit's Drain for a batch handler: it runs up to
// max of the receiver's due messages on the caller's goroutine, in
// batches of up to the batch size, fetched one at a time as Drain fetches
// them (see fetchOne). It returns how many it fetched.
func (c *consumer) drainBatches(ctx context.Context, fp *broker.FetchParams, max int) (int, error) {
	n := 0
	for n < max {
		var ds []broker.Delivery
		var err error
		for len(ds) < c.o.batchSize && n+len(ds) < max {
			dl, ok, ferr := c.fetchOne(ctx, fp)
			if err = ferr; err != nil || !ok {
				break
			}
			ds = append(ds, dl)
		}
		if len(ds) > 0 {
			n += len(ds)
			if rerr := c.runBatchByHand(ctx, ds); rerr != nil {
				return n, rerr
			}
		}
		if err != nil || len(ds) < c.o.batchSize && n < max {
			return n, err
		}
	}
	return n, nil
}

// runBatchByHand handles ds as one batch on the caller's goroutine, as a
// batcher has a batch run, after dropping those too late on the broker's
// clock (see runByHand).
func (c *consumer) runBatchByHand(ctx context.Context, ds []broker.Delivery) error {
	now, err := c.d.b.Now(ctx)
	if err != nil {
		return err
	}
	bt := &batch{}
	for i := range ds {
		if !c.tooLateAt(&ds[i], now) {
			bt.join(c, ds[i])
		}
	}
	if len(bt.tasks) == 0 {
		return nil
	}
	b := c.batches
	b.mu.Lock()
	b.busy++ // as start, for finishBatch
	b.mu.Unlock()
	c.runBatch(bt)
	return nil
}

// startBatch picks the deliveries of bt to hand to its handler, those
// still held whose deadline and expiry have not passed (the others are
// dropped, see tooLate), with their messages, and makes the handler's ctx
// (see BatchHandler); end releases it.
func (c *consumer) startBatch(bt *batch) (handed []*task, msgs []*Message, ctx context.Context, end func()) {
	d := c.d
	now := time.Now()
	var dropped []*task
	for _, t := range bt.tasks {
		if c.tooLate(&t.dl, now) {
			dropped = append(dropped, t)
		}
	}
	bt.mu.Lock()
	defer bt.mu.Unlock()
	for _, t := range dropped {
		bt.setGone(t, errNotHanded)
	}
	handed = make([]*task, 0, len(bt.tasks))
	msgs = make([]*Message, 0, len(bt.tasks))
	var last time.Time // the last deadline
	every := true      // every message has one
	for _, t := range bt.tasks {
		if t.settle.Load() == taskCancelled {
			bt.setGone(t, ErrCancelled) // before its cancel did
		}
		if bt.gone[t] != nil {
			continue
		}
		msg := &t.msg
		d.setMessage(msg, &t.dl.Env, t.dl.Deadline, t.dl.Attempt)
		msg.Group = t.dl.GroupKey
		msg.settle = &t.settle
		if msg.retention == 0 {
			msg.retention = c.o.retention
		}
		if msg.retention > 0 {
			d.priorReply(msg)
			c.startResult(msg, &t.dl)
		}
		every = every && !msg.Deadline.IsZero()
		if msg.Deadline.After(last) {
			last = msg.Deadline
		}
		handed, msgs = append(handed, t), append(msgs, msg)
	}
	if len(handed) == 0 {
		return nil, nil, nil, nil
	}
	bt.live = len(handed)
	ctx, cancel := context.WithCancelCause(c.hardCtx)
	bt.cancel = cancel
	end = func() { cancel(nil) }
	if every {
		var cancelDeadline context.CancelFunc
		ctx, cancelDeadline = context.WithDeadline(ctx, last)
		end = func() { cancelDeadline(); cancel(nil) }
	}
	return handed, msgs, ctx, end
}

// callBatch runs the batch handler, turning a panic into a *PanicError.
func (c *consumer) callBatch(ctx context.Context, msgs []*Message) (outs []Outcome, err error) {
	defer func() {
		if v := recover(); v != nil {
			outs, err = nil, pool.NewPanicError(v)
		}
	}()
	return c.o.batch.HandleBatch(ctx, msgs)
}

// settleBatch settles each delivery handed to the handler by its outcome,
// or by err when set (the handler's error, a panic, outcomes of the wrong
// number), batchSettlers at a time.
func (c *consumer) settleBatch(bt *batch, handed []*task, outs []Outcome, err error, took time.Duration) {
	outcome := func(i int) Outcome {
		if err != nil {
			return Outcome{Err: err}
		}
		return outs[i]
	}
	if len(handed) == 1 {
		c.settleOutcome(bt, handed[0], outcome(0), took)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(batchSettlers, len(handed)) {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < len(handed); i = int(next.Add(1)) - 1 {
				c.settleOutcome(bt, handed[i], outcome(i), took)
			}
		})
	}
	wg.Wait()
}

// settleOutcome settles t, handed to the handler, by out, unless t is no
// longer held, or failed after the instance stopped (it is then left for
// another delivery).
func (c *consumer) settleOutcome(bt *batch, t *task, out Outcome, took time.Duration) {
	msg := &t.msg
	switch cause := bt.goneCause(t); {
	case errors.Is(cause, ErrLeaseLost):
		c.d.log.Warn("disker: lease lost while handling; the message goes to another worker", logAttrs(c.name, msg.ID, msg.Attempt)...)
		return
	case cause != nil:
		c.cancelled(msg)
		return
	case out.Err != nil && c.hardCtx.Err() != nil:
		return
	}
	if out.Err == nil {
		out.Err = out.check()
	}
	if out.Err == nil && out.ReplyError != nil {
		c.succeed(t, msg, nil, out.ReplyError, took, false)
		return
	}
	c.settle(t, msg, out.Reply, out.Err, took, msg.Deadline)
}
