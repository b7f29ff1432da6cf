package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSplitArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want []string
		err  bool
	}{
		{"tr a-z A-Z", []string{"tr", "a-z", "A-Z"}, false},
		{"  cat  ", []string{"cat"}, false},
		{`grep -e 'a b' "c d" e\ f`, []string{"grep", "-e", "a b", "c d", "e f"}, false},
		{`echo "say \"hi\" \$HOME \\ \n"`, []string{"echo", `say "hi" $HOME \ \n`}, false},
		{`echo '$HOME' * ;`, []string{"echo", "$HOME", "*", ";"}, false},
		{`a''b ""`, []string{"ab", ""}, false},
		{"", nil, false},
		{"'open", nil, true},
		{`"open`, nil, true},
		{`trailing\`, nil, true},
	}
	for _, tt := range tests {
		got, err := splitArgs(tt.in)
		if (err != nil) != tt.err || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("splitArgs(%q) = %q, %v; want %q, error %v", tt.in, got, err, tt.want, tt.err)
		}
	}
}

func TestByteSize(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int64{"0": 0, "1048576": 1 << 20, "512KiB": 512 << 10, "1MiB": 1 << 20,
		"2M": 2 << 20, "3k": 3 << 10, "1 GiB": 1 << 30, "10B": 10} {
		var s byteSize
		if err := s.Set(in); err != nil || int64(s) != want {
			t.Errorf("Set(%q) = %d, %v; want %d", in, s, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1", "1.5MiB", "1TiB", "99999999999G"} {
		var s byteSize
		if err := s.Set(in); err == nil {
			t.Errorf("Set(%q) accepted", in)
		}
	}
	s := byteSize(512 << 10)
	if s.String() != "512KiB" {
		t.Errorf("String() = %q", s.String())
	}
}

func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"web", "a.b:c-d_e", strings.Repeat("x", 200)} {
		if err := checkName("receiver", ok); err != nil {
			t.Errorf("checkName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "a b", "_inbox", "x{y}", "a*", strings.Repeat("x", 201)} {
		err := checkName("receiver", bad)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "--receiver") || bad != "" && !strings.Contains(err.Error(), strconv.Quote(bad)) {
			t.Errorf("checkName(%q) = %v, want a usage error naming --receiver and quoting the name", bad, err)
		}
	}
	for name, want := range map[string]string{
		"":         "--receiver is required",
		"my queue": `invalid --receiver "my queue": has a character outside [A-Za-z0-9._:-] at byte 2`,
		"_inbox.x": `invalid --receiver "_inbox.x": must not start with '_' (reserved for Disker's own names)`,
	} {
		if err := checkName("receiver", name); err == nil || err.Error() != want {
			t.Errorf("checkName(%q) = %v, want %q", name, err, want)
		}
	}
}

func TestExecHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := &disker.Message{ID: "id-1", Receiver: "r", Sender: "s", Attempt: 2, Content: []byte("hello")}
	run := func(argv []string, timeout time.Duration, max int) ([]byte, error) {
		h := &execHandler{argv: argv, timeout: timeout, maxReply: max, env: os.Environ()}
		return h.Handle(ctx, msg)
	}
	if out, err := run([]string{"tr", "a-z", "A-Z"}, 0, 100); err != nil || string(out) != "HELLO" {
		t.Fatalf("tr: %q, %v", out, err)
	}
	out, err := run([]string{"sh", "-c", `echo "$DISKER_MESSAGE_ID $DISKER_RECEIVER $DISKER_SENDER $DISKER_ATTEMPT"`}, 0, 100)
	if err != nil || string(out) != "id-1 r s 2\n" {
		t.Fatalf("environment: %q, %v", out, err)
	}
	if out, err := run([]string{"true"}, 0, 100); err != nil || out == nil || len(out) != 0 {
		t.Fatalf("empty stdout: %q (nil: %v), %v; want an empty, non-nil reply", out, out == nil, err)
	}
	_, err = run([]string{"sh", "-c", "echo partial; echo 'it broke' >&2; exit 3"}, 0, 100)
	if err == nil || !strings.Contains(err.Error(), "exit status 3") || !strings.Contains(err.Error(), "it broke") {
		t.Fatalf("failing command: %v; want the exit status and stderr", err)
	}
	// A shell that starts a child: the whole group dies at the timeout.
	_, err = run([]string{"sh", "-c", "sleep 30 & wait"}, 100*time.Millisecond, 100)
	if err == nil || !strings.Contains(err.Error(), "--exec-timeout") {
		t.Fatalf("slow command: %v; want the --exec-timeout error", err)
	}
	_, err = run([]string{"cat"}, 0, 3)
	if err == nil || !strings.Contains(err.Error(), "over 3 bytes") {
		t.Fatalf("large reply: %v", err)
	}
	// A command that does not read its stdin still succeeds.
	big := &disker.Message{ID: "id-2", Content: bytes.Repeat([]byte("x"), 4<<20)}
	if out, err := (&execHandler{argv: []string{"echo", "hi"}, maxReply: 100, env: os.Environ()}).Handle(ctx, big); err != nil || string(out) != "hi\n" {
		t.Fatalf("command that ignores stdin: %q, %v", out, err)
	}
	if _, err := run([]string{"/no/such/command"}, 0, 100); err == nil {
		t.Fatal("a missing command succeeded")
	}
}

