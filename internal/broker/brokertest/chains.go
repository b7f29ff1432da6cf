package brokertest

import (
	"maps"
	"strings"
	"testing"

	"github.com/diskerhq/disker/internal/broker"
)

// chainStep is a step of a chain under test: the batch whose completion
// it is, and its message.
type chainStep struct {
	batch string
	env   *broker.Envelope
}

// newChain creates the batches of a chain whose steps after the first
// are msgs (fire-and-forget, given no content to take the reply of the
// step before), the last first, as the disker package does; outer, when
// not empty, is a batch the last step is a child of. It returns the
// steps; the first message is sent with sendFirst.
func newChain(t *testing.T, b broker.Broker, outer string, msgs ...*broker.Envelope) []chainStep {
	t.Helper()
	ctx := ctxT(t)
	steps := make([]chainStep, len(msgs))
	inner, innerTakes := outer, false
	for i := len(msgs) - 1; i >= 0; i-- {
		env := msgs[i]
		env.Route, env.Sender, env.Retention = broker.RouteNone, "", batchRetention
		id := broker.NewBatchID(env.Receiver, name("chain"))
		takes := len(env.Content) == 0
		p := broker.CreateBatchParams{ID: id, Completion: *env, OnlyIfAllSucceed: true, Retention: batchRetention,
			CompletionBatch: inner, CompletionBatchReply: innerTakes, ReplyAsContent: takes}
		if err := b.CreateBatch(ctx, &p); err != nil {
			t.Fatalf("CreateBatch of step %d: %v", i+2, err)
		}
		if inner != "" {
			if err := b.AddBatchChildren(ctx, inner, []broker.BatchChild{{ID: env.ID, Receiver: env.Receiver}}); err != nil {
				t.Fatalf("AddBatchChildren: %v", err)
			}
			if inner != outer {
				if _, err := b.SealBatch(ctx, inner); err != nil {
					t.Fatalf("SealBatch: %v", err)
				}
			}
		}
		steps[i] = chainStep{batch: id, env: env}
		inner, innerTakes = id, takes
	}
	return steps
}

// sendFirst sends the first message of a chain to r, the child of the
// batch of steps[0], and seals that batch.
func sendFirst(t *testing.T, b broker.Broker, r string, steps []chainStep) *broker.Envelope {
	t.Helper()
	env := newEnv(r, "first")
	env.Route, env.Sender = broker.RouteNone, ""
	id := steps[0].batch
	if err := b.AddBatchChildren(ctxT(t), id, []broker.BatchChild{{ID: env.ID, Receiver: r}}); err != nil {
		t.Fatalf("AddBatchChildren: %v", err)
	}
	sendP(t, b, broker.SendParams{Env: *env, Retention: batchRetention, Batch: id, BatchReply: len(steps[0].env.Content) == 0})
	if _, err := b.SealBatch(ctxT(t), id); err != nil {
		t.Fatalf("SealBatch: %v", err)
	}
	return env
}

// runStep fetches receiver r's one message, checks it is want (content and
// headers as given), and settles it done with reply (nil: none), or with
// an error when failed; then hands r's outbox over.
func runStep(t *testing.T, b broker.Broker, r string, want *broker.Envelope, reply *broker.Envelope, failed bool) {
	t.Helper()
	var ds []broker.Delivery
	eventually(t, "a step of "+r, func() bool {
		ds = fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: 1, Block: pollBlock, Lease: longLease, MaxAttempts: 10})
		return len(ds) > 0
	})
	if want != nil {
		checkEnv(t, "the step", ds[0].Env, want)
	}
	p := broker.FinishResultParams{Receiver: r, ID: ds[0].Env.ID, Ref: ds[0].Ref, State: broker.ResultDone, Worker: "w", Attempt: 1,
		Retention: batchRetention, Reply: reply}
	if failed {
		p.ErrorCode, p.ErrorText = "handler", "it failed"
	}
	finish(t, b, p)
	if err := b.SettleBatchReports(ctxT(t), r); err != nil {
		t.Fatalf("SettleBatchReports: %v", err)
	}
}

