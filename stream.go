package disker

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// MaxPartials is the most partial replies (Message.Partial) one delivery
// attempt of a message may send, its progress streamed to the caller
// (Message.Progress) counted with them: the next one returns an error
// matching ErrPartialCap and is not sent. A redelivery (a new attempt)
// counts anew.
const MaxPartials = 10_000

// Errors of streamed requests. Check them with errors.Is.
var (
	// ErrNotStreamed is returned by Message.Partial for a message whose
	// sender does not read partial replies: one sent by Send (named sender
	// or fire-and-forget) or by Request. Only RequestStream reads them; a
	// handler that serves both kinds asks Message.Streamed first.
	ErrNotStreamed = errors.New("disker: nobody streams this message's replies: partial replies go with RequestStream")
	// ErrPartialCap is returned by Message.Partial when the attempt has
	// sent MaxPartials partial replies already: the partial was not sent.
	ErrPartialCap = broker.ErrPartialCap
)

// Part is one item of a RequestStream: a partial reply, the handler's
// progress, or the final reply.
type Part struct {
	// Content is a partial reply's data, as the handler sent it
	// (Message.Partial), or its progress when Progress is set; nil on the
	// final reply.
	Content []byte
	// Progress is set when Content is the handler's progress
	// (Message.Progress), not a piece of the reply.
	Progress bool
	// Attempt is the delivery attempt of the handler that sent the
	// partial: 1, and one more for each redelivery (see Restart).
	Attempt int
	// Restart is set on the first partial of an attempt that follows
	// partials of an earlier attempt: the message was delivered again (its
	// worker died, or lost its lease) and its new handler starts over, so
	// what the earlier attempt sent should be dropped. The attempts of a
	// stream never go back: once a later attempt has sent a partial, an
	// earlier one's partials are refused.
	Restart bool
	// Reply is set on the last item alone, when the request ended with a
	// reply: the reply message, as Request returns it.
	Reply *Message
}

// Streamed reports whether msg, a message this instance received, comes
// from a RequestStream, which reads its partial replies (Partial).
func (msg *Message) Streamed() bool { return msg.stream }

// Partial sends data to the caller of msg's RequestStream as a partial
// reply, before the final one (the reply the handler returns, or Reply).
// Call it from msg's handler, as often as needed, up to MaxPartials times
// per attempt; data is at most Config.MaxMessageSize bytes. Each call
// returns once the broker has appended the partial to the caller's inbox:
// the caller gets the partials of one handler in the order they were
// sent, and every one of them before the final outcome.
//
// A partial is accepted only while the request is not settled, in one
// atomic step of the broker: once its final reply, its timeout (its
// deadline passed, by the broker's clock) or its cancellation is in,
// Partial returns an error matching ErrLate and sends nothing. It returns
// ErrNotStreamed for a message that does not come from a RequestStream
// (see Streamed), ErrPartialCap over the cap, an error matching
// ErrLeaseLost when a later delivery attempt of the message has sent
// partials already, and a *ValidationError for a message that was not
// delivered to a handler of this instance, or data over the size limit.
func (msg *Message) Partial(ctx context.Context, data []byte) error {
	return msg.partial(ctx, broker.PartData, data)
}

// partial sends a partial reply of kind with data for msg (see Partial).
func (msg *Message) partial(ctx context.Context, kind broker.PartKind, data []byte) error {
	switch {
	case msg == nil:
		return invalid("Message", "must not be nil")
	case msg.owner == nil || msg.settle == nil:
		return invalid("Message", "partial replies are sent from the handler of a message this instance delivered")
	case ctx == nil:
		return invalid("ctx", "must not be nil")
	case !msg.stream:
		return fmt.Errorf("disker: partial to message %s: %w", msg.ID, ErrNotStreamed)
	case len(data) > msg.owner.cfg.MaxMessageSize:
		return invalid("data", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(data), msg.owner.cfg.MaxMessageSize)
	case msg.settle.Load() == taskCancelled:
		return fmt.Errorf("disker: partial to message %s: the message was cancelled: %w", msg.ID, ErrLate)
	}
	d := msg.owner
	err := d.b.Partial(ctx, &broker.PartialParams{Inbox: msg.Sender, RequestID: msg.ID, Attempt: msg.Attempt,
		Kind: kind, Data: data, Deadline: msg.brokerDeadline, Max: MaxPartials})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, broker.ErrLate):
		return fmt.Errorf("disker: partial to message %s: the request has its final outcome (a reply, its timeout or its cancellation) or its caller has gone: %w", msg.ID, ErrLate)
	case errors.Is(err, broker.ErrPartialCap):
		return fmt.Errorf("disker: partial to message %s: attempt %d sent %d partial replies already (MaxPartials): %w", msg.ID, msg.Attempt, MaxPartials, ErrPartialCap)
	case errors.Is(err, broker.ErrLeaseLost):
		return fmt.Errorf("disker: partial to message %s: attempt %d: %w", msg.ID, msg.Attempt, err)
	}
	return d.record("partial", err)
}

