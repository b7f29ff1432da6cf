package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/diskerhq/disker/diskerotel"
	"github.com/diskerhq/disker/internal/cli"
	"github.com/diskerhq/disker/internal/redistest"
)

var redisURL string

func TestMain(m *testing.M) {
	srv, stop := redistest.MustStart()
	redisURL = srv.URL()
	code := m.Run()
	stop()
	os.Exit(code)
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// provider returns a tracer provider for service that exports each span to
// exp as it ends.
func provider(t *testing.T, exp sdktrace.SpanExporter, service string) *sdktrace.TracerProvider {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// tier is a gateway and a worker --http, run by the command with tracing
// in this process, in front of a service traced as "service": every span
// goes to exp.
type tier struct {
	exp     *tracetest.InMemoryExporter
	gateway string // base URL
}

// startTier starts the service (serving with serve), a worker for
// receiver with workerArgs, and a gateway for it with gatewayArgs. They
// stop when the test ends.
func startTier(t *testing.T, receiver string, serve http.HandlerFunc, workerArgs, gatewayArgs []string) *tier {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	svcTracer := diskerotel.New(diskerotel.WithTracerProvider(provider(t, exp, "service")))
	svc := httptest.NewServer(svcTracer.HTTPHandler(serve))
	t.Cleanup(svc.Close)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	prefix := redistest.Prefix(t)
	run := func(name string, args []string) *syncBuffer {
		logs := &syncBuffer{}
		args = append(args, "--redis-url", redisURL, "--key-prefix", prefix, "--receiver", receiver,
			"--log-format", "json", "--shutdown-timeout", "5s")
		wg.Go(func() {
			if code := cli.RunWith(ctx, &tracing{exporter: exp, syncExport: true}, args, strings.NewReader(""), io.Discard, logs); code != 0 {
				t.Errorf("%s exited %d: %s", name, code, logs)
			}
		})
		return logs
	}
	run("worker", append([]string{"worker", "--http", svc.URL}, workerArgs...))
	logs := run("gateway", append([]string{"gateway", "--listen", "127.0.0.1:0"}, gatewayArgs...))
	return &tier{exp: exp, gateway: "http://" + gatewayAddr(t, logs)}
}

// gatewayAddr waits for the address in the "gateway started" line of a
// gateway's JSON logs.
func gatewayAddr(t *testing.T, logs *syncBuffer) string {
	t.Helper()
	return waitFor(t, "the gateway's address", func() (string, bool) {
		for line := range strings.Lines(logs.String()) {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == "gateway started" {
				return rec["listen"].(string), true
			}
		}
		return "", false
	})
}

// waitFor polls f until it reports done, for up to 20s.
func waitFor[T any](t *testing.T, what string, f func() (T, bool)) T {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		v, ok := f()
		if ok {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// get sends GET path to the gateway inside a "client" span of its own
// tracer, with its traceparent, and returns the status and the span.
func (tr *tier) get(t *testing.T, path string) (int, trace.SpanContext) {
	t.Helper()
	tp := provider(t, tr.exp, "client")
	ctx, span := tp.Tracer("test").Start(context.Background(), "client")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, tr.gateway+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	span.End()
	return resp.StatusCode, span.SpanContext()
}

// spanKey names a span by its service and name, and its attempt when it
// has one: "disker-worker/handle web#2".
func spanKey(s tracetest.SpanStub) string {
	k := ""
	for _, kv := range s.Resource.Attributes() {
		if kv.Key == semconv.ServiceNameKey {
			k = kv.Value.AsString()
		}
	}
	k += "/" + s.Name
	for _, kv := range s.Attributes {
		if kv.Key == diskerotel.AttrAttempt {
			k += fmt.Sprintf("#%d", kv.Value.AsInt64())
		}
	}
	return k
}

// waitTrace waits until the trace of root holds a span for each key of
// want and for the client's, the gateway's and its send's, and checks that each has the parent want gives and that every span
// of the trace is among them.
func (tr *tier) waitTrace(t *testing.T, root trace.SpanContext, want map[string]string) map[string]tracetest.SpanStub {
	t.Helper()
	// Every request goes from the client through the gateway to a send.
	want[client], want[gwServer], want[gwSend] = "", client, gwServer
	var byKey map[string]tracetest.SpanStub
	waitFor(t, "the spans of the trace", func() (struct{}, bool) {
		byKey = map[string]tracetest.SpanStub{}
		for _, s := range tr.exp.GetSpans() {
			if s.SpanContext.TraceID() == root.TraceID() {
				byKey[spanKey(s)] = s
			}
		}
		return struct{}{}, len(byKey) >= len(want)
	})
	byID := map[trace.SpanID]string{}
	for k, s := range byKey {
		byID[s.SpanContext.SpanID()] = k
	}
	for k, s := range byKey {
		parent, ok := want[k]
		switch {
		case !ok:
			t.Errorf("unexpected span %s in the trace", k)
		case parent == "":
			if s.Parent.IsValid() {
				t.Errorf("span %s has parent %s, want none", k, byID[s.Parent.SpanID()])
			}
		case byID[s.Parent.SpanID()] != parent:
			t.Errorf("span %s has parent %q, want %q", k, byID[s.Parent.SpanID()], parent)
		}
	}
	for k := range want {
		if _, ok := byKey[k]; !ok {
			t.Errorf("span %s missing from the trace", k)
		}
	}
	return byKey
}

// The spans of one request through the tier, by key, each with its
// parent's key.
const (
	client     = "client/client"
	gwServer   = "disker-gateway/HTTP GET"
	gwSend     = "disker-gateway/send web"
	gwTimeout  = "disker-gateway/timeout web"
	svcServer  = "service/HTTP GET"
	workerHTTP = "disker-worker/HTTP GET"
)

func handle(attempt int) string { return fmt.Sprintf("disker-worker/handle web#%d", attempt) }

func TestTraceSuccess(t *testing.T) {
	tr := startTier(t, "web", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}, nil, nil)
	code, root := tr.get(t, "/hello")
	if code != http.StatusOK {
		t.Fatalf("status %d, want 200", code)
	}
	spans := tr.waitTrace(t, root, map[string]string{
		handle(1):  gwSend,
		workerHTTP: handle(1),
		svcServer:  workerHTTP,
	})
	h := spans[handle(1)]
	if len(h.Links) != 1 || h.Links[0].SpanContext.SpanID() != spans[gwSend].SpanContext.SpanID() {
		t.Errorf("the handle span's links are %v, want one to the send span", h.Links)
	}
	if l := spans[gwSend].Links; len(l) != 1 || l[0].SpanContext.SpanID() != h.SpanContext.SpanID() {
		t.Errorf("the send span's links are %v, want one to the handle span, whose context came back with the reply", l)
	}
	if h.SpanKind != trace.SpanKindConsumer {
		t.Errorf("the handle span's kind is %v, want consumer", h.SpanKind)
	}
	var id string
	for _, kv := range spans[gwSend].Attributes {
		if kv.Key == diskerotel.AttrMessageID {
			id = kv.Value.AsString()
		}
	}
	found := false
	for _, kv := range h.Attributes {
		if kv.Key == diskerotel.AttrMessageID {
			found = kv.Value.AsString() == id && id != ""
		}
	}
	if !found {
		t.Errorf("the send span's message id %q is not the handle span's (%v)", id, h.Attributes)
	}
}

// abort makes the service drop the connection without a response: an
// error for the worker, which retries.
func abort() { panic(http.ErrAbortHandler) }

func TestTraceRetryThenSuccess(t *testing.T) {
	tr := startTier(t, "web", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Disker-Attempt") == "1" {
			abort()
		}
		fmt.Fprintln(w, "second time lucky")
	}, nil, nil)
	code, root := tr.get(t, "/flaky")
	if code != http.StatusOK {
		t.Fatalf("status %d, want 200", code)
	}
	// Both attempts' HTTP spans share a key: the map holds the second's.
	tr.waitTrace(t, root, map[string]string{
		handle(1):                   gwSend,
		"disker-worker/retry web#1": handle(1),
		handle(2):                   gwSend,
		workerHTTP:                  handle(2),
		svcServer:                   workerHTTP,
	})
}

func TestTraceDeadLetter(t *testing.T) {
	tr := startTier(t, "web", func(w http.ResponseWriter, r *http.Request) { abort() },
		[]string{"--max-attempts", "1"}, nil)
	code, root := tr.get(t, "/broken")
	if code != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", code)
	}
	spans := tr.waitTrace(t, root, map[string]string{
		handle(1):                         gwSend,
		"disker-worker/dead-letter web#1": handle(1),
		workerHTTP:                        handle(1),
		svcServer:                         workerHTTP,
	})
	for _, k := range []string{gwSend, handle(1), "disker-worker/dead-letter web#1", gwServer} {
		if spans[k].Status.Code.String() != "Error" {
			t.Errorf("span %s has status %v, want Error", k, spans[k].Status)
		}
	}
}

func TestTraceTimeout(t *testing.T) {
	tr := startTier(t, "web", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // the worker gives up at the message's deadline
	}, nil, []string{"--timeout", "300ms"})
	code, root := tr.get(t, "/slow")
	if code != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", code)
	}
	spans := tr.waitTrace(t, root, map[string]string{
		gwTimeout:                     gwSend,
		handle(1):                     gwSend,
		"disker-worker/expired web#1": handle(1),
		workerHTTP:                    handle(1),
		svcServer:                     workerHTTP,
	})
	for _, k := range []string{gwSend, gwTimeout, handle(1), "disker-worker/expired web#1"} {
		if spans[k].Status.Code.String() != "Error" {
			t.Errorf("span %s has status %v, want Error", k, spans[k].Status)
		}
	}
}
