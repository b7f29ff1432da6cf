package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// batchT is a batch under test: its id, its completion receiver, and the
// receivers of its children, whose outboxes are handed over after each
// settlement (Batches.SettleBatchReports).
type batchT struct {
	t     *testing.T
	b     broker.Broker
	id    string
	recv  string
	comp  *broker.Envelope
	fail  *broker.Envelope
	recvs map[string]bool
}

const batchRetention = time.Hour

// newBatch creates a batch whose completion goes to a receiver of its own.
func newBatch(t *testing.T, b broker.Broker, onlyIfAll, failure bool) *batchT {
	t.Helper()
	recv := name("done")
	bt := &batchT{t: t, b: b, id: broker.NewBatchID(recv, name("batch")), recv: recv, recvs: map[string]bool{}}
	bt.comp = newEnv(recv, "completion")
	bt.comp.Route, bt.comp.Sender = broker.RouteNone, ""
	p := broker.CreateBatchParams{ID: bt.id, Completion: *bt.comp, OnlyIfAllSucceed: onlyIfAll, Retention: batchRetention}
	if failure {
		bt.fail = newEnv(recv, "failure")
		bt.fail.Route, bt.fail.Sender = broker.RouteNone, ""
		p.Failure = bt.fail
	}
	if err := b.CreateBatch(ctxT(t), &p); err != nil {
		t.Fatalf("CreateBatch: %v", err)
	}
	return bt
}

// add registers and sends a child to receiver r, with mod applied to its
// send.
func (bt *batchT) add(r string, mod func(*broker.SendParams)) *broker.Envelope {
	bt.t.Helper()
	env := newEnv(r, "child")
	env.Route, env.Sender = broker.RouteNone, ""
	if err := bt.b.AddBatchChildren(ctxT(bt.t), bt.id, []broker.BatchChild{{ID: env.ID, Receiver: r}}); err != nil {
		bt.t.Fatalf("AddBatchChildren: %v", err)
	}
	p := broker.SendParams{Env: *env, Retention: batchRetention, Batch: bt.id}
	if mod != nil {
		mod(&p)
	}
	sendP(bt.t, bt.b, p)
	bt.recvs[r] = true
	return env
}

// info hands the outboxes over and reads the batch.
func (bt *batchT) info() broker.BatchInfo {
	bt.t.Helper()
	for r := range bt.recvs {
		if err := bt.b.SettleBatchReports(ctxT(bt.t), r); err != nil {
			bt.t.Fatalf("SettleBatchReports: %v", err)
		}
	}
	info, err := bt.b.Batch(ctxT(bt.t), bt.id)
	if err != nil {
		bt.t.Fatalf("Batch: %v", err)
	}
	return info
}

// seal seals the batch.
func (bt *batchT) seal() {
	bt.t.Helper()
	if _, err := bt.b.SealBatch(ctxT(bt.t), bt.id); err != nil {
		bt.t.Fatalf("SealBatch: %v", err)
	}
}

// fired checks that the completion receiver holds exactly want (nil:
// nothing), and takes it.
func (bt *batchT) fired(want *broker.Envelope) {
	bt.t.Helper()
	ds := fetch(bt.t, bt.b, broker.FetchParams{Receiver: bt.recv, Consumer: "c", Max: 10, Lease: longLease, MaxAttempts: 10})
	switch {
	case want == nil && len(ds) != 0:
		bt.t.Fatalf("the batch queued %d messages (%s), want none yet", len(ds), ds[0].Env.Content)
	case want != nil && (len(ds) != 1 || ds[0].Env.ID != want.ID):
		bt.t.Fatalf("the batch queued %d messages, want exactly %s", len(ds), want.Content)
	}
	for _, d := range ds {
		ack(bt.t, bt.b, bt.recv, d.Ref)
	}
}

// settle fetches the next message of r and settles it: done (with an
// error when failed), or dead-lettered (then purged).
func settle(t *testing.T, b broker.Broker, r string, st broker.ResultState, failed bool) broker.Delivery {
	t.Helper()
	var ds []broker.Delivery
	for i := 0; i < 5 && len(ds) == 0; i++ { // a wake entry of a deferred child may come first
		ds = fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 1, Lease: longLease, MaxAttempts: 10})
	}
	if len(ds) != 1 {
		t.Fatalf("Fetch %s: %d deliveries, want 1", r, len(ds))
	}
	d := ds[0]
	switch st {
	case broker.ResultDeadLettered:
		deadLetter(t, b, r, d, "it failed")
		if _, err := b.PurgeDeadLetters(ctxT(t), r); err != nil {
			t.Fatal(err)
		}
	default:
		p := broker.FinishResultParams{Receiver: r, ID: d.Env.ID, Ref: d.Ref, State: st, Worker: "w", Attempt: 1, Retention: batchRetention}
		if failed {
			p.ErrorCode, p.ErrorText = "handler", "it failed"
		}
		finish(t, b, p)
	}
	return d
}

