package broker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Errors of Batches.
var (
	// ErrNoBatch is returned for a batch id that names no batch: it was
	// never created, or its retention after its completion passed.
	ErrNoBatch = errors.New("disker: no such batch")
	// ErrBatchSealed is returned when children are added to a batch that
	// is sealed (or cancelled): nothing is added, nothing is sent.
	ErrBatchSealed = errors.New("disker: the batch is sealed: no child can be added")
	// ErrBatchExists is returned by CreateBatch for an id in use.
	ErrBatchExists = errors.New("disker: a batch with this id exists already")
)

// BatchState is where a batch is in its life.
type BatchState uint8

// The states of a batch.
const (
	// BatchOpen: children may be added.
	BatchOpen BatchState = iota + 1
	// BatchSealed: no child may be added; it completes when the last of
	// its children settles.
	BatchSealed
	// BatchCompleted: sealed and every child settled: the completion (or
	// the failure message) was queued, once.
	BatchCompleted
)

// String returns the state's name in lower case.
func (s BatchState) String() string {
	switch s {
	case BatchOpen:
		return "open"
	case BatchSealed:
		return "sealed"
	case BatchCompleted:
		return "completed"
	}
	return fmt.Sprintf("BatchState(%d)", s)
}

// BatchFired says which message a completed batch queued.
type BatchFired uint8

// What a completed batch queued.
const (
	// FiredNone: not completed yet, or completed in OnlyIfAllSucceed mode
	// with a failed child and no failure message.
	FiredNone BatchFired = iota
	// FiredCompletion: the completion message was queued.
	FiredCompletion
	// FiredFailure: the failure message was queued (OnlyIfAllSucceed, a
	// child did not succeed).
	FiredFailure
)

// String returns "none", "completion" or "failure".
func (f BatchFired) String() string {
	switch f {
	case FiredNone:
		return "none"
	case FiredCompletion:
		return "completion"
	case FiredFailure:
		return "failure"
	}
	return fmt.Sprintf("BatchFired(%d)", f)
}

// BatchCounts are a batch's children by outcome. A child counts once,
// at its first final outcome.
type BatchCounts struct {
	// Children is the number of children added (or known from their
	// report).
	Children int
	// Succeeded: handled and acknowledged without an error.
	Succeeded int
	// Failed: handled, and its handler's error was final (no retry left).
	Failed int
	// DeadLettered, Cancelled, Expired, TimedOut: settled by the step of
	// that name (see ResultState).
	DeadLettered, Cancelled, Expired, TimedOut int
}

// Settled is the number of children with a final outcome.
func (c BatchCounts) Settled() int {
	return c.Succeeded + c.Failed + c.DeadLettered + c.Cancelled + c.Expired + c.TimedOut
}

// BatchInfo is a batch as the broker keeps it.
type BatchInfo struct {
	ID    string
	State BatchState
	// OnlyIfAllSucceed is the batch's mode (CreateBatchParams).
	OnlyIfAllSucceed bool
	// Cancelled reports whether CancelBatch was called.
	Cancelled bool
	Counts    BatchCounts
	// Fired is what the completed batch queued; CompletionID and
	// FailureID are the ids of its two messages (FailureID "" if none).
	Fired                   BatchFired
	CompletionID, FailureID string
	// Created and Completed are broker times (Completed zero until then).
	Created, Completed time.Time
}

// BatchChild is a child of a batch: its message id and receiver.
type BatchChild struct {
	ID, Receiver string
}

