package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// tourShell is one bash process that runs the tour's commands in turn, as
// a reader would type them into one terminal: variables ($APP, $W2) and
// background jobs carry over from one command to the next.
type tourShell struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout syncBuffer
	stderr syncBuffer
	n      int
	quiet  bool // no copy of its output in the log of a failed test
}

func startTourShell(t *testing.T, dir string, env []string) *tourShell {
	t.Helper()
	sh := &tourShell{t: t}
	sh.cmd = exec.Command("bash", "-s")
	sh.cmd.Dir = dir
	sh.cmd.Env = env
	sh.cmd.Stdout, sh.cmd.Stderr = &sh.stdout, &sh.stderr
	// Its own process group: the cleanup ends the shell and its jobs.
	sh.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var err error
	if sh.stdin, err = sh.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := sh.cmd.Start(); err != nil {
		t.Fatalf("start bash: %v", err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-sh.cmd.Process.Pid, syscall.SIGKILL)
		_ = sh.cmd.Wait()
		if t.Failed() && !sh.quiet {
			t.Logf("the tour's shell:\nstdout:\n%s\nstderr:\n%s", sh.stdout.String(), sh.stderr.String())
		}
	})
	return sh
}

// run runs script in the shell and returns what it printed on stdout and
// its exit status, waiting up to timeout.
func (sh *tourShell) run(script string, timeout time.Duration) (string, int) {
	sh.t.Helper()
	sh.n++
	marker := fmt.Sprintf("__tour_step_%d__", sh.n)
	from := len(sh.stdout.String())
	if _, err := fmt.Fprintf(sh.stdin, "%s\necho %s $?\n", script, marker); err != nil {
		sh.t.Fatalf("write to the tour's shell: %v", err)
	}
	var out string
	waitFor(sh.t, timeout, "the tour's step: "+script, func() bool {
		out = sh.stdout.String()[from:]
		return strings.Contains(out, marker)
	})
	i := strings.Index(out, marker)
	code, _ := strconv.Atoi(strings.Fields(out[i+len(marker):])[0])
	return out[:i], code
}

// tourBlocks returns the ```sh blocks of the README's tour, each a list of
// lines, and checks that docs/tour.md has the same.
func tourBlocks(t *testing.T) [][]string {
	t.Helper()
	section := func(path, from, to string) [][]string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		start := strings.Index(s, from)
		end := len(s)
		if to != "" {
			end = strings.Index(s, to)
		}
		if start < 0 || end < start {
			t.Fatalf("%s has no %q section", path, from)
		}
		var blocks [][]string
		var cur []string
		in := false
		for line := range strings.Lines(s[start:end]) {
			line = strings.TrimRight(line, "\n")
			switch {
			case line == "```sh":
				in, cur = true, nil
			case line == "```" && in:
				in = false
				blocks = append(blocks, cur)
			case in:
				cur = append(cur, line)
			}
		}
		return blocks
	}
	readme := section("../../README.md", "## Five-minute tour", "## More")
	if page := section("../../docs/tour.md", "## Five-minute tour", ""); !slices.EqualFunc(readme, page, slices.Equal) {
		t.Fatalf("the commands of docs/tour.md differ from those of the README's tour:\n%q\n%q", page, readme)
	}
	return readme
}

