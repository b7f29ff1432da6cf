package brokertest

import (
	"testing"

	"github.com/diskerhq/disker/internal/broker"
)

// testBatchGroups follows a batch whose children are keyed messages of
// one key (GroupKey, one out at a time): each way a keyed child settles
// makes its record final and lets the key's next message go, and the
// child counts once for the batch: handled (succeeded, failed), expired,
// timed out, dead-lettered (DeadLetter, and by Fetch after its leases
// lapsed), cancelled while waiting behind its key, cancelled in flight
// and cancelled queued. The completion is queued exactly once, and the
// key is left with nothing.
func testBatchGroups(t *testing.T, b broker.Broker) {
	r := name("r")
	bt := newBatch(t, b, false, false)
	kids := make([]*broker.Envelope, 9)
	for i := range kids {
		kids[i] = bt.add(r, func(p *broker.SendParams) { p.GroupKey = "k" })
	}
	bt.seal()
	// take fetches what r has, which must be kids[i] alone: the key lets
	// one message out at a time.
	take := func(i int) broker.Delivery {
		t.Helper()
		ds := fetchAll(t, b, r, "w", longLease)
		if len(ds) != 1 || ds[0].Env.ID != kids[i].ID {
			t.Fatalf("r has %d deliveries (%q), want child %d alone", len(ds), contents(ds), i)
		}
		return ds[0]
	}
	// final checks kids[i]'s record says st.
	final := func(i int, st broker.ResultState) {
		t.Helper()
		if rec := result(t, b, r, kids[i].ID); rec.State != st {
			t.Fatalf("child %d: %+v, want %v", i, rec, st)
		}
	}
	done := func(i int, st broker.ResultState, failed bool) {
		t.Helper()
		d := take(i)
		p := broker.FinishResultParams{Receiver: r, ID: d.Env.ID, Ref: d.Ref, State: st, Worker: "w", Attempt: 1, Retention: batchRetention}
		if failed {
			p.ErrorCode, p.ErrorText = "handler", "it failed"
		}
		finish(t, b, p)
		final(i, st)
	}
	done(0, broker.ResultDone, false)
	done(1, broker.ResultDone, true)
	done(2, broker.ResultExpired, false)
	done(3, broker.ResultTimedOut, false)
	deadLetter(t, b, r, take(4), "it failed")
	final(4, broker.ResultDeadLettered)
	if _, err := b.PurgeDeadLetters(ctxT(t), r); err != nil {
		t.Fatal(err)
	}
	flying := take(5)
	// kids[6] waits behind kids[5]: cancelled there, it leaves the key's
	// queue.
	if st := stats(t, b, r); st.GroupWaiting != 3 {
		t.Fatalf("Stats with child 5 out: %d keyed messages waiting, want 3", st.GroupWaiting)
	}
	if c := cancel(t, b, r, kids[6].ID); c.State != broker.CancelQueued {
		t.Fatalf("Cancel of a child waiting behind its key: %+v", c)
	}
	final(6, broker.ResultCancelled)
	if c := cancel(t, b, r, flying.Env.ID); c.State != broker.CancelInFlight {
		t.Fatalf("Cancel of a child in flight: %+v", c)
	}
	final(5, broker.ResultCancelled)
	// The cancellation let kids[7] go: queued, not delivered.
	if st := stats(t, b, r); st.GroupWaiting != 1 || st.Length != 1 {
		t.Fatalf("Stats after the cancellations: %+v, want child 7 queued and child 8 waiting", st)
	}
	if c := cancel(t, b, r, kids[7].ID); c.State != broker.CancelQueued {
		t.Fatalf("Cancel of a queued child: %+v", c)
	}
	final(7, broker.ResultCancelled)
	if info := bt.info(); info.State != broker.BatchSealed ||
		info.Counts != (broker.BatchCounts{Children: 9, Succeeded: 1, Failed: 1, Expired: 1, TimedOut: 1, DeadLettered: 1, Cancelled: 3}) {
		t.Fatalf("the batch with one child left: %+v", info)
	}
	bt.fired(nil)
	// The last one, dead-lettered by Fetch after its leases lapsed.
	loseLeases(t, b, r, 1, 0)
	final(8, broker.ResultDeadLettered)
	info := bt.info()
	if info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion ||
		info.Counts != (broker.BatchCounts{Children: 9, Succeeded: 1, Failed: 1, Expired: 1, TimedOut: 1, DeadLettered: 2, Cancelled: 3}) {
		t.Fatalf("the completed batch: %+v", info)
	}
	bt.fired(bt.comp)
	if st := stats(t, b, r); st.GroupWaiting != 0 || st.GroupKeys != 0 || st.Length != 0 {
		t.Fatalf("Stats at the end: %+v, want nothing left", st)
	}
	bt.fired(nil)
}

// testBatchGroupChain follows a chain whose first step is a keyed
// message: its success, with its reply, queues the next step (which takes
// the reply), and a second keyed message of its key goes when it
// settles.
func testBatchGroupChain(t *testing.T, b broker.Broker) {
	r1, r2 := name("c1"), name("c2")
	two := &broker.Envelope{ID: name("msg"), Receiver: r2}
	steps := newChain(t, b, "", two)
	env := newEnv(r1, "first")
	env.Route, env.Sender = broker.RouteNone, ""
	if err := b.AddBatchChildren(ctxT(t), steps[0].batch, []broker.BatchChild{{ID: env.ID, Receiver: r1}}); err != nil {
		t.Fatalf("AddBatchChildren: %v", err)
	}
	sendP(t, b, broker.SendParams{Env: *env, Retention: batchRetention, Batch: steps[0].batch, BatchReply: true, GroupKey: "k"})
	if _, err := b.SealBatch(ctxT(t), steps[0].batch); err != nil {
		t.Fatalf("SealBatch: %v", err)
	}
	behind := newEnv(r1, "behind")
	sendP(t, b, broker.SendParams{Env: *behind, GroupKey: "k"})
	reply := &broker.Envelope{ID: name("msg"), Receiver: "x", Content: []byte("reply of 1")}
	runStep(t, b, r1, nil, reply, false)
	ds := fetchAll(t, b, r1, "w", longLease)
	checkContents(t, "the key after the chain's step", ds, "behind")
	ack(t, b, r1, ds[0].Ref)
	got := *two
	got.Content = reply.Content
	runStep(t, b, r2, &got, nil, false)
	for i, s := range steps {
		info, err := b.Batch(ctxT(t), s.batch)
		if err != nil || info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion || info.Counts.Succeeded != 1 {
			t.Fatalf("the batch of step %d: %+v, %v", i+2, info, err)
		}
	}
}
