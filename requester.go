package disker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// RequestGrace bounds how long a Request runs past its context's end (its
// deadline, or its cancellation): the time it has to settle the request in
// the broker and read the outcome. Whatever the broker does (down, stalled,
// paused), Request returns by then; when the broker could not settle it in
// time, Request returns ErrOutcomeUnknown.
const RequestGrace = 500 * time.Millisecond

// requester is the instance's side of Request: its private reply
// address, the inbox, with the Requests waiting on it and the reader that
// hands them their entries. How a Request is sent, waits and is settled is
// decided here, and only here (the broker's side is broker.Inbox).
//
// The inbox's state in the broker, a reply stream, must not outlive the
// instance, so it carries an expiry (broker.Inbox.KeepInbox): the first
// Request opens the inbox with one, each heartbeat renews it, and Close
// deletes the state once the Requests have returned
// (broker.Inbox.CloseInbox). An instance that crashes leaves it to expire.
// The expiry covers three heartbeat intervals past the later of now and
// the latest deadline of a Request (plus inboxMargin), so a Request never
// loses its state while the instance lives, even if a few heartbeats fail.
//
// Replies to it use broker.Inbox.ReplyInbox: once the inbox has gone, a
// reply is dropped (the replier gets ErrLate) instead of re-creating a
// reply stream that nobody reads.
type requester struct {
	d    *Disker
	name string // the inbox's address: "_inbox." and the instance's id

	reader   *replyReader   // started by the first Request; guarded by d.mu
	requests sync.WaitGroup // Requests in progress

	mu     sync.Mutex
	open   bool      // the broker has it open (KeepInbox succeeded once)
	until  time.Time // local time until which the broker keeps it, at least
	latest time.Time // the latest deadline of a Request sent from it
	// renewing is the renewal of the inbox's expiry in flight, if any:
	// one at a time, made with r.mu released, so that a renewal that
	// the broker does not answer holds up no Request past its context.
	renewing *renewal

	waitMu  sync.Mutex
	waiters map[string]*waiter
}

// newRequester returns the requester of d, whose inbox is not open yet.
func newRequester(d *Disker) *requester {
	// Users cannot pick such a name: '_' is not allowed at the start of a
	// user's name (see ValidateName).
	return &requester{d: d, name: "_inbox." + d.id, waiters: make(map[string]*waiter)}
}

// inboxMargin is how long after a Request's deadline the inbox must still
// hold its state: the Request appends its marker at the deadline (again
// if the broker's clock was behind), and the reader needs a block time to
// read it.
func (r *requester) inboxMargin() time.Duration {
	return r.d.cfg.ReceiverBlockTimeout + 5*time.Second
}

// inboxTTL is the expiry of the inbox's state from now. Call with r.mu
// held.
func (r *requester) inboxTTL(now time.Time) time.Duration {
	ttl := 3 * r.d.cfg.HeartbeatInterval
	if wait := r.latest.Add(r.inboxMargin()).Sub(now); wait > 0 {
		ttl += wait
	}
	return ttl
}

// renewal is one renewal of the inbox's expiry (KeepInbox): done is
// closed when it ended, with err its outcome.
type renewal struct {
	now  time.Time     // when it began
	ttl  time.Duration // the expiry it sets, from now
	done chan struct{}
	err  error
}

// beginRenewal records a renewal of the inbox's expiry, to cover r.latest,
// as the one in flight, and returns it; the caller must make it (renew).
// Call with r.mu held and no renewal in flight.
func (r *requester) beginRenewal() *renewal {
	now := time.Now()
	w := &renewal{now: now, ttl: r.inboxTTL(now), done: make(chan struct{})}
	r.renewing = w
	return w
}

// renew makes renewal w in the broker, with ctx, and records its outcome.
// Call without r.mu held.
func (r *requester) renew(ctx context.Context, w *renewal) error {
	err := r.d.b.KeepInbox(ctx, r.name, w.ttl)
	r.mu.Lock()
	if err == nil {
		r.open, r.until = true, w.now.Add(w.ttl)
	}
	w.err = err
	r.renewing = nil
	r.mu.Unlock()
	close(w.done)
	return err
}

