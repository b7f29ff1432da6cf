package diskertest

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/broker"
)

// Sent is a message that the kit's broker accepted: queued, or stored for
// later. Sends that stored nothing (a duplicate of WithDedupKey, a repeat
// of WithIdempotencyKey) are not Sent.
type Sent struct {
	// Message is the message as it was sent: its ID, Sender, Receiver,
	// Content, Headers and Priority. Sender is empty for a Request's
	// message (see Request) and a schedule's.
	Message disker.Message
	// At is when the broker accepted it, on the kit's clock.
	At time.Time
	// Due is when it is, or was, queued for its receiver: At, unless it
	// was sent for later (WithDelay, WithDeliverAt).
	Due time.Time
	// Timeout is its timeout (WithTimeout, or a Request's deadline), 0 if
	// none. Deadline is its deadline on the kit's clock (Due plus
	// Timeout, or the end of its idempotency key's window), zero if none.
	Timeout  time.Duration
	Deadline time.Time
	// Expiry is when it expires unstarted (WithExpiry, WithExpireAt), on
	// the kit's clock; zero if never.
	Expiry time.Time
	// DedupKey and IdempotencyKey are its keys (WithDedupKey,
	// WithIdempotencyKey); empty if none.
	DedupKey, IdempotencyKey string
	// Request reports whether Request sent it: its reply goes back to the
	// Request's caller.
	Request bool
	// Schedule is the name of the schedule whose tick sent it; empty for
	// a message sent otherwise.
	Schedule string
}

// Outcome is how a delivery ended (Delivery.Outcome).
type Outcome int

// The outcomes of a delivery.
const (
	// Unsettled: the delivery was not settled: its handler's context
	// ended (the kit's Disker closed, Unhandle) before it returned, and
	// the message waits to be delivered again after its lease.
	Unsettled Outcome = iota
	// Handled: the handler returned without an error (or with
	// disker.ErrReplyLater) and the message was acknowledged, after its
	// reply, if any, was sent.
	Handled
	// Retried: the handler failed, and the message will be delivered
	// again at Delivery.RetryAt.
	Retried
	// DeadLettered: the handler failed for the last time (its last
	// attempt, or an error marked NoRetry), and the message moved to the
	// receiver's dead letters.
	DeadLettered
	// Expired: the message was dropped unstarted, its deadline or its
	// expiry having passed.
	Expired
	// GivenBack: the handler gave the message back without counting an
	// attempt (HandleWithPool had no worker ready).
	GivenBack
	// Cancelled: the message was cancelled (Disker.Cancel) while its
	// handler ran.
	Cancelled
)

var outcomeNames = [...]string{"unsettled", "handled", "retried", "dead-lettered", "expired", "given back", "cancelled"}

// String returns the outcome's name in lower case, such as "retried".
func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Delivery is one delivery of a message to a receiver's handler, which
// Drain ran, and how it ended.
type Delivery struct {
	// Message is the message as the handler got it, but for its
	// Deadline, which is on the kit's clock (the handler's is the local
	// time that the kit's clock would take to reach it).
	Message disker.Message
	// Expiry is when the message expires unstarted, on the kit's clock;
	// zero if never.
	Expiry time.Time
	// Outcome is how the delivery ended.
	Outcome Outcome
	// Err is the handler's error (a *disker.PanicError for a panic); nil
	// when it returned none.
	Err error
	// Reply is the reply sent for this delivery, its message's latest: the
	// response its handler returned, a Reply made to it, or an error reply
	// (Reply.Error is set then: a dead letter's, an expired message's);
	// nil if none.
	Reply *disker.Message
	// RetryAt is when a Retried message is delivered again, on the kit's
	// clock.
	RetryAt time.Time
	// Reason is why a DeadLettered message was dead-lettered.
	Reason string
}

// recorder is the kit's broker: the in-memory broker, with a record of
// what was sent, delivered, settled and replied through it.
type recorder struct {
	broker.Broker
	now func() time.Time

	mu        sync.Mutex
	sent      []Sent
	sentMore  chan struct{} // closed, and made anew, when a message is sent
	delivered []*Delivery
	byKey     map[string]*Delivery // every delivery, by refKey
	open      map[string]bool      // the refKeys of the deliveries not settled yet
	latest    map[string]string    // the refKey of a message's latest delivery, by its id
	replies   []disker.Message
}

func newRecorder(b broker.Broker, now func() time.Time) *recorder {
	return &recorder{Broker: b, now: now, sentMore: make(chan struct{}), byKey: map[string]*Delivery{}, open: map[string]bool{}, latest: map[string]string{}}
}

func refKey(receiver, ref string) string { return receiver + "\x00" + ref }

