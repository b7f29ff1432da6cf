package membroker

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// memBatch is a batch (broker.Batches): its info, its messages, its
// children (id -> receiver while waiting) and the children counted.
type memBatch struct {
	info       broker.BatchInfo
	completion []byte
	// next is the completion's send when it has a retention (a chain's
	// step, a nested batch's completion, with CompletionBatch), nil
	// otherwise: its record is written when the batch completes.
	next *broker.SendParams
	// replyAsContent: the completion takes the reply of the child that
	// succeeded (replyIn, encoded; nil: none).
	replyAsContent bool
	replyIn        []byte
	failure        []byte
	retention      time.Duration
	expires        time.Time
	waiting        map[string]string
	counted        map[string]bool
}

// batch returns the live batch id, dropping it if it expired. Callers
// hold mu.
func (c *core) batch(id string, now time.Time) *memBatch {
	bt := c.batches[id]
	if bt != nil && !now.Before(bt.expires) {
		delete(c.batches, id)
		return nil
	}
	return bt
}

// reportBatch counts child id's outcome o in its batch, once, in the step
// that settled it (finalResult), with its reply when it goes to the batch
// (nil: none). Callers hold mu.
func (c *core) reportBatch(id, child string, o broker.ResultState, failed bool, reply []byte) {
	now := c.now()
	bt := c.batch(id, now)
	if bt == nil || bt.counted[child] {
		return
	}
	if _, ok := bt.waiting[child]; !ok {
		bt.info.Counts.Children++
	}
	delete(bt.waiting, child)
	bt.counted[child] = true
	n := &bt.info.Counts
	switch {
	case o == broker.ResultDone && failed:
		n.Failed++
	case o == broker.ResultDone:
		n.Succeeded++
		if reply != nil {
			bt.replyIn = reply
		}
	case o == broker.ResultDeadLettered:
		n.DeadLettered++
	case o == broker.ResultCancelled:
		n.Cancelled++
	case o == broker.ResultExpired:
		n.Expired++
	default:
		n.TimedOut++
	}
	c.fireBatch(bt, now)
}

// fireBatch queues the completion (or the failure message) of bt when it
// is sealed and every child settled, and marks it completed. Callers
// hold mu.
func (c *core) fireBatch(bt *memBatch, now time.Time) {
	info := &bt.info
	if info.State != broker.BatchSealed || info.Counts.Settled() != info.Counts.Children {
		return
	}
	raw, fired := bt.completion, broker.FiredCompletion
	if info.OnlyIfAllSucceed && info.Counts.Succeeded != info.Counts.Children {
		raw, fired = bt.failure, broker.FiredFailure
	}
	recv, _, _ := broker.ParseBatchID(info.ID)
	switch {
	case raw == nil:
		fired = broker.FiredNone
	case fired == broker.FiredCompletion && bt.replyAsContent && bt.replyIn != nil:
		raw = withReply(raw, bt.replyIn)
	}
	if raw != nil {
		c.place(c.queue(recv), recv, "", &entry{ref: c.nextRef(), raw: raw, at: now}, now)
	}
	bt.replyIn = nil
	info.State, info.Fired, info.Completed = broker.BatchCompleted, fired, now
	bt.expires = now.Add(bt.retention)
	if bt.next != nil {
		c.recordSent(bt.next, time.Time{}, now, now)
		if fired != broker.FiredCompletion {
			// Never sent: settled cancelled, for the batch it is a child of.
			c.finalResult(recv, bt.next.Env.ID, broker.ResultCancelled, bt.next.Retention, nil, broker.CodeCancelled, broker.NotSentText, nil)
		}
	}
}

// CreateBatch creates an open batch. See broker.Batches.
func (b *Broker) CreateBatch(ctx context.Context, p *broker.CreateBatchParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	now := c.now()
	if c.batch(p.ID, now) != nil {
		return broker.ErrBatchExists
	}
	bt := &memBatch{info: broker.BatchInfo{ID: p.ID, State: broker.BatchOpen, OnlyIfAllSucceed: p.OnlyIfAllSucceed,
		CompletionID: p.Completion.ID, Created: now},
		completion: encode(&p.Completion), retention: p.Retention, expires: now.Add(broker.PendingRetention + p.Retention),
		waiting: make(map[string]string), counted: make(map[string]bool)}
	if p.Failure != nil {
		bt.failure, bt.info.FailureID = encode(p.Failure), p.Failure.ID
	}
	if p.Completion.Retention > 0 {
		bt.next = &broker.SendParams{Env: p.Completion, Retention: p.Completion.Retention, Batch: p.CompletionBatch,
			BatchReply: p.CompletionBatchReply}
	}
	bt.replyAsContent = p.ReplyAsContent
	c.batches[p.ID] = bt
	c.indexBatch(p.ID)
	return nil
}