// covers reports whether the broker keeps the inbox open past deadline
// (zero: none) and its margin. Call with r.mu held.
func (r *requester) covers(deadline time.Time) bool {
	return r.open && (deadline.IsZero() || !deadline.Add(r.inboxMargin()).After(r.until))
}

// ensureInbox makes the inbox ready for a Request with deadline (zero for
// none), until ctx ends: it starts reading it, counts the Request in for
// Close to wait on, and makes sure the broker keeps the inbox past the
// deadline. A renewal it needs runs on a goroutine of its own, which it
// waits for until ctx ends (the broker's I/O may outlast ctx), and which
// other Requests may share. On success the caller must call
// r.requests.Done when the Request returns.
func (r *requester) ensureInbox(ctx context.Context, deadline time.Time) error {
	d := r.d
	d.mu.Lock()
	if d.closed.Load() {
		d.mu.Unlock()
		return ErrClosed
	}
	r.requests.Add(1)
	if r.reader == nil {
		r.reader = d.startReader(r.readInbox)
	}
	d.mu.Unlock()

	r.mu.Lock()
	if deadline.After(r.latest) {
		r.latest = deadline
	}
	for !r.covers(deadline) {
		w := r.renewing
		if w == nil {
			w = r.beginRenewal()
			// Counted in r.requests, as this Request is: Close waits for it.
			r.requests.Go(func() { _ = r.renew(d.opCtx, w) })
		}
		r.mu.Unlock()
		select {
		case <-w.done:
		case <-ctx.Done():
			r.requests.Done()
			return ctx.Err()
		}
		r.mu.Lock()
		if w.err != nil {
			r.mu.Unlock()
			r.requests.Done()
			// The closed check is above, under d.mu, with the count for Close.
			return d.record("request", w.err)
		}
	}
	r.mu.Unlock()
	return nil
}

// heartbeat renews the inbox's expiry, if it is open and no renewal is in
// flight already.
func (r *requester) heartbeat(ctx context.Context) {
	r.mu.Lock()
	if !r.open || r.renewing != nil {
		r.mu.Unlock()
		return
	}
	w := r.beginRenewal()
	r.mu.Unlock()
	if err := r.renew(ctx, w); err != nil && ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
		r.d.health.fail("keep inbox", err)
	}
}

// close deletes the inbox's state in the broker, if it was opened.
// Close calls it once the Requests have returned and the reader stopped.
func (r *requester) close(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.open {
		return
	}
	if err := r.d.b.CloseInbox(ctx, r.name); err != nil {
		r.d.log.Warn("disker: cannot delete the inbox; it expires by itself", "inbox", r.name, "error", err)
		return
	}
	r.open = false
}

// Request sends msg to msg.Receiver and waits for the reply, which it
// returns. msg.Sender must be empty: the message is sent from this
// instance's private reply address, with ctx's deadline as its timeout
// (WithTimeout may shorten it), so the
// reply and the timeout are decided by the broker's clock at one point:
// the reply counts if the broker appended it to the inbox before the
// deadline, and the replier of any other is told ErrLate. Request sees
// exactly one of them.
//
// It returns an error matching ErrTimeout (and context.DeadlineExceeded)
// when no reply came in time, a *RemoteError when the reply carries an error
// (for instance, the message was dead-lettered after its last attempt), and
// ctx's error when ctx was cancelled before a deadline; a reply that was
// already in the inbox then is returned instead. A cancelled ctx cancels
// the message (see Cancel): one not delivered yet never is, and when a
// worker holds it, Request waits (within RequestGrace) for the worker's
// outcome: the reply if the handler replied before the cancellation reached
// the worker, else ctx's error, and then the handler's reply is refused
// with ErrLate; when the worker has not answered by then, the outcome is
// unknown (ErrOutcomeUnknown, which matches ctx's error too): its reply may
// still be accepted. When the broker cannot be
// reached, Request returns an error matching ErrUnavailable at once, unless
// the connection broke after the message was written: then the message may
// have been queued all the same, so Request waits for its deadline and
// settles the request as it would have, returning the reply or an error
// that matches ErrTimeout and says that the send failed. Without a deadline in ctx
// the message has no timeout: Request waits until ctx is cancelled.
//
// With WithIdempotencyKey, Requests with the same key share one message
// and one reply: a Request whose key was answered already returns that
// reply at once, and one whose key is being handled waits for it.
//
// Whatever the broker does (down, refusing connections, resetting them,
// unreachable with its sockets open for any length of time, paused),
// Request returns by ctx's end plus RequestGrace. When the broker
// could not settle the request by then, or its settlement could not be
// read by then, it returns ErrOutcomeUnknown (not
// ErrTimeout): a reply the broker accepted before the deadline may then go
// unread, its replier told it was accepted, so the requester must not take
// the request for timed out (the gateway answers 504 all the same).
//
// The private reply address, the inbox, is "_inbox." followed by the
// instance's id (see requester). Its state in the broker (a reply stream) lives as long as
// the instance: it carries an expiry that the heartbeat renews
// (Config.HeartbeatInterval; it always covers the deadlines of the
// Requests in flight), Close deletes it once the Requests have returned,
// and the broker deletes it by itself some heartbeat intervals after an
// instance crashed. A reply that comes after the inbox has gone is dropped
// (the replier gets ErrLate) and re-creates nothing.
func (d *Disker) Request(ctx context.Context, msg Message, opts ...SendOption) (*Message, error) {
	q, err := d.newRequest(msg, opts)
	if err != nil {
		return nil, err
	}
	ctx, cancel := q.bound(ctx)
	defer cancel()
	if err := q.prepare(ctx); err != nil {
		return nil, err
	}
	if err := q.open(); err != nil {
		return nil, err
	}
	defer q.close()
	if m, done, err := q.send(); done {
		return m, err
	}
	return q.wait()
}

