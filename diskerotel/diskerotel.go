// Package diskerotel traces Disker's messages with OpenTelemetry, across
// processes.
//
// A [Tracer] carries the W3C trace context of the sender in the message's
// headers (traceparent, tracestate) and makes these spans:
//
//   - "send RECEIVER" around [Tracer.Send] and [Tracer.Request] (kind
//     producer, or client for a Request);
//   - "handle RECEIVER" around each call of a handler wrapped by
//     [Tracer.Handler] (kind consumer): a child of the sender's span, with a
//     link to it as well; its context goes back in the reply's headers, and
//     the send span of a Request links to the handle span that answered;
//   - "retry RECEIVER", "dead-letter RECEIVER" and "expired RECEIVER" when a
//     failed delivery is given back for another attempt, moved to the
//     dead-letter stream, or dropped past its deadline: children of the
//     handle span that failed, made from the events of
//     disker.Config.OnEvent (pass [Tracer.Observe]);
//   - "timeout RECEIVER" when a Request timed out (a child of its send span)
//     or when a timeout notice reaches a TimeoutHandler wrapped by
//     [Tracer.TimeoutHandler] (a child of the original send span).
//
// Each span carries the receiver (messaging.destination.name), the message
// id (messaging.message.id, once known) and the delivery attempt
// (disker.attempt). [Tracer.HTTPHandler] and [Tracer.Transport] continue a
// trace through HTTP, as the disker command's gateway and worker --http do.
//
// The package lives in a module of its own, so that the core module does not
// depend on OpenTelemetry. Wire it like this:
//
//	tr := diskerotel.New()
//	d, err := disker.New(ctx, disker.Config{RedisURL: url, OnEvent: tr.Observe})
//	...
//	d.Handle("jobs", tr.Handler(h))
//	id, err := tr.Send(ctx, d, disker.Message{Sender: "me", Receiver: "jobs", Content: b})
package diskerotel

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/diskerhq/disker"
)

// ScopeName is the instrumentation scope of the spans.
const ScopeName = "github.com/diskerhq/disker/diskerotel"

// The attributes of the spans.
const (
	// AttrSystem is messaging.system, always "disker".
	AttrSystem = attribute.Key("messaging.system")
	// AttrReceiver is messaging.destination.name: the receiver.
	AttrReceiver = attribute.Key("messaging.destination.name")
	// AttrMessageID is messaging.message.id: the message's id.
	AttrMessageID = attribute.Key("messaging.message.id")
	// AttrAttempt is disker.attempt: the delivery attempt, from 1.
	AttrAttempt = attribute.Key("disker.attempt")
)

// failedKeep is how long the span of a failed handler call is kept for the
// event that settles the delivery (retry, dead letter, expiry); the event
// follows the call at once unless the delivery was abandoned (a lost lease,
// a stop), and then no event comes.
const failedKeep = time.Minute

// Tracer makes the spans of Disker's messages. Its methods are safe for
// concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator

	mu     sync.Mutex
	failed map[delivery]*failure
}

// delivery names one attempt of one message.
type delivery struct {
	receiver, id string
	attempt      int
}

// failure is a handler call that failed, waiting for the event that says
// what became of its delivery.
type failure struct {
	span trace.SpanContext
	at   time.Time
}

type config struct {
	tp   trace.TracerProvider
	prop propagation.TextMapPropagator
}

// Option configures a Tracer.
type Option func(*config)

// WithTracerProvider makes spans with tp; the default is the global one
// (otel.GetTracerProvider).
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithPropagator carries the trace context with p; the default is the W3C
// trace context and baggage (not the global propagator, which is a no-op
// unless a program sets one).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// New returns a Tracer.
func New(opts ...Option) *Tracer {
	c := config{}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.prop == nil {
		c.prop = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	return &Tracer{
		tracer: c.tp.Tracer(ScopeName),
		prop:   c.prop,
		failed: make(map[delivery]*failure),
	}
}

// attrs are the attributes of a span about a message.
func attrs(receiver, id string, attempt int) trace.SpanStartEventOption {
	kv := []attribute.KeyValue{AttrSystem.String("disker"), AttrReceiver.String(receiver)}
	if id != "" {
		kv = append(kv, AttrMessageID.String(id))
	}
	if attempt > 0 {
		kv = append(kv, AttrAttempt.Int(attempt))
	}
	return trace.WithAttributes(kv...)
}

// fail marks span as failed with err.
func fail(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// inject puts ctx's trace context in msg's headers, in a copy of them.
func (t *Tracer) inject(ctx context.Context, msg *disker.Message) {
	carrier := propagation.MapCarrier{}
	t.prop.Inject(ctx, carrier)
	if len(carrier) == 0 {
		return
	}
	h := make(map[string]string, len(msg.Headers)+len(carrier))
	maps.Copy(h, msg.Headers)
	maps.Copy(h, carrier)
	msg.Headers = h
}

// Send sends msg with d.Send inside a "send RECEIVER" span, whose context
// it carries in the message's headers.
func (t *Tracer) Send(ctx context.Context, d *disker.Disker, msg disker.Message, opts ...disker.SendOption) (string, error) {
	ctx, span := t.tracer.Start(ctx, "send "+msg.Receiver,
		trace.WithSpanKind(trace.SpanKindProducer), attrs(msg.Receiver, "", 0))
	defer span.End()
	t.inject(ctx, &msg)
	id, err := d.Send(ctx, msg, opts...)
	if err != nil {
		fail(span, err)
		return id, err
	}
	span.SetAttributes(AttrMessageID.String(id))
	return id, nil
}

// Request sends msg with d.Request inside a "send RECEIVER"
// span, whose context it carries in the message's headers, and waits for
// the reply. When the reply comes back with the context of the handle span
// that answered (a handler wrapped by Handler), the send span links to it.
// The span has the message id when a reply came (Disker does not tell it
// otherwise). When the request timed out, a "timeout RECEIVER" span
// runs from its deadline to the moment Request returned.
func (t *Tracer) Request(ctx context.Context, d *disker.Disker, msg disker.Message, opts ...disker.SendOption) (*disker.Message, error) {
	receiver := msg.Receiver
	ctx, span := t.tracer.Start(ctx, "send "+receiver,
		trace.WithSpanKind(trace.SpanKindClient), attrs(receiver, "", 0))
	defer span.End()
	t.inject(ctx, &msg)
	reply, err := d.Request(ctx, msg, opts...)
	if err != nil {
		fail(span, err)
		if errors.Is(err, disker.ErrTimeout) {
			start := time.Now()
			if dl, ok := ctx.Deadline(); ok && dl.Before(start) {
				start = dl
			}
			_, ts := t.tracer.Start(ctx, "timeout "+receiver, trace.WithTimestamp(start), attrs(receiver, "", 0))
			fail(ts, err)
			ts.End()
		}
		return reply, err
	}
	span.SetAttributes(AttrMessageID.String(reply.InReplyTo))
	if sc := trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(reply.Headers))); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
	return reply, nil
}

