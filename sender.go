package disker

// The side of a named sender: the handlers of its replies and timeout
// notices (OnReply, OnTimeout), and the goroutines that read reply streams.

import (
	"context"
	"errors"
	"runtime/debug"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// replyLease is how long a reply-stream entry read by an instance stays
// with it before another instance of the sender may read it again.
const replyLease = 30 * time.Second

// replyBatch is how many reply-stream entries a reader takes at a time.
const replyBatch = 128

// senderHandlers are the handlers of one sender in this instance, and the
// reader of its reply stream.
type senderHandlers struct {
	timeout TimeoutHandler
	reply   ReplyHandler
	reader  *replyReader
	// defaultReply says reply is OnTimeout's default (defaultReplyHandler).
	defaultReply bool
	// pinned says the monitor watches the sender for these handlers.
	pinned bool
}

// replyReader is the goroutine that reads one reply stream (a sender's,
// or the inbox).
type replyReader struct {
	cancel context.CancelFunc
	done   chan struct{}
}

func (d *Disker) addSenderHandler(sender string, set func(*senderHandlers) bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return ErrClosed
	}
	s := d.senders[sender]
	if s == nil {
		s = &senderHandlers{}
		d.senders[sender] = s
	}
	if !set(s) {
		return ErrAlreadyRegistered
	}
	if s.reader == nil && !s.pinned {
		if !d.manual { // by hand, the kit hands the entries on (manual.go)
			s.reader = d.startReader(func(ctx context.Context) { d.readReplies(ctx, sender) })
		}
		s.pinned = true
		d.monitor.pin(sender)
	}
	return nil
}

func (d *Disker) removeSenderHandler(sender string, clear func(*senderHandlers) bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed.Load() {
		return ErrClosed
	}
	s := d.senders[sender]
	if s == nil || !clear(s) {
		return ErrNotHandled
	}
	if s.timeout == nil && s.reply == nil {
		// The reader goroutine stops by itself; d.wg awaits it on Close.
		if s.reader != nil {
			s.reader.cancel()
		}
		d.monitor.unpin(sender)
		delete(d.senders, sender)
	}
	return nil
}

// startReader starts run, a reading loop, until the reader is cancelled
// or the instance closes. Call with d.mu held.
func (d *Disker) startReader(run func(ctx context.Context)) *replyReader {
	ctx, cancel := context.WithCancel(d.bgCtx)
	r := &replyReader{cancel: cancel, done: make(chan struct{})}
	d.wg.Go(func() {
		defer close(r.done)
		run(ctx)
	})
	return r
}

// readReplies reads sender's reply stream until ctx ends, hands each entry
// to its handler, and acknowledges each entry after its handler returned.
func (d *Disker) readReplies(ctx context.Context, sender string) {
	// One params value for the loop's life: a read allocates none.
	rp := broker.ReadRepliesParams{Sender: sender, Consumer: d.id, Max: replyBatch, Block: d.cfg.ReceiverBlockTimeout, Lease: replyLease}
	d.readLoop(ctx, sender, replyStream{
		read: func(ctx context.Context) ([]broker.Reply, error) { return d.b.ReadReplies(ctx, &rp) },
		ack: func(ctx context.Context, refs ...string) error {
			return d.b.AckReplies(ctx, sender, refs...)
		},
		handle: func(ctx context.Context, r *broker.Reply) { d.dispatchReply(ctx, sender, r) },
	})
}

// replyStream is how a reading loop reads, acknowledges and hands on the
// entries of one reply stream.
type replyStream struct {
	read   func(ctx context.Context) ([]broker.Reply, error)
	ack    func(ctx context.Context, refs ...string) error
	handle func(ctx context.Context, r *broker.Reply)
}

// readLoop reads s, the reply stream of name, until ctx ends, hands each
// entry on, and acknowledges each entry after it was handled.
func (d *Disker) readLoop(ctx context.Context, name string, s replyStream) {
	acks := newAcker(d, "sender", name, s.ack)
	defer acks.close(ctx) // ctx has ended by then: one try per batch
	var bo pacer
	for ctx.Err() == nil {
		rs, err := s.read(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, broker.ErrClosed) {
				return
			}
			d.health.fail("read replies", err)
			if !bo.wait(ctx.Done()) {
				return
			}
			continue
		}
		bo.reset()
		d.health.ok()
		for i := range rs {
			s.handle(ctx, &rs[i])
			acks.add(rs[i].Ref) // even when ctx ended: the handler ran
		}
	}
}

func (d *Disker) dispatchReply(ctx context.Context, sender string, r *broker.Reply) {
	if r.Kind == broker.KindTimeout {
		d.timedOut.Add(1)
		if d.onEvent != nil {
			d.emit(Event{Kind: EventTimedOut, Receiver: r.Env.Receiver, Sender: sender, MessageID: r.RequestID})
		}
	}
	d.mu.Lock()
	s := d.senders[sender]
	var th TimeoutHandler
	var rh ReplyHandler
	if s != nil {
		th, rh = s.timeout, s.reply
	}
	d.mu.Unlock()
	msg := d.messageOf(&r.Env, time.Time{}, 0)
	switch {
	case r.Kind == broker.KindTimeout && th != nil:
		d.safely("timeout handler", sender, r.RequestID, func() { th.HandleTimeout(ctx, msg) })
	case r.Kind == broker.KindReply && rh != nil:
		d.safely("reply handler", sender, r.RequestID, func() { rh.HandleReply(ctx, msg) })
	default:
		d.log.Warn("disker: no handler for a reply-stream entry; dropped", "sender", sender, "id", r.RequestID, "kind", kindName(r.Kind))
	}
}

// safely runs f and logs a panic instead of crashing the reader.
func (d *Disker) safely(what, sender, id string, f func()) {
	defer func() {
		if v := recover(); v != nil {
			d.log.Error("disker: "+what+" panicked", "sender", sender, "id", id, "panic", v, "stack", string(debug.Stack()))
		}
	}()
	f()
}

func kindName(k broker.ReplyKind) string {
	if k == broker.KindTimeout {
		return "timeout"
	}
	return "reply"
}