// request is one Request in progress. Its phases are its methods, in
// order: newRequest checks the call and makes the message; prepare sets
// its timeout; open readies the inbox and the waiter; send sends it,
// which may decide the outcome at once; wait waits for the inbox's entry
// that decides it (settle). When ctx ends first, end settles the request
// within RequestGrace: cancelOwn (a cancelled ctx cancels the message, and
// a worker that holds it decides), giveUp (the request's marker in the
// inbox; ErrOutcomeUnknown when the broker does not answer in time), then
// the grace in which an entry before the marker may still decide it.
type request struct {
	d           *Disker
	r           *requester
	receiver    string
	onSent      func(string)  // WithOnSent's
	withTimeout time.Duration // WithTimeout's
	// lead is how long until the message is due (WithDelay,
	// WithDeliverAt): WithTimeout counts from then.
	lead time.Duration

	ps      [1]broker.SendParams // the message's send
	id      string               // the message's id
	ctx     context.Context      // Request's, bounded by WithTimeout
	dl      time.Time            // ctx's deadline; zero without one
	timeout time.Duration        // the message's timeout, from its delivery; 0 for none
	w       waiter               // the request's entries in the inbox, once open

	deadline time.Time // the deadline replies are judged by (the broker's), once sent
	sendErr  error     // the send failed, and the message may have been queued all the same
	// stop is when Request returns at the latest: RequestGrace after ctx's
	// end; known from the start when ctx has a deadline, else once ctx
	// ended (see ending).
	stop   time.Time
	marker broker.Reply // the request's marker in the inbox, once it gave up
}

// newRequest checks a Request of msg with opts, and returns it with its
// message, from the inbox, not sent.
func (d *Disker) newRequest(msg Message, opts []SendOption) (*request, error) {
	if msg.Sender != "" {
		return nil, invalid("Message.Sender", "must be empty for Request: the reply goes to the instance's private address")
	}
	if err := d.checkContent(&msg); err != nil {
		return nil, err
	}
	o := sendOptionsOf(nil, opts)
	if err := o.check(true); err != nil { // the inbox is the sender
		return nil, err
	}
	switch {
	case o.debounce:
		return nil, invalid("WithDebounce", "a later send may replace the message, which then has no reply of its own to wait for: it goes with Send, not with Request")
	case o.then != nil:
		return nil, invalid("WithThen", "goes with Send: a Request waits for its own reply, not for a chain")
	case o.batchSet:
		return nil, invalid("WithBatch", "goes with Send, SendBatch and SendEach, not with Request")
	}
	q := &request{d: d, r: d.rq, receiver: msg.Receiver, onSent: o.onSent, withTimeout: o.timeout}
	if o.later() {
		q.lead = o.delay
		if !o.at.IsZero() {
			q.lead = max(time.Until(o.at), 0)
		}
	}
	msg.Sender = q.r.name
	o.params(&q.ps[0], &msg, broker.RouteInbox)
	q.id = q.ps[0].Env.ID
	return q, nil
}

