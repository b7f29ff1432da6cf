package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker/internal/redistest"
)

// The end-to-end tests build the disker binary once and run it as a user
// would: as processes, against a private redis-server, driven by real HTTP
// clients.
var (
	bin        string   // the built disker binary
	buildFlags []string // extra flags of its go build (-race under the race detector)
	redisURL   string   // the private redis-server
	prefixes   atomic.Int64
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "disker-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "disker")
	// go test puts its own go command first on PATH.
	build := exec.Command("go", append(append([]string{"build"}, buildFlags...), "-o", bin, ".")...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go build of the disker command failed:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	if len(buildFlags) > 0 {
		// The processes inherit it: a data race ends the process at once.
		os.Setenv("GORACE", "halt_on_error=1")
	}
	srv, stop := redistest.MustStart()
	redisURL = srv.URL()
	code := m.Run()
	stop()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// env is the environment of one test's disker processes: the private Redis
// and a key prefix of the test's own.
type env struct {
	t        *testing.T
	prefix   string
	redisURL string
	extra    []string
}

func newEnv(t *testing.T) *env {
	return &env{t: t, prefix: fmt.Sprintf("e2e%d", prefixes.Add(1)), redisURL: redisURL}
}

func (e *env) environ() []string {
	out := []string{"DISKER_REDIS_URL=" + e.redisURL, "DISKER_KEY_PREFIX=" + e.prefix, "DISKER_LOG_FORMAT=json"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISKER_") {
			out = append(out, kv)
		}
	}
	return append(out, e.extra...)
}

// proc is a running disker process.
type proc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdout syncBuffer
	stderr syncBuffer
	done   chan struct{}
	err    error
}

// start starts disker with args; the process is killed when the test ends.
func (e *env) start(args ...string) *proc {
	e.t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = e.environ()
	return startProc(e.t, cmd, fmt.Sprintf("disker %v", args), true)
}

// startProc starts cmd, keeping its output; it is killed when the test
// ends, and its output logged then if the test failed and logOnFail says
// so.
func startProc(t *testing.T, cmd *exec.Cmd, what string, logOnFail bool) *proc {
	t.Helper()
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", what, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() && logOnFail {
			t.Logf("%s\nstdout:\n%s\nstderr:\n%s", what, p.stdout.String(), p.stderr.String())
		}
	})
	return p
}

// run runs disker with args to the end and returns its output and exit code.
func (e *env) run(stdin string, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = e.environ()
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code < 0 {
		e.t.Fatalf("disker %v: %v\nstderr: %s", args, err, errb.String())
	}
	return out.String(), errb.String(), code
}

// exitCode waits up to timeout for the process to exit and returns its code.
func (p *proc) exitCode(timeout time.Duration) int {
	p.t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(timeout):
		p.t.Fatalf("disker did not exit within %v\nstderr:\n%s", timeout, p.stderr.String())
		return -1
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// waitLog waits for a JSON log line whose msg is msg and returns its fields.
func (p *proc) waitLog(msg string) map[string]any {
	p.t.Helper()
	var found map[string]any
	waitFor(p.t, 30*time.Second, "log line "+msg, func() bool {
		sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
				found = rec
				return true
			}
		}
		select {
		case <-p.done:
			p.t.Fatalf("disker exited (%v) before logging %q:\n%s", p.err, msg, p.stderr.String())
		default:
		}
		return false
	})
	return found
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		<-tick.C
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and readers at once.
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

// withoutLogs drops the JSON log lines from a command's stderr, leaving
// what it says to its user.
func withoutLogs(stderr string) string {
	var b strings.Builder
	for line := range strings.Lines(stderr) {
		if !strings.HasPrefix(line, "{") {
			b.WriteString(line)
		}
	}
	return b.String()
}
