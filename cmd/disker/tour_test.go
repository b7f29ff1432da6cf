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
		if t.Failed() {
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

// tourLines returns the lines of the README's tour that are in ```sh
// blocks.
func tourLines(t *testing.T) map[string]bool {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	start, end := strings.Index(s, "## Five-minute tour"), strings.Index(s, "## More")
	if start < 0 || end < start {
		t.Fatal("README.md has no \"## Five-minute tour\" section before \"## More\"")
	}
	lines := map[string]bool{}
	in := false
	for line := range strings.Lines(s[start:end]) {
		line = strings.TrimRight(line, "\n")
		switch {
		case line == "```sh":
			in = true
		case line == "```":
			in = false
		case in:
			lines[line] = true
		}
	}
	return lines
}

func freeTCPPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// TestTour runs the README's five-minute tour: its commands as written
// (each must be a line of the README's tour), in one shell, with the
// disker binary of this test on PATH, against this test's redis-server
// instead of one on 6379 (step 1 is not run), and free ports in place of
// 8000, 8080 and 9090. It needs bash, python3 and curl, as the tour does.
func TestTour(t *testing.T) {
	t.Parallel()
	for _, tool := range []string{"bash", "python3", "curl", "xargs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the tour needs %s: %v", tool, err)
		}
	}
	written := tourLines(t)
	e := newEnv(t)
	appPort, gwPort, adminPort := freeTCPPort(t), freeTCPPort(t), freeTCPPort(t)
	ports := strings.NewReplacer("8000", appPort, "8080", gwPort, "9090", adminPort)
	env := append(e.environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	sh := startTourShell(t, root, env)
	// step runs lines of the tour, which must be in the README as given.
	step := func(timeout time.Duration, lines ...string) (string, int) {
		t.Helper()
		for _, l := range lines {
			if !written[l] {
				t.Fatalf("the tour's test runs %q, which is not a line of the README's tour", l)
			}
		}
		return sh.run(ports.Replace(strings.Join(lines, "\n")), timeout)
	}
	gateway := "http://127.0.0.1:" + gwPort

	// 2. A worker.
	step(10*time.Second, `disker worker --receiver upper --exec 'tr a-z A-Z' &`)
	if out, code := step(60*time.Second, `disker send --to upper --wait 'hello, disker'`); code != 0 || out != "HELLO, DISKER" {
		t.Fatalf("step 2: send: exit %d, %q", code, out)
	}

	// 3. The service, two workers, a gateway.
	step(10*time.Second,
		`python3 docs/tour/app.py 8000 & APP=$!`,
		`disker worker  --receiver web --http http://127.0.0.1:8000 --admin 127.0.0.1:9090 &`,
		`disker worker  --receiver web --http http://127.0.0.1:8000 & W2=$!`,
		`disker gateway --receiver web --listen :8080 --timeout 10s &`)
	// A reader would wait a moment; the test waits for the service and
	// for both workers to be listed.
	waitFor(t, 60*time.Second, "the service, the gateway and both workers", func() bool {
		for _, url := range []string{"http://127.0.0.1:" + appPort + "/", gateway + "/nothing-yet"} {
			resp, err := http.Get(url)
			if err != nil {
				return false
			}
			resp.Body.Close()
		}
		out, _, _ := e.run("", "stats", "--json", "--receiver", "web")
		var snap struct {
			Receivers []struct {
				Workers int `json:"workers"`
			} `json:"receivers"`
		}
		return json.Unmarshal([]byte(out), &snap) == nil && len(snap.Receivers) == 1 && snap.Receivers[0].Workers == 2
	})

	// 4. curl it: 200s, and a 504.
	if out, _ := step(60*time.Second, `curl -i http://localhost:8080/`); !strings.HasPrefix(out, "HTTP/1.1 200") {
		t.Errorf("step 4: curl -i /: %q", out)
	}
	if out, _ := step(5*time.Minute, `for i in $(seq 200); do curl -s -o /dev/null -w '%{http_code}\n' http://localhost:8080/; done | sort | uniq -c`); !slices.Equal(strings.Fields(out), []string{"200", "200"}) {
		t.Errorf("step 4: 200 requests: %q, want all 200", out)
	}
	if out, _ := step(60*time.Second, `curl -i 'http://localhost:8080/slow?s=15'   # 504 Gateway Timeout, after 10s`); !strings.HasPrefix(out, "HTTP/1.1 504") {
		t.Errorf("step 4: a request that outlasts --timeout 10s: %q, want 504", out)
	}

	// 5. kill -9 a worker while 20 slow requests run: all 20 get 200.
	out, _ := step(2*time.Minute,
		`seq 20 | xargs -P 20 -I{} curl -s -o /dev/null -w '%{http_code}\n' 'http://localhost:8080/slow?s=2' | sort | uniq -c &`,
		`sleep 1; kill -9 $W2; wait $!`)
	if !slices.Equal(strings.Fields(out), []string{"20", "200"}) {
		t.Errorf("step 5: 20 requests to /slow?s=2 with a worker killed with SIGKILL after 1s: %q, want all 20 with 200", out)
	}

	// 6. The service stopped: 502 with a request id, and a dead letter.
	step(10*time.Second, `kill $APP`)
	if out, _ := step(60*time.Second, `curl -i http://localhost:8080/              # 502 Bad Gateway ... (request id 5f0c...)`); !strings.HasPrefix(out, "HTTP/1.1 502") || !strings.Contains(out, "request id ") {
		t.Errorf("step 6: with the service stopped: %q, want 502 with a request id", out)
	}
	if out, code := step(60*time.Second, `disker dlq list --receiver web`); code != 0 || !strings.Contains(out, "forward to") {
		t.Errorf("step 6: dlq list: exit %d, %q", code, out)
	}

	// 7. Watch it. stats --watch runs until stopped: here in the background
	// until it has drawn a table, then interrupted as Ctrl-C would.
	watch := `disker stats --watch             # queues, in flight, dead letters, rate, live workers; Ctrl-C ends it`
	if !written[watch] {
		t.Fatalf("%q is not a line of the README's tour", watch)
	}
	from := len(sh.stdout.String())
	sh.run(strings.TrimSpace(watch[:strings.Index(watch, "#")])+" & STATS=$!", 10*time.Second)
	waitFor(t, 30*time.Second, "stats --watch to draw its table", func() bool {
		return strings.Contains(sh.stdout.String()[from:], "RECEIVER")
	})
	if _, code := sh.run("kill -INT $STATS; wait $STATS", 30*time.Second); code != 0 {
		t.Errorf("step 7: stats --watch ended with %d on SIGINT, want 0", code)
	}
	if out, _ := step(30*time.Second, `curl -s localhost:9090/metrics | grep '^disker_'`); !strings.Contains(out, "disker_") {
		t.Errorf("step 7: metrics: %q", out)
	}
}