// CreateBatchParams are the arguments of Batches.CreateBatch.
type CreateBatchParams struct {
	// ID is the batch's id, made by NewBatchID: it names the receiver of
	// the completion, whose keys hold the batch.
	ID string
	// Completion is queued to its receiver when the batch completes (see
	// OnlyIfAllSucceed): a fire-and-forget message (RouteNone, no
	// timeout) to the receiver that ID names.
	Completion Envelope
	// OnlyIfAllSucceed queues Completion only when every child succeeded,
	// and Failure (when not nil) otherwise. False queues Completion when
	// every child settled, whatever their outcomes.
	OnlyIfAllSucceed bool
	// Failure, when not nil, is queued instead of Completion when a child
	// did not succeed in OnlyIfAllSucceed mode: a fire-and-forget message
	// to the same receiver as Completion.
	Failure *Envelope
	// CompletionBatch, when not empty, makes Completion a child of that
	// batch (a chain's next step, a batch nested in another): queueing it
	// writes its retained result with the batch id, in the same step, so
	// that its settlement counts there. A batch that completes without
	// queueing Completion (its failure message, or nothing) settles it
	// all the same, in the same step: its retained result is written
	// cancelled (ErrorCode CodeCancelled, ErrorText NotSentText) and
	// counts as cancelled there, so that the batches after it complete
	// too. Completion.Retention must then be > 0.
	CompletionBatch string
	// CompletionBatchReply, with CompletionBatch, sends the completion's
	// reply to that batch with its outcome (SendParams.BatchReply).
	CompletionBatchReply bool
	// ReplyAsContent queues Completion, which has no content, with the
	// content of the reply of the batch's child that succeeded, and the
	// reply's headers under its own (its own win on a name in both): a
	// chain's next step. The batch has one child, sent with
	// SendParams.BatchReply, and OnlyIfAllSucceed: a child that succeeded
	// without a reply gives the completion no content. A child whose reply
	// is over the broker's cap on a receiver's retained bytes
	// (MaxResultBytes) does not succeed: its result gets the error
	// CodeReplyTooLarge instead of the reply, and it counts as failed.
	ReplyAsContent bool
	// Retention is how long the batch is kept after it completed; > 0,
	// at most MaxRetention. Until then it is kept PendingRetention after
	// its last change on top of it.
	Retention time.Duration
}

// Validate returns an error naming the first field that is not valid.
func (p *CreateBatchParams) Validate() error {
	recv, _, ok := ParseBatchID(p.ID)
	if !ok {
		return fmt.Errorf("broker: CreateBatchParams.ID %q is not a batch id", p.ID)
	}
	if err := checkBatchMessage("CreateBatchParams.Completion", &p.Completion, recv); err != nil {
		return err
	}
	if p.Failure != nil {
		if !p.OnlyIfAllSucceed {
			return errors.New("broker: CreateBatchParams.Failure is set, but OnlyIfAllSucceed is not: it would never be sent")
		}
		if err := checkBatchMessage("CreateBatchParams.Failure", p.Failure, recv); err != nil {
			return err
		}
	}
	if p.CompletionBatch != "" {
		if err := CheckBatchID("CreateBatchParams.CompletionBatch", p.CompletionBatch); err != nil {
			return err
		}
		if p.Completion.Retention <= 0 {
			return notPositive("CreateBatchParams.Completion.Retention (CompletionBatch)", p.Completion.Retention)
		}
	}
	if p.CompletionBatchReply && p.CompletionBatch == "" {
		return errors.New("broker: CreateBatchParams.CompletionBatchReply is set without CompletionBatch")
	}
	if p.ReplyAsContent && (len(p.Completion.Content) > 0 || !p.OnlyIfAllSucceed) {
		return errors.New("broker: CreateBatchParams.ReplyAsContent needs a Completion without content, and OnlyIfAllSucceed")
	}
	if p.Retention <= 0 {
		return notPositive("CreateBatchParams.Retention", p.Retention)
	}
	return checkRetention("CreateBatchParams.Retention", p.Retention)
}

func checkBatchMessage(field string, env *Envelope, recv string) error {
	switch {
	case env.ID == "":
		return empty(field + ".ID")
	case env.Receiver != recv:
		return fmt.Errorf("broker: %s.Receiver %q is not the receiver of the batch id, %q", field, env.Receiver, recv)
	case env.Route != RouteNone || env.Timeout != 0:
		return fmt.Errorf("broker: %s must be fire-and-forget (no reply route, no timeout)", field)
	}
	return nil
}

// Codes the broker writes in a retained result (ResultRecord.ErrorCode).
const (
	// CodeCancelled: a batch's completion that was never sent, as its
	// batch did not succeed (CreateBatchParams.CompletionBatch).
	CodeCancelled = "cancelled"
	// CodeReplyTooLarge: a child's reply that was to go to its batch
	// (SendParams.BatchReply) is over the cap on its receiver's retained
	// bytes: the child counts as failed.
	CodeReplyTooLarge = "reply_too_large"
)