// AddBatchChildren registers children of an open batch. See
// broker.Batches.
func (b *Broker) AddBatchChildren(ctx context.Context, id string, children []broker.BatchChild) error {
	if err := broker.CheckBatchChildren(id, children); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	bt := b.c.batch(id, now)
	switch {
	case bt == nil:
		return broker.ErrNoBatch
	case bt.info.State != broker.BatchOpen:
		return broker.ErrBatchSealed
	}
	for _, ch := range children {
		if _, ok := bt.waiting[ch.ID]; !ok && !bt.counted[ch.ID] {
			bt.waiting[ch.ID] = ch.Receiver
			bt.info.Counts.Children++
		}
	}
	bt.expires = now.Add(broker.PendingRetention + bt.retention)
	return nil
}

// RemoveBatchChild forgets a waiting child. See broker.Batches.
func (b *Broker) RemoveBatchChild(ctx context.Context, id, childID string) error {
	if err := errors.Join(broker.CheckBatchID("batch id", id), broker.CheckName("child id", childID)); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	if bt := b.c.batch(id, now); bt != nil {
		if _, ok := bt.waiting[childID]; ok {
			delete(bt.waiting, childID)
			bt.info.Counts.Children--
			b.c.fireBatch(bt, now)
		}
	}
	return nil
}

// SealBatch seals a batch. See broker.Batches.
func (b *Broker) SealBatch(ctx context.Context, id string) (broker.BatchInfo, error) {
	info, _, err := b.seal(ctx, id, false)
	return info, err
}

// CancelBatch cancels and seals a batch. See broker.Batches.
func (b *Broker) CancelBatch(ctx context.Context, id string) ([]broker.BatchChild, error) {
	_, waiting, err := b.seal(ctx, id, true)
	return waiting, err
}

// seal seals batch id, cancelling it too when cancel is set, and returns
// it and its waiting children.
func (b *Broker) seal(ctx context.Context, id string, cancel bool) (broker.BatchInfo, []broker.BatchChild, error) {
	if err := broker.CheckBatchID("batch id", id); err != nil {
		return broker.BatchInfo{}, nil, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.BatchInfo{}, nil, err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	bt := b.c.batch(id, now)
	if bt == nil {
		return broker.BatchInfo{}, nil, broker.ErrNoBatch
	}
	if cancel {
		bt.info.Cancelled = true
	}
	if bt.info.State == broker.BatchOpen {
		bt.info.State = broker.BatchSealed
	}
	b.c.fireBatch(bt, now)
	var waiting []broker.BatchChild
	if cancel {
		for child, recv := range bt.waiting {
			waiting = append(waiting, broker.BatchChild{ID: child, Receiver: recv})
		}
	}
	return bt.info, waiting, nil
}

// Batch returns a batch. See broker.Batches.
func (b *Broker) Batch(ctx context.Context, id string) (broker.BatchInfo, error) {
	if err := broker.CheckBatchID("batch id", id); err != nil {
		return broker.BatchInfo{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.BatchInfo{}, err
	}
	defer b.c.mu.Unlock()
	bt := b.c.batch(id, b.c.now())
	if bt == nil {
		return broker.BatchInfo{}, broker.ErrNoBatch
	}
	return bt.info, nil
}

// SettleBatchReports does nothing: the step that settles a child counts
// it in its batch (reportBatch). See broker.Batches.
func (b *Broker) SettleBatchReports(ctx context.Context, receiver string) error {
	if err := b.check(ctx); err != nil {
		return err
	}
	return broker.CheckName("receiver", receiver)
}

// withReply is the encoded completion raw, which has no content, with the
// content of the encoded reply rep and its headers under raw's own (raw's
// win on a name in both), as the Redis broker's wireWithReply makes it.
func withReply(raw, rep []byte) []byte {
	env, err1 := decode(raw)
	r, err2 := decode(rep)
	if err1 != nil || err2 != nil {
		return raw
	}
	env.Content = r.Content
	if len(r.Headers) > 0 {
		h := maps.Clone(r.Headers)
		maps.Copy(h, env.Headers)
		env.Headers = h
	}
	return encode(&env)
}