// RequestStream sends msg to msg.Receiver as Request does, and returns the
// iterator of its replies: each partial reply the handler sends
// (Message.Partial) and each progress it reports (Message.Progress, with
// Part.Progress set) in order, then exactly one final item, the last: the
// reply (Part.Reply, with a nil error), or the error Request would return
// (a *RemoteError, an error matching ErrTimeout, ctx's error, ...). The
// final outcome is decided as Request's is, and a partial is never
// yielded after it: the broker refuses a partial once the request is
// settled.
//
// The message is sent when the iteration starts, and the iterator is
// single-use: ranging over it again yields an error alone. A caller that
// stops ranging before the final item (break) gives the request up as a
// cancelled ctx does: the message is cancelled (see Cancel), and its
// handler's later partials and reply are refused with ErrLate.
//
// A redelivered message (its worker died, or lost its lease) streams
// again from its new attempt: its first partial has Part.Restart set, and
// the final outcome is still exactly one. Invalid arguments (those
// Request refuses, and WithIdempotencyKey, whose Requests share one reply
// but could not share a stream) are yielded as the only item.
func (d *Disker) RequestStream(ctx context.Context, msg Message, opts ...SendOption) iter.Seq2[Part, error] {
	q, err := d.newRequest(msg, opts)
	if err == nil && q.ps[0].Env.IdempotencyKey != "" {
		q, err = nil, invalid("WithIdempotencyKey", "Requests with one key share one reply, not one stream: it goes with Request, not with RequestStream")
	}
	if err == nil && ctx == nil {
		q, err = nil, invalid("ctx", "must not be nil")
	}
	var used atomic.Bool
	return func(yield func(Part, error) bool) {
		switch {
		case err != nil:
			yield(Part{}, err)
		case !used.CompareAndSwap(false, true):
			yield(Part{}, errors.New("disker: RequestStream: the iterator was ranged over already: it sends its message once"))
		default:
			q.ps[0].Env.Stream = true
			q.w.stream = true
			q.stream(ctx, yield)
		}
	}
}

// stream runs a RequestStream's request q with ctx, yielding its items:
// the phases of Request (see request), with waitStream for wait.
func (q *request) stream(ctx context.Context, yield func(Part, error) bool) {
	ctx, cancel := q.bound(ctx)
	defer cancel()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	if err := q.prepare(ctx); err != nil {
		yield(Part{}, err)
		return
	}
	if err := q.open(); err != nil {
		yield(Part{}, err)
		return
	}
	defer q.close()
	if m, done, err := q.send(); done {
		yield(finalPart(m, err))
		return
	}
	var s streamState
	m, decided, err := q.waitStream(&s, yield)
	switch {
	case decided:
		if s.yieldParts(q, yield) {
			yield(finalPart(m, err))
		}
	case !s.ended:
		// The caller stopped ranging before the outcome: give the
		// request up as a cancelled ctx does.
		stop()
		_, _, _ = q.end()
	}
}

// finalPart is the last item of a stream whose outcome is m or err.
func finalPart(m *Message, err error) (Part, error) {
	if err != nil {
		return Part{}, err
	}
	return Part{Reply: m}, nil
}

// streamState is where a RequestStream's iteration is.
type streamState struct {
	attempt int  // the attempt of the last partial yielded
	ended   bool // ctx ended, and end settled the request
}

// yieldParts yields the partial replies q's waiter passed, and reports
// whether the caller wants more.
func (s *streamState) yieldParts(q *request, yield func(Part, error) bool) bool {
	for _, e := range q.w.takeParts() {
		if e.Part != broker.PartData && e.Part != broker.PartProgress {
			continue
		}
		p := Part{Content: e.Env.Content, Progress: e.Part == broker.PartProgress, Attempt: e.Attempt,
			Restart: s.attempt != 0 && e.Attempt > s.attempt}
		s.attempt = e.Attempt
		if !yield(p, nil) {
			return false
		}
	}
	return true
}

// waitStream is wait, which calls it with s and yield nil, for a
// RequestStream as well: it yields the partial replies as they come, and
// returns the outcome with decided true (its partials not yet yielded: see
// yieldParts), or decided false when the caller stopped ranging first.
func (q *request) waitStream(s *streamState, yield func(Part, error) bool) (m *Message, decided bool, err error) {
	ended := q.ctx.Done()
	var grace <-chan time.Time
	for {
		select {
		case <-q.w.ready:
			if e, ok := q.w.decide(q.deadline, q.marker.Ref); ok {
				m, err := q.settle(&e)
				return m, true, err
			}
			if s != nil && !s.yieldParts(q, yield) {
				return nil, false, nil
			}
		case <-q.d.closing:
			return nil, true, ErrClosed
		case <-ended:
			ended = nil
			if s != nil {
				s.ended = true
			}
			if m, done, err := q.end(); done {
				return m, true, err
			}
			t := time.NewTimer(max(time.Until(q.stop), 0))
			defer t.Stop()
			grace = t.C
		case <-grace:
			return nil, true, q.unknown(fmt.Errorf("the inbox's entries were not read by %v after the end", RequestGrace))
		}
	}
}
