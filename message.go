package disker

import (
	"context"
	"maps"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Message is a message between a sender and a receiver.
//
// Set the fields Sender, Receiver, Content, and optionally Headers,
// FireAndForget and Timeout, to send one; Disker sets the rest on the
// messages it delivers.
type Message struct {
	// ID is the message's id, set by Send.
	ID string
	// Sender is the sender's name: its reply address. Required unless
	// FireAndForget.
	Sender string
	// Receiver is the name of the receiver the message goes to.
	Receiver string
	// Content is the payload, up to Config.MaxMessageSize bytes.
	Content []byte
	// Headers are optional key/value metadata, delivered with the message.
	Headers map[string]string
	// FireAndForget means no reply is expected: Reply is an error and a
	// handler's response is discarded.
	FireAndForget bool
	// Timeout, when > 0, gives the message a deadline of Timeout after Send:
	// its sender then receives exactly one of the reply or a timeout notice
	// (see OnTimeout), and a worker never starts it after the deadline.
	// 0 means no timeout. It cannot be combined with FireAndForget.
	Timeout time.Duration

	// Deadline is set on delivered messages that have a Timeout: the
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
}

// SendOption changes a message before Send sends it.
type SendOption func(*Message)

// WithTimeout gives the message a timeout (Message.Timeout).
func WithTimeout(d time.Duration) SendOption {
	return func(m *Message) { m.Timeout = d }
}

// WithFireAndForget marks the message fire-and-forget (Message.FireAndForget).
func WithFireAndForget() SendOption {
	return func(m *Message) { m.FireAndForget = true }
}

// WithHeader sets header key to value (Message.Headers).
func WithHeader(key, value string) SendOption {
	return func(m *Message) {
		if m.Headers == nil {
			m.Headers = make(map[string]string, 1)
		}
		m.Headers[key] = value
	}
}

// Send queues msg for msg.Receiver and returns its id once the broker has
// accepted it. A message with a Timeout is queued together with its pending
// timeout in one atomic step; this instance then watches the sender's
// timeouts, so that a notice reaches the sender's TimeoutHandler (on
// whichever instance registered one) within Config.TimeoutMonitorFrequency of
// the deadline.
//
// Send returns a *ValidationError for bad input, an error wrapping
// ErrUnavailable when the broker cannot be reached, and ErrClosed after
// Close.
func (d *Disker) Send(ctx context.Context, msg Message, opts ...SendOption) (string, error) {
	if len(opts) > 0 {
		msg.Headers = maps.Clone(msg.Headers)
		for _, o := range opts {
			o(&msg)
		}
	}
	if err := d.validateMessage(&msg); err != nil {
		return "", err
	}
	id := newID()
	if _, err := d.send(ctx, &msg, id); err != nil {
		return "", err
	}
	return id, nil
}

func (d *Disker) validateMessage(m *Message) error {
	if err := checkName("Message.Receiver", m.Receiver); err != nil {
		return err
	}
	switch {
	case m.Sender == "" && !m.FireAndForget:
		return invalid("Message.Sender", "must be set unless the message is fire-and-forget")
	case m.Sender != "":
		if err := checkName("Message.Sender", m.Sender); err != nil {
			return err
		}
	}
	if len(m.Content) > d.cfg.MaxMessageSize {
		return invalid("Message.Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(m.Content), d.cfg.MaxMessageSize)
	}
	if m.Timeout < 0 {
		return invalid("Message.Timeout", "must be >= 0, got %v", m.Timeout)
	}
	if m.Timeout > 0 && m.FireAndForget {
		return invalid("Message.Timeout", "a fire-and-forget message cannot have a timeout")
	}
	if m.Timeout > 0 && m.Timeout < time.Millisecond {
		return invalid("Message.Timeout", "must be at least 1ms, got %v", m.Timeout)
	}
	return nil
}

// send sends a validated message under id. It returns the local deadline.
func (d *Disker) send(ctx context.Context, m *Message, id string) (time.Time, error) {
	if d.closed.Load() {
		return time.Time{}, ErrClosed
	}
	env := broker.Envelope{
		ID:            id,
		Sender:        m.Sender,
		Receiver:      m.Receiver,
		Content:       m.Content,
		Headers:       m.Headers,
		FireAndForget: m.FireAndForget,
		Timeout:       m.Timeout,
	}
	if m.Timeout > 0 {
		// Watch before sending: the monitor must know the sender by the time
		// the deadline passes.
		d.monitor.watch(m.Sender, time.Now().Add(m.Timeout))
	}
	bdl, err := d.b.Send(ctx, &env)
	if err != nil {
		d.health.fail("send", err)
		return time.Time{}, wrapBroker("send", err)
	}
	d.health.ok()
	d.sent.Add(1)
	if d.onEvent != nil {
		d.emit(Event{Kind: EventSent, Receiver: m.Receiver, Sender: m.Sender, MessageID: id})
	}
	return d.clock.local(bdl), nil
}

// messageOf turns a delivered envelope into a Message.
func (d *Disker) messageOf(env *broker.Envelope, deadline time.Time, attempt int) *Message {
	m := &Message{
		ID:            env.ID,
		Sender:        env.Sender,
		Receiver:      env.Receiver,
		Content:       env.Content,
		Headers:       env.Headers,
		FireAndForget: env.FireAndForget,
		Timeout:       env.Timeout,
		Deadline:      d.clock.local(deadline),
		Attempt:       attempt,
		InReplyTo:     env.InReplyTo,
	}
	if env.ErrorCode != "" {
		m.Error = &RemoteError{Code: env.ErrorCode, Text: env.ErrorText}
	}
	return m
}