// testBatches follows a batch of children on two receivers: each way a
// child settles is counted once, a repeated outcome is not counted again,
// nothing is queued before the seal nor before the last child settled,
// and the completion is queued exactly once.
func testBatches(t *testing.T, b broker.Broker) {
	bt := newBatch(t, b, false, false)
	r1, r2 := name("r1"), name("r2")
	bt.add(r1, nil)
	bt.add(r2, nil)
	settle(t, b, r1, broker.ResultDone, false)
	settle(t, b, r2, broker.ResultDone, true)
	bt.add(r1, nil)
	d := settle(t, b, r1, broker.ResultDeadLettered, false)
	if info := bt.info(); info.State != broker.BatchOpen || info.Counts != (broker.BatchCounts{Children: 3, Succeeded: 1, Failed: 1, DeadLettered: 1}) {
		t.Fatalf("open batch: %+v", info)
	}
	bt.fired(nil)
	last := bt.add(r2, nil)
	bt.seal()
	if info := bt.info(); info.State != broker.BatchSealed || info.Counts.Settled() != 3 {
		t.Fatalf("sealed batch with a child left: %+v", info)
	}
	bt.fired(nil)
	settle(t, b, r2, broker.ResultDone, false)
	info := bt.info()
	if info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion || info.Completed.IsZero() ||
		info.Counts != (broker.BatchCounts{Children: 4, Succeeded: 2, Failed: 1, DeadLettered: 1}) || info.CompletionID != bt.comp.ID {
		t.Fatalf("completed batch: %+v", info)
	}
	bt.fired(bt.comp)
	// A second outcome of a settled child (a redelivery's) counts nothing
	// and queues nothing.
	finish(t, b, broker.FinishResultParams{Receiver: r2, ID: last.ID, State: broker.ResultDone, Worker: "w2", Retention: batchRetention})
	finish(t, b, broker.FinishResultParams{Receiver: r1, ID: d.Env.ID, State: broker.ResultDone, Worker: "w2", Retention: batchRetention})
	if again := bt.info(); again.Counts != info.Counts {
		t.Fatalf("after repeated outcomes: %+v, want %+v", again.Counts, info.Counts)
	}
	bt.fired(nil)
	if _, err := b.SealBatch(ctxT(t), bt.id); err != nil {
		t.Fatalf("sealing a completed batch again: %v", err)
	}
	bt.fired(nil)
}

