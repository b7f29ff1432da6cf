package diskerotel_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskerotel"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestSendAndTimeoutNotice sends two messages with Tracer.Send on a real
// redis-server: one handled, one that nobody handles before its timeout.
// The handle span is a child of the first send span, and the timeout
// notice's span a child of the second's.
func TestSendAndTimeoutNotice(t *testing.T) {
	srv := redistest.Start(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())
	tr := diskerotel.New(diskerotel.WithTracerProvider(tp))
	d, err := disker.New(context.Background(), disker.Config{RedisURL: srv.URL(), Logger: slog.New(slog.DiscardHandler), OnEvent: tr.Observe,
		TimeoutMonitorFrequency: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	handled := make(chan struct{}, 1)
	if err := d.Handle("jobs", tr.Handler(disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) ([]byte, error) {
		handled <- struct{}{}
		return nil, nil
	}))); err != nil {
		t.Fatal(err)
	}
	timedOut := make(chan struct{}, 1)
	if err := d.OnTimeout("me", tr.TimeoutHandler(disker.TimeoutHandlerFunc(func(ctx context.Context, msg *disker.Message) {
		timedOut <- struct{}{}
	}))); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := tr.Send(ctx, d, disker.Message{Receiver: "jobs", Content: []byte("hi")}); err != nil {
		t.Fatal(err)
	}
	lostID, err := tr.Send(ctx, d, disker.Message{Sender: "me", Receiver: "nobody", Content: []byte("hello?")}, disker.WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range []chan struct{}{handled, timedOut} {
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			t.Fatal("the message was not handled, or its timeout not noticed")
		}
	}
	var spans tracetest.SpanStubs
	byName := map[string]tracetest.SpanStub{}
	deadline := time.Now().Add(10 * time.Second)
	for len(byName) < 4 && time.Now().Before(deadline) {
		spans = exp.GetSpans()
		for _, s := range spans {
			byName[s.Name] = s
		}
		time.Sleep(10 * time.Millisecond)
	}
	check := func(child, parent string) {
		t.Helper()
		c, p := byName[child], byName[parent]
		if !c.SpanContext.IsValid() || !p.SpanContext.IsValid() {
			t.Fatalf("missing span %q or %q in %v", child, parent, spans)
		}
		if c.Parent.SpanID() != p.SpanContext.SpanID() || c.SpanContext.TraceID() != p.SpanContext.TraceID() {
			t.Errorf("span %q is not a child of %q", child, parent)
		}
	}
	check("handle jobs", "send jobs")
	check("timeout nobody", "send nobody")
	if k := byName["send jobs"].SpanKind; k != trace.SpanKindProducer {
		t.Errorf("send span kind %v, want producer", k)
	}
	var id string
	for _, kv := range byName["timeout nobody"].Attributes {
		if kv.Key == diskerotel.AttrMessageID {
			id = kv.Value.AsString()
		}
	}
	if id != lostID {
		t.Errorf("the timeout span's message id is %q, want %q", id, lostID)
	}
}
