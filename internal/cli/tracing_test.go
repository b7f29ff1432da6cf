package cli

import (
	"context"
	"net/http"
	"reflect"
	"testing"

	"github.com/diskerhq/disker"
)

type nopHandler struct{}

func (*nopHandler) Handle(context.Context, *disker.Message) ([]byte, error) { return nil, nil }

// TestNoTracingChangesNothing checks that without a Tracing the commands
// use their handler, HTTP handler, transport and event function as they
// are: tracing off puts nothing on a message's path.
func TestNoTracingChangesNothing(t *testing.T) {
	a := &app{}
	stop, err := a.startTracing(context.Background(), "worker")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	h := &nopHandler{}
	if got := a.traceHandler(h); got != disker.Handler(h) {
		t.Errorf("traceHandler wrapped the handler: %T", got)
	}
	mux := http.NewServeMux()
	if got := a.traceHTTP(mux); got != http.Handler(mux) {
		t.Errorf("traceHTTP wrapped the handler: %T", got)
	}
	tr := &http.Transport{}
	if got := a.traceTransport(tr); got != http.RoundTripper(tr) {
		t.Errorf("traceTransport wrapped the transport: %T", got)
	}
	observe := func(disker.Event) {}
	if got := a.observe(observe); reflect.ValueOf(got).Pointer() != reflect.ValueOf(observe).Pointer() {
		t.Error("observe wrapped the event function")
	}
}
