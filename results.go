package disker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// MaxRetention is the longest retention WithRetention and
// WithResultRetention accept: 30 days.
const MaxRetention = broker.MaxRetention

// MaxProgressSize is the largest progress value Message.Progress records,
// in bytes: 64 KiB.
const MaxProgressSize = broker.MaxProgressSize

// Errors of retained results.
var (
	// ErrResultNotFound is returned by Result when the message has no
	// retained result: it was sent without a retention (and its receiver
	// keeps none by default, or has not started it yet), its retention
	// passed, it was evicted by the receiver's cap on retained bytes, or no
	// such message was sent. These are not told apart: a result that
	// expired is gone.
	ErrResultNotFound = broker.ErrNoResult
	// ErrResultFinal is returned by Message.Progress once the message's
	// final outcome is recorded (or its handler returned).
	ErrResultFinal = broker.ErrResultFinal
	// ErrNotInHandler is returned by Message.Progress for a Message that is
	// not being handled by this instance: one the caller made, a reply, or
	// one whose handler returned.
	ErrNotInHandler = errors.New("disker: the message is not being handled here")
)

// WithRetention keeps the message's fate for d after its final outcome
// (replied, handled, dead-lettered, timed out, cancelled, expired), for
// Result and WaitResult to find by its id: its state, attempts, times, the
// reply its sender received or its error, the worker that ran it, and its
// latest progress (Message.Progress). d must be from 1ms to MaxRetention.
//
// The send records the message (ResultQueued) in the same atomic step that
// stores it, each start records its attempt, and the final outcome is
// recorded in the step that settles the message, so that the retained fate
// is the outcome its sender saw (see docs/results.md). The receiver's
// retained bytes are capped (Config.MaxResultBytes): over the cap, the
// results closest to the end of their retention go first.
func WithRetention(d time.Duration) SendOption {
	return func(o *sendOptions) { o.retention, o.retentionSet = d, true }
}

// WithResultRetention keeps the fate of each message of the receiver for d
// after its final outcome, as WithRetention does, when the message was
// sent without a retention of its own. The record of such a message is
// made when this instance starts it: before that, Result finds nothing. d
// must be from 1ms to MaxRetention.
func WithResultRetention(d time.Duration) HandleOption {
	return func(o *handleOptions) {
		if d < time.Millisecond || d > MaxRetention {
			o.setErr(invalid("WithResultRetention", "must be from 1ms to %v (MaxRetention), got %v", MaxRetention, d))
			return
		}
		o.retention = d
	}
}

// ResultState is the state of a message as its retained result tells it.
type ResultState int

// The states of a Result. ResultQueued and ResultRunning are not final.
const (
	// ResultQueued: sent (queued, or deferred), not started yet.
	ResultQueued ResultState = iota + 1
	// ResultRunning: a worker started it, and there is no final outcome
	// yet (it may be retried).
	ResultRunning
	// ResultSucceeded: handled; Reply is the reply its sender received,
	// if it has one.
	ResultSucceeded
	// ResultFailed: handled, and its sender received an error (Err).
	ResultFailed
	// ResultDeadLettered: moved to the dead-letter stream; Err holds the
	// reason (Code CodeDeadLetter).
	ResultDeadLettered
	// ResultTimedOut: its deadline (WithTimeout) passed without a reply
	// accepted: its sender received a timeout notice.
	ResultTimedOut
	// ResultCancelled: cancelled (Cancel, or its Request's ctx ended).
	ResultCancelled
	// ResultExpired: dropped unstarted, its expiry (WithExpiry) passed.
	ResultExpired
)

// String returns the state's name in lower case.
func (s ResultState) String() string {
	switch s {
	case ResultQueued:
		return "queued"
	case ResultRunning:
		return "running"
	case ResultSucceeded:
		return "succeeded"
	case ResultFailed:
		return "failed"
	case ResultDeadLettered:
		return "dead_lettered"
	case ResultTimedOut:
		return "timed_out"
	case ResultCancelled:
		return "cancelled"
	case ResultExpired:
		return "expired"
	}
	return fmt.Sprintf("ResultState(%d)", int(s))
}

// Final reports whether s is a final state: the message's outcome is
// decided for good.
func (s ResultState) Final() bool { return s >= ResultSucceeded }