// Handler returns h inside a "handle RECEIVER" span, a child of the span
// whose context the message carries (and linked to it). The span's context
// goes back with the reply, in its headers (Message.SetReplyHeader). A
// failed call's span is kept for the event that settles the delivery (see
// Observe).
func (t *Tracer) Handler(h disker.Handler) disker.Handler {
	return disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) (resp []byte, err error) {
		ctx = t.prop.Extract(ctx, propagation.MapCarrier(msg.Headers))
		opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), attrs(msg.Receiver, msg.ID, msg.Attempt)}
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
		}
		ctx, span := t.tracer.Start(ctx, "handle "+msg.Receiver, opts...)
		carrier := propagation.MapCarrier{}
		t.prop.Inject(ctx, carrier)
		for k, v := range carrier {
			msg.SetReplyHeader(k, v)
		}
		defer func() {
			if v := recover(); v != nil {
				err = fmt.Errorf("panic: %v", v)
				defer panic(v)
			}
			if err != nil {
				fail(span, err)
				t.keepFailed(msg, span.SpanContext())
			}
			span.End()
		}()
		return h.Handle(ctx, msg)
	})
}

// TimeoutHandler returns h inside a "timeout RECEIVER" span, a child of the
// span that sent the timed-out message.
func (t *Tracer) TimeoutHandler(h disker.TimeoutHandler) disker.TimeoutHandler {
	return disker.TimeoutHandlerFunc(func(ctx context.Context, msg *disker.Message) {
		ctx = t.prop.Extract(ctx, propagation.MapCarrier(msg.Headers))
		ctx, span := t.tracer.Start(ctx, "timeout "+msg.Receiver, attrs(msg.Receiver, msg.ID, 0))
		defer span.End()
		span.SetStatus(codes.Error, disker.ErrTimeout.Error())
		h.HandleTimeout(ctx, msg)
	})
}

func (t *Tracer) keepFailed(msg *disker.Message, sc trace.SpanContext) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.failed) >= 1024 {
		for k, f := range t.failed {
			if now.Sub(f.at) > failedKeep {
				delete(t.failed, k)
			}
		}
	}
	t.failed[delivery{msg.Receiver, msg.ID, msg.Attempt}] = &failure{span: sc, at: now}
}

// Observe makes the spans of retries, dead letters and expiries from the
// events of a disker instance: pass it as disker.Config.OnEvent (or call it
// from yours). Each is a child of the handle span of the failed call that
// led to it, and runs from the failure to the event.
func (t *Tracer) Observe(e disker.Event) {
	var name string
	switch e.Kind {
	case disker.EventFailed:
		t.mu.Lock()
		if f := t.failed[delivery{e.Receiver, e.MessageID, e.Attempt}]; f != nil {
			f.at = time.Now()
		}
		t.mu.Unlock()
		return
	case disker.EventRetried:
		name = "retry "
	case disker.EventDeadLettered:
		name = "dead-letter "
	case disker.EventExpired:
		name = "expired "
	default:
		return
	}
	k := delivery{e.Receiver, e.MessageID, e.Attempt}
	t.mu.Lock()
	f := t.failed[k]
	delete(t.failed, k)
	t.mu.Unlock()
	if f == nil {
		return // not handled through Handler, or dropped before it ran
	}
	ctx := trace.ContextWithSpanContext(context.Background(), f.span)
	_, span := t.tracer.Start(ctx, name+e.Receiver, trace.WithTimestamp(f.at), attrs(e.Receiver, e.MessageID, e.Attempt))
	switch {
	case e.Kind == disker.EventExpired:
		span.SetStatus(codes.Error, "the message's deadline passed")
	case e.Kind == disker.EventDeadLettered:
		fail(span, e.Err)
	case e.Err != nil:
		span.SetAttributes(attribute.String("error.message", e.Err.Error()))
	}
	span.End()
}
