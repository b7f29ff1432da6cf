package membroker

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// resultSet is a receiver's retained records (broker.Results).
type resultSet struct {
	recs map[string]*memResult
	// bytes counts the sizes of the final records.
	bytes int64
	// swept is how many records there were after the last sweep of the
	// expired ones: a sweep runs when there are twice as many.
	swept int
}

// sweep drops the expired records once their number doubled since the
// last sweep.
func (rs *resultSet) sweep(now time.Time) {
	if len(rs.recs) < 2*rs.swept+16 {
		return
	}
	for id, r := range rs.recs {
		if !now.Before(r.expires) {
			rs.forget(id, r)
		}
	}
	rs.swept = len(rs.recs)
}

// memResult is one record: the record as Result returns it (without Now),
// the reply encoded, when it goes, and its size once final.
type memResult struct {
	rec     broker.ResultRecord
	reply   []byte
	expires time.Time
	size    int64
	indexed bool // final: counted in bytes
	// batch is the batch of a child (SendParams.Batch), "" if none;
	// batchReply sends its reply there (SendParams.BatchReply).
	batch      string
	batchReply bool
}

// results returns receiver's records, made on first use. Callers hold mu.
func (c *core) results(receiver string) *resultSet {
	rs := c.resultSets[receiver]
	if rs == nil {
		rs = &resultSet{recs: make(map[string]*memResult)}
		c.resultSets[receiver] = rs
	}
	return rs
}

// result returns the live record of id, dropping it if it expired.
// Callers hold mu.
func (c *core) result(receiver, id string, now time.Time) *memResult {
	rs := c.resultSets[receiver]
	if rs == nil {
		return nil
	}
	r := rs.recs[id]
	if r != nil && !now.Before(r.expires) {
		rs.forget(id, r)
		return nil
	}
	return r
}

func (rs *resultSet) forget(id string, r *memResult) {
	if r.indexed {
		rs.bytes -= r.size
	}
	delete(rs.recs, id)
}

// recordSent writes the record of a message sent with a retention, due
// at due. Callers hold mu.
func (c *core) recordSent(p *broker.SendParams, deadline, due, now time.Time) {
	if p.Retention <= 0 {
		return
	}
	rs := c.results(p.Env.Receiver)
	rs.sweep(now)
	rs.recs[p.Env.ID] = &memResult{
		rec: broker.ResultRecord{ID: p.Env.ID, Receiver: p.Env.Receiver, State: broker.ResultQueued, Sent: now,
			Deadline: deadline, Route: p.Env.Route, Retention: p.Retention},
		expires:    due.Add(broker.PendingRetention + p.Retention),
		batch:      p.Batch,
		batchReply: p.BatchReply,
	}
}

// finalResult writes the final state st of receiver's record id, as the
// Redis broker's resFinal does: st unless the record is final already
// (ResultState 0: leave it; ResultTimedOut with a reply recorded or given
// is ResultDone), reply, code and text unless set, then the
// record expires its retention from now and counts against the cap. A
// batch child's first final state is counted in its batch in the same
// step (reportBatch), with its reply when it goes there (batchReply; over
// the cap, the child fails with CodeReplyTooLarge instead).
// ret creates a missing record (0: nothing is written). Callers hold mu.
func (c *core) finalResult(receiver, id string, st broker.ResultState, ret time.Duration, reply []byte, code, text string, set func(*broker.ResultRecord)) {
	now := c.now()
	r := c.result(receiver, id, now)
	if r == nil && ret <= 0 {
		return // no record, and none to make
	}
	rs := c.results(receiver)
	rs.sweep(now)
	if r == nil {
		r = &memResult{rec: broker.ResultRecord{ID: id, Receiver: receiver, State: broker.ResultRunning, Retention: ret}}
		rs.recs[id] = r
	}
	if ret <= 0 {
		ret = r.rec.Retention
	}
	if st == broker.ResultTimedOut && (r.reply != nil || len(reply) > 0) {
		st = broker.ResultDone // its sender received the reply
	}
	settles := st != 0 && !r.rec.State.Final()
	if settles {
		r.rec.State = st
	}
	if r.reply == nil && len(reply) > 0 {
		r.reply = reply
	}
	if r.rec.ErrorCode == "" && r.rec.ErrorText == "" {
		r.rec.ErrorCode, r.rec.ErrorText = code, text
	}
	if set != nil {
		set(&r.rec)
	}
	if settles && r.batch != "" {
		failed := r.rec.ErrorCode != "" || r.rec.ErrorText != ""
		var passed []byte
		if st == broker.ResultDone && !failed && r.batchReply {
			if int64(len(r.reply)) > c.maxResults {
				r.rec.ErrorCode, r.rec.ErrorText, failed = broker.CodeReplyTooLarge, broker.ReplyTooLargeText, true
				r.reply = nil
			} else {
				passed = r.reply
			}
		}
		c.reportBatch(r.batch, id, st, failed, passed)
	}
	if r.rec.Finished.IsZero() {
		r.rec.Finished = now
	}
	r.expires = now.Add(ret)
	if r.indexed {
		rs.bytes -= r.size
	}
	r.size = int64(64 + len(id) + len(r.reply) + len(r.rec.Progress) + len(r.rec.ErrorText) + len(r.rec.Worker))
	r.indexed = true
	rs.bytes += r.size
	for rs.bytes > c.maxResults {
		var oldest string
		var at time.Time
		for k, o := range rs.recs {
			if o.indexed && (oldest == "" || o.expires.Before(at)) {
				oldest, at = k, o.expires
			}
		}
		if oldest == "" {
			break
		}
		rs.forget(oldest, rs.recs[oldest])
	}
}