// Result is the retained fate of a message (WithRetention). Times are in
// the local clock, corrected to the broker's; zero when not known or not
// yet.
type Result struct {
	// ID and Receiver name the message.
	ID       string
	Receiver string
	// State is what became of it.
	State ResultState
	// Attempts is the number of the latest attempt started (0: none yet).
	Attempts int
	// Worker is the id of the instance (Disker.ID) that ran the latest
	// attempt.
	Worker string
	// SentAt, StartedAt (the first attempt) and FinishedAt (the final
	// outcome).
	SentAt, StartedAt, FinishedAt time.Time
	// Deadline is the message's deadline (WithTimeout), zero if none.
	Deadline time.Time
	// Reply is the content of the reply its sender received, nil if none;
	// for a fire-and-forget message, its handler's response (which nobody
	// received): the result keeps it.
	Reply []byte
	// ReplyHeaders are that reply's headers.
	ReplyHeaders map[string]string
	// Err is the error its sender received, or why it failed (the
	// dead-letter reason); nil if none.
	Err *RemoteError
	// Progress is the latest progress its handler recorded
	// (Message.Progress), nil if none.
	Progress []byte
	// ExpiresAt is when the result goes.
	ExpiresAt time.Time
	// Batch is the id of the batch the message is a child of (WithBatch,
	// Batch.Send, a chain's step), "" if none.
	Batch string
}

// Result returns the retained result of message id, sent to receiver with
// a retention (WithRetention, or its receiver's WithResultRetention). A
// message whose outcome is not decided yet has a Result too, with State
// ResultQueued or ResultRunning (State.Final is false); WaitResult waits for the
// final one. It returns ErrResultNotFound when there is none (see there).
func (d *Disker) Result(ctx context.Context, receiver, id string) (*Result, error) {
	if err := checkName("receiver", receiver); err != nil {
		return nil, err
	}
	if _, ok := idTime(id); !ok {
		return nil, invalid("id", "%q is not a message id (26 characters of Crockford base32, as Send returns)", id)
	}
	rec, err := call(d, "result", func() (broker.ResultRecord, error) { return d.b.Result(ctx, receiver, id) })
	if err != nil {
		return nil, err
	}
	return d.resultOf(&rec), nil
}

// WaitResult returns the final result of message id, as Result does,
// reading it again (every 20ms at first, every second at most) until it is
// final or ctx ends (with ctx's error). It returns ErrResultNotFound as
// Result does, at once.
func (d *Disker) WaitResult(ctx context.Context, receiver, id string) (*Result, error) {
	wait := 20 * time.Millisecond
	var timer *time.Timer
	for {
		r, err := d.Result(ctx, receiver, id)
		if err != nil || r.State.Final() {
			return r, err
		}
		if timer == nil {
			timer = time.NewTimer(wait)
			defer timer.Stop()
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
		}
		wait = min(2*wait, time.Second)
	}
}

// ListResults returns up to max of receiver's final retained results, the
// latest to go first (for the dashboard and the command line).
func (d *Disker) ListResults(ctx context.Context, receiver string, max int) ([]*Result, error) {
	if err := checkName("receiver", receiver); err != nil {
		return nil, err
	}
	if max < 1 {
		return nil, invalid("max", "must be >= 1, got %d", max)
	}
	recs, err := call(d, "list results", func() ([]broker.ResultRecord, error) { return d.b.ListResults(ctx, receiver, max) })
	if err != nil {
		return nil, err
	}
	out := make([]*Result, len(recs))
	for i := range recs {
		out[i] = d.resultOf(&recs[i])
	}
	return out, nil
}

