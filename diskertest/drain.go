package diskertest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// maxDrain bounds the deliveries and reply-stream entries one Drain hands
// on: a handler that sends to its own receiver at each run, or that fails
// for ever with no backoff, would otherwise never let it end.
const maxDrain = 10_000

// Drain runs, on the test's goroutine, the handlers of what is due at the
// kit's clock, until nothing is: the messages of the receivers that the
// kit's Disker serves (Handle), one at a time (those of a batch handler,
// HandleBatch, in batches of up to its batch size), each through its handler
// and the settling of its outcome (reply and acknowledgement, retry or
// dead letter), and the replies and timeout notices of the senders it has
// handlers for (OnReply, OnTimeout). What the handlers send is run too,
// in the same Drain, when it is due. With names, it runs only the
// receivers and senders named.
//
// It runs the messages as the Disker's own loops would: in the order of
// the broker (priority, then retries and expired leases, then the
// oldest), none whose deadline or expiry passed (those are dropped, as
// Expired), none of a paused receiver, and no more than a rate limit
// (WithRateLimit) allows at the kit's time. A message deferred, or
// retried after a delay, is due once Advance reaches its time.
//
// Drain returns the deliveries it ran, in order, with their outcomes. It
// fails the test when a name is neither a receiver served nor a sender
// with handlers, when the broker fails, and when more than 10,000
// deliveries and replies came due in one Drain (a handler that sends to
// its own receiver each time, or fails for ever with no backoff).
func (k *Kit) Drain(names ...string) []Delivery {
	k.t.Helper()
	receivers, senders := k.in.Names()
	if len(names) > 0 {
		receivers, senders = k.named(names, receivers, senders)
	}
	ctx := context.Background()
	first := k.rec.count()
	for total := 0; ; {
		// Handlers may add or remove receivers and senders meanwhile.
		if len(names) == 0 {
			receivers, senders = k.in.Names()
		} else {
			receivers, senders = k.still(receivers, senders)
		}
		n := 0
		for _, r := range receivers {
			got, err := k.in.Drain(ctx, r, maxDrain+1-total-n)
			if err != nil {
				k.t.Fatalf("diskertest: Drain: %v", err)
			}
			n += got
		}
		for _, s := range senders {
			got, err := k.in.DrainReplies(ctx, s, maxDrain+1-total-n)
			if err != nil {
				k.t.Fatalf("diskertest: Drain: %v", err)
			}
			n += got
		}
		if total += n; total > maxDrain {
			k.t.Fatalf("diskertest: Drain: more than %d deliveries and replies, and more are due: does a handler send to its own receiver each time it runs, or fail for ever with no backoff?", maxDrain)
		}
		if n == 0 {
			return k.rec.deliveredFrom(first, "")
		}
	}
}

// still returns those of receivers and senders that are still served
// and have handlers.
func (k *Kit) still(receivers, senders []string) (rs, ss []string) {
	served, handled := k.in.Names()
	for _, r := range receivers {
		if slices.Contains(served, r) {
			rs = append(rs, r)
		}
	}
	for _, s := range senders {
		if slices.Contains(handled, s) {
			ss = append(ss, s)
		}
	}
	return rs, ss
}

// named returns the receivers and senders among names, and fails the test
// for a name that is neither.
func (k *Kit) named(names, receivers, senders []string) (rs, ss []string) {
	k.t.Helper()
	for _, name := range names {
		r, s := slices.Contains(receivers, name), slices.Contains(senders, name)
		if !r && !s {
			k.t.Fatalf("diskertest: Drain(%q): neither a receiver the kit's Disker serves (Handle: %s) nor a sender it has handlers for (OnReply, OnTimeout: %s)",
				name, list(receivers), list(senders))
		}
		if r && !slices.Contains(rs, name) {
			rs = append(rs, name)
		}
		if s && !slices.Contains(ss, name) {
			ss = append(ss, name)
		}
	}
	return rs, ss
}

// list is names quoted and separated by commas, or "none".
func list(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = `"` + n + `"`
	}
	return strings.Join(q, ", ")
}

// Delivered returns the deliveries to receiver that Drain ran, in order,
// with their outcomes; every receiver's when receiver is "". A message
// retried is there once per delivery.
func (k *Kit) Delivered(receiver string) []Delivery { return k.rec.deliveredFrom(0, receiver) }

// Sent returns the messages that the kit's broker accepted for receiver,
// in order: sent by Send, SendBatch, SendEach and Request, and by the
// ticks of schedules; every receiver's when receiver is "". It is what was
// sent, whether or not it was delivered since.
func (k *Kit) Sent(receiver string) []Sent { return k.rec.sentTo(receiver) }

// Replies returns the replies accepted for sender, a named sender (the
// Sender of the messages answered), in order: the responses of handlers,
// the Replies made, and the error replies (Message.Error set) of dead
// letters, expired and cancelled messages. The replies to a Request are
// in the Reply of its Delivery.
func (k *Kit) Replies(sender string) []disker.Message { return k.rec.repliesTo(sender) }

// DeadLetters returns the dead letters of receiver, oldest first, as
// Disker.DeadLetters lists them. It fails the test when the broker fails.
func (k *Kit) DeadLetters(receiver string) []disker.DeadLetter {
	k.t.Helper()
	dls, err := k.d.DeadLetters(context.Background(), receiver, maxDrain)
	if err != nil {
		k.t.Fatalf("diskertest: DeadLetters: %v", err)
	}
	return dls
}

// ErrNoReply is the error of Kit.Request when the Drain that followed the
// Request's send did not answer it: its message was retried, deferred,
// not handled, or its handler replies later.
var ErrNoReply = errors.New("diskertest: no reply: the Drain after the Request did not answer it")

// Request sends msg as Disker.Request does (with opts), runs Drain, and
// returns the Request's outcome: the reply, or the error Request returns
// (a *disker.RemoteError for a dead letter, one matching disker.ErrExpired
// for an expired message, a *disker.ValidationError for bad input). When
// the Drain did not answer it, Request cancels it (which cancels its
// message, as a cancelled Request does) and returns ErrNoReply.
//
// A Request made by the code under test waits for its reply as in
// production, while the test runs the receiver's handler: call Drain from
// the test's goroutine while the code under test waits on another.
func (k *Kit) Request(msg disker.Message, opts ...disker.SendOption) (*disker.Message, error) {
	k.t.Helper()
	type result struct {
		m   *disker.Message
		err error
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan result, 1)
	stop := make(chan struct{})
	from := len(k.rec.sentTo(""))
	go func() {
		defer close(stop)
		m, err := k.d.Request(ctx, msg, opts...)
		done <- result{m, err}
	}()
	s, ok := k.rec.waitSent(from, func(s *Sent) bool { return s.Request && s.Message.Receiver == msg.Receiver }, stop)
	if !ok { // it ended before its message was sent
		r := <-done
		return r.m, r.err
	}
	id := s.Message.ID
	k.Drain()
	answered := k.rec.answered(id)
	if !answered {
		cancel()
	}
	t := time.NewTimer(requestWait)
	defer t.Stop()
	select {
	case r := <-done:
		if !answered && errors.Is(r.err, context.Canceled) {
			return nil, ErrNoReply
		}
		return r.m, r.err
	case <-t.C:
		k.t.Fatalf("diskertest: Request: no outcome %v after the Drain that answered it", requestWait)
		return nil, nil
	}
}

// requestWait bounds the wait of Kit.Request for an outcome that the
// broker has: the Request's reader hands it on at once.
const requestWait = 10 * time.Second