// testBatchChains follows chains made of batches of one child, as WithThen
// makes them: a step given no content gets the reply of the step before
// (its content, and its headers under the step's own), in the step that
// counts the step before; a step given content keeps it; a step that
// fails stops the chain, and the steps after it are settled cancelled,
// never queued, so that every batch of the chain completes; and a chain
// whose last step is the child of another batch counts there once, as
// succeeded or, when it stopped, as cancelled.
func testBatchChains(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r1, r2, r3, r4 := name("c1"), name("c2"), name("c3"), name("c4")
	two := &broker.Envelope{ID: name("msg"), Receiver: r2, Headers: map[string]string{"a": "own", "z": "own", "y": strings.Repeat("w", 150)}}
	three := &broker.Envelope{ID: name("msg"), Receiver: r3}
	four := &broker.Envelope{ID: name("msg"), Receiver: r4, Content: []byte("given"), Headers: map[string]string{"k": "v"}}
	steps := newChain(t, b, "", two, three, four)
	sendFirst(t, b, r1, steps)
	// Lengths over 127 take varints of two bytes.
	reply := &broker.Envelope{ID: name("msg"), Receiver: "x", Content: []byte("reply of 1 " + strings.Repeat("x", 300)),
		Headers: map[string]string{"a": "theirs", "b": "theirs", "ünï": "theirs", "": "empty name", "long": strings.Repeat("v", 200)}}
	runStep(t, b, r1, nil, reply, false)
	// Step 2 takes the reply: its content, the headers merged, its own
	// winning.
	got2 := *two
	got2.Content = reply.Content
	got2.Headers = maps.Clone(reply.Headers)
	maps.Copy(got2.Headers, two.Headers)
	runStep(t, b, r2, &got2, nil, false)
	// Step 3 takes an acknowledgement without a reply: no content.
	runStep(t, b, r3, three, &broker.Envelope{ID: name("msg"), Receiver: "x", Content: []byte("reply of 3")}, false)
	// Step 4 has content of its own: it keeps it, and not the reply.
	runStep(t, b, r4, four, nil, false)
	for i, s := range steps {
		info, err := b.Batch(ctx, s.batch)
		if err != nil || info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion || info.Counts.Succeeded != 1 {
			t.Fatalf("the batch of step %d: %+v, %v", i+2, info, err)
		}
	}

	// A chain whose second step fails: steps 3 and 4 are never queued,
	// their results say cancelled, and every batch completes.
	two, three, four = &broker.Envelope{ID: name("msg"), Receiver: r2}, &broker.Envelope{ID: name("msg"), Receiver: r3},
		&broker.Envelope{ID: name("msg"), Receiver: r4}
	steps = newChain(t, b, "", two, three, four)
	sendFirst(t, b, r1, steps)
	runStep(t, b, r1, nil, &broker.Envelope{ID: name("msg"), Receiver: "x", Content: []byte("ok")}, false)
	runStep(t, b, r2, nil, nil, true)
	for _, env := range []*broker.Envelope{three, four} {
		rec := result(t, b, env.Receiver, env.ID)
		if rec.State != broker.ResultCancelled || rec.ErrorCode != broker.CodeCancelled || rec.ErrorText != broker.NotSentText {
			t.Fatalf("the result of a step after the failed one: %+v", rec)
		}
		if st := stats(t, b, env.Receiver); st.Length != 0 {
			t.Fatalf("a step after the failed one was queued: %+v", st)
		}
	}
	for i, s := range steps {
		info, err := b.Batch(ctx, s.batch)
		want, fired := []broker.BatchCounts{{Children: 1, Succeeded: 1}, {Children: 1, Failed: 1}, {Children: 1, Cancelled: 1}}[i], broker.FiredNone
		if i == 0 {
			fired = broker.FiredCompletion
		}
		if err != nil || info.State != broker.BatchCompleted || info.Fired != fired || info.Counts != want {
			t.Fatalf("the batch of step %d of the stopped chain: %+v, %v", i+2, info, err)
		}
	}

	// Two chains as children of an outer batch, by their last steps: one
	// succeeds, one stops at its first step; the outer batch counts one
	// succeeded, one cancelled, and completes once.
	outer := newBatch(t, b, false, false)
	okTwo, okThree := &broker.Envelope{ID: name("msg"), Receiver: r2}, &broker.Envelope{ID: name("msg"), Receiver: r3}
	okSteps := newChain(t, b, outer.id, okTwo, okThree)
	badTwo, badThree := &broker.Envelope{ID: name("msg"), Receiver: r2}, &broker.Envelope{ID: name("msg"), Receiver: r3}
	badSteps := newChain(t, b, outer.id, badTwo, badThree)
	outer.seal()
	sendFirst(t, b, r1, okSteps)
	sendFirst(t, b, r1, badSteps)
	runStep(t, b, r1, nil, nil, false)
	runStep(t, b, r1, nil, nil, true)
	outer.fired(nil)
	runStep(t, b, r2, okTwo, nil, false)
	outer.fired(nil)
	runStep(t, b, r3, okThree, nil, false)
	if info := outer.info(); info.Fired != broker.FiredCompletion || info.Counts != (broker.BatchCounts{Children: 2, Succeeded: 1, Cancelled: 1}) {
		t.Fatalf("the batch of two chains: %+v", info)
	}
	outer.fired(outer.comp)

	// A batch whose completion is the child of another (nested batches):
	// it fires its failure message, so its completion is never sent and
	// counts as cancelled there.
	top := newBatch(t, b, false, false)
	innerComp := &broker.Envelope{ID: name("msg"), Receiver: r4, Content: []byte("inner done"), Retention: batchRetention}
	innerFail := &broker.Envelope{ID: name("msg"), Receiver: r4, Content: []byte("inner failed")}
	innerID := broker.NewBatchID(r4, name("inner"))
	if err := b.AddBatchChildren(ctx, top.id, []broker.BatchChild{{ID: innerComp.ID, Receiver: r4}}); err != nil {
		t.Fatal(err)
	}
	top.seal()
	if err := b.CreateBatch(ctx, &broker.CreateBatchParams{ID: innerID, Completion: *innerComp, Failure: innerFail, OnlyIfAllSucceed: true,
		CompletionBatch: top.id, Retention: batchRetention}); err != nil {
		t.Fatal(err)
	}
	inner := &batchT{t: t, b: b, id: innerID, recv: r4, recvs: map[string]bool{}}
	inner.add(r1, nil)
	inner.seal()
	runStep(t, b, r1, nil, nil, true)
	inner.fired(innerFail)
	if info := top.info(); info.Fired != broker.FiredCompletion || info.Counts != (broker.BatchCounts{Children: 1, Cancelled: 1}) {
		t.Fatalf("the batch over a failed batch: %+v", info)
	}
	top.fired(top.comp)
	if rec := result(t, b, r4, innerComp.ID); rec.State != broker.ResultCancelled {
		t.Fatalf("the result of a completion never sent: %+v", rec)
	}
}
