package disker

import (
	"context"
	"reflect"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// MaxChainLength is the most messages a chain holds, its first included.
const MaxChainLength = 100

// thenStep is a WithThen: the next message and its options.
type thenStep struct {
	next Message
	opts []SendOption
}

// WithThen makes a chain: when the message succeeds (its handler returns
// no error), next is queued, exactly once, by the step that counts the
// message's success; when it fails (dead-lettered, failed, cancelled,
// expired, timed out) next is never queued, and the failure is in the
// message's retained result (Result). next goes with its own opts, which
// may hold only WithRetention and a WithThen of its own: a chain of any
// length up to MaxChainLength, decided one step after the other. next is
// fire-and-forget (no Sender); its content is as given (the reply of the
// step before is in that step's retained result). WithThen goes with Send
// only.
//
// A chain is made of batches of one child (see NewBatch): each step is
// the only child of a batch whose completion, sent only if it succeeded,
// is the next step; so a chain has the batches' exactly-once completion,
// on one server and on the Cluster. Every step's result is retained
// (WithRetention, DefaultBatchRetention when not given).
func WithThen(next Message, opts ...SendOption) SendOption {
	return func(o *sendOptions) { o.then = &thenStep{next: next, opts: opts} }
}

// checkThen checks a chain's steps from step.
func (d *Disker) checkThen(step *thenStep) error {
	for n := 2; step != nil; n++ {
		if n > MaxChainLength {
			return invalid("WithThen", "the chain is longer than %d (MaxChainLength)", MaxChainLength)
		}
		if err := checkBatchMessage("WithThen.next", &step.next, d.cfg.MaxMessageSize); err != nil {
			return err
		}
		o := sendOptionsOf(nil, step.opts)
		rest := o
		rest.then, rest.retention, rest.retentionSet = nil, 0, false
		if !reflect.DeepEqual(rest, sendOptions{}) {
			return invalid("WithThen", "the next message's options may only be WithRetention and WithThen")
		}
		if o.retentionSet && (o.retention < time.Millisecond || o.retention > MaxRetention) {
			return invalid("WithThen", "the next message's WithRetention must be from 1ms to %v (MaxRetention)", MaxRetention)
		}
		step = o.then
	}
	return nil
}

// thenBatch creates the batches of the chain from step, the last first,
// and returns the id of the batch whose completion is step's message.
func (d *Disker) thenBatch(ctx context.Context, step *thenStep) (string, error) {
	o := sendOptionsOf(nil, step.opts)
	inner := ""
	if o.then != nil {
		var err error
		if inner, err = d.thenBatch(ctx, o.then); err != nil {
			return "", err
		}
	}
	ret := o.retention
	if ret == 0 {
		ret = DefaultBatchRetention
	}
	id := broker.NewBatchID(step.next.Receiver, newID())
	comp := batchEnvelope(id, &step.next, "completion")
	comp.Retention = ret
	p := broker.CreateBatchParams{ID: id, Completion: comp, OnlyIfAllSucceed: true, Retention: ret, CompletionBatch: inner}
	_, err := call(d, "chain", func() (struct{}, error) {
		if err := d.b.CreateBatch(ctx, &p); err != nil {
			return struct{}{}, err
		}
		if inner == "" {
			return struct{}{}, nil
		}
		if err := d.b.AddBatchChildren(ctx, inner, []broker.BatchChild{{ID: comp.ID, Receiver: comp.Receiver}}); err != nil {
			return struct{}{}, err
		}
		_, err := d.b.SealBatch(ctx, inner)
		return struct{}{}, err
	})
	return id, err
}

// startChain creates the batches of the chain of p, sent with o, and
// makes p the child of the first: o gets WithBatch, p its batch and
// retention.
func (d *Disker) startChain(ctx context.Context, p *broker.SendParams, o *sendOptions) error {
	if err := d.checkThen(o.then); err != nil {
		return err
	}
	id, err := d.thenBatch(ctx, o.then)
	if err != nil {
		return err
	}
	o.batch, o.batchSet, p.Batch = id, true, id
	if p.Retention == 0 {
		p.Retention = DefaultBatchRetention
	}
	return nil
}
