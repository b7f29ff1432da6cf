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
// expired, timed out) next is never queued, its retained result says
// cancelled (CodeCancelled), and the failure is in the message's retained
// result (Result). next goes with its own opts, which may hold only
// WithRetention and a WithThen of its own: a chain of any length up to
// MaxChainLength, decided one step after the other. next is
// fire-and-forget (no Sender).
//
// A next message with no content (nil or empty) takes the reply of the
// step before: its content, and its headers under next's own (next's win
// on a name in both); a step that succeeded without a reply gives it no
// content. A next message with content keeps it, and its own headers
// only. The reply goes on in the broker's step that counts the step
// before; a reply over the broker's cap on a receiver's retained bytes
// (Config.MaxResultBytes) cannot, and its step counts as failed
// (CodeReplyTooLarge), which stops the chain.
//
// WithThen goes with Send (and Batch.Send) and its options, WithGroup
// among them (a keyed step's settle, its key's release and its outcome
// are one broker step), not with WithDebounce (a debounced message that a
// later send replaces is never settled: the chain would stop there), and
// with the options of a batch's completion
// (BatchOptions.CompletionOptions). With WithBatch, the
// chain as a whole is the batch's child: its last step's outcome counts
// there, or cancelled when the chain stopped before it.
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
			return invalid("WithThen", "the next message's options may only be WithRetention and WithThen (give WithBatch to the chain's first message: the chain is then the batch's child)")
		}
		if err := checkRetention("WithThen", o); err != nil {
			return err
		}
		step = o.then
	}
	return nil
}

// checkRetention checks the WithRetention of a message the broker sends
// (a chain's step, a completion); field names where it is given.
func checkRetention(field string, o sendOptions) error {
	if o.retentionSet && (o.retention < time.Millisecond || o.retention > MaxRetention) {
		return invalid(field, "WithRetention must be from 1ms to %v (MaxRetention)", MaxRetention)
	}
	return nil
}

// chainHead is what thenBatch made: the id of the batch whose completion
// is the step's message, whether that message takes the reply of its
// batch's child, and the chain's last step (the child of outer).
type chainHead struct {
	id    string
	takes bool
	last  string
}

// thenBatch creates the batches of the chain from step, the last first,
// the last step being the child of batch outer ("" for none).
func (d *Disker) thenBatch(ctx context.Context, step *thenStep, outer string) (chainHead, error) {
	o := sendOptionsOf(nil, step.opts)
	ret := o.retention
	if ret == 0 {
		ret = DefaultBatchRetention
	}
	id := broker.NewBatchID(step.next.Receiver, newID())
	comp := batchEnvelope(id, &step.next, "completion")
	comp.Retention = ret
	takes := len(step.next.Content) == 0
	p := broker.CreateBatchParams{ID: id, Completion: comp, OnlyIfAllSucceed: true, Retention: ret, ReplyAsContent: takes}
	last, err := d.createFollowed(ctx, &p, o.then, outer)
	return chainHead{id: id, takes: takes, last: last}, err
}

// createFollowed creates batch p, whose completion starts the chain then
// (nil for none) and, or, is the child of batch outer ("" for none): the
// chain's batches first, then the completion is registered with the batch
// it is a child of (the chain's first, or outer), then p is created, and
// the chain's first batch is sealed. It returns the id of the chain's last
// step (p's completion when then is nil).
func (d *Disker) createFollowed(ctx context.Context, p *broker.CreateBatchParams, then *thenStep, outer string) (string, error) {
	inner, takes, last := outer, false, p.Completion.ID
	if then != nil {
		h, err := d.thenBatch(ctx, then, outer)
		if err != nil {
			return "", err
		}
		inner, takes, last = h.id, h.takes, h.last
	}
	p.CompletionBatch, p.CompletionBatchReply = inner, takes
	_, err := call(d, "create batch", func() (struct{}, error) {
		if inner != "" {
			if err := d.b.AddBatchChildren(ctx, inner, []broker.BatchChild{{ID: p.Completion.ID, Receiver: p.Completion.Receiver}}); err != nil {
				return struct{}{}, err
			}
		}
		if err := d.b.CreateBatch(ctx, p); err != nil {
			if inner != "" {
				_ = d.b.RemoveBatchChild(ctx, inner, p.Completion.ID)
			}
			return struct{}{}, err
		}
		if inner == "" || inner == outer {
			return struct{}{}, nil
		}
		_, err := d.b.SealBatch(ctx, inner)
		return struct{}{}, err
	})
	return last, err
}

// startChain creates the batches of the chain of p, sent with o, and
// makes p the child of the first: o gets WithBatch, p its batch and
// retention. A batch o names (WithBatch) gets the chain's last step as
// its child; startChain returns a function that forgets it there, for a
// first message that was not stored.
func (d *Disker) startChain(ctx context.Context, p *broker.SendParams, o *sendOptions) (unsent func(), err error) {
	if err := d.checkThen(o.then); err != nil {
		return nil, err
	}
	outer := ""
	if o.batchSet {
		outer = o.batch
	}
	h, err := d.thenBatch(ctx, o.then, outer)
	if err != nil {
		return nil, err
	}
	o.batch, o.batchSet, p.Batch, p.BatchReply = h.id, true, h.id, h.takes
	if p.Retention == 0 {
		p.Retention = DefaultBatchRetention
	}
	return func() {
		if outer != "" {
			ctx, cancel := context.WithTimeout(context.Background(), SendTimeout)
			_ = d.b.RemoveBatchChild(ctx, outer, h.last)
			cancel()
		}
	}, nil
}
