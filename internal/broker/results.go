package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Errors of Results.
var (
	// ErrNoResult is returned when a message has no retained result: it
	// was sent without a retention, its retention passed (its record
	// expired, or was evicted by the receiver's cap), or no such message
	// was sent. The broker does not tell these apart.
	ErrNoResult = errors.New("disker: no retained result for this message")
	// ErrResultFinal is returned by SetProgress when the message's final
	// outcome is recorded already.
	ErrResultFinal = errors.New("disker: the message's final outcome is recorded already")
)

// MaxRetention is the longest retention of a message's result
// (SendParams.Retention, Envelope.Retention): 30 days.
const MaxRetention = 30 * 24 * time.Hour

// PendingRetention is how long a record whose message has no final
// outcome yet lives after its last change (send, start, progress), on
// top of its retention: a message that never settles (its queue was
// deleted by hand) leaves nothing for good.
const PendingRetention = 30 * 24 * time.Hour

// MaxProgressSize is the largest progress value (SetProgress), in bytes.
const MaxProgressSize = 64 << 10

// DefaultMaxResultBytes is the default cap on the bytes of the final
// results retained per receiver: 64 MiB. Over it, the results closest to
// the end of their retention are evicted first.
const DefaultMaxResultBytes = 64 << 20

// ResultState is the state of a message as its record tells it.
type ResultState uint8

// The states of a record. The first two are not final.
const (
	// ResultQueued: sent (queued, or deferred), not started.
	ResultQueued ResultState = iota + 1
	// ResultRunning: a worker started it; no final outcome yet.
	ResultRunning
	// ResultDone: handled and acknowledged (the handler returned; an
	// error it returned without a retry left is ErrorCode/ErrorText).
	ResultDone
	// ResultDeadLettered: moved to the dead-letter stream (ErrorText is
	// the reason).
	ResultDeadLettered
	// ResultCancelled: cancelled (Cancels.Cancel).
	ResultCancelled
	// ResultExpired: dropped unstarted, its expiry or deadline passed.
	ResultExpired
	// ResultTimedOut: the worker that handled it found its deadline
	// passed when it replied: its sender was told it timed out.
	ResultTimedOut
)

// Final reports whether s is a final state.
func (s ResultState) Final() bool { return s >= ResultDone }

// String returns the state's name in lower case.
func (s ResultState) String() string {
	switch s {
	case ResultQueued:
		return "queued"
	case ResultRunning:
		return "running"
	case ResultDone:
		return "done"
	case ResultDeadLettered:
		return "dead_lettered"
	case ResultCancelled:
		return "cancelled"
	case ResultExpired:
		return "expired"
	case ResultTimedOut:
		return "timed_out"
	}
	return fmt.Sprintf("ResultState(%d)", s)
}

// ResultRecord is the retained fate of a message, as the broker keeps it.
//
// The record holds two things: what became of the message at its receiver
// (State, written by the step that settles it: FinishResult, Queue's
// DeadLetter, Cancels' Cancel) and what its sender received (Reply,
// written by the step that accepted the reply when the broker can: the
// Redis broker's timed reply script on one server, else FinishResult as
// its worker saw it). A timed message with a reply route whose deadline
// (Deadline) passed, broker time (Now), without an accepted reply, timed
// out for its sender: readers decide that by Now, as the broker decided
// it (see disker's Result).
type ResultRecord struct {
	ID       string
	Receiver string
	State    ResultState
	// Attempts is the number of the latest attempt started (0: none).
	Attempts int
	// Worker is the id of the instance that ran the latest attempt.
	Worker string
	// Sent, Started (first attempt) and Finished (the final outcome),
	// broker time; zero when not known or not yet.
	Sent, Started, Finished time.Time
	// Deadline is the message's deadline, zero if none.
	Deadline time.Time
	// Route is the message's reply route (RouteNone when not known).
	Route Route
	// Reply is the reply its sender received, nil if none (yet).
	Reply *Envelope
	// ErrorCode and ErrorText say why the message failed, when it did
	// (the dead-letter reason; the handler's error).
	ErrorCode, ErrorText string
	// Progress is the latest progress recorded (SetProgress), nil if none.
	Progress []byte
	// Batch is the id of the batch the message is a child of
	// (SendParams.Batch), "" if none.
	Batch string
	// Retention is how long the record is kept after the final outcome.
	Retention time.Duration
	// Expires is when the record goes (broker time).
	Expires time.Time
	// Now is the broker's time when the record was read.
	Now time.Time
}