// Send records the messages the broker stored.
func (r *recorder) Send(ctx context.Context, ps []broker.SendParams) error {
	at := r.now()
	if err := r.Broker.Send(ctx, ps); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range ps {
		if o := ps[i].Result.Outcome; o == broker.Queued || o == broker.Deferred {
			r.addSent(sentOf(&ps[i], at))
		}
	}
	return nil
}

// addSent records s. Callers hold mu.
func (r *recorder) addSent(s Sent) {
	r.sent = append(r.sent, s)
	close(r.sentMore)
	r.sentMore = make(chan struct{})
}

// waitSent waits for the first message sent, from the from-th on, for
// which want is true, and returns it; or false once stop is closed.
func (r *recorder) waitSent(from int, want func(s *Sent) bool, stop <-chan struct{}) (Sent, bool) {
	for {
		r.mu.Lock()
		for ; from < len(r.sent); from++ {
			if s := r.sent[from]; want(&s) {
				r.mu.Unlock()
				return s, true
			}
		}
		more := r.sentMore
		r.mu.Unlock()
		select {
		case <-more:
		case <-stop:
			return Sent{}, false
		}
	}
}

// sentOf is the record of p, stored at at.
func sentOf(p *broker.SendParams, at time.Time) Sent {
	s := Sent{
		Message:        messageOf(&p.Env),
		At:             at,
		Due:            at,
		Timeout:        p.Env.Timeout,
		Deadline:       p.Result.Deadline,
		DedupKey:       p.DedupKey,
		IdempotencyKey: p.Env.IdempotencyKey,
		Request:        p.Env.Route == broker.RouteInbox,
	}
	s.Message.Group = p.GroupKey
	if s.Request {
		s.Message.Sender = ""
	}
	switch {
	case p.Delay > 0:
		s.Due = at.Add(p.Delay)
	case p.DeliverAt.After(at):
		s.Due = p.DeliverAt
	}
	switch {
	case p.Expiry > 0:
		s.Expiry = s.Due.Add(p.Expiry)
	case !p.ExpireAt.IsZero():
		s.Expiry = p.ExpireAt
	}
	return s
}

// messageOf is the Message of env, with copies of its content and headers
// (a sender may reuse its buffer once Send returned).
func messageOf(env *broker.Envelope) disker.Message {
	m := disker.Message{
		ID:        env.ID,
		Sender:    env.Sender,
		Receiver:  env.Receiver,
		Content:   bytes.Clone(env.Content),
		Headers:   maps.Clone(env.Headers),
		InReplyTo: env.InReplyTo,
		Priority:  disker.Priority(env.Priority),
	}
	if env.ErrorCode != "" {
		m.Error = &disker.RemoteError{Code: env.ErrorCode, Text: env.ErrorText, MessageID: env.InReplyTo}
	}
	return m
}

// TickSchedule records the message of a tick that the broker queued.
func (r *recorder) TickSchedule(ctx context.Context, p *broker.TickParams) (broker.TickResult, error) {
	res, err := r.Broker.TickSchedule(ctx, p)
	if err != nil {
		return res, err
	}
	env := p.Env
	switch res.Outcome {
	case broker.TickSent:
	case broker.TickCaughtUp:
		env = p.MissedEnv
	default:
		return res, nil
	}
	s := Sent{Message: messageOf(env), At: res.Now, Due: res.Now, Schedule: p.Name}
	r.mu.Lock()
	r.addSent(s)
	r.mu.Unlock()
	return res, nil
}