// syncBuffer collects a command's output while tests read it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logField waits for a JSON log line with msg and returns its field.
func logField(t *testing.T, b *syncBuffer, msg, field string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		sc := bufio.NewScanner(strings.NewReader(b.String()))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
				s, _ := rec[field].(string)
				return s
			}
		}
		<-time.After(10 * time.Millisecond)
	}
	t.Fatalf("no log line %q in:\n%s", msg, b.String())
	return ""
}

// TestHTTPTierInProcess runs a worker and a gateway in this process, on the
// in-memory broker, so that the race detector sees their code.
func TestHTTPTierInProcess(t *testing.T) {
	t.Parallel()
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("X-Path", r.URL.Path)
		w.WriteHeader(http.StatusAccepted)
		w.Write(b)
	}))
	defer svc.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wOut, gOut syncBuffer
	codes := make(chan int, 2)
	broker := "mem://cli-http-tier"
	go func() {
		codes <- Run(ctx, []string{"worker", "--receiver", "web", "--http", svc.URL + "/base", "--redis-url", broker,
			"--log-format", "json", "--concurrency", "4"}, strings.NewReader(""), io.Discard, &wOut)
	}()
	logField(t, &wOut, "worker started", "receiver")
	go func() {
		codes <- Run(ctx, []string{"gateway", "--listen", "127.0.0.1:0", "--receiver", "web", "--redis-url", broker,
			"--log-format", "json", "--timeout", "10s", "--admin", "127.0.0.1:0"}, strings.NewReader(""), io.Discard, &gOut)
	}()
	url := "http://" + logField(t, &gOut, "gateway started", "listen")

	var wg sync.WaitGroup
	for i := range 20 {
		wg.Go(func() {
			body := strings.Repeat("x", i*100)
			resp, err := http.Post(url+"/p?i=1", "text/plain", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			got, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusAccepted || string(got) != body || resp.Header.Get("X-Path") != "/base/p" {
				t.Errorf("request %d: %d %q %v", i, resp.StatusCode, got, resp.Header)
			}
		})
	}
	wg.Wait()
	http.DefaultClient.CloseIdleConnections()
	cancel()
	for range 2 {
		if code := <-codes; code != ExitOK {
			t.Errorf("exit code %d after the context ended\nworker:\n%s\ngateway:\n%s", code, wOut.String(), gOut.String())
		}
	}
}

func TestDemoInProcess(t *testing.T) {
	t.Parallel()
	var out, errOut syncBuffer
	code := Run(context.Background(), []string{"demo", "--messages", "60", "--rate", "0", "--workers", "2"}, strings.NewReader(""), &out, &errOut)
	if code != ExitOK || !strings.Contains(out.String(), "Summary") {
		t.Fatalf("demo: %d\n%s\n%s", code, out.String(), errOut.String())
	}
	out = syncBuffer{}
	code = Run(context.Background(), []string{"demo", "pool", "--job", "20ms", "--callers", "4", "--size", "2"}, strings.NewReader(""), &out, &errOut)
	if code != ExitOK || !strings.Contains(out.String(), "The callers share them") {
		t.Fatalf("demo pool: %d\n%s\n%s", code, out.String(), errOut.String())
	}
}

// TestEnvFallback cannot run in parallel: it sets environment variables.
func TestEnvFallback(t *testing.T) {
	t.Setenv("DISKER_LOG_LEVEL", "loud")
	var out, errOut bytes.Buffer
	if code := Run(context.Background(), []string{"version"}, nil, &out, &errOut); code != ExitUsage ||
		!strings.Contains(errOut.String(), "invalid --log-level (DISKER_LOG_LEVEL) \"loud\"") {
		t.Fatalf("bad DISKER_LOG_LEVEL: %d %q", code, errOut.String())
	}
	errOut.Reset()
	if code := Run(context.Background(), []string{"version", "--log-level", "warn"}, nil, &out, &errOut); code != ExitOK {
		t.Fatalf("a flag did not win over its environment variable: %d %q", code, errOut.String())
	}
	if got := envName("shutdown-timeout"); got != "DISKER_SHUTDOWN_TIMEOUT" {
		t.Fatalf("envName = %q", got)
	}
}