// resultOf turns a broker record into a Result. What the sender received
// decides first: a reply recorded (its error code tells a dead letter, a
// cancellation or an expiry told to the sender); else, for a timed
// message from a named sender, a deadline passed in broker time (no reply
// was accepted by then, so its pending timeout gave the sender a timeout
// notice); else a cancellation (a Request's caller that gave up saw it
// cancelled); else a dead letter recorded before the deadline (its sender
// was sent the dead-letter error then); else a deadline passed; else the
// receiver's state.
func (d *Disker) resultOf(rec *broker.ResultRecord) *Result {
	r := &Result{
		ID: rec.ID, Receiver: rec.Receiver, Attempts: rec.Attempts, Worker: rec.Worker,
		SentAt: d.b.Local(rec.Sent), StartedAt: d.b.Local(rec.Started), FinishedAt: d.b.Local(rec.Finished),
		Deadline: d.b.Local(rec.Deadline), Progress: rec.Progress, ExpiresAt: d.b.Local(rec.Expires), Batch: rec.Batch,
	}
	if rec.ErrorCode != "" || rec.ErrorText != "" {
		r.Err = &RemoteError{Code: rec.ErrorCode, Text: rec.ErrorText, MessageID: rec.ID}
	}
	timedOut := !rec.Deadline.IsZero() && !rec.Now.Before(rec.Deadline)
	switch {
	case rec.Reply != nil:
		r.Reply, r.ReplyHeaders = rec.Reply.Content, rec.Reply.Headers
		if r.Reply == nil {
			r.Reply = []byte{}
		}
		r.State = ResultSucceeded
		if code := rec.Reply.ErrorCode; code != "" || rec.Reply.ErrorText != "" {
			r.Reply = nil
			r.Err = &RemoteError{Code: code, Text: rec.Reply.ErrorText, MessageID: rec.ID}
			r.State = map[string]ResultState{CodeDeadLetter: ResultDeadLettered, CodeCancelled: ResultCancelled,
				CodeExpired: ResultExpired}[code]
			if r.State == 0 {
				r.State = ResultFailed
			}
		}
	case timedOut && rec.Route == broker.RouteSender:
		r.State = ResultTimedOut
	case rec.State == broker.ResultCancelled:
		r.State = ResultCancelled
	case rec.State == broker.ResultDeadLettered && !rec.Finished.IsZero() && (rec.Deadline.IsZero() || rec.Finished.Before(rec.Deadline)):
		// Dead-lettered before its deadline: its sender was sent the
		// dead-letter error then (its error reply, when its record was
		// not reached where it was accepted: on a Cluster, a Request's
		// inbox or a sender in another slot).
		r.State = ResultDeadLettered
	case timedOut:
		r.State = ResultTimedOut
	default:
		r.State = map[broker.ResultState]ResultState{broker.ResultQueued: ResultQueued, broker.ResultRunning: ResultRunning,
			broker.ResultDone: ResultSucceeded, broker.ResultDeadLettered: ResultDeadLettered, broker.ResultExpired: ResultExpired,
			broker.ResultTimedOut: ResultTimedOut}[rec.State]
		if r.State == ResultSucceeded && r.Err != nil {
			r.State = ResultFailed
		}
	}
	if r.State.Final() && r.FinishedAt.IsZero() && timedOut {
		r.FinishedAt = d.b.Local(rec.Deadline)
	}
	return r
}

// recordReply records the notice msg's sender received after msg was
// settled (its cancellation, its dead letter), msg.sentReply once
// accepted, on msg's retained result, when it has one: the broker
// recorded it already where it accepted it when it could (one Redis
// server); on a Cluster whose slots part the sender and the receiver, this
// is the step that records it, and its record is final (cancelled,
// dead-lettered) already, so nothing else changes.
func (d *Disker) recordReply(ctx context.Context, msg *Message) {
	if msg.retention <= 0 || msg.sentReply == nil {
		return
	}
	err := d.b.FinishResult(ctx, &broker.FinishResultParams{Receiver: msg.Receiver, ID: msg.ID, State: broker.ResultDone,
		Worker: d.id, Reply: msg.sentReply, Retention: msg.retention})
	if err != nil {
		d.log.Warn("disker: cannot record the cancellation notice on the message's result", "receiver", msg.Receiver, "id", msg.ID, "error", err)
	}
}

// Progress reports data as the progress of msg, a message this instance
// is handling. Call it from the handler, before it returns. It goes to
// two places, each where it applies:
//
//   - a message with a retained result (WithRetention,
//     WithResultRetention) records it there, where Result finds it: the
//     result keeps the latest progress, with the final outcome too;
//   - a message from a RequestStream (see Streamed) sends it to its
//     caller, whose iterator yields it in order with the partial replies,
//     with Part.Progress set. It counts toward MaxPartials.
//
// A message with neither records and sends nothing: Progress returns
// nil. A message with both records it first, then sends it.
//
// It returns ErrNotInHandler for a Message not being handled here,
// ErrResultFinal once the handler returned or the message's outcome is
// decided (replied, cancelled; for a streamed message, also when the
// broker refuses the progress as late, its deadline passed or its caller
// gone: the error matches ErrLate as well), an error
// when data is over MaxProgressSize, and for a streamed message the
// errors of Partial (ErrPartialCap, ErrLeaseLost).
func (msg *Message) Progress(ctx context.Context, data []byte) error {
	switch {
	case msg == nil || msg.settle == nil || msg.owner == nil:
		return ErrNotInHandler
	case len(data) > MaxProgressSize:
		return invalid("data", "%d bytes is over the limit of %d (MaxProgressSize)", len(data), MaxProgressSize)
	case msg.settle.Load() != taskRunning:
		return ErrResultFinal
	}
	if msg.retention > 0 {
		d := msg.owner
		if err := d.record("progress", d.b.SetProgress(ctx, msg.Receiver, msg.ID, data)); err != nil {
			return err
		}
	}
	if !msg.stream {
		return nil
	}
	err := msg.partial(ctx, broker.PartProgress, data)
	if errors.Is(err, ErrLate) {
		return fmt.Errorf("disker: progress of message %s: its request has its final outcome, or its caller has gone: %w (%w)", msg.ID, ErrResultFinal, ErrLate)
	}
	return err
}
