package disker

import (
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Message is a message between a sender and a receiver.
//
// Set the fields Receiver, Content, and optionally Sender and Headers, to
// send one: what a message is lives in these fields, and how it is sent
// (its timeout, due time, priority, keys) in SendOptions. A message without a Sender is
// fire-and-forget: nobody receives a reply. Disker sets the rest on the
// messages it delivers.
type Message struct {
	// ID is the message's id, set by Send.
	ID string
	// Sender is the sender's name: its reply address. Empty for a
	// fire-and-forget message, and for Request (which replies to the
	// instance's private address).
	Sender string
	// Receiver is the name of the receiver the message goes to.
	Receiver string
	// Content is the payload, up to Config.MaxMessageSize bytes.
	Content []byte
	// Headers are optional key/value metadata, delivered with the message.
	Headers map[string]string

	// Deadline is set on delivered messages sent with a timeout: the
	// deadline in the local clock (the broker decides by its own clock;
	// Disker corrects for the difference). Zero if none.
	Deadline time.Time
	// Attempt is set on delivered messages: 1 on the first delivery, and one
	// more on each redelivery.
	Attempt int
	// InReplyTo is set on replies: the id of the request answered.
	InReplyTo string
	// Error is set on replies that carry an error instead of a response,
	// such as a request that was dead-lettered (Code CodeDeadLetter).
	Error *RemoteError
	// Priority is set on delivered messages: the level it was sent with
	// (WithPriority).
	Priority Priority
	// Group is set on delivered messages: the group key it was sent with
	// (WithGroup), or empty.
	Group string

	// timeout is the timeout the message was sent with (WithTimeout), set
	// on delivered messages; 0 if none.
	timeout time.Duration
	// route is where a reply to a delivered message goes, decoded once
	// at delivery: nowhere (fire-and-forget), its Sender's reply stream,
	// or a Request's inbox (see Disker.reply). noReply is set with it for
	// RouteNone, so that a Message the caller made (route unset) expects
	// a reply when it has a Sender.
	route   broker.Route
	noReply bool
	// brokerDeadline is Deadline in the broker's clock, as delivered: a
	// reply to a Request is judged against it (see Disker.reply).
	brokerDeadline time.Time
	// replyHeaders are the headers of the reply (SetReplyHeader).
	replyHeaders map[string]string
	// idemKey is the idempotency key of a delivered message from an
	// idempotent Request: its reply is stored under the key and sent to
	// the key's waiters (see Disker.replyIdempotent).
	idemKey string
	// settle is the state of the delivery being handled (taskRunning,
	// taskSettled, taskCancelled), set on delivered messages: a reply is
	// sent only while it is not cancelled, and a cancellation only takes
	// one not settled.
	settle *atomic.Int32
	// retention is how long a delivered message's result is kept: its
	// own (WithRetention), else its receiver's (WithResultRetention); 0
	// for none. owner is the instance handling it (Progress, Partial),
	// and sentReply the reply its sender received, once accepted, for the
	// record of its final outcome.
	retention time.Duration
	owner     *Disker
	sentReply *broker.Envelope
	// stream is set on a delivered message from a RequestStream: its
	// handler may send partial replies (Partial), and its replies settle
	// the stream (see broker.Streams).
	stream bool
}

// replyTo is where a reply to msg, a delivered message, goes: its Sender
// (a sender's name, or a Request's inbox) when it has a reply route and a
// valid one, else "".
func (msg *Message) replyTo() string {
	if msg.route == broker.RouteNone || broker.CheckName("sender", msg.Sender) != nil {
		return ""
	}
	return msg.Sender
}

// SetReplyHeader sets header key to value on the reply to msg, a message
// this instance received: the reply a handler returns, or the one sent by
// Reply, carries it in its Headers. Call it from the handler, before it
// returns or calls Reply.
func (msg *Message) SetReplyHeader(key, value string) {
	if msg.replyHeaders == nil {
		msg.replyHeaders = make(map[string]string, 1)
	}
	msg.replyHeaders[key] = value
}

// ExpectsReply reports whether a reply to msg, a message this instance
// received, reaches anyone: false for a fire-and-forget message (sent
// without a Sender), whose handler's response is discarded and for which
// Reply returns ErrFireAndForget.
func (msg *Message) ExpectsReply() bool {
	return msg.Sender != "" && !msg.noReply
}

// wantsReply reports whether a reply to msg, a delivered message, goes
// anywhere: to its sender, or stored under its idempotency key for the
// sends that joined it.
func (msg *Message) wantsReply() bool {
	return msg.ExpectsReply() || msg.idemKey != ""
}

// messageOf turns a delivered envelope into a Message.
func (d *Disker) messageOf(env *broker.Envelope, deadline time.Time, attempt int) *Message {
	m := new(Message)
	d.setMessage(m, env, deadline, attempt)
	return m
}

// setMessage sets *m to the Message of a delivered envelope, as messageOf
// makes it, for a caller that holds the Message in memory of its own.
func (d *Disker) setMessage(m *Message, env *broker.Envelope, deadline time.Time, attempt int) {
	*m = Message{
		ID:        env.ID,
		Sender:    env.Sender,
		Receiver:  env.Receiver,
		Content:   env.Content,
		Headers:   env.Headers,
		Deadline:  d.b.Local(deadline),
		Attempt:   attempt,
		InReplyTo: env.InReplyTo,
		Priority:  Priority(env.Priority),

		timeout:        env.Timeout,
		route:          env.Route,
		noReply:        env.Route == broker.RouteNone,
		brokerDeadline: deadline,
		idemKey:        env.IdempotencyKey,
		retention:      env.Retention,
		owner:          d,
		stream:         env.Stream,
	}
	if env.ErrorCode != "" {
		m.Error = &RemoteError{Code: env.ErrorCode, Text: env.ErrorText}
	}
}
