package cli

import (
	"context"
	"net/http"

	"github.com/spf13/pflag"

	"github.com/diskerhq/disker"
)

// Tracing traces the messages and HTTP traffic of the worker and gateway
// commands. The disker command built from this module has none, and then
// nothing of it is on a message's path; the module
// github.com/diskerhq/disker/diskerotel builds the command with
// OpenTelemetry tracing (diskerotel/cmd/disker), which installs one with
// [MainWith].
type Tracing interface {
	// Flags registers the flags that configure tracing on the flag set of
	// the worker and of the gateway command.
	Flags(fs *pflag.FlagSet)
	// Start starts tracing for one run of command ("worker" or "gateway"),
	// once the flags are parsed. It returns the Tracer and the function
	// that flushes and stops it, which the command calls as it exits.
	Start(ctx context.Context, command string) (Tracer, func(context.Context) error, error)
}

// Tracer traces one run of a command: the methods of
// diskerotel.Tracer that the commands use.
type Tracer interface {
	// Observe sees the events of the command's disker instance.
	Observe(disker.Event)
	// Handler wraps the worker's handler.
	Handler(disker.Handler) disker.Handler
	// Request sends a gateway's request and waits for its reply.
	Request(ctx context.Context, d *disker.Disker, msg disker.Message, opts ...disker.SendOption) (*disker.Message, error)
	// HTTPHandler wraps the gateway's HTTP handler.
	HTTPHandler(http.Handler) http.Handler
	// Transport wraps the HTTP transport of worker --http.
	Transport(http.RoundTripper) http.RoundTripper
}

// tracingCommands are the commands that take the Tracing's flags.
var tracingCommands = map[string]bool{"worker": true, "gateway": true}

// startTracing starts the app's Tracing, if any, for command. The returned
// function stops it; call it as the command exits.
func (a *app) startTracing(ctx context.Context, command string) (func(), error) {
	if a.tracing == nil {
		return func() {}, nil
	}
	tr, stop, err := a.tracing.Start(ctx, command)
	if err != nil {
		return nil, err
	}
	a.tracer = tr
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingFlushTimeout)
		defer cancel()
		if err := stop(sctx); err != nil {
			a.log.Warn("tracing: cannot flush the last spans", "err", err)
		}
	}, nil
}

// observe returns f, or f followed by the Tracer's Observe when tracing.
func (a *app) observe(f func(disker.Event)) func(disker.Event) {
	if a.tracer == nil {
		return f
	}
	tr := a.tracer
	return func(e disker.Event) {
		f(e)
		tr.Observe(e)
	}
}

// traceHandler returns h, inside the Tracer's span when tracing.
func (a *app) traceHandler(h disker.Handler) disker.Handler {
	if a.tracer == nil {
		return h
	}
	return a.tracer.Handler(h)
}

// traceHTTP returns h, inside the Tracer's span when tracing.
func (a *app) traceHTTP(h http.Handler) http.Handler {
	if a.tracer == nil {
		return h
	}
	return a.tracer.HTTPHandler(h)
}

// traceTransport returns rt, inside the Tracer's span when tracing.
func (a *app) traceTransport(rt http.RoundTripper) http.RoundTripper {
	if a.tracer == nil {
		return rt
	}
	return a.tracer.Transport(rt)
}

// request sends a gateway's request, through the Tracer when tracing.
func (g *gateway) request(ctx context.Context, msg disker.Message, opts ...disker.SendOption) (*disker.Message, error) {
	if g.tracer == nil {
		return g.d.Request(ctx, msg, opts...)
	}
	return g.tracer.Request(ctx, g.d, msg, opts...)
}
