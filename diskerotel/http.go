package diskerotel

import (
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// HTTPHandler returns h inside a server span named "HTTP METHOD", which
// continues the trace of an incoming traceparent header (a new trace
// starts without one). The disker command's gateway runs this way, so the
// messages it sends are part of the caller's trace.
func (t *Tracer) HTTPHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := t.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := t.tracer.Start(ctx, "HTTP "+r.Method, trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				attribute.String("http.request.method", r.Method),
				attribute.String("url.path", r.URL.Path),
			))
		defer span.End()
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r.WithContext(ctx))
		setStatus(span, sw.code)
	})
}

// Transport returns rt (http.DefaultTransport when nil) inside a client
// span named "HTTP METHOD", a child of the request's context, whose trace
// context it puts in the request's headers in place of any there: the
// disker command's worker --http runs this way, so the service it calls
// continues the trace of the message.
func (t *Tracer) Transport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &transport{t: t, rt: rt}
}

type transport struct {
	t  *Tracer
	rt http.RoundTripper
}

func (tr *transport) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, span := tr.t.tracer.Start(r.Context(), "HTTP "+r.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("url.full", r.URL.Redacted()),
		))
	defer span.End()
	r = r.Clone(ctx)
	for _, f := range tr.t.prop.Fields() {
		r.Header.Del(f)
	}
	tr.t.prop.Inject(ctx, propagation.HeaderCarrier(r.Header))
	resp, err := tr.rt.RoundTrip(r)
	if err != nil {
		fail(span, err)
		return nil, err
	}
	setStatus(span, resp.StatusCode)
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the transport it
// wraps, when that has the method (as *http.Transport does).
func (tr *transport) CloseIdleConnections() {
	if c, ok := tr.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// setStatus records an HTTP status code on span; a 5xx is an error.
func setStatus(span trace.Span, code int) {
	span.SetAttributes(attribute.Int("http.response.status_code", code))
	if code >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(code)+" "+http.StatusText(code))
	}
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
