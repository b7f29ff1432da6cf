package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// sseEvent is one server-sent event.
type sseEvent struct {
	event, id, data string
}

// readEvent reads the next server-sent event from r.
func readEvent(t *testing.T, r *bufio.Reader) sseEvent {
	t.Helper()
	var e sseEvent
	var data []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading an event: %v (so far %+v)", err, e)
		}
		line = strings.TrimSuffix(line, "\n")
		if line == "" {
			e.data = strings.Join(data, "\n")
			return e
		}
		k, v, _ := strings.Cut(line, ": ")
		switch k {
		case "event":
			e.event = v
		case "id":
			e.id = v
		case "data":
			data = append(data, v)
		}
	}
}

// openEvents sends a GET of url that accepts server-sent events and
// returns the response, checked, and a reader of its body.
func openEvents(t *testing.T, url string) *bufio.Reader {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s with Accept: text/event-stream: %d %s %q", url, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return bufio.NewReader(resp.Body)
}

// checkEvents reads events from r and compares them with want.
func checkEvents(t *testing.T, r *bufio.Reader, want ...sseEvent) {
	t.Helper()
	for _, w := range want {
		if e := readEvent(t, r); e != w {
			t.Fatalf("event %+v, want %+v", e, w)
		}
	}
}

// TestGatewayEventsHTTP streams a service's chunked response through a
// "worker --http --stream" and the gateway to a client that accepts
// server-sent events: its first chunk arrives as an event while the
// service still waits for the test's signal, the rest after it, then the
// final event. A client that does not accept events gets the whole
// response.
func TestGatewayEventsHTTP(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	release := make(chan struct{})
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "first\n")
		if r.URL.Path == "/wait" {
			w.(http.Flusher).Flush()
			<-release
		}
		fmt.Fprint(w, "second\n")
	}))
	t.Cleanup(svc.Close)
	e.startWorker("--receiver", "sse", "--http", svc.URL, "--stream")
	_, g := e.startGateway("--receiver", "sse", "--timeout", "30s")

	if code, body := get(t, g+"/plain"); code != http.StatusOK || body != "first\nsecond\n" {
		t.Fatalf("GET without events: %d %q, want the whole body", code, body)
	}
	r := openEvents(t, g+"/wait")
	checkEvents(t, r, sseEvent{"partial", "1.1", "first"})
	close(release)
	checkEvents(t, r, sseEvent{"partial", "1.2", "second"}, sseEvent{"reply", "", ""})
	if rest, err := io.ReadAll(r); err != nil || len(rest) != 0 {
		t.Fatalf("after the final event: %q, %v; want the end", rest, err)
	}
	req, _ := http.NewRequest(http.MethodGet, g+"/plain", nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Idempotency-Key", "k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("events with an Idempotency-Key: %d, want 400", resp.StatusCode)
	}
}

// TestGatewayEventsExec streams a command's stdout lines through a
// "worker --exec --stream" and the gateway as server-sent events: its
// first line arrives while the command waits on a FIFO that the test
// opens only after reading it.
func TestGatewayEventsExec(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fifo := filepath.Join(t.TempDir(), "go")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	e.startWorker("--receiver", "lines", "--shell", "--stream", "--exec", "echo one; cat "+fifo+" >/dev/null; printf 'two\\nthree'")
	_, g := e.startGateway("--receiver", "lines", "--timeout", "30s")
	r := openEvents(t, g+"/")
	checkEvents(t, r, sseEvent{"partial", "1.1", "one"})
	f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	checkEvents(t, r, sseEvent{"partial", "1.2", "two"}, sseEvent{"partial", "1.3", "three"}, sseEvent{"reply", "", ""})
}

// TestGatewayEventsProgress serves the gateway's receiver with a Go handler
// that reports progress between partial replies: a client that accepts
// server-sent events gets each progress as an event "progress" in order
// with the partials, the first before the handler goes on.
func TestGatewayEventsProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, err := disker.New(context.Background(), disker.Config{RedisURL: e.redisURL, KeyPrefix: e.prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d.Close(ctx)
	})
	release := make(chan struct{})
	if err := d.Handle("prog", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		if err := m.Progress(ctx, []byte("1/2")); err != nil {
			return nil, err
		}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if err := m.Partial(ctx, []byte("half")); err != nil {
			return nil, err
		}
		if err := m.Progress(ctx, []byte("2/2")); err != nil {
			return nil, err
		}
		return []byte("all"), nil
	})); err != nil {
		t.Fatal(err)
	}
	_, g := e.startGateway("--receiver", "prog", "--timeout", "30s")
	r := openEvents(t, g+"/")
	checkEvents(t, r, sseEvent{"progress", "", "1/2"})
	close(release)
	checkEvents(t, r, sseEvent{"partial", "1.1", "half"}, sseEvent{"progress", "", "2/2"}, sseEvent{"reply", "", "all"})
}