// NotSentText is the error text of a completion never sent
// (CreateBatchParams.CompletionBatch).
const NotSentText = "disker: never sent: the batch or chain step before it did not succeed"

// ReplyTooLargeText is the error text of CodeReplyTooLarge.
const ReplyTooLargeText = "disker: the reply is over the cap on the receiver's retained bytes (MaxResultBytes): it cannot go on to the next step"

// NewBatchID returns the id of a batch whose completion goes to
// receiver: "<receiver>/<unique>". unique must not be empty.
func NewBatchID(receiver, unique string) string { return receiver + "/" + unique }

// ParseBatchID splits a batch id made by NewBatchID.
func ParseBatchID(id string) (receiver, unique string, ok bool) {
	receiver, unique, ok = strings.Cut(id, "/")
	return receiver, unique, ok && receiver != "" && unique != ""
}

// CheckBatchID returns an error naming field when id is not a batch id.
func CheckBatchID(field, id string) error {
	if _, _, ok := ParseBatchID(id); !ok {
		return fmt.Errorf("broker: %s %q is not a batch id", field, id)
	}
	return nil
}

// Batches are groups of messages with a completion that is queued
// exactly once, when the group is sealed and its last child settled.
//
// A child is a message sent with SendParams.Batch (and a retention): the
// step that settles it for good (the final write of its retained result:
// FinishResult, DeadLetter, Cancel, an expiry) records its outcome for its
// batch. The batch counts each child once, by message id, and the step
// that counts the last settled child of a sealed batch queues the
// completion in the same atomic step: one decision, in the broker.
//
// Adding children is two steps: AddBatchChildren registers them (it fails
// with ErrBatchSealed or ErrNoBatch, and then nothing is sent), then they
// are sent; a child whose send failed is removed with RemoveBatchChild.
type Batches interface {
	// CreateBatch creates an open batch; ErrBatchExists if p.ID is used.
	CreateBatch(ctx context.Context, p *CreateBatchParams) error
	// AddBatchChildren registers children of batch id before they are
	// sent: ErrNoBatch, or ErrBatchSealed when it is sealed or cancelled
	// (nothing registered). Registering a child again does nothing.
	AddBatchChildren(ctx context.Context, id string, children []BatchChild) error
	// RemoveBatchChild forgets a registered child that was not sent; a
	// child that reported already stays.
	RemoveBatchChild(ctx context.Context, id, childID string) error
	// SealBatch seals batch id (sealing it again does nothing): from then
	// on it completes when its last child settles, at once when every
	// child settled already (or it has none).
	SealBatch(ctx context.Context, id string) (BatchInfo, error)
	// Batch returns batch id, or ErrNoBatch.
	Batch(ctx context.Context, id string) (BatchInfo, error)
	// CancelBatch marks batch id cancelled and seals it, and returns its
	// children that have not settled, for the caller to cancel (Cancels):
	// the batch completes as usual when they settle.
	CancelBatch(ctx context.Context, id string) ([]BatchChild, error)
	// SettleBatchReports hands the outcomes of receiver's settled children
	// to their batches, where a broker records them in a step of their
	// own (see the Redis broker on the Cluster); it does nothing where
	// they are recorded in the settling step.
	SettleBatchReports(ctx context.Context, receiver string) error
}

// MaxBatchChildren is the most children one AddBatchChildren call takes.
const MaxBatchChildren = 10000

// CheckBatchChildren checks the arguments of AddBatchChildren.
func CheckBatchChildren(id string, children []BatchChild) error {
	if err := CheckBatchID("batch id", id); err != nil {
		return err
	}
	if len(children) == 0 || len(children) > MaxBatchChildren {
		return fmt.Errorf("broker: %d children, want 1..%d", len(children), MaxBatchChildren)
	}
	for i, c := range children {
		if c.ID == "" || c.Receiver == "" {
			return fmt.Errorf("broker: child %d has an empty id or receiver", i)
		}
	}
	return nil
}
