package chaos

// Batches and chains in the harness: each producer creates batches of a
// few children on the base receivers, with a completion to recvBatchDone,
// and sends chains of a few steps to recvChain; the workers serve both.
// checkbatches.go judges what they record.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/diskerhq/disker"
)

// Kinds of history events of batches.
const (
	// KindSeal: a producer's Seal of the batch of Op (ID, the batch id)
	// returned: Result ok or error (Err). A batch with no KindSeal ok was
	// not sealed for sure (its producer was killed before or during the
	// call, or the call failed).
	KindSeal = "seal"
	// KindBatchCounts: the handler of the completion of the batch of Op
	// (ID, the batch id; Attempt, the completion's) read the batch: its
	// Counts, or Result error (Err).
	KindBatchCounts = "batch_counts"
)

// Modes of send of batches and chains.
const (
	// ModeBatchDone: the completion of a batch, whose content is the
	// batch's op; its send is NewBatch (KindSent's ID is the batch id)
	// and N the children the producer means to add. Redis queues it.
	ModeBatchDone = "batch_done"
	// ModeBatchChild: a child of a batch, op "<batch op>.<i>", sent with
	// Batch.SendEach to a base receiver.
	ModeBatchChild = "batch_child"
	// ModeChain: the first step of a chain, op "<chain op>.0", sent with
	// Send and WithThen; N is the chain's length.
	ModeChain = "chain"
	// ModeChainNext: a later step of a chain, op "<chain op>.<i>": its
	// KindSend is recorded with the first step's, and Redis queues it when
	// the step before succeeds, so it has no KindSent.
	ModeChainNext = "chain_next"
)

// The receivers of batches and chains.
const (
	recvBatchDone = "chaos.batchdone" // the batches' completions
	recvChain     = "chaos.chain"     // the chains' steps
)

// Sizes of batches and chains, and how often a step stops its chain.
const (
	minChildren, maxChildren = 2, 4
	minSteps, maxSteps       = 2, 4
	// chainStopEvery: one step in chainStopEvery fails for good
	// (NoRetry), so its chain stops there.
	chainStopEvery = 10
	// batchRetention keeps batches and their children's results: longer
	// than any run.
	batchRetention = 2 * time.Hour
)

// BatchCounts are a batch's counts as a completion's handler read them
// (disker.BatchInfo).
type BatchCounts struct {
	Children     int `json:"children"`
	Succeeded    int `json:"succeeded"`
	Failed       int `json:"failed"`
	DeadLettered int `json:"dead_lettered"`
	Cancels      int `json:"cancels"`
	Expired      int `json:"expired"`
	TimedOut     int `json:"timed_out"`
}

// settled is the sum of the final outcomes; failures those other than a
// success.
func (b *BatchCounts) settled() int { return b.Succeeded + b.failures() }
func (b *BatchCounts) failures() int {
	return b.Failed + b.DeadLettered + b.Cancels + b.Expired + b.TimedOut
}

// poisoned reports whether the plain handler fails the op of hash for
// good (NoRetry: a dead letter).
func poisoned(hash uint32) bool { return hash%100 == 7 }

// failsFirst reports whether a handler fails the first attempt of the op
// of hash (then it is retried).
func failsFirst(hash uint32, attempt int) bool { return hash%20 == 3 && attempt == 1 }

// stopsChain reports whether the handler of recvChain fails the step of
// hash for good.
func stopsChain(hash uint32) bool { return hash%chainStopEvery == 4 }

// completionHandler handles the batches' completions: it records its start,
// reads the batch (KindBatchCounts) and ends; it fails the first attempt
// of one completion in twenty, and an attempt whose read failed, so that
// the same completion is delivered again.
func completionHandler(d *disker.Disker, rec *Recorder) disker.HandlerFunc {
	return func(ctx context.Context, m *disker.Message) ([]byte, error) {
		end := recordStart(rec, m)
		op := string(m.Content)
		if failsFirst(opHash(op), m.Attempt) {
			end(ResultFailed)
			return nil, errors.New("chaos: first attempt fails")
		}
		id := m.Headers[disker.HeaderBatch]
		e := Event{Kind: KindBatchCounts, Op: op, ID: id, Attempt: m.Attempt, Result: ResultOK}
		info, err := d.Batch(ctx, id)
		if err != nil {
			e.Result, e.Err = ResultError, err.Error()
			rec.Record(e)
			end(ResultFailed)
			return nil, err
		}
		e.Counts = &BatchCounts{Children: info.Children, Succeeded: info.Succeeded, Failed: info.Failed,
			DeadLettered: info.DeadLettered, Cancels: info.Cancels, Expired: info.Expired, TimedOut: info.TimedOut}
		rec.Record(e)
		end(ResultOK)
		return nil, nil
	}
}

