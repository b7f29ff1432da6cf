package metrics

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMetricsFromARealInstance serves a receiver on the in-memory broker,
// sends to it, and reads the metrics over HTTP.
func TestMetricsFromARealInstance(t *testing.T) {
	m := New()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "mem://metrics-test", OnEvent: m.Observe, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())
	m.Watch(d)
	err = d.Handle("jobs", disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) ([]byte, error) {
		if string(msg.Content) == "fail" {
			return nil, disker.NoRetry(errors.New("no"))
		}
		return msg.Content, nil
	}), disker.WithConcurrency(3))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 4 {
		if _, err := d.Request(ctx, disker.Message{Receiver: "jobs", Content: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
	}
	var re *disker.RemoteError
	if _, err := d.Request(ctx, disker.Message{Receiver: "jobs", Content: []byte("fail")}); !errors.As(err, &re) {
		t.Fatalf("Request(fail) = %v, want a RemoteError", err)
	}

	srv, err := Listen("127.0.0.1:0", m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	wants := []string{
		`disker_messages_sent_total{receiver="jobs"} 5`,
		`disker_messages_handled_total{receiver="jobs"} 4`,
		`disker_messages_failed_total{receiver="jobs"} 1`,
		`disker_messages_dead_lettered_total{receiver="jobs"} 1`,
		`disker_replies_total{receiver="jobs"} 5`, // 4 replies and 1 error reply
		`disker_handler_duration_seconds_count{outcome="handled",receiver="jobs"} 4`,
		`disker_in_flight{receiver="jobs"} 0`,
		`disker_concurrency{receiver="jobs"} 3`,
		`disker_queue_queued{receiver="jobs"} 0`,
		`disker_queue_dead_letters{receiver="jobs"} 1`,
		`disker_broker_up 1`,
		`# TYPE go_goroutines gauge`,
	}
	// The worker's events may trail the replies its callers got: poll.
	var missing []string
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := get(t, "http://"+srv.Addr()+"/metrics")
		if code != 200 {
			t.Fatalf("/metrics: %d", code)
		}
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(body, want+"\n") {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics lacks %q:\n%s", missing, body)
		}
		<-time.After(20 * time.Millisecond)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	m := New()
	srv, err := Listen("127.0.0.1:0", m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + srv.Addr()
	check := func(path string, wantCode int, wantBody string) {
		t.Helper()
		code, body := get(t, base+path)
		if code != wantCode || strings.TrimSpace(body) != wantBody {
			t.Fatalf("%s: %d %q, want %d %q", path, code, body, wantCode, wantBody)
		}
	}
	check("/healthz", 200, "ok")
	check("/readyz", 200, "ready")
	m.Observe(disker.Event{Kind: disker.EventUnavailable, Err: errors.New("down")})
	check("/healthz", 200, "ok")
	check("/readyz", 503, "broker unavailable")
	if _, body := get(t, base+"/metrics"); !strings.Contains(body, "disker_broker_up 0") {
		t.Fatal("disker_broker_up is not 0 while the broker is unavailable")
	}
	m.Observe(disker.Event{Kind: disker.EventAvailable})
	check("/readyz", 200, "ready")
	srv.SetStopping()
	check("/healthz", 503, "stopping")
	check("/readyz", 503, "stopping")
	if err := srv.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("the server still answers after Close")
	}
}

func TestListenBadAddress(t *testing.T) {
	_, err := Listen("127.0.0.1:notaport", New(), slog.New(slog.DiscardHandler))
	if err == nil || !strings.HasPrefix(err.Error(), "metrics: ") {
		t.Fatalf("Listen(bad address) = %v, want a metrics: error", err)
	}
}

func TestGatewayMetrics(t *testing.T) {
	m := New()
	m.ObserveHTTP(504, 2*time.Second)
	m.ObserveHTTP(200, time.Millisecond)
	m.ObserveHTTP(200, time.Millisecond)
	srv, err := Listen("127.0.0.1:0", m, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(context.Background())
	_, body := get(t, "http://"+srv.Addr()+"/metrics")
	for _, want := range []string{`disker_gateway_requests_total{code="200"} 2`, `disker_gateway_requests_total{code="504"} 1`,
		`disker_gateway_request_duration_seconds_count{code="504"} 1`} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