// Fetch records the deliveries.
func (r *recorder) Fetch(ctx context.Context, p *broker.FetchParams) ([]broker.Delivery, error) {
	ds, err := r.Broker.Fetch(ctx, p)
	if err != nil {
		return ds, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range ds {
		dl := &ds[i]
		m := messageOf(&dl.Env)
		m.Attempt, m.Deadline, m.Group = dl.Attempt, dl.Deadline, dl.GroupKey
		v := &Delivery{Message: m, Expiry: dl.Expiry}
		r.delivered = append(r.delivered, v)
		key := refKey(p.Receiver, dl.Ref)
		r.byKey[key], r.open[key], r.latest[dl.Env.ID] = v, true, key
	}
	return ds, nil
}

// settle records how the open delivery ref of receiver ended, if it is
// open. Callers hold mu.
func (r *recorder) settle(receiver, ref string, o Outcome) *Delivery {
	return r.settleKey(refKey(receiver, ref), o)
}

// settleKey is settle of the delivery of refKey key. Callers hold mu.
func (r *recorder) settleKey(key string, o Outcome) *Delivery {
	if !r.open[key] {
		return nil
	}
	delete(r.open, key)
	v := r.byKey[key]
	v.Outcome = o
	return v
}

// latestOf returns the latest delivery of message id, and whether it is
// open; nil if there was none. Callers hold mu.
func (r *recorder) latestOf(id string) (*Delivery, bool) {
	key := r.latest[id]
	return r.byKey[key], r.open[key]
}

// Ack records the deliveries handled.
func (r *recorder) Ack(ctx context.Context, receiver string, refs ...string) error {
	return r.settleAll(r.Broker.Ack(ctx, receiver, refs...), receiver, refs, Handled)
}

// Drop records the deliveries dropped unstarted.
func (r *recorder) Drop(ctx context.Context, receiver string, refs ...string) error {
	return r.settleAll(r.Broker.Drop(ctx, receiver, refs...), receiver, refs, Expired)
}

func (r *recorder) settleAll(err error, receiver string, refs []string, o Outcome) error {
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ref := range refs {
		r.settle(receiver, ref, o)
	}
	return nil
}

// Retry records a delivery retried or given back.
func (r *recorder) Retry(ctx context.Context, p *broker.RetryParams) error {
	if err := r.Broker.Retry(ctx, p); err != nil {
		return err
	}
	o := Retried
	if p.Uncounted {
		o = GivenBack
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.settle(p.Receiver, p.Ref, o); v != nil {
		v.RetryAt = r.now().Add(p.Delay)
	}
	return nil
}

// DeadLetter records a delivery dead-lettered.
func (r *recorder) DeadLetter(ctx context.Context, receiver string, d broker.Delivery, reason string) error {
	if err := r.Broker.DeadLetter(ctx, receiver, d, reason); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v := r.settle(receiver, d.Ref, DeadLettered); v != nil {
		v.Reason = reason
	}
	return nil
}

// Cancel records a delivery cancelled while its handler ran. It looks
// for the message from the oldest entry on (see Fate).
func (r *recorder) Cancel(ctx context.Context, p *broker.CancelParams) (broker.Cancelled, error) {
	q := *p
	q.Since = time.Time{}
	res, err := r.Broker.Cancel(ctx, &q)
	if err != nil || res.State != broker.CancelInFlight {
		return res, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, open := r.latestOf(p.ID); open && v.Message.Receiver == p.Receiver {
		r.settleKey(r.latest[p.ID], Cancelled)
	}
	return res, nil
}

// Fate looks for the message from the oldest entry on: the client bounds
// the search by the time in the message's id, which is the local clock's,
// not the kit's.
func (r *recorder) Fate(ctx context.Context, p *broker.FateParams) (broker.Fate, error) {
	q := *p
	q.Since = time.Time{}
	return r.Broker.Fate(ctx, &q)
}

// Reply records a reply accepted for a named sender.
func (r *recorder) Reply(ctx context.Context, reply *broker.Envelope, mode broker.ReplyMode) error {
	if err := r.Broker.Reply(ctx, reply, mode); err != nil {
		return err
	}
	r.replied(reply)
	return nil
}

// ReplyInbox records a reply accepted for a Request.
func (r *recorder) ReplyInbox(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	if err := r.Broker.ReplyInbox(ctx, reply, deadline); err != nil {
		return err
	}
	r.replied(reply)
	return nil
}

func (r *recorder) replied(env *broker.Envelope) {
	m := messageOf(env)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replies = append(r.replies, m)
	if v, _ := r.latestOf(env.InReplyTo); v != nil && v.Reply == nil {
		v.Reply = &m
	}
}

// event records the error of a handler that failed.
func (r *recorder) event(e disker.Event) {
	if e.Kind != disker.EventFailed {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if v, open := r.latestOf(e.MessageID); open && v.Message.Attempt == e.Attempt {
		v.Err = e.Err
	}
}

// deliveredFrom returns copies of the deliveries from the i-th on, to
// receiver ("" for all).
func (r *recorder) deliveredFrom(i int, receiver string) []Delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []Delivery{}
	for _, v := range r.delivered[i:] {
		if receiver == "" || v.Message.Receiver == receiver {
			c := *v
			if c.Reply != nil {
				reply := *c.Reply
				c.Reply = &reply
			}
			out = append(out, c)
		}
	}
	return out
}

// count returns how many deliveries were recorded.
func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.delivered)
}

// sentTo returns the messages sent to receiver ("" for all), in order.
func (r *recorder) sentTo(receiver string) []Sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []Sent{}
	for _, s := range r.sent {
		if receiver == "" || s.Message.Receiver == receiver {
			out = append(out, s)
		}
	}
	return out
}

// repliesTo returns the replies accepted for sender, in order.
func (r *recorder) repliesTo(sender string) []disker.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := []disker.Message{}
	for _, m := range r.replies {
		if m.Receiver == sender {
			out = append(out, m)
		}
	}
	return out
}

// answered reports whether a reply to message id was accepted.
func (r *recorder) answered(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.replies {
		if m.InReplyTo == id {
			return true
		}
	}
	return false
}