// chainHandler handles the chains' steps: it works up to maxWork, fails
// the first attempt of one step in twenty (a retry: the chain goes on),
// and one step in chainStopEvery for good (the chain stops).
func chainHandler(rec *Recorder) disker.HandlerFunc {
	return func(ctx context.Context, m *disker.Message) ([]byte, error) {
		_, hash, end, ok := begin(ctx, rec, m, maxWork)
		if !ok {
			return nil, ctx.Err()
		}
		switch {
		case stopsChain(hash):
			end(ResultFailed)
			return nil, disker.NoRetry(errors.New("chaos: the chain stops here"))
		case failsFirst(hash, m.Attempt):
			end(ResultFailed)
			return nil, errors.New("chaos: first attempt fails")
		}
		end(ResultOK)
		return nil, nil
	}
}

// batched creates a batch whose completion goes to recvBatchDone, adds
// 2 to 4 children on the base receivers in one SendEach, and seals it,
// recording each step.
func (p *producer) batched(rng *rand.Rand, op string) {
	n := minChildren + rng.IntN(maxChildren-minChildren+1)
	p.rec.Record(Event{Kind: KindSend, Op: op, Mode: ModeBatchDone, Receiver: recvBatchDone, N: int64(n)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := p.d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: recvBatchDone, Content: []byte(op)},
		Retention: batchRetention})
	if err != nil {
		p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: err.Error()})
		return
	}
	p.rec.Record(Event{Kind: KindSent, Op: op, ID: b.ID()})
	children := make([]disker.Outgoing, n)
	for i := range children {
		child := Event{Kind: KindSend, Op: fmt.Sprintf("%s.%d", op, i), Mode: ModeBatchChild, Receiver: Receivers[rng.IntN(len(Receivers))]}
		p.rec.Record(child)
		children[i] = disker.Outgoing{Message: disker.Message{Receiver: child.Receiver, Content: []byte(child.Op)}}
	}
	ids, err := b.SendEach(ctx, children)
	ops := make([]string, n)
	for i, c := range children {
		ops[i] = string(c.Message.Content)
	}
	p.recordSent(ops, ids, err)
	seal := Event{Kind: KindSeal, Op: op, ID: b.ID(), Result: ResultOK}
	if _, err := b.Seal(ctx); err != nil {
		seal.Result, seal.Err = ResultError, err.Error()
	}
	p.rec.Record(seal)
}

// chained sends a chain of 2 to 4 steps to recvChain: the first with
// Send, each next one WithThen of the one before.
func (p *producer) chained(rng *rand.Rand, op string) {
	n := minSteps + rng.IntN(maxSteps-minSteps+1)
	steps := make([]string, n)
	for i := range steps {
		steps[i] = fmt.Sprintf("%s.%d", op, i)
		mode := ModeChainNext
		if i == 0 {
			mode = ModeChain
		}
		p.rec.Record(Event{Kind: KindSend, Op: steps[i], Mode: mode, Receiver: recvChain, N: int64(n)})
	}
	var opts []disker.SendOption
	for i := n - 1; i >= 1; i-- {
		opts = []disker.SendOption{disker.WithThen(disker.Message{Receiver: recvChain, Content: []byte(steps[i])}, opts...)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := p.d.Send(ctx, disker.Message{Receiver: recvChain, Content: []byte(steps[0])}, opts...)
	if err != nil {
		p.rec.Record(Event{Kind: KindSendFailed, Op: steps[0], Err: err.Error()})
		return
	}
	p.rec.Record(Event{Kind: KindSent, Op: steps[0], ID: id})
}
