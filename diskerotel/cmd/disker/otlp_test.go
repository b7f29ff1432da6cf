package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/diskerhq/disker/internal/cli"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestOTLPEndpoint runs a gateway with --otlp-endpoint pointing at a real
// HTTP listener that decodes OTLP/HTTP exports, sends it a request that
// times out (no worker serves the receiver), stops it, and checks that the
// spans of the request reached the listener, under the gateway's service
// name.
func TestOTLPEndpoint(t *testing.T) {
	var (
		mu       sync.Mutex
		names    []string
		services []string
	)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("export to %s as %s, want /v1/traces as application/x-protobuf", r.URL.Path, r.Header.Get("Content-Type"))
		}
		b, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Errorf("the export does not decode: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for _, rs := range req.GetResourceSpans() {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.GetKey() == "service.name" {
					services = append(services, kv.GetValue().GetStringValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					names = append(names, s.GetName())
				}
			}
		}
	}))
	defer collector.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	logs := &syncBuffer{}
	done := make(chan int, 1)
	go func() {
		done <- cli.RunWith(ctx, &tracing{}, []string{"gateway", "--listen", "127.0.0.1:0", "--receiver", "nobody",
			"--timeout", "200ms", "--redis-url", redisURL, "--key-prefix", redistest.Prefix(t),
			"--otlp-endpoint", collector.URL, "--log-format", "json"}, strings.NewReader(""), io.Discard, logs)
	}()
	addr := gatewayAddr(t, logs)
	resp, err := http.Get("http://" + addr + "/x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("status %d, want 504", resp.StatusCode)
	}
	cancel() // the gateway flushes its spans as it exits
	if code := <-done; code != 0 {
		t.Fatalf("gateway exited %d: %s", code, logs)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(names)
	if want := []string{"HTTP GET", "send nobody", "timeout nobody"}; !slices.Equal(names, want) {
		t.Errorf("exported spans %q, want %q", names, want)
	}
	for _, s := range services {
		if s != "disker-gateway" {
			t.Errorf("service.name %q, want disker-gateway", s)
		}
	}
}
