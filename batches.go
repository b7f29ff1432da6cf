package disker

import (
	"context"
	"errors"
	"maps"
	"reflect"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Headers of a batch's completion (and failure) message.
const (
	// HeaderBatch is the header that carries the batch id on its
	// completion and failure messages: Disker.Batch(ctx, id) returns the
	// final counts, which no longer change once the completion is queued.
	HeaderBatch = "Disker-Batch"
	// HeaderBatchOutcome is "completion" on the completion message and
	// "failure" on the failure message.
	HeaderBatchOutcome = "Disker-Batch-Outcome"
)

// DefaultBatchRetention is the retention of a batch and of its children's
// results when BatchOptions.Retention is 0: 24 hours.
const DefaultBatchRetention = 24 * time.Hour

// Errors of batches.
var (
	// ErrBatchNotFound is returned for a batch id that names no batch:
	// never created, or its retention after its completion passed.
	ErrBatchNotFound = broker.ErrNoBatch
	// ErrBatchSealed is returned when a child is added to a sealed (or
	// cancelled) batch: nothing is sent.
	ErrBatchSealed = broker.ErrBatchSealed
)

// BatchOptions configure NewBatch.
type BatchOptions struct {
	// Completion is queued to Completion.Receiver exactly once, when the
	// batch is sealed and every child settled (see OnlyIfAllSucceed). It
	// is fire-and-forget: Sender must be empty. It gets the headers
	// HeaderBatch and HeaderBatchOutcome.
	Completion Message
	// OnlyIfAllSucceed queues Completion only when every child succeeded
	// (its handler returned no error), and Failure otherwise, if it is
	// set. False queues Completion when every child settled, whatever
	// their outcomes: succeeded, failed, dead-lettered, cancelled,
	// expired or timed out.
	OnlyIfAllSucceed bool
	// Failure, when not nil, goes instead of Completion when a child did
	// not succeed in OnlyIfAllSucceed mode. It goes to the same receiver
	// as Completion, and is fire-and-forget too.
	Failure *Message
	// Retention is how long the batch (Disker.Batch) and its children's
	// results (Disker.Result) are kept after the completion; 0 means
	// DefaultBatchRetention; at most MaxRetention.
	Retention time.Duration
	// CompletionOptions are the options of Completion, which may be
	// WithRetention (its result is retained), WithThen (the completion
	// starts a chain: the next steps follow it when it succeeds, and may
	// take its reply) and WithBatch (a nested batch: the completion is a
	// child of that batch, and counts there as cancelled when it is not
	// sent, in OnlyIfAllSucceed mode with a child that did not succeed).
	// With WithThen and WithBatch, the chain the completion starts is that
	// batch's child. With WithThen or WithBatch, the completion's result
	// is retained for Retention unless WithRetention says otherwise.
	CompletionOptions []SendOption
}

// Batch is a batch of messages with a completion that is queued exactly
// once, when the batch is sealed and its last child settled: decided in
// one atomic step in the broker (see docs/batches.md). Make one with
// NewBatch, add children with Send and SendEach (or any send with
// WithBatch), then Seal it.
type Batch struct {
	d         *Disker
	id        string
	retention time.Duration
}

// NewBatch creates an open batch. Its id is the completion receiver's
// name, a slash and a unique part: the batch lives next to that
// receiver's queue in the broker.
func (d *Disker) NewBatch(ctx context.Context, opts BatchOptions) (*Batch, error) {
	if err := checkBatchMessage("BatchOptions.Completion", &opts.Completion, d.cfg.MaxMessageSize); err != nil {
		return nil, err
	}
	if opts.Failure != nil {
		if !opts.OnlyIfAllSucceed {
			return nil, invalid("BatchOptions.Failure", "is set without OnlyIfAllSucceed: it would never be sent")
		}
		if err := checkBatchMessage("BatchOptions.Failure", opts.Failure, d.cfg.MaxMessageSize); err != nil {
			return nil, err
		}
		if opts.Failure.Receiver != opts.Completion.Receiver {
			return nil, invalid("BatchOptions.Failure.Receiver", "%q is not the completion's receiver %q", opts.Failure.Receiver, opts.Completion.Receiver)
		}
	}
	ret := opts.Retention
	switch {
	case ret == 0:
		ret = DefaultBatchRetention
	case ret < time.Millisecond || ret > MaxRetention:
		return nil, invalid("BatchOptions.Retention", "must be from 1ms to %v (MaxRetention), got %v", MaxRetention, ret)
	}
	co := sendOptionsOf(nil, opts.CompletionOptions)
	if err := d.checkCompletionOptions(co); err != nil {
		return nil, err
	}
	id := broker.NewBatchID(opts.Completion.Receiver, newID())
	p := broker.CreateBatchParams{ID: id, Completion: batchEnvelope(id, &opts.Completion, "completion"),
		OnlyIfAllSucceed: opts.OnlyIfAllSucceed, Retention: ret}
	if opts.Failure != nil {
		f := batchEnvelope(id, opts.Failure, "failure")
		p.Failure = &f
	}
	outer := ""
	if co.batchSet {
		outer = co.batch
	}
	switch {
	case co.retentionSet:
		p.Completion.Retention = co.retention
	case co.then != nil || co.batchSet:
		p.Completion.Retention = ret
	}
	if _, err := d.createFollowed(ctx, &p, co.then, outer); err != nil {
		return nil, err
	}
	return &Batch{d: d, id: id, retention: ret}, nil
}

// checkCompletionOptions checks BatchOptions.CompletionOptions.
func (d *Disker) checkCompletionOptions(o sendOptions) error {
	const field = "BatchOptions.CompletionOptions"
	rest := o
	rest.then, rest.retention, rest.retentionSet, rest.batch, rest.batchSet = nil, 0, false, "", false
	if !reflect.DeepEqual(rest, sendOptions{}) {
		return invalid(field, "may only be WithRetention, WithThen and WithBatch")
	}
	if err := checkRetention(field, o); err != nil {
		return err
	}
	if o.batchSet {
		if err := checkBatchID(field, o.batch); err != nil {
			return err
		}
	}
	return d.checkThen(o.then)
}

// checkBatchMessage checks a completion or failure message.
func checkBatchMessage(field string, m *Message, maxSize int) error {
	if err := checkName(field+".Receiver", m.Receiver); err != nil {
		return err
	}
	if m.Sender != "" {
		return invalid(field+".Sender", "must be empty: a batch's messages are fire-and-forget")
	}
	if len(m.Content) > maxSize {
		return invalid(field+".Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(m.Content), maxSize)
	}
	return nil
}

// batchEnvelope is m as batch id queues it, with its headers.
func batchEnvelope(id string, m *Message, outcome string) broker.Envelope {
	h := make(map[string]string, len(m.Headers)+2)
	maps.Copy(h, m.Headers)
	h[HeaderBatch], h[HeaderBatchOutcome] = id, outcome
	return broker.Envelope{ID: newID(), Receiver: m.Receiver, Content: m.Content, Headers: h}
}

// ID returns the batch's id, for WithBatch, Disker.Batch and
// Disker.CancelBatch.
func (b *Batch) ID() string { return b.id }

// Send sends msg as a child of the batch, as Disker.Send does, with its
// result retained for the batch's retention unless opts say otherwise
// (WithRetention). It returns ErrBatchSealed once the batch is sealed.
func (b *Batch) Send(ctx context.Context, msg Message, opts ...SendOption) (string, error) {
	return b.d.Send(ctx, msg, append([]SendOption{WithRetention(b.retention), WithBatch(b.id)}, opts...)...)
}

// SendEach sends msgs as children of the batch, as Disker.SendEach does,
// in as few round trips as it can.
func (b *Batch) SendEach(ctx context.Context, msgs []Outgoing, opts ...SendOption) ([]string, error) {
	return b.d.SendEach(ctx, msgs, append([]SendOption{WithRetention(b.retention), WithBatch(b.id)}, opts...)...)
}

// Seal seals the batch: no child can be added from then on, and the
// completion is queued when the last child settles, at once when every
// child settled already or it has none. Seal after every Send and SendEach
// of the batch returned. Sealing again does nothing.
func (b *Batch) Seal(ctx context.Context) (*BatchInfo, error) {
	info, err := call(b.d, "seal batch", func() (broker.BatchInfo, error) { return b.d.b.SealBatch(ctx, b.id) })
	if err != nil {
		return nil, err
	}
	return batchInfoOf(&info), nil
}

// WithBatch sends the message as a child of batch id (Batch.ID): its
// final outcome counts for the batch. The send first adds the child to the
// batch, and fails with ErrBatchSealed or ErrBatchNotFound, sending
// nothing, when it cannot. A child needs a retained result: without
// WithRetention it is kept for DefaultBatchRetention. With WithThen, the
// chain is the batch's child: its last step's outcome counts there (or
// cancelled, when the chain stopped before it). WithBatch goes with Send,
// SendBatch and SendEach and their options (a keyed child, WithGroup,
// counts when it settles, as any child), not with Request nor
// WithDebounce (a debounced message that a later send replaces is never
// settled: the batch would wait for it for ever); in
// BatchOptions.CompletionOptions it nests a batch in another.
func WithBatch(id string) SendOption {
	return func(o *sendOptions) { o.batch, o.batchSet = id, true }
}

// BatchState is where a batch is in its life.
type BatchState int

// The states of a batch.
const (
	// BatchOpen: children may be added.
	BatchOpen BatchState = iota + 1
	// BatchSealed: no child may be added; it completes when its last
	// child settles.
	BatchSealed
	// BatchCompleted: every child settled, and the completion (or the
	// failure message) was queued, once.
	BatchCompleted
)

// String returns the state's name in lower case.
func (s BatchState) String() string { return broker.BatchState(s).String() }

// BatchInfo is a batch's state and counts (Disker.Batch).
type BatchInfo struct {
	ID    string
	State BatchState
	// OnlyIfAllSucceed is the batch's mode.
	OnlyIfAllSucceed bool
	// Cancelled reports whether CancelBatch was called.
	Cancelled bool
	// Children is the number of children added; the others count them by
	// final outcome, each once. Settled is their sum.
	Children, Settled                                           int
	Succeeded, Failed, DeadLettered, Cancels, Expired, TimedOut int
	// CompletionSent and FailureSent say which message the completed
	// batch queued (neither: OnlyIfAllSucceed with a failed child and no
	// failure message).
	CompletionSent, FailureSent bool
	// CompletionID and FailureID are the message ids of the completion
	// and of the failure message ("" when there is none), sent to the
	// receiver the batch id names once the batch completed.
	CompletionID, FailureID string
	// Created and Completed are broker times (Completed zero until then).
	Created, Completed time.Time
}

// batchInfoOf is the broker's batch as BatchInfo.
func batchInfoOf(b *broker.BatchInfo) *BatchInfo {
	c := b.Counts
	return &BatchInfo{ID: b.ID, State: BatchState(b.State), OnlyIfAllSucceed: b.OnlyIfAllSucceed, Cancelled: b.Cancelled,
		Children: c.Children, Settled: c.Settled(), Succeeded: c.Succeeded, Failed: c.Failed, DeadLettered: c.DeadLettered,
		Cancels: c.Cancelled, Expired: c.Expired, TimedOut: c.TimedOut,
		CompletionSent: b.Fired == broker.FiredCompletion, FailureSent: b.Fired == broker.FiredFailure,
		CompletionID: b.CompletionID, FailureID: b.FailureID,
		Created: b.Created, Completed: b.Completed}
}

// checkBatchID checks a batch id argument.
func checkBatchID(field, id string) error {
	recv, _, ok := broker.ParseBatchID(id)
	if !ok || validName(recv) != "" {
		return invalid(field, "%q is not a batch id (Batch.ID)", id)
	}
	return nil
}

// Batch returns batch id's state and counts, or ErrBatchNotFound.
func (d *Disker) Batch(ctx context.Context, id string) (*BatchInfo, error) {
	if err := checkBatchID("id", id); err != nil {
		return nil, err
	}
	info, err := call(d, "batch", func() (broker.BatchInfo, error) { return d.b.Batch(ctx, id) })
	if err != nil {
		return nil, err
	}
	return batchInfoOf(&info), nil
}

// CancelBatch cancels batch id: it is sealed and marked cancelled, and
// each child not settled yet is cancelled (Cancel: a child being handled
// has its context ended). The batch then completes as any batch does,
// when its last child settled: cancelled children count as Cancels, so
// the completion goes (in OnlyIfAllSucceed mode, the failure message,
// unless every child succeeded before). It returns the batch as it is
// after the cancellations.
func (d *Disker) CancelBatch(ctx context.Context, id string) (*BatchInfo, error) {
	if err := checkBatchID("id", id); err != nil {
		return nil, err
	}
	waiting, err := call(d, "cancel batch", func() ([]broker.BatchChild, error) { return d.b.CancelBatch(ctx, id) })
	if err != nil {
		return nil, err
	}
	recvs := make(map[string]bool)
	var errs []error
	for _, c := range waiting {
		if _, err := d.cancel(ctx, c.Receiver, c.ID, true); err != nil {
			errs = append(errs, err)
		}
		recvs[c.Receiver] = true
	}
	for r := range recvs {
		if _, err := call(d, "batch reports", func() (struct{}, error) { return struct{}{}, d.b.SettleBatchReports(ctx, r) }); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return d.Batch(ctx, id)
}

// addChildren registers the children among ps (SendParams.Batch) with
// their batches before they are sent.
func (d *Disker) addChildren(ctx context.Context, ps []broker.SendParams) error {
	var byBatch map[string][]broker.BatchChild
	for i := range ps {
		if id := ps[i].Batch; id != "" {
			if byBatch == nil {
				byBatch = make(map[string][]broker.BatchChild)
			}
			byBatch[id] = append(byBatch[id], broker.BatchChild{ID: ps[i].Env.ID, Receiver: ps[i].Env.Receiver})
		}
	}
	for id, children := range byBatch {
		for len(children) > 0 {
			n := min(len(children), broker.MaxBatchChildren)
			if _, err := call(d, "add to batch", func() (struct{}, error) {
				return struct{}{}, d.b.AddBatchChildren(ctx, id, children[:n])
			}); err != nil {
				return err
			}
			children = children[n:]
		}
	}
	return nil
}

// dropUnsent forgets, in their batches, the children among ps that were
// not stored: refused, or duplicates. A child whose send may have been
// stored (its error wraps ErrUnavailable, or ctx ended) stays: it counts
// when it settles, and a batch that waits for one that was not stored is
// ended by CancelBatch.
func (d *Disker) dropUnsent(ps []broker.SendParams) {
	for i := range ps {
		p := &ps[i]
		if p.Batch == "" {
			continue
		}
		if notStored(&p.Result) {
			ctx, cancel := context.WithTimeout(context.Background(), SendTimeout)
			_ = d.b.RemoveBatchChild(ctx, p.Batch, p.Env.ID)
			cancel()
		}
	}
}

// notStored reports whether a send's result says its message was not
// stored: refused, or a duplicate. A send whose error wraps
// ErrUnavailable, or ctx's, may have been stored.
func notStored(r *broker.SendResult) bool {
	return r.Outcome == broker.Duplicate || r.Outcome == broker.Joined ||
		(r.Outcome == broker.SendFailed && r.Err != nil && !errors.Is(r.Err, ErrUnavailable) && !errors.Is(r.Err, context.Canceled) && !errors.Is(r.Err, context.DeadlineExceeded))
}