// bound returns ctx bounded by WithTimeout, which counts from the
// message's due time.
func (q *request) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if q.withTimeout > 0 {
		return context.WithTimeout(ctx, q.lead+q.withTimeout)
	}
	return ctx, func() {}
}

// prepare gives the message ctx's deadline as its timeout, counted from
// its delivery. A deadline that comes before the delivery is a
// *ValidationError.
func (q *request) prepare(ctx context.Context) error {
	q.ctx = ctx
	p := &q.ps[0]
	p.Env.Timeout = 0
	dl, hasDeadline := ctx.Deadline()
	if hasDeadline {
		measured := time.Now()
		timeout := max(dl.Sub(measured), time.Millisecond)
		if q.lead > 0 {
			if timeout <= q.lead {
				return invalid("WithDelay", "the Request's deadline (ctx's, or WithTimeout's) comes before its delivery time, %v from now", q.lead)
			}
			timeout -= q.lead // counted from the delivery
		}
		// The deadline counts from now, however long the inbox and the
		// send take to reach the broker (broker.SendParams.TimeoutFrom).
		p.Env.Timeout, p.TimeoutFrom = timeout, measured
	}
	q.dl, q.timeout = dl, p.Env.Timeout
	if hasDeadline {
		q.stop = dl.Add(RequestGrace)
	}
	return nil
}

// ending records that ctx has ended, now: Request returns by RequestGrace
// from now, or from its deadline if that is sooner.
func (q *request) ending() {
	if s := time.Now().Add(RequestGrace); q.stop.IsZero() || s.Before(q.stop) {
		q.stop = s
	}
}

// open readies the inbox for the request (requester.ensureInbox) and
// registers its waiter, unless ctx ended already. Once it succeeded, close
// must follow.
func (q *request) open() error {
	if err := q.ctx.Err(); err != nil {
		return q.ended()
	}
	if err := q.r.ensureInbox(q.ctx, q.dl); err != nil {
		switch {
		case errors.Is(err, ErrClosed):
		case q.ctx.Err() != nil:
			return q.ended()
		case errors.Is(err, context.DeadlineExceeded):
			// The broker saw the deadline pass a moment before ctx did.
			return q.d.requestEnded(q.id, context.DeadlineExceeded)
		}
		return err
	}
	q.w.ready = make(chan struct{}, 1)
	q.r.waitMu.Lock()
	q.r.waiters[q.id] = &q.w
	q.r.waitMu.Unlock()
	return nil
}

// close undoes open: the inbox's entries for the request go nowhere, and
// Close no longer waits for it.
func (q *request) close() {
	q.r.waitMu.Lock()
	delete(q.r.waiters, q.id)
	q.r.waitMu.Unlock()
	q.r.requests.Done()
}

// send sends the message, and returns done true with the Request's result
// when the send decides it: a failed send, a duplicate (WithDedupKey), or
// an idempotent Request whose key has its reply already (Joined). A send
// that failed because the broker could not be reached, when the message
// has a deadline, decides nothing: the message may have been queued all
// the same (the write made, its answer lost), so the request is settled
// as any other, so that a reply is either returned or refused, and sendErr
// keeps the failure. The replies are then judged against deadline: the
// broker's, or ctx's when the send did not end (see sendApart).
func (q *request) send() (*Message, bool, error) {
	ok, err := q.sendApart()
	if !ok {
		// q.ps is the send's still.
		q.deadline, q.sendErr = q.dl, fmt.Errorf("%w: the send did not end within %v after the Request's end", ErrUnavailable, q.sendGrace())
		if q.deadline.IsZero() {
			return nil, true, q.sendErr
		}
		return nil, false, nil
	}
	p := &q.ps[0]
	res := &p.Result
	q.deadline = res.Deadline
	if err == nil {
		switch res.Outcome {
		case broker.Duplicate:
			return nil, true, &DuplicateError{ID: res.ID, Receiver: q.receiver, Key: p.DedupKey}
		case broker.Joined:
			if res.Reply != nil {
				// An idempotent Request whose key has its reply already.
				res.Reply.InReplyTo = q.id
				m, err := q.d.outcome(q.id, &broker.Reply{Kind: broker.KindReply, RequestID: q.id, Env: *res.Reply})
				return m, true, err
			}
		}
		return nil, false, nil
	}
	if !errors.Is(err, ErrUnavailable) || q.deadline.IsZero() {
		return nil, true, err
	}
	q.sendErr = err
	return nil, false, nil
}