func TestCheckRedisURL(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"redis://127.0.0.1:6379/0", "rediss://u:p@h/3", "redis://h", "mem://x",
		"redis://s1:26379?addr=s2:26379&master_set=m"} {
		if _, err := checkRedisURL(ok); err != nil {
			t.Errorf("checkRedisURL(%q) = %v", ok, err)
		}
	}
	for in, want := range map[string]string{
		"":                         "is empty",
		"localhost:6379":           "did you mean redis://localhost:6379?",
		"http://h:1":               `scheme "http"`,
		"redis://":                 "no host",
		"redis://h:0":              `port "0"`,
		"redis://h:1/-1":           `database "-1"`,
		"rediss://h?skip_verify=1": "--tls-insecure-skip-verify",
		"redis://u:secret@h:1/x":   `"redis://u:xxxxx@h:1/x"`,
		"redis://h:1/0\x7f":        "invalid",
	} {
		_, err := checkRedisURL(in)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), want) {
			t.Errorf("checkRedisURL(%q) = %v; want a usage error with %q", in, err, want)
		}
		if strings.Contains(fmt.Sprint(err), "secret") {
			t.Errorf("checkRedisURL(%q) = %v: shows the password", in, err)
		}
	}
}

// TestGatewayClientGoneCancelsService: when the HTTP client of the
// gateway goes away, its message is cancelled: the worker's --http call is
// cancelled, and the service sees its request's context end.
func TestGatewayClientGoneCancelsService(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		select {
		case <-r.Context().Done():
			ended <- r.Context().Err()
		case <-time.After(time.Minute):
			ended <- errors.New("the service's request was not cancelled")
		}
	}))
	defer svc.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wOut, gOut syncBuffer
	codes := make(chan int, 2)
	broker := "mem://cli-http-cancel"
	go func() {
		codes <- Run(ctx, []string{"worker", "--receiver", "web", "--http", svc.URL, "--redis-url", broker,
			"--log-format", "json"}, strings.NewReader(""), io.Discard, &wOut)
	}()
	logField(t, &wOut, "worker started", "receiver")
	go func() {
		codes <- Run(ctx, []string{"gateway", "--listen", "127.0.0.1:0", "--receiver", "web", "--redis-url", broker,
			"--log-format", "json", "--timeout", "60s"}, strings.NewReader(""), io.Discard, &gOut)
	}()
	url := "http://" + logField(t, &gOut, "gateway started", "listen")

	cctx, goAway := context.WithCancel(ctx)
	req, _ := http.NewRequestWithContext(cctx, http.MethodGet, url+"/slow", nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the service got no request")
	}
	gone := time.Now()
	goAway()
	<-errc
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the service's request ended with %v, want it cancelled", err)
		}
		t.Logf("the service's request was cancelled %v after the client went away", time.Since(gone))
	case <-time.After(20 * time.Second):
		t.Fatal("the service's request was not cancelled after the client went away")
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	for range 2 {
		<-codes
	}
}

// TestVerboseAndLogLevel cannot run in parallel: it sets environment
// variables. -v and --log-level both on the command line are a usage
// error; one from its variable gives way to the other on the command line.
func TestVerboseAndLogLevel(t *testing.T) {
	run := func(args ...string) (int, string) {
		var out, errOut bytes.Buffer
		code := Run(context.Background(), args, nil, &out, &errOut)
		return code, errOut.String()
	}
	if code, errOut := run("version", "-v", "--log-level", "info"); code != ExitUsage || !strings.Contains(errOut, "give -v or --log-level, not both") {
		t.Errorf("-v --log-level info: %d %q, want a usage error", code, errOut)
	}
	t.Setenv("DISKER_LOG_LEVEL", "warn")
	if code, errOut := run("version", "-v"); code != ExitOK {
		t.Errorf("DISKER_LOG_LEVEL=warn with -v: %d %q, want 0", code, errOut)
	}
	t.Setenv("DISKER_LOG_LEVEL", "")
	os.Unsetenv("DISKER_LOG_LEVEL")
	t.Setenv("DISKER_VERBOSE", "true")
	if code, errOut := run("version", "--log-level", "warn"); code != ExitOK {
		t.Errorf("DISKER_VERBOSE=true with --log-level warn: %d %q, want 0", code, errOut)
	}
}
