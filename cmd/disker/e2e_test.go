package main_test

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// service is the local HTTP service behind the workers. A worker's --http
// URL may start with /A or /B, so the service knows which worker forwarded
// a request.
//
//	/echo   answers with the request's body, the status in ?status=, and
//	        what it saw in X-Echo-* headers
//	/slow   never answers (until the client goes away)
//	/block  waits until release is closed, then echoes
type service struct {
	srv      *httptest.Server
	release  chan struct{}
	mu       sync.Mutex
	arrivals map[string]int // /block requests in progress, by worker prefix
}

func newService(t *testing.T) *service {
	s := &service{release: make(chan struct{}), arrivals: map[string]int{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(func() {
		s.srv.CloseClientConnections()
		s.srv.Close()
	})
	return s
}

func (s *service) serve(w http.ResponseWriter, r *http.Request) {
	path, worker := r.URL.Path, "-"
	for _, p := range []string{"/A", "/B"} {
		if strings.HasPrefix(path, p+"/") {
			path, worker = strings.TrimPrefix(path, p), p[1:]
		}
	}
	switch path {
	case "/slow":
		<-r.Context().Done()
		return
	case "/block":
		s.mu.Lock()
		s.arrivals[worker]++
		s.mu.Unlock()
		select {
		case <-s.release:
		case <-r.Context().Done():
			return
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	status := http.StatusOK
	if v := r.URL.Query().Get("status"); v != "" {
		status, _ = strconv.Atoi(v)
	}
	h := w.Header()
	h.Set("Content-Type", r.Header.Get("Content-Type"))
	h.Set("X-Echo-Method", r.Method)
	h.Set("X-Echo-Path", path)
	h.Set("X-Echo-Query", r.URL.RawQuery)
	h.Set("X-Echo-Test", r.Header.Get("X-Test"))
	h.Set("X-Echo-Forwarded-For", r.Header.Get("X-Forwarded-For"))
	h.Set("X-Attempt", r.Header.Get("X-Disker-Attempt"))
	h.Set("X-Worker", worker)
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func (s *service) inFlight() (total int, by map[string]int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	by = map[string]int{}
	for k, v := range s.arrivals {
		total += v
		by[k] = v
	}
	return total, by
}

func randomBytes(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// startWorker starts an --http worker and waits until it serves.
func (e *env) startWorker(args ...string) *proc {
	p := e.start(append([]string{"worker"}, args...)...)
	p.waitLog("worker started")
	return p
}

// startGateway starts a gateway on a free port and returns it and its URL.
func (e *env) startGateway(args ...string) (*proc, string) {
	p := e.start(append([]string{"gateway", "--listen", "127.0.0.1:0"}, args...)...)
	rec := p.waitLog("gateway started")
	return p, "http://" + rec["listen"].(string)
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

// TestHTTPTier runs two gateways and two --http workers in front of a local
// service and drives them with Go's HTTP client and with curl.
func TestHTTPTier(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := newService(t)
	w1 := e.startWorker("--receiver", "web", "--http", svc.srv.URL, "--concurrency", "8", "--admin", "127.0.0.1:0")
	e.startWorker("--receiver", "web", "--http", svc.srv.URL, "--concurrency", "8")
	gw, url := e.startGateway("--receiver", "web", "--timeout", "30s", "--max-body", "1MiB", "--admin", "127.0.0.1:0")
	_, fastURL := e.startGateway("--receiver", "web", "--timeout", "1s")

	t.Run("many concurrent requests", func(t *testing.T) {
		const n, clients = 300, 32
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
		defer client.CloseIdleConnections()
		work := make(chan int)
		errs := make(chan error, n)
		var wg sync.WaitGroup
		for range clients {
			wg.Go(func() {
				for i := range work {
					errs <- checkEcho(client, url, i)
				}
			})
		}
		for i := range n {
			work <- i
		}
		close(work)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})

	t.Run("large binary body", func(t *testing.T) {
		body := randomBytes(t, 512<<10)
		req, _ := http.NewRequest("PUT", url+"/echo?status=201", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 201 || !bytes.Equal(got, body) {
			t.Fatalf("status %d, %d bytes back (equal: %v); want 201 and the %d bytes sent", resp.StatusCode, len(got), bytes.Equal(got, body), len(body))
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/octet-stream" {
			t.Fatalf("Content-Type = %q", ct)
		}
	})

	t.Run("every byte value", func(t *testing.T) {
		body := make([]byte, 256*4)
		for i := range body {
			body[i] = byte(i)
		}
		resp, err := http.Post(url+"/echo", "application/octet-stream", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !bytes.Equal(got, body) {
			t.Fatalf("status %d, body equal: %v", resp.StatusCode, bytes.Equal(got, body))
		}
	})

	t.Run("curl", func(t *testing.T) {
		curl, err := exec.LookPath("curl")
		if err != nil {
			t.Fatal("curl is not installed: the end-to-end tests use it as a real HTTP client (make test and .ci/run install it)")
		}
		dir := t.TempDir()
		in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
		body := randomBytes(t, 300<<10)
		if err := os.WriteFile(in, body, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(curl, "-sS", "-o", out, "-w", "%{http_code}", "-H", "Content-Type: image/png",
			"-H", "X-Test: from curl", "--data-binary", "@"+in, url+"/echo?status=202&q=a%20b")
		code, err := cmd.Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		got, _ := os.ReadFile(out)
		if string(code) != "202" || !bytes.Equal(got, body) {
			t.Fatalf("curl got status %s and %d bytes (equal: %v), want 202 and %d bytes", code, len(got), bytes.Equal(got, body), len(body))
		}
		headers, err := exec.Command(curl, "-sS", "-D", "-", "-o", "/dev/null", "-H", "X-Test: hdr", url+"/echo?x=1").Output()
		if err != nil {
			t.Fatalf("curl -D: %v", err)
		}
		for _, want := range []string{"X-Echo-Method: GET", "X-Echo-Query: x=1", "X-Echo-Test: hdr", "X-Echo-Forwarded-For: 127.0.0.1"} {
			if !strings.Contains(string(headers), want) {
				t.Errorf("curl's response headers lack %q:\n%s", want, headers)
			}
		}
	})

	t.Run("slow service gives 504", func(t *testing.T) {
		code, body := get(t, fastURL+"/slow")
		if code != http.StatusGatewayTimeout || !strings.Contains(body, "no reply") {
			t.Fatalf("got %d %q, want 504", code, body)
		}
	})

	t.Run("body over --max-body gives 413", func(t *testing.T) {
		resp, err := http.Post(url+"/echo", "application/octet-stream", bytes.NewReader(make([]byte, 1<<20+1)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413", resp.StatusCode)
		}
	})

	t.Run("metrics and health", func(t *testing.T) {
		gwAdmin := "http://" + gw.waitLog("gateway started")["admin"].(string)
		wAdmin := "http://" + w1.waitLog("worker started")["admin"].(string)
		for _, c := range []struct{ url, want string }{
			{gwAdmin + "/metrics", `disker_gateway_requests_total{code="201"}`},
			{gwAdmin + "/metrics", `disker_messages_sent_total{receiver="web"}`},
			{wAdmin + "/metrics", `disker_messages_handled_total{receiver="web"}`},
			{wAdmin + "/metrics", `disker_handler_duration_seconds_bucket{outcome="handled",receiver="web"`},
			{wAdmin + "/metrics", `disker_in_flight{receiver="web"}`},
			{wAdmin + "/metrics", `disker_concurrency{receiver="web"} 8`},
			{wAdmin + "/healthz", "ok"},
			{wAdmin + "/readyz", "ready"},
			{gwAdmin + "/healthz", "ok"},
		} {
			code, body := get(t, c.url)
			if code != 200 || !strings.Contains(body, c.want) {
				t.Errorf("GET %s: %d, body lacks %q", c.url, code, c.want)
			}
		}
	})

	t.Run("stats shows both workers", func(t *testing.T) {
		waitFor(t, 20*time.Second, "two workers of web in stats", func() bool {
			out, _, code := e.run("", "stats", "--json", "--receiver", "web")
			var snap struct {
				Receivers []struct {
					Receiver string `json:"receiver"`
					Workers  int    `json:"workers"`
				} `json:"receivers"`
			}
			return code == 0 && json.Unmarshal([]byte(out), &snap) == nil &&
				len(snap.Receivers) == 1 && snap.Receivers[0].Workers == 2
		})
		out, _, code := e.run("", "stats")
		if code != 0 || !strings.Contains(out, "web") || !strings.Contains(out, "WORKER") {
			t.Fatalf("stats (%d):\n%s", code, out)
		}
	})
}

// checkEcho sends request i to the gateway and checks what comes back.
func checkEcho(c *http.Client, url string, i int) error {
	body := fmt.Sprintf("request %d %s", i, strings.Repeat("x", i))
	status := 200 + i%3
	req, _ := http.NewRequest("POST", fmt.Sprintf("%s/echo?status=%d&i=%d", url, status, i), strings.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("X-Test", "value "+strconv.Itoa(i))
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("request %d: %v", i, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("request %d: read: %v", i, err)
	}
	switch {
	case resp.StatusCode != status:
		return fmt.Errorf("request %d: status %d, want %d (%s)", i, resp.StatusCode, status, got)
	case string(got) != body:
		return fmt.Errorf("request %d: body %q, want %q", i, got, body)
	case resp.Header.Get("X-Echo-Method") != "POST",
		resp.Header.Get("X-Echo-Query") != fmt.Sprintf("status=%d&i=%d", status, i),
		resp.Header.Get("X-Echo-Test") != "value "+strconv.Itoa(i),
		resp.Header.Get("X-Echo-Path") != "/echo":
		return fmt.Errorf("request %d: the service saw %v", i, resp.Header)
	}
	return nil
}

// TestKillWorkerLosesNothing kills one of two workers with SIGKILL while
// requests are in flight on both: every request accepted by the gateway
// still gets its real answer (or a 504), and the killed worker's requests
// are handled by the other after their lease.
func TestKillWorkerLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t)
	svc := newService(t)
	a := e.startWorker("--receiver", "web", "--http", svc.srv.URL+"/A", "--concurrency", "16", "--lease", "2s")
	e.startWorker("--receiver", "web", "--http", svc.srv.URL+"/B", "--concurrency", "16", "--lease", "2s")
	_, url := e.startGateway("--receiver", "web", "--timeout", "60s")

	// 24 requests, and each worker holds at most 16: both hold some.
	const n = 24
	type result struct {
		status        int
		body, attempt string
		worker        string
		err           error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			resp, err := http.Post(fmt.Sprintf("%s/block?i=%d", url, i), "text/plain", strings.NewReader(fmt.Sprint("payload ", i)))
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			results[i] = result{status: resp.StatusCode, body: string(b), attempt: resp.Header.Get("X-Attempt"), worker: resp.Header.Get("X-Worker")}
		})
	}
	waitFor(t, 30*time.Second, "all requests in flight at the service", func() bool {
		total, _ := svc.inFlight()
		return total == n
	})
	_, by := svc.inFlight()
	if by["A"] == 0 || by["B"] == 0 {
		t.Fatalf("requests in flight by worker: %v; want some on each", by)
	}
	a.signal(syscall.SIGKILL)
	a.exitCode(10 * time.Second)
	close(svc.release)
	wg.Wait()

	retried := 0
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("request %d: %v", i, r.err)
		case r.status == http.StatusGatewayTimeout:
			t.Logf("request %d: 504 (allowed)", i)
		case r.status != 200 || r.body != fmt.Sprint("payload ", i):
			t.Errorf("request %d: %d %q", i, r.status, r.body)
		case r.attempt != "1":
			retried++
			if r.worker != "B" {
				t.Errorf("request %d: attempt %s answered through worker %s, want B", i, r.attempt, r.worker)
			}
		}
	}
	if retried == 0 {
		t.Errorf("no request was redelivered after the kill; %d were in flight on the killed worker", by["A"])
	}
	t.Logf("in flight at the kill: %v; redelivered and answered: %d", by, retried)
}

// TestExecWorker serves a receiver with "tr a-z A-Z" and sends to it in
// every way send offers.
func TestExecWorker(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z", "--concurrency", "4")

	if out, errOut, code := e.run("", "send", "--to", "upper", "--wait", "hello world"); code != 0 || out != "HELLO WORLD" {
		t.Fatalf("send DATA: %d %q %s", code, out, errOut)
	}
	if out, errOut, code := e.run("from stdin\n", "send", "--to", "upper", "--wait", "-"); code != 0 || out != "FROM STDIN\n" {
		t.Fatalf("send -: %d %q %s", code, out, errOut)
	}
	file := filepath.Join(t.TempDir(), "data")
	os.WriteFile(file, []byte("from a file"), 0o600)
	if out, errOut, code := e.run("", "send", "--to", "upper", "--wait", "@"+file); code != 0 || out != "FROM A FILE" {
		t.Fatalf("send @FILE: %d %q %s", code, out, errOut)
	}
	out, errOut, code := e.run("", "send", "--to", "upper", "--fire-and-forget", "nobody waits")
	if code != 0 || len(strings.TrimSpace(out)) != 26 {
		t.Fatalf("send --fire-and-forget: %d %q %s; want a message id", code, out, errOut)
	}

	var lines strings.Builder
	for i := range 50 {
		fmt.Fprintf(&lines, "{\"content\": \"line %d\"}\n", i)
	}
	lines.WriteString("{\"content\": {\"k\": \"json value\"}}\n")
	jsonl := filepath.Join(t.TempDir(), "m.jsonl")
	os.WriteFile(jsonl, []byte(lines.String()), 0o600)
	out, errOut, code = e.run("", "send", "--to", "upper", "--wait", "--concurrency", "8", "--file", jsonl)
	if code != 0 {
		t.Fatalf("send --file: %d %s", code, errOut)
	}
	got := map[int]string{}
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var r struct {
			Line  int    `json:"line"`
			Reply string `json:"reply"`
			Error string `json:"error"`
		}
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("send --file output: %v\n%s", err, out)
		}
		if r.Error != "" {
			t.Errorf("line %d: %s", r.Line, r.Error)
		}
		got[r.Line] = r.Reply
	}
	for i := range 50 {
		if want := fmt.Sprintf("LINE %d", i); got[i+1] != want {
			t.Errorf("line %d: reply %q, want %q", i+1, got[i+1], want)
		}
	}
	if got[51] != `{"K":"JSON VALUE"}` {
		t.Errorf("line 51: reply %q", got[51])
	}
}

// TestDeadLettersAndStats makes a message fail on every attempt and looks at
// it with stats and dlq, retries it and purges it.
func TestDeadLettersAndStats(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "failing", "--max-attempts", "2", "--shell",
		"--exec", `echo "bad input: $(cat)" >&2; exit 3`)

	_, errOut, code := e.run("", "send", "--to", "failing", "--wait", "--timeout", "30s", "boom")
	errOut = withoutLogs(errOut)
	if code != 1 || !strings.Contains(errOut, "bad input: boom") || strings.Count(errOut, "\n") != 1 {
		t.Fatalf("send to a failing worker: exit %d, stderr %q; want 1 and one line with the stderr tail", code, errOut)
	}
	deadLetters := func() int64 {
		out, errOut, code := e.run("", "stats", "--json", "--receiver", "failing")
		var snap struct {
			Receivers []struct {
				DeadLetters int64 `json:"dead_letters"`
			} `json:"receivers"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Receivers) != 1 {
			t.Fatalf("stats --json: %d %s %s", code, out, errOut)
		}
		return snap.Receivers[0].DeadLetters
	}
	if n := deadLetters(); n != 1 {
		t.Fatalf("stats: %d dead letters, want 1", n)
	}
	out, _, code := e.run("", "dlq", "list", "--receiver", "failing")
	if code != 0 || !strings.Contains(out, `"boom"`) || !strings.Contains(out, "exit status 3") {
		t.Fatalf("dlq list (%d):\n%s", code, out)
	}
	out, _, code = e.run("", "dlq", "list", "--receiver", "failing", "--json")
	var dls []struct {
		ID       string `json:"id"`
		Content  string `json:"content"`
		Attempts int    `json:"attempts"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &dls) != nil || len(dls) != 1 || dls[0].Content != "boom" || dls[0].Attempts != 2 {
		t.Fatalf("dlq list --json (%d):\n%s", code, out)
	}

	first := dls[0].ID
	out, _, code = e.run("", "dlq", "retry", "--receiver", "failing", first)
	if code != 0 || !strings.Contains(out, "retried 1") {
		t.Fatalf("dlq retry (%d): %s", code, out)
	}
	// It fails twice more and comes back.
	waitFor(t, 30*time.Second, "the retried message back in the dead-letter stream", func() bool {
		out, _, _ := e.run("", "dlq", "list", "--receiver", "failing", "--json")
		return json.Unmarshal([]byte(out), &dls) == nil && len(dls) == 1 && dls[0].ID != first
	})
	out, _, code = e.run("", "dlq", "purge", "--receiver", "failing", "--all")
	if code != 0 || !strings.Contains(out, "purged 1") {
		t.Fatalf("dlq purge (%d): %s", code, out)
	}
	if n := deadLetters(); n != 0 {
		t.Fatalf("stats after purge: %d dead letters, want 0", n)
	}

	// Messages with no worker wait in the queue.
	for range 3 {
		if _, errOut, code := e.run("", "send", "--to", "idle", "--fire-and-forget", "x"); code != 0 {
			t.Fatalf("send: %s", errOut)
		}
	}
	out, _, code = e.run("", "stats", "--json")
	var snap struct {
		Receivers []struct {
			Receiver string `json:"receiver"`
			Queued   int64  `json:"queued"`
		} `json:"receivers"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil {
		t.Fatalf("stats --json (%d): %s", code, out)
	}
	found := false
	for _, r := range snap.Receivers {
		if r.Receiver == "idle" {
			found = r.Queued == 3
		}
	}
	if !found {
		t.Fatalf("stats does not show 3 queued messages for idle:\n%s", out)
	}
}

// TestPriorityAndLimits sends messages at three priority levels with
// "disker send --priority" to a receiver no worker serves: "stats" counts
// them by level. A worker started with --global-concurrency and --rate
// shows its limits in "stats", and handles the high one first.
func TestPriorityAndLimits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, p := range []string{"low", "normal", "high"} {
		if _, errOut, code := e.run("", "send", "--to", "ranked", "--priority", p, "--fire-and-forget", p); code != 0 {
			t.Fatalf("send --priority %s: %s", p, errOut)
		}
	}
	type row struct {
		Receiver          string  `json:"receiver"`
		Queued            int64   `json:"queued"`
		QueuedHigh        int64   `json:"queued_high"`
		QueuedLow         int64   `json:"queued_low"`
		GlobalConcurrency int     `json:"global_concurrency"`
		RateLimit         float64 `json:"rate_limit"`
		RateBurst         int     `json:"rate_burst"`
	}
	stats := func() row {
		out, errOut, code := e.run("", "stats", "--json", "--receiver", "ranked")
		var snap struct {
			Receivers []row `json:"receivers"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Receivers) != 1 {
			t.Fatalf("stats --json: %d %s %s", code, out, errOut)
		}
		return snap.Receivers[0]
	}
	if r := stats(); r.Queued != 3 || r.QueuedHigh != 1 || r.QueuedLow != 1 {
		t.Fatalf("stats: %+v, want 3 queued, 1 high and 1 low", r)
	}
	out, _, code := e.run("", "stats", "--receiver", "ranked")
	if code != 0 || !strings.Contains(out, "3 (high 1, low 1)") || !strings.Contains(out, "LIMITS") {
		t.Fatalf("stats (%d):\n%s", code, out)
	}
	log := filepath.Join(t.TempDir(), "order")
	e.startWorker("--receiver", "ranked", "--concurrency", "1", "--global-concurrency", "2", "--rate", "50", "--burst", "5",
		"--shell", "--exec", "cat >> "+log+"; echo >> "+log)
	waitFor(t, 30*time.Second, "the three messages handled", func() bool {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "\n") == 3
	})
	if b, _ := os.ReadFile(log); string(b) != "high\nnormal\nlow\n" {
		t.Fatalf("handled in the order %q, want high, normal, low", b)
	}
	if r := stats(); r.GlobalConcurrency != 2 || r.RateLimit != 50 || r.RateBurst != 5 {
		t.Fatalf("stats with the worker: %+v, want global concurrency 2, rate 50, burst 5", r)
	}
	out, _, _ = e.run("", "stats", "--receiver", "ranked")
	if !strings.Contains(out, "2 at once, 50/s burst 5") {
		t.Fatalf("stats does not show the limits:\n%s", out)
	}
}

// TestWorkerGracefulStop sends SIGTERM to a worker with a message in
// flight: it finishes the message, replies, and exits 0. A second signal
// exits at once.
func TestWorkerGracefulStop(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	marks := t.TempDir()
	e.extra = []string{"MARKS=" + marks}
	// The command marks that it started, then waits for the test's go-ahead.
	// It writes its pid into the mark.
	script := `echo $$ > "$MARKS/$DISKER_MESSAGE_ID"; while [ ! -e "$MARKS/go" ]; do sleep 0.02; done; tr a-z A-Z`
	started := func() bool {
		entries, _ := os.ReadDir(marks)
		return len(entries) > 0
	}
	// Whatever happens, no command waits for ever after the test.
	t.Cleanup(func() { os.WriteFile(filepath.Join(marks, "go"), nil, 0o600) })

	w := e.startWorker("--receiver", "slow", "--shell", "--exec", script, "--shutdown-timeout", "60s")
	send := e.start("send", "--to", "slow", "--wait", "--timeout", "60s", "finish me")
	waitFor(t, 30*time.Second, "the message to start", started)
	w.signal(syscall.SIGTERM)
	w.waitLog("stopping: no new messages; waiting for those in flight")
	select {
	case <-w.done:
		t.Fatalf("the worker exited with a message in flight:\n%s", w.stderr.String())
	default:
	}
	os.WriteFile(filepath.Join(marks, "go"), nil, 0o600)
	if code := w.exitCode(30 * time.Second); code != 0 {
		t.Fatalf("worker exit code %d after SIGTERM, want 0:\n%s", code, w.stderr.String())
	}
	if code := send.exitCode(30 * time.Second); code != 0 || send.stdout.String() != "FINISH ME" {
		t.Fatalf("send: exit %d, stdout %q", code, send.stdout.String())
	}
	w.waitLog("worker stopped")

	// A second signal does not wait.
	os.Remove(filepath.Join(marks, "go"))
	for _, f := range must(os.ReadDir(marks)) {
		os.Remove(filepath.Join(marks, f.Name()))
	}
	w2 := e.startWorker("--receiver", "slow2", "--shell", "--exec", script, "--shutdown-timeout", "60s")
	e.start("send", "--to", "slow2", "--wait", "--timeout", "60s", "never finished")
	waitFor(t, 30*time.Second, "the message to start", started)
	w2.signal(syscall.SIGTERM)
	w2.waitLog("stopping: no new messages; waiting for those in flight")
	// A repeat within 250ms of the first counts as the same delivery; signal
	// again until the worker gives up.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
resignal:
	for {
		select {
		case <-w2.done:
			break resignal
		case <-deadline:
			t.Fatal("the worker did not exit on a second signal")
		case <-tick.C:
			_ = w2.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	if code := w2.exitCode(10 * time.Second); code != 1 {
		t.Fatalf("exit code %d after a second signal, want 1", code)
	}
	// The command it was running does not outlive it.
	var pid int
	for _, f := range must(os.ReadDir(marks)) {
		b, err := os.ReadFile(filepath.Join(marks, f.Name()))
		if err == nil && len(bytes.TrimSpace(b)) > 0 {
			pid = must(strconv.Atoi(string(bytes.TrimSpace(b))))
		}
	}
	if pid == 0 {
		t.Fatal("the command did not record its pid")
	}
	waitFor(t, 10*time.Second, "the command to die with its worker", func() bool {
		return !alive(pid)
	})
}

// alive reports whether process pid runs (a zombie does not count).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestDemo runs the demo on the embedded broker and through Redis, and the
// pool demo.
func TestDemo(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, args := range [][]string{
		{"demo"},
		{"demo", "--redis-url", redisURL, "--key-prefix", e.prefix + "demo", "--messages", "150"},
	} {
		out, errOut, code := e.run("", args...)
		if code != 0 || !strings.Contains(out, "Summary") || !strings.Contains(out, "errors           0") {
			t.Errorf("disker %v: exit %d\nstdout:\n%s\nstderr:\n%s", args, code, out, errOut)
		}
		// Not a terminal: plain periodic lines, no cursor moves.
		if strings.Contains(out, "\x1b[") {
			t.Errorf("disker %v wrote terminal escapes to a pipe", args)
		}
	}
	out, errOut, code := e.run("", "demo", "pool", "--job", "100ms")
	if code != 0 || !strings.Contains(out, "Act 1") || !strings.Contains(out, "Act 2") || !strings.Contains(out, "caller 3") {
		t.Errorf("demo pool: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestUsage checks help, version, and the one-line errors and exit codes.
func TestUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, cmd := range [][]string{{}, {"demo"}, {"demo", "pool"}, {"worker"}, {"gateway"}, {"send"}, {"stats"},
		{"dlq"}, {"dlq", "list"}, {"dlq", "retry"}, {"dlq", "purge"}, {"version"}} {
		out, _, code := e.run("", append(cmd, "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:") || (len(cmd) > 0 && !strings.Contains(out, "Examples:")) {
			t.Errorf("disker %v --help: exit %d\n%s", cmd, code, out)
		}
	}
	if out, _, code := e.run("", "version"); code != 0 || !strings.HasPrefix(out, "disker ") {
		t.Errorf("version: %d %q", code, out)
	}
	for _, c := range []struct {
		args []string
		env  string
		code int
		want string
	}{
		{[]string{"worker", "--receiver", "x"}, "", 2, "one of --exec or --http is required"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--bogus"}, "", 2, "unknown flag: --bogus"},
		{[]string{"worker", "--receiver", "bad name", "--exec", "cat"}, "", 2, `invalid --receiver "bad name"`},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--concurrency", "0"}, "", 2, "--concurrency"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--prefetch", "-1"}, "", 2, "--prefetch"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat"}, "DISKER_CONCURRENCY=lots", 2, "DISKER_CONCURRENCY"},
		{[]string{"worker", "--receiver", "x", "--exec", "'unterminated"}, "", 2, "unterminated"},
		{[]string{"gateway", "--receiver", "web", "--timeout", "0s"}, "", 2, "--timeout"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--global-concurrency", "0"}, "", 2, "--global-concurrency"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--rate", "0"}, "", 2, "--rate"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--rate", "-3"}, "", 2, "--rate"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--rate", "10", "--burst", "0"}, "", 2, "--burst"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--burst", "5"}, "", 2, "--burst needs --rate"},
		{[]string{"send", "--to", "x", "--priority", "urgent", "hi"}, "", 2, "--priority"},
		{[]string{"send", "--to", "x", "--group", "", "hi"}, "", 2, "invalid --group: must not be empty"},
		{[]string{"send", "--to", "x", "--delay", "1m", "--at", "2030-01-01T00:00:00Z", "hi"}, "", 2, "invalid --delay: --delay and --at both give the message a due time: give one"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--group-concurrency", "0"}, "", 2, "--group-concurrency"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--group-rate", "0"}, "", 2, "--group-rate"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--group-burst", "5"}, "", 2, "--group-burst needs --group-rate"},
		{[]string{"send", "hello"}, "", 2, "--to is required"},
		{[]string{"send", "--to", "x", "--wait", "--fire-and-forget", "hi"}, "", 2, "exclude each other"},
		{[]string{"dlq", "retry", "--receiver", "x"}, "", 2, "--all"},
		{[]string{"stats", "--interval", "soon"}, "", 2, "--interval"},
		{[]string{"nope"}, "", 2, `unknown command "nope"`},
		{[]string{"stats", "--redis-url", "redis://127.0.0.1:1/0"}, "", 1, "start redis-server there"},
		{[]string{"send", "--to", "nobody", "--wait", "--require-worker", "hi"}, "", 1, `no live worker serves "nobody"`},
	} {
		e.extra = nil
		if c.env != "" {
			e.extra = []string{c.env}
		}
		_, errOut, code := e.run("", c.args...)
		errOut = withoutLogs(errOut)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("disker %v: exit %d, stderr %q; want exit %d and one line with %q", c.args, code, errOut, c.code, c.want)
		}
	}
}

// TestGatewayRedisDown stops Redis under a gateway: requests get 503 at
// once, and 200 again when Redis is back.
func TestGatewayRedisDown(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t)
	e.redisURL = srv.URL()
	svc := newService(t)
	e.startWorker("--receiver", "web", "--http", svc.srv.URL)
	gw, url := e.startGateway("--receiver", "web", "--timeout", "20s", "--admin", "127.0.0.1:0")
	admin := "http://" + gw.waitLog("gateway started")["admin"].(string)
	if code, body := get(t, url+"/echo"); code != 200 {
		t.Fatalf("before the stop: %d %q", code, body)
	}
	srv.Kill()
	// A request sent in the instant Redis dies may have been queued all the
	// same (its answer lost), and the gateway then settles it at its timeout
	// (see disker.Request). Once the gateway knows that Redis is down, a
	// request fails at once.
	waitFor(t, 30*time.Second, "the gateway to report Redis down", func() bool {
		code, _ := get(t, admin+"/readyz")
		return code == http.StatusServiceUnavailable
	})
	code, body := get(t, url+"/echo")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "cannot be reached") {
		t.Fatalf("with Redis down: %d %q, want 503", code, body)
	}
	srv.Restart()
	waitFor(t, 30*time.Second, "200 again after Redis restarted", func() bool {
		code, _ := get(t, url+"/echo")
		return code == 200
	})
}

// TestGatewayBadGateway: a service that is down, and a receiver served by
// something that does not answer in HTTP, both give 502 with a request id
// that the gateway's log and the dead letter carry with the reason; the
// client learns nothing of the backend's address or error.
func TestGatewayBadGateway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "down", "--http", "http://127.0.0.1:1", "--max-attempts", "2")
	gw, downURL := e.startGateway("--receiver", "down", "--timeout", "30s")
	code, body := get(t, downURL+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "request id ") {
		t.Fatalf("service down: %d %q, want 502 with a request id", code, body)
	}
	for _, secret := range []string{"127.0.0.1", "connection refused", "forward to", "dial"} {
		if strings.Contains(body, secret) {
			t.Errorf("the 502 body tells the client %q: %q", secret, body)
		}
	}
	id := strings.TrimSuffix(strings.Fields(body[strings.Index(body, "request id ")+len("request id "):])[0], ")")
	logged := gw.waitLog("request failed")
	if err, _ := logged["err"].(string); !strings.Contains(err, "connection refused") || !strings.Contains(err, id) {
		t.Errorf("the gateway's log does not give the reason with request id %s: %v", id, logged)
	}
	out, _, _ := e.run("", "dlq", "list", "--receiver", "down", "--json")
	if !strings.Contains(out, `\"url\":\"/x\"`) || !strings.Contains(out, `"request-id": "`+id+`"`) {
		t.Fatalf("the failed request is not in the dead letters with request id %s:\n%s", id, out)
	}

	e.startWorker("--receiver", "plain", "--exec", "cat")
	_, plainURL := e.startGateway("--receiver", "plain", "--timeout", "30s")
	code, body = get(t, plainURL+"/x")
	if code != http.StatusBadGateway || !strings.Contains(body, "not an HTTP response") || !strings.Contains(body, "request id ") {
		t.Fatalf("non-HTTP reply: %d %q, want 502", code, body)
	}
}

// TestSendFileInBatches sends 250 lines without --wait (three SendBatch
// calls of at most 100 lines) to a receiver nobody serves: stats counts
// all 250 queued.
func TestSendFileInBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var lines strings.Builder
	for i := range 250 {
		fmt.Fprintf(&lines, "{\"content\": \"job %d\"}\n", i)
	}
	jsonl := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(jsonl, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := e.run("", "send", "--to", "bulk", "--concurrency", "2", "--file", jsonl)
	if code != 0 || !strings.Contains(errOut, "sent 250 of 250 messages to bulk") {
		t.Fatalf("send --file: exit %d, stderr %q", code, errOut)
	}
	out, errOut, code := e.run("", "stats", "--json", "--receiver", "bulk")
	var snap struct {
		Receivers []struct {
			Queued int64 `json:"queued"`
		} `json:"receivers"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Receivers) != 1 || snap.Receivers[0].Queued != 250 {
		t.Fatalf("stats --json after the batches: %d %s %s; want 250 queued", code, out, errOut)
	}
}