// sendApart sends the message and returns ok true with the send's error
// (its Result's, or the call's); or ok false when its time ran out first:
// sendGrace after ctx's end. Over Redis the send runs on a goroutine of
// its own (goSend): whatever the broker's client does (a stalled
// connection holds the commands pipelined on it, a reconnection those
// that come meanwhile), the Request goes on by its bound, the rest of
// RequestGrace left to settle it; a write the send started may still be
// made then, and q.ps is then the send's (nothing reads it any more).
//
// A cancelled ctx does not interrupt the send (it moves the end of its
// time: see ending): an interrupted send leaves it unknown whether the
// message was queued, and so whether a reply may still be accepted.
// WithOnSent's hook is called here, on Request's goroutine, once the
// message was stored.
func (q *request) sendApart() (bool, error) {
	sctx := context.WithoutCancel(q.ctx)
	d, ps := q.d, q.ps[:]
	sent := func(err error) (bool, error) {
		if err == nil {
			err = ps[0].Result.Err
		}
		afterSent(ps, func(int) func(string) { return q.onSent })
		return true, err
	}
	if !d.remote { // the in-memory broker answers at once
		return sent(d.send(sctx, ps))
	}
	job := d.goSend(sctx, ps)
	if job == nil {
		return sent(ErrClosed)
	}
	// end fires at the end of the send's time, once known (a deadline, or
	// ctx's end).
	t := sendTimers.Get().(*time.Timer)
	defer sendTimers.Put(t)
	defer t.Stop()
	var end <-chan time.Time
	if e := q.sendEnd(); !e.IsZero() {
		t.Reset(time.Until(e))
		end = t.C
	}
	ended := q.ctx.Done()
	for {
		select {
		case err := <-job.done:
			job.release()
			return sent(err)
		case <-ended:
			ended = nil
			q.ending() // moves the end
			t.Reset(time.Until(q.sendEnd()))
			end = t.C
		case <-end:
			return false, nil // its time ran out
		}
	}
}

// sendGrace is how long after ctx's end the send may take: the rest of
// RequestGrace is left to give up (see end).
func (q *request) sendGrace() time.Duration { return RequestGrace * 9 / 10 }

// sendEnd is the end of the send's time (see sendGrace); zero while it is
// not known (ctx has no deadline and has not ended).
func (q *request) sendEnd() time.Time {
	if q.stop.IsZero() {
		return time.Time{}
	}
	return q.stop.Add(q.sendGrace() - RequestGrace)
}

// wait waits for the request's outcome, and returns it. The outcome is the
// first reply appended before the deadline. Once ctx ends, end settles the
// request in the inbox with a marker: one at or after the deadline leaves
// no room for a reply after it; one before the deadline (ctx was
// cancelled) leaves the replies after it unread. From then on the outcome
// is that first reply if it precedes the marker, else the marker. When
// neither was read by the end of the grace, the broker has decided the
// outcome but the Request does not know it: ErrOutcomeUnknown, not ctx's
// error, which a reply accepted before the marker would belie. Close ends
// the wait with ErrClosed.
func (q *request) wait() (*Message, error) {
	m, _, err := q.waitStream(nil, nil)
	return m, err
}

// settle returns the Request's result from e, the inbox's entry that
// decided it (waiter.decide). A reply is the outcome, but for the worker's
// cancelled notice to a Request whose ctx was cancelled: that notice came
// after cancelOwn stopped waiting for it (the worker learns of a
// cancellation at its next poll of the marks). The notice, or the
// request's marker, ends the Request with ctx's error: a timeout, which
// it counts, or the cancellation; a send that failed is named in it.
func (q *request) settle(e *broker.Reply) (*Message, error) {
	if e.Kind == broker.KindReply && !(q.ctx.Err() == context.Canceled && isCancelledNotice(e)) {
		return q.d.outcome(q.id, e)
	}
	if q.ctx.Err() == context.DeadlineExceeded {
		q.d.countTimeout(q.receiver, q.id)
	}
	if q.sendErr != nil {
		return nil, fmt.Errorf("%w (its send failed, and it may not have been queued: %v)", q.ended(), q.sendErr)
	}
	return nil, q.ended()
}