// StartResult records the start of an attempt. See broker.Results.
func (b *Broker) StartResult(ctx context.Context, p *broker.StartResultParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	r := b.c.result(p.Receiver, p.ID, now)
	if r == nil {
		if p.Retention <= 0 {
			return nil
		}
		r = &memResult{rec: broker.ResultRecord{ID: p.ID, Receiver: p.Receiver, Deadline: p.Deadline, Route: p.Route, Retention: p.Retention}}
		b.c.results(p.Receiver).recs[p.ID] = r
	}
	if r.rec.State.Final() || r.reply != nil {
		return nil
	}
	r.rec.State, r.rec.Worker, r.rec.Attempts = broker.ResultRunning, p.Worker, p.Attempt
	if r.rec.Started.IsZero() {
		r.rec.Started = now
	}
	r.expires = now.Add(broker.PendingRetention + r.rec.Retention)
	return nil
}

// FinishResult acknowledges (or drops) p.Ref and records the final outcome
// in one step under the mutex. See broker.Results.
func (b *Broker) FinishResult(ctx context.Context, p *broker.FinishResultParams) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var reply []byte
	if p.Reply != nil {
		reply = encode(p.Reply)
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	c := b.c
	if s := c.queues[p.Receiver]; s != nil && p.Ref != "" {
		if c.removeSettled(p.Receiver, s, p.Ref, c.now()) != nil && p.State == broker.ResultExpired {
			c.expired[p.Receiver]++
		}
		c.tidy(p.Receiver)
	}
	c.finalResult(p.Receiver, p.ID, p.State, p.Retention, reply, p.ErrorCode, p.ErrorText, func(r *broker.ResultRecord) {
		r.Worker = p.Worker
		if p.Attempt > 0 {
			r.Attempts = p.Attempt
		}
	})
	return nil
}

// SetProgress records data as the latest progress of a record that is not
// final. See broker.Results.
func (b *Broker) SetProgress(ctx context.Context, receiver, id string, data []byte) error {
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckName("id", id), broker.CheckProgress(data)); err != nil {
		return err
	}
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	r := b.c.result(receiver, id, now)
	switch {
	case r == nil:
		return broker.ErrNoResult
	case r.rec.State.Final() || r.reply != nil:
		return broker.ErrResultFinal
	}
	r.rec.Progress = slices.Clone(data)
	r.expires = now.Add(broker.PendingRetention + r.rec.Retention)
	return nil
}

// Result returns the record of message id of receiver. See
// broker.Results.
func (b *Broker) Result(ctx context.Context, receiver, id string) (broker.ResultRecord, error) {
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckName("id", id)); err != nil {
		return broker.ResultRecord{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.ResultRecord{}, err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	r := b.c.result(receiver, id, now)
	if r == nil {
		return broker.ResultRecord{}, broker.ErrNoResult
	}
	return r.out(now)
}

// out returns a copy of the record as read at now.
func (r *memResult) out(now time.Time) (broker.ResultRecord, error) {
	rec := r.rec
	rec.Progress = slices.Clone(rec.Progress)
	rec.Now, rec.Expires, rec.Batch = now, r.expires, r.batch
	if r.reply != nil {
		env, err := decode(r.reply)
		if err != nil {
			return broker.ResultRecord{}, err
		}
		rec.Reply = &env
	}
	return rec, nil
}

// ListResults returns up to max of receiver's final records, the latest
// ending first. See broker.Results.
func (b *Broker) ListResults(ctx context.Context, receiver string, max int) ([]broker.ResultRecord, error) {
	if err := errors.Join(broker.CheckName("receiver", receiver), broker.CheckPositive("max", max)); err != nil {
		return nil, err
	}
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	rs := b.c.resultSets[receiver]
	if rs == nil {
		return nil, nil
	}
	now := b.c.now()
	var live []*memResult
	for id, r := range rs.recs {
		if !now.Before(r.expires) {
			rs.forget(id, r)
			continue
		}
		if r.indexed {
			live = append(live, r)
		}
	}
	slices.SortFunc(live, func(x, y *memResult) int { return y.expires.Compare(x.expires) })
	out := make([]broker.ResultRecord, 0, min(max, len(live)))
	for _, r := range live[:min(max, len(live))] {
		rec, err := r.out(now)
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, nil
}