// TestTour runs the README's five-minute tour, every line of it as
// written but "make build" (this test built the command), in one bash
// shell, from a directory laid out as a checkout: bin/disker is this
// test's binary and docs/tour the repository's. The tour picks its ports
// and starts its own redis-server; the shell's environment has no DISKER_
// variable, as a new user's would not. Where the tour says what happens,
// the test checks it; where a reader would wait a moment, it waits for
// what the reader would see. It needs bash, python3, curl and
// redis-server, as the tour does.
func TestTour(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "python3", "curl", "xargs", "redis-server"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s: %v", tool, err)
		}
	}
	blocks := tourBlocks(t)
	if len(blocks) != 7 {
		t.Fatalf("the tour has %d blocks of commands; this test knows 7", len(blocks))
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, link := range []struct{ from, to string }{
		{filepath.Join(dir, "bin", "disker"), bin},
		{filepath.Join(dir, "docs", "tour"), filepath.Join(root, "docs", "tour")},
	} {
		if err := os.MkdirAll(filepath.Dir(link.from), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(link.to, link.from); err != nil {
			t.Fatal(err)
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISKER_") {
			env = append(env, kv)
		}
	}
	sh := startTourShell(t, dir, env)
	ran := 0
	step := func(timeout time.Duration, lines ...string) (string, int) {
		t.Helper()
		ran += len(lines)
		return sh.run(strings.Join(lines, "\n"), timeout)
	}
	// A line that runs until Ctrl-C runs in the background until it has
	// shown what it shows, then gets Ctrl-C's SIGINT.
	untilCtrlC := func(line, shows string) {
		t.Helper()
		ran++
		from := len(sh.stdout.String())
		sh.run(strings.TrimSpace(line[:strings.Index(line, "#")])+" & UNTIL_CTRL_C=$!", 10*time.Second)
		waitFor(t, 30*time.Second, line+" to show "+shows, func() bool {
			return strings.Contains(sh.stdout.String()[from:], shows)
		})
		if _, code := sh.run("kill -INT $UNTIL_CTRL_C; wait $UNTIL_CTRL_C", 30*time.Second); code != 0 {
			t.Errorf("%s ended with %d on Ctrl-C, want 0", line, code)
		}
	}
	var ports map[string]string
	port := func(name string) string {
		if ports == nil {
			out, _ := sh.run("echo PORTS $REDIS_PORT $APP_PORT $ADMIN_PORT $GATEWAY_PORT $DASHBOARD_PORT", 10*time.Second)
			f := strings.Fields(out[max(0, strings.LastIndex(out, "PORTS ")):])[1:]
			if len(f) != 5 {
				t.Fatalf("the tour's ports: %q", out)
			}
			ports = map[string]string{"REDIS": f[0], "APP": f[1], "ADMIN": f[2], "GATEWAY": f[3], "DASHBOARD": f[4]}
		}
		return ports[name]
	}

	// 1. Build (done), pick ports, start Redis.
	b := blocks[0]
	if !strings.HasPrefix(b[0], "make build") {
		t.Fatalf("the tour's first line is %q, want make build", b[0])
	}
	ran++
	if _, code := step(30*time.Second, b[1:]...); code != 0 {
		t.Fatalf("step 1: exit %d", code)
	}
	for _, name := range []string{"REDIS", "APP", "ADMIN", "GATEWAY", "DASHBOARD"} {
		if n, err := strconv.Atoi(port(name)); err != nil || n < 1024 {
			t.Fatalf("step 1: %s_PORT=%q", name, port(name))
		}
	}
	if out, _ := sh.run("command -v disker", 10*time.Second); strings.TrimSpace(out) != filepath.Join(dir, "bin", "disker") {
		t.Fatalf("step 1: disker on PATH is %q, want the checkout's bin/disker", out)
	}
	waitFor(t, 30*time.Second, "the tour's redis-server", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+port("REDIS"))
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	// 2. A worker.
	b = blocks[1]
	if out, code := step(60*time.Second, b[:2]...); code != 0 || out != strings.TrimPrefix(b[2], "# ") {
		t.Fatalf("step 2: exit %d, %q; want %s", code, out, b[2])
	}
	ran++ // the reply, as a comment

	// 3. The service, two workers, a gateway.
	step(10*time.Second, blocks[2]...)
	gateway, app := "http://127.0.0.1:"+port("GATEWAY"), "http://127.0.0.1:"+port("APP")
	// A reader would wait a moment; the test waits for the service and
	// for both workers to be listed.
	waitFor(t, 60*time.Second, "the service, the gateway and both workers", func() bool {
		for _, url := range []string{app + "/", gateway + "/nothing-yet"} {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		out, _ := sh.run("disker stats --json --receiver web", 30*time.Second)
		var snap struct {
			Receivers []struct {
				Workers int `json:"workers"`
			} `json:"receivers"`
		}
		return json.Unmarshal([]byte(out), &snap) == nil && len(snap.Receivers) == 1 && snap.Receivers[0].Workers == 2
	})

	// 4. curl it: 200s with the service's headers, and a 504.
	b = blocks[3]
	if out, _ := step(60*time.Second, b[0]); !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.Contains(out, "ports.py") {
		t.Errorf("step 4: %s: %q", b[0], out)
	}
	out, _ := step(60*time.Second, b[1])
	direct, err := http.Get(app + "/ports.py")
	if err != nil {
		t.Fatal(err)
	}
	direct.Body.Close()
	for _, h := range []string{"Content-Length", "Content-Type", "Last-Modified"} {
		if want := h + ": " + direct.Header.Get(h) + "\r\n"; direct.Header.Get(h) == "" || !strings.Contains(out, want) {
			t.Errorf("step 4: %s: the service sent %q; through the gateway:\n%s", b[1], want, out)
		}
	}
	if out, _ := step(5*time.Minute, b[2]); !slices.Equal(strings.Fields(out), []string{"200", "200"}) {
		t.Errorf("step 4: 200 requests: %q, want all 200", out)
	}
	if out, _ := step(60*time.Second, b[3]); !strings.HasPrefix(out, "HTTP/1.1 504") {
		t.Errorf("step 4: a request that outlasts --timeout 10s: %q, want 504", out)
	}

	// 5. kill -9 a worker while 20 slow requests run: all 20 get 200.
	b = blocks[4]
	out, _ = step(2*time.Minute, b[:2]...)
	if want := strings.Fields(strings.TrimPrefix(b[2], "#")); !slices.Equal(strings.Fields(out), want) || !slices.Equal(want, []string{"20", "200"}) {
		t.Errorf("step 5: 20 requests to /slow?s=2 with a worker killed with SIGKILL after 1s: %q, want %q", out, b[2])
	}
	ran++ // the outcome, as a comment

	// 6. The service stopped: 502 with a request id, and a dead letter.
	b = blocks[5]
	step(10*time.Second, b[0])
	if out, _ := step(60*time.Second, b[1]); !strings.HasPrefix(out, "HTTP/1.1 502") || !strings.Contains(out, "request id ") {
		t.Errorf("step 6: with the service stopped: %q, want 502 with a request id", out)
	}
	if out, code := step(60*time.Second, b[2]); code != 0 || !strings.Contains(out, "forward to") {
		t.Errorf("step 6: dlq list: exit %d, %q", code, out)
	}

	// 7. Watch it.
	b = blocks[6]
	untilCtrlC(b[0], "RECEIVER")
	if out, _ := step(30*time.Second, b[1]); !strings.Contains(out, "disker_messages_handled_total") {
		t.Errorf("step 7: metrics: %q", out)
	}

	total := 0
	for _, b := range blocks {
		total += len(b)
	}
	if ran != total {
		t.Errorf("the test ran %d of the tour's %d lines", ran, total)
	}
}