// end settles the request when ctx ended before its outcome, by the end of
// its grace, stop: RequestGrace after ctx's end (its deadline, or its
// cancellation if sooner), with a tenth of it at least to try. A
// cancelled ctx first cancels the message (cancelOwn), which may decide
// the outcome. Then a message without a timeout has nothing to settle:
// ctx's error; one with a timeout gets the request's marker in the inbox
// (giveUp), and the entry that decides it may come until stop. done is
// true when end decided the Request's result itself.
func (q *request) end() (*Message, bool, error) {
	now := time.Now()
	q.ending()
	if q.ctx.Err() == context.Canceled {
		// Six tenths of the grace at most to cancel, and a tenth of it
		// left to give up; a worker that holds the message has until
		// stop to answer.
		until := now.Add(RequestGrace * 6 / 10)
		if last := q.stop.Add(-RequestGrace / 10); last.Before(until) {
			until = last
		}
		if m, done, err := q.cancelOwn(until, q.stop); done {
			return m, true, err
		}
	}
	if q.timeout == 0 && !q.w.stream {
		// A streamed request is settled all the same: its handler's
		// partials stop at the marker.
		return nil, true, q.ended()
	}
	if err := q.giveUp(); err != nil {
		return nil, true, err
	}
	return nil, false, nil
}

// cancelOwn cancels the message, within until, now that nobody waits for
// its reply (requester.cancelOwn). One not delivered yet never will be;
// the worker that holds one settles it, with its reply or a cancelled
// notice, whichever came first there, so that the Request and the replier
// agree. done is true when that decided the result: the reply, or ctx's
// error. Otherwise the request is settled in its inbox as any other, but
// for a message a worker holds that did not answer by stop: its reply may
// still be accepted (the inbox takes a reply until the deadline), so the
// outcome is unknown (ErrOutcomeUnknown). A streamed request's marker
// settles it for good (later replies are refused), so it gives up as any
// other.
func (q *request) cancelOwn(until, stop time.Time) (*Message, bool, error) {
	wait := stop
	if q.w.stream {
		wait = until
	}
	e, ok, inFlight := q.r.cancelOwn(&q.w, q.receiver, q.id, q.deadline, until, wait)
	if !ok {
		if inFlight && !q.w.stream {
			return nil, true, q.unknown(errors.New("the worker that holds the message did not answer its cancellation"))
		}
		return nil, false, nil
	}
	if e.Kind == broker.KindReply && !isCancelledNotice(&e) {
		m, err := q.d.outcome(q.id, &e)
		return m, true, err
	}
	return nil, true, q.ended()
}

// giveUp appends the request's marker to the inbox (requester.giveUp),
// trying until stop, which it moves to a tenth of RequestGrace from now if
// that is sooner. When the broker did not answer by then, the outcome is
// unknown (a reply may have been accepted before the deadline all the
// same): giveUp returns ErrOutcomeUnknown, which matches ErrUnavailable
// and ctx's error too, and counts the timeout, if it was one.
func (q *request) giveUp() error {
	if floor := time.Now().Add(RequestGrace / 10); q.stop.Before(floor) {
		q.stop = floor
	}
	r, id, deadline, stop := q.r, q.id, q.deadline, q.stop
	timedOut := q.ctx.Err() == context.DeadlineExceeded
	stream := q.w.stream
	marker, ok, err := within(r, stop, func() (broker.Reply, error) { return r.giveUp(id, deadline, timedOut, stream, stop) })
	if !ok {
		err = fmt.Errorf("the broker did not answer by %v after the end", RequestGrace)
	}
	if err != nil {
		return q.unknown(err)
	}
	q.marker = marker
	return nil
}

// unknown is the Request's error when it cannot tell its outcome by the
// end of its grace, for the reason why: ErrOutcomeUnknown, which matches
// ErrUnavailable and ctx's error too. It counts the timeout, if it was one.
func (q *request) unknown(why error) error {
	if q.ctx.Err() == context.DeadlineExceeded {
		q.d.countTimeout(q.receiver, q.id)
	}
	return fmt.Errorf("%w (request %s: %w): %w: %v", ErrOutcomeUnknown, q.id, q.ctx.Err(), ErrUnavailable, why)
}