// Results keeps the fates of messages sent with a retention
// (SendParams.Retention, Envelope.Retention), in the receiver's keys: a
// record written at the send (ResultQueued), at each start, and at the
// final outcome in the same atomic step that settles the message, then
// kept for the retention (broker time) or until the receiver's cap on
// retained bytes evicts it.
type Results interface {
	// Result returns the record of message id of receiver, or
	// ErrNoResult.
	Result(ctx context.Context, receiver, id string) (ResultRecord, error)
	// ListResults returns up to max of receiver's final records, the
	// latest finished first.
	ListResults(ctx context.Context, receiver string, max int) ([]ResultRecord, error)
	// StartResult records the start of an attempt.
	StartResult(ctx context.Context, p *StartResultParams) error
	// FinishResult records the final outcome of a delivery, acknowledging
	// (or dropping) its ref in the same atomic step when p.Ref is set.
	FinishResult(ctx context.Context, p *FinishResultParams) error
	// SetProgress records data as the latest progress of message id of
	// receiver: ErrNoResult when it has no record, ErrResultFinal when its
	// final outcome is recorded.
	SetProgress(ctx context.Context, receiver, id string, data []byte) error
}

// StartResultParams are the arguments of Results.StartResult.
type StartResultParams struct {
	Receiver, ID string
	// Worker is the id of the instance that starts the attempt.
	Worker string
	// Attempt is the attempt's number (Delivery.Attempt).
	Attempt int
	// Retention, when the message has no record (it was sent without a
	// retention, and its receiver keeps results by default), creates one
	// with this retention; 0 writes nothing then.
	Retention time.Duration
	// Deadline and Route are the message's deadline and reply route, for
	// a record created here.
	Deadline time.Time
	Route    Route
	// ReplyTo is where a reply to the message goes, for RouteSender and
	// RouteInbox: its Sender (the sender's name, or the Request's inbox).
	// A broker that accepts a reply in another step than the one that
	// records it (a Redis Cluster whose slots part the two) uses it to
	// find what an earlier attempt had accepted; empty for none.
	ReplyTo string
}

// Validate returns an error naming the first field that is not valid.
func (p *StartResultParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("StartResultParams.Receiver")
	case p.ID == "":
		return empty("StartResultParams.ID")
	case p.Attempt < 1:
		return notPositive("StartResultParams.Attempt", p.Attempt)
	case p.ReplyTo != "":
		if err := CheckName("StartResultParams.ReplyTo", p.ReplyTo); err != nil {
			return err
		}
	}
	return checkRetention("StartResultParams.Retention", p.Retention)
}

// FinishResultParams are the arguments of Results.FinishResult.
type FinishResultParams struct {
	Receiver, ID string
	// Ref, when not empty, is the delivery's ref: it is acknowledged
	// (Queue.Ack), or dropped (Queue.Drop) when State is ResultExpired, in
	// the same step. A ref of a keyed message (SendParams.GroupKey) is
	// settled by Queue.Ack first: its record is written after.
	Ref string
	// State is the final state: ResultDone, ResultExpired or
	// ResultTimedOut (dead letters and cancellations are recorded by
	// DeadLetter, Fetch past MaxAttempts, and Cancel). ResultTimedOut on
	// a record that holds a reply (recorded where it was accepted), or with
	// Reply set, is written ResultDone: the sender received that reply.
	State ResultState
	// Worker and Attempt are the worker's id and the attempt's number.
	Worker  string
	Attempt int
	// Reply is the reply the sender received, as the worker saw it (nil:
	// none, or it was refused as late); a reply recorded already stays.
	Reply *Envelope
	// ErrorCode and ErrorText say why the message failed, if it did.
	ErrorCode, ErrorText string
	// Retention is the message's (Envelope.Retention, or the receiver's
	// default); > 0. A record that does not exist is created with it.
	Retention time.Duration
	// ReplyTo is where a reply to the message goes, as
	// StartResultParams.ReplyTo: a later attempt with no Reply records
	// what an earlier one had accepted, where the broker accepts a reply
	// in another step than the one that records it.
	ReplyTo string
}

// Validate returns an error naming the first field that is not valid.
func (p *FinishResultParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("FinishResultParams.Receiver")
	case p.ID == "":
		return empty("FinishResultParams.ID")
	case p.State != ResultDone && p.State != ResultExpired && p.State != ResultTimedOut:
		return fmt.Errorf("broker: FinishResultParams.State %v is not done, expired or timed_out", p.State)
	case p.Retention <= 0:
		return notPositive("FinishResultParams.Retention", p.Retention)
	case p.ReplyTo != "":
		if err := CheckName("FinishResultParams.ReplyTo", p.ReplyTo); err != nil {
			return err
		}
	}
	return checkRetention("FinishResultParams.Retention", p.Retention)
}

// CheckProgress returns an error when data is over MaxProgressSize.
func CheckProgress(data []byte) error {
	if len(data) > MaxProgressSize {
		return fmt.Errorf("broker: progress is %d bytes, over the limit of %d", len(data), MaxProgressSize)
	}
	return nil
}

func checkRetention(field string, d time.Duration) error {
	switch {
	case d < 0:
		return negative(field, d)
	case d > MaxRetention:
		return fmt.Errorf("broker: %s %v is over the limit of %v", field, d, MaxRetention)
	case d > 0 && d < time.Millisecond:
		return fmt.Errorf("broker: %s %v is under a millisecond", field, d)
	}
	return nil
}