// testBatchEdges covers the cases where a completion is easy to lose or
// double: a batch of one child, an empty sealed batch, a child cancelled,
// one that timed out or expired, the all-succeed mode with and without a
// failure message, a cancelled batch; and the errors: adding to a sealed
// or unknown batch, and a child sent without a retention.
func testBatchEdges(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("r")

	one := newBatch(t, b, false, false)
	one.add(r, nil)
	one.seal()
	one.fired(nil)
	settle(t, b, r, broker.ResultDone, false)
	if info := one.info(); info.Fired != broker.FiredCompletion || info.Counts.Succeeded != 1 {
		t.Fatalf("one-child batch: %+v", info)
	}
	one.fired(one.comp)

	empty := newBatch(t, b, true, false)
	empty.seal()
	if info := empty.info(); info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion || info.Counts.Children != 0 {
		t.Fatalf("empty sealed batch: %+v", info)
	}
	empty.fired(empty.comp)

	// A cancelled child, one timed out and one expired: settled, so the
	// completion fires; in all-succeed mode, the failure message instead.
	mixed := newBatch(t, b, true, true)
	later := mixed.add(r, func(p *broker.SendParams) { p.Delay = time.Hour })
	mixed.add(r, nil)
	mixed.add(r, nil)
	mixed.seal()
	if c := cancel(t, b, r, later.ID); c.State != broker.CancelDeferred {
		t.Fatalf("Cancel: %+v", c)
	}
	settle(t, b, r, broker.ResultTimedOut, false)
	mixed.fired(nil)
	settle(t, b, r, broker.ResultExpired, false)
	info := mixed.info()
	if info.Fired != broker.FiredFailure || info.Counts != (broker.BatchCounts{Children: 3, Cancelled: 1, TimedOut: 1, Expired: 1}) || info.FailureID != mixed.fail.ID {
		t.Fatalf("all-succeed batch with failures: %+v", info)
	}
	mixed.fired(mixed.fail)

	silent := newBatch(t, b, true, false)
	silent.add(r, nil)
	silent.seal()
	settle(t, b, r, broker.ResultDeadLettered, false)
	if info := silent.info(); info.State != broker.BatchCompleted || info.Fired != broker.FiredNone {
		t.Fatalf("all-succeed batch without a failure message: %+v", info)
	}
	silent.fired(nil)

	// A cancelled batch: sealed, its waiting children returned; it
	// completes when they settle.
	cb := newBatch(t, b, false, false)
	w1 := cb.add(r, func(p *broker.SendParams) { p.Delay = time.Hour })
	waiting, err := b.CancelBatch(ctx, cb.id)
	if err != nil || len(waiting) != 1 || waiting[0] != (broker.BatchChild{ID: w1.ID, Receiver: r}) {
		t.Fatalf("CancelBatch: %v, %v", waiting, err)
	}
	if info := cb.info(); !info.Cancelled || info.State != broker.BatchSealed {
		t.Fatalf("cancelled batch: %+v", info)
	}
	cancel(t, b, r, w1.ID)
	if info := cb.info(); info.Fired != broker.FiredCompletion || info.Counts.Cancelled != 1 {
		t.Fatalf("cancelled batch after its child: %+v", info)
	}
	cb.fired(cb.comp)

	// Errors: nothing is registered.
	child := []broker.BatchChild{{ID: name("c"), Receiver: r}}
	if err := b.AddBatchChildren(ctx, one.id, child); !errors.Is(err, broker.ErrBatchSealed) {
		t.Fatalf("adding to a sealed batch: %v, want ErrBatchSealed", err)
	}
	if err := b.AddBatchChildren(ctx, broker.NewBatchID(r, "nope"), child); !errors.Is(err, broker.ErrNoBatch) {
		t.Fatalf("adding to an unknown batch: %v, want ErrNoBatch", err)
	}
	if _, err := b.Batch(ctx, broker.NewBatchID(r, "nope")); !errors.Is(err, broker.ErrNoBatch) {
		t.Fatalf("Batch of an unknown id: %v, want ErrNoBatch", err)
	}
	if info := one.info(); info.Counts.Children != 1 {
		t.Fatalf("the sealed batch after a refused add: %+v", info)
	}
	open := newBatch(t, b, false, false)
	if err := b.CreateBatch(ctx, &broker.CreateBatchParams{ID: open.id, Completion: *open.comp, Retention: time.Hour}); !errors.Is(err, broker.ErrBatchExists) {
		t.Fatalf("CreateBatch of an id in use: %v, want ErrBatchExists", err)
	}
	for _, p := range []broker.SendParams{
		{Env: *newEnv(r, "x"), Batch: open.id},
		{Env: *newEnv(r, "x"), Batch: "no-slash", Retention: time.Hour},
		{Env: *newEnv(r, "x"), Batch: open.id, Retention: time.Hour, DebounceKey: "k", DebounceWait: time.Second, DebounceMax: time.Second},
	} {
		if _, err := broker.SendOne(ctx, b, p); err == nil {
			t.Fatalf("Send with %+v: no error", p)
		}
	}
	if st := stats(t, b, r); st.Length != 0 {
		t.Fatalf("refused sends queued something: %+v", st)
	}
	for _, p := range []broker.CreateBatchParams{
		{ID: "x", Completion: *open.comp, Retention: time.Hour},
		{ID: broker.NewBatchID(name("other"), "u"), Completion: *open.comp, Retention: time.Hour},
		{ID: broker.NewBatchID(open.recv, "u"), Completion: *open.comp},
		{ID: broker.NewBatchID(open.recv, "u"), Completion: *open.comp, Failure: open.comp, Retention: time.Hour},
	} {
		if err := b.CreateBatch(ctx, &p); err == nil {
			t.Fatalf("CreateBatch %+v: no error", p)
		}
	}
}