// ended is the Request's error when ctx ended first (requestEnded).
func (q *request) ended() error {
	return q.d.requestEnded(q.id, q.ctx.Err())
}

// cancelOwn cancels message id of receiver, sent by a Request (waiting
// as w) whose context was cancelled, within until. When the message was
// not delivered yet, no reply can come: it returns a marker-kind entry
// and true. When a worker holds it, it waits until wait for the worker's
// outcome, the first reply before deadline (the reply, or the worker's
// cancelled notice), and returns it and true. Otherwise (not found: the
// reply, if any, is on its way; or no answer in time, inFlight) it
// returns false, and the Request settles the request in its inbox as
// before.
func (r *requester) cancelOwn(w *waiter, receiver, id string, deadline, until, wait time.Time) (e broker.Reply, ok, inFlight bool) {
	d := r.d
	res, ok, err := within(r, until, func() (CancelResult, error) {
		ctx, cancel := context.WithDeadline(d.opCtx, until)
		defer cancel()
		return d.cancel(ctx, receiver, id, false)
	})
	if !ok || err != nil {
		if err != nil {
			d.log.Debug("disker: cannot cancel the message of a cancelled Request", "receiver", receiver, "id", id, "error", err)
		}
		return broker.Reply{}, false, false
	}
	switch res {
	case CancelQueued, CancelDeferred:
		return broker.Reply{Kind: broker.KindTimeout, RequestID: id}, true, false
	case CancelInFlight:
	default:
		return broker.Reply{}, false, false
	}
	t := time.NewTimer(max(time.Until(wait), 0))
	defer t.Stop()
	for {
		if e, ok := w.decide(deadline, ""); ok {
			return e, true, true
		}
		select {
		case <-w.ready:
		case <-t.C:
			return broker.Reply{}, false, true
		case <-d.closing:
			return broker.Reply{}, false, true
		}
	}
}

// giveUp appends Request id's marker to the inbox (and settles a streamed
// request: see broker.Streams). When the Request's
// deadline has passed (timedOut), it appends markers until one is at or
// after the deadline by the broker's clock, which may be a little behind
// the local one: that marker settles the request as timed out. While the
// broker cannot be reached, it tries again until stop: until a marker is
// in, a reply may still be accepted (so a replier may be told its reply
// was accepted for a Request that returned a timeout: at-least-once
// delivery allows it).
func (r *requester) giveUp(id string, deadline time.Time, timedOut, stream bool, stop time.Time) (broker.Reply, error) {
	d := r.d
	var bo pacer
	for {
		ctx, cancel := context.WithDeadline(d.opCtx, stop)
		var m broker.Reply
		var err error
		if stream {
			m, err = d.b.GiveUpStream(ctx, r.name, id)
		} else {
			m, err = d.b.GiveUp(ctx, r.name, id)
		}
		cancel()
		switch {
		case errors.Is(err, broker.ErrLate):
			return m, errors.New("the inbox has expired")
		case errors.Is(err, broker.ErrClosed):
			return m, err
		case err != nil:
			d.health.fail("give up", err)
			if !bo.waitUntil(d.closing, stop) {
				return m, err
			}
			continue
		case !timedOut || !m.At.Before(deadline):
			d.health.ok()
			return m, nil
		}
		if !sleepUntil(max(deadline.Sub(m.At), time.Millisecond), d.closing, stop) {
			return m, fmt.Errorf("the broker's clock did not reach the deadline by %v after it", RequestGrace)
		}
	}
}

// within runs f on its own goroutine, which Close waits for, and returns
// its results, or ok false if stop (zero: none) comes first; f then ends
// alone.
func within[T any](r *requester, stop time.Time, f func() (T, error)) (v T, ok bool, err error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	r.requests.Add(1)
	go func() {
		defer r.requests.Done()
		v, err := f()
		done <- result{v, err}
	}()
	var timeout <-chan time.Time
	if !stop.IsZero() {
		t := time.NewTimer(time.Until(stop))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case res := <-done:
		return res.v, true, res.err
	case <-timeout:
		return v, false, nil
	}
}

// countTimeout counts a Request's timeout, and reports it.
func (d *Disker) countTimeout(receiver, id string) {
	d.timedOut.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventTimedOut, Receiver: receiver, Sender: d.rq.name, MessageID: id})
	}
}

// requestEnded is Request's error when ctx ended first.
func (d *Disker) requestEnded(id string, ctxErr error) error {
	if ctxErr == context.Canceled {
		return fmt.Errorf("disker: request %s: %w", id, ctxErr)
	}
	return timeoutErr(id, ctxErr)
}

// outcome turns the reply to request id into Request's result.
func (d *Disker) outcome(id string, r *broker.Reply) (*Message, error) {
	m := d.messageOf(&r.Env, time.Time{}, 0)
	if m.Error != nil {
		m.Error.MessageID = id
		return nil, m.Error
	}
	return m, nil
}

// waiter is a Request waiting for its outcome: the inbox's entries for
// it, in the order the inbox's reader read them, which is the order they
// were appended.
type waiter struct {
	mu      sync.Mutex
	entries []broker.Reply
	next    int           // entries before it were looked at and decided nothing
	ready   chan struct{} // signalled when entries were added
	// first backs entries while there is one, the common case: a reply.
	first [1]broker.Reply
	// stream is set for a RequestStream: decide keeps the partial replies
	// it passes in parts, in order, for takeParts.
	stream bool
	parts  []broker.Reply
}

// takeParts returns the partial replies decide passed since the last
// call, in order.
func (w *waiter) takeParts() []broker.Reply {
	w.mu.Lock()
	defer w.mu.Unlock()
	ps := w.parts
	w.parts = nil
	if w.next == len(w.entries) {
		// All looked at: a long stream's entries do not pile up.
		w.entries, w.next = w.entries[:0], 0
	}
	return ps
}

func (w *waiter) add(r *broker.Reply) {
	w.mu.Lock()
	if w.entries == nil {
		w.entries = w.first[:0]
	}
	w.entries = append(w.entries, *r)
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// decide looks at the entries not looked at yet, in order, for the one
// that settles the Request: a reply appended before deadline (any reply
// when there is none), or the Request's marker (ref marker, once it gave
// up). Other entries are replies that came too late, earlier markers, and
// partial replies (kept for a RequestStream: see takeParts).
func (w *waiter) decide(deadline time.Time, marker string) (broker.Reply, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ; w.next < len(w.entries); w.next++ {
		e := w.entries[w.next]
		switch {
		case e.Kind == broker.KindPartial:
			if w.stream {
				w.parts = append(w.parts, e)
			}
		case e.Kind == broker.KindReply && (deadline.IsZero() || e.At.Before(deadline)):
			return e, true
		case e.Kind == broker.KindTimeout && marker != "" && e.Ref == marker:
			return e, true
		}
	}
	return broker.Reply{}, false
}

// deliverOutcome hands an inbox entry to the Request that waits for it, if
// any (a Request that returned has gone). Request counts its own timeouts.
func (r *requester) deliverOutcome(e *broker.Reply) {
	r.waitMu.Lock()
	w := r.waiters[e.RequestID]
	r.waitMu.Unlock()
	if w != nil {
		w.add(e)
	}
}

// isCancelledNotice reports whether e is a worker's cancelled notice (see
// consumer.notifyCancelled): to a Request whose own cancellation took the
// message, not a reply but the end of it.
func isCancelledNotice(e *broker.Reply) bool {
	return e.Env.ErrorCode == CodeCancelled
}

// readInbox reads the inbox until ctx ends and hands each entry to the
// Request that waits for it.
func (r *requester) readInbox(ctx context.Context) {
	d := r.d
	handed := false
	d.readLoop(ctx, r.name, replyStream{
		read: func(ctx context.Context) ([]broker.Reply, error) {
			if handed {
				yieldToWoken() // the Requests it handed entries to
			}
			rs, err := d.b.ReadInbox(ctx, r.name, replyBatch, d.cfg.ReceiverBlockTimeout)
			handed = len(rs) > 0
			return rs, err
		},
		ack: func(ctx context.Context, refs ...string) error {
			return d.b.AckInbox(ctx, r.name, refs...)
		},
		handle: func(_ context.Context, e *broker.Reply) { r.deliverOutcome(e) },
	})
}
