package main_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// TestExecEnvHasNoSecrets: an --exec command does not inherit Disker's own
// variables (DISKER_REDIS_URL carries the password), only those named with
// --exec-env, besides the message's.
func TestExecEnvHasNoSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.extra = []string{"DISKER_TOKEN=secret", "OTHER_VAR=kept"}
	e.startWorker("--receiver", "env", "--exec", "env")
	e.startWorker("--receiver", "env-kept", "--exec", "env", "--exec-env", "DISKER_KEY_PREFIX")
	out, errOut, code := e.run("", "send", "--to", "env", "--wait", "x")
	if code != 0 {
		t.Fatalf("send: exit %d: %s", code, errOut)
	}
	for _, leaked := range []string{"DISKER_REDIS_URL", "DISKER_TOKEN", "DISKER_KEY_PREFIX", "DISKER_LOG_FORMAT"} {
		if strings.Contains(out, leaked+"=") {
			t.Errorf("the --exec command sees %s:\n%s", leaked, out)
		}
	}
	for _, want := range []string{"DISKER_MESSAGE_ID=", "DISKER_RECEIVER=env", "OTHER_VAR=kept", "PATH="} {
		if !strings.Contains(out, want) {
			t.Errorf("the --exec command lacks %s:\n%s", want, out)
		}
	}
	out, errOut, code = e.run("", "send", "--to", "env-kept", "--wait", "x")
	if code != 0 || !strings.Contains(out, "DISKER_KEY_PREFIX="+e.prefix+"\n") || strings.Contains(out, "DISKER_REDIS_URL=") {
		t.Errorf("--exec-env DISKER_KEY_PREFIX: exit %d %s\n%s", code, errOut, out)
	}
	if _, errOut, code := e.run("", "worker", "--receiver", "x", "--exec", "env", "--exec-env", "HOME"); code != 2 || !strings.Contains(errOut, "--exec-env") {
		t.Errorf("--exec-env HOME: exit %d %s; want 2", code, errOut)
	}
}

// redisCLI runs redis-cli against addr and returns its output.
func redisCLI(t *testing.T, addr string, args ...string) string {
	t.Helper()
	host, port, _ := net.SplitHostPort(addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli %v: %v: %s", args, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestGatewayCredentialsRotated: the password of the gateway's ACL user
// changes under it; its connections are cut, and a request gets 503 (the
// message was surely not queued), not 500.
func TestGatewayCredentialsRotated(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	redisCLI(t, srv.Addr(), "ACL", "SETUSER", "app", "on", ">first", "~*", "&*", "+@all")
	e := newEnv(t)
	e.redisURL = "redis://app:first@" + srv.Addr() + "/0"
	svc := newService(t)
	e.startWorker("--receiver", "web", "--http", svc.srv.URL)
	_, url := e.startGateway("--receiver", "web", "--timeout", "2s")
	if code, body := get(t, url+"/echo"); code != 200 {
		t.Fatalf("before the rotation: %d %q", code, body)
	}
	redisCLI(t, srv.Addr(), "ACL", "SETUSER", "app", "resetpass", ">second")
	redisCLI(t, srv.Addr(), "CLIENT", "KILL", "USER", "app")
	// A request written to a connection the gateway has not yet seen cut
	// may have been queued (its answer lost): it is settled at its timeout,
	// 504, as it should be. Once the gateway reconnects, Redis refuses the
	// credentials, and a request gets 503; never 500.
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := get(t, url+"/echo")
		if code == http.StatusServiceUnavailable && strings.Contains(body, "credentials") {
			return
		}
		if code != http.StatusGatewayTimeout || time.Now().After(deadline) {
			t.Fatalf("after the rotation: %d %q, want 503 that names the credentials", code, body)
		}
	}
}

// TestGatewaySlowBody: clients that send their body a byte at a time are
// answered 408 and cut off after --read-timeout, while other clients are
// served, a request that waits on its worker longer than --read-timeout
// included.
func TestGatewaySlowBody(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := newService(t)
	e.startWorker("--receiver", "web", "--http", svc.srv.URL, "--concurrency", "4")
	_, url := e.startGateway("--receiver", "web", "--timeout", "60s", "--read-timeout", "1s")
	addr := strings.TrimPrefix(url, "http://")

	// A long request: its worker holds it until the slow clients are done.
	long := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/block", "text/plain", strings.NewReader("long"))
		if err != nil {
			long <- -1
			return
		}
		resp.Body.Close()
		long <- resp.StatusCode
	}()
	waitFor(t, 30*time.Second, "the long request at the service", func() bool {
		n, _ := svc.inFlight()
		return n == 1
	})

	// Each slow client announces 200 bytes and sends one every 100ms: it
	// would take 20s to finish.
	const slow, bodyLen = 20, 200
	answers := make(chan string, slow)
	var wg sync.WaitGroup
	for range slow {
		wg.Go(func() {
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				answers <- "dial: " + err.Error()
				return
			}
			defer conn.Close()
			fmt.Fprintf(conn, "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n", bodyLen)
			got := make(chan string, 1)
			go func() {
				line, err := bufio.NewReader(conn).ReadString('\n')
				if err != nil && line == "" {
					line = "closed: " + err.Error()
				}
				got <- strings.TrimSpace(line)
			}()
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for sent := 0; ; sent++ {
				select {
				case line := <-got:
					answers <- line
					return
				case <-tick.C:
					if sent == bodyLen {
						answers <- "the whole slow body was sent and the connection is still open"
						return
					}
					_, _ = conn.Write([]byte("x"))
				}
			}
		})
	}
	// Normal traffic meanwhile.
	for i := range 20 {
		if err := checkEcho(http.DefaultClient, url, i); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
	close(answers)
	for a := range answers {
		if !strings.Contains(a, "408") {
			t.Errorf("a slow-body client got %q, want 408 before its body was done", a)
		}
	}
	close(svc.release)
	if code := <-long; code != 200 {
		t.Errorf("the long request got %d, want 200", code)
	}
}

// TestSendAndCommandDetails: send --receiver, send --wait to a receiver no
// worker serves, a newline after a reply on a terminal, --version, dlq
// with unknown ids and receivers, readable durations in JSON logs.
func TestSendAndCommandDetails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z")

	if out, errOut, code := e.run("", "send", "--receiver", "upper", "--wait", "hi"); code != 0 || out != "HI" {
		t.Errorf("send --receiver: exit %d, %q %s", code, out, errOut)
	}
	if out, _, code := e.run("", "--version"); code != 0 || !strings.HasPrefix(out, "disker ") {
		t.Errorf("--version: exit %d, %q", code, out)
	}

	// No worker: send says so at once, and waits unless --require-worker.
	_, errOut, code := e.run("", "send", "--to", "nobody", "--wait", "--timeout", "1s", "hi")
	if code != 1 || !strings.Contains(errOut, `no live worker serves "nobody"`) || !strings.Contains(errOut, "no reply") {
		t.Errorf("send --wait to nobody: exit %d, %s", code, errOut)
	}
	_, errOut, code = e.run("", "send", "--to", "nobody", "--wait", "--require-worker", "--timeout", "60s", "hi")
	if code != 1 || !strings.Contains(errOut, `no live worker serves "nobody"`) || strings.Contains(errOut, "no reply") {
		t.Errorf("send --wait --require-worker to nobody: exit %d, %s", code, errOut)
	}

	// On a terminal (script(1) gives the command one), a reply that does
	// not end with a newline gets one.
	if _, err := exec.LookPath("script"); err != nil {
		t.Fatalf("script(1), to run a command on a terminal: %v", err)
	}
	cmd := exec.Command("script", "-qec", bin+" send --to upper --wait hi", "/dev/null")
	cmd.Env = e.environ()
	cmd.Stdin = strings.NewReader("")
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), "HI\r\n") {
		t.Errorf("send --wait on a terminal: %v, %q; want the reply and a newline", err, out)
	}

	// dlq: a receiver never seen, ids that are not dead letters.
	_, errOut, code = e.run("", "dlq", "list", "--receiver", "neverseen")
	if code != 1 || !strings.Contains(errOut, `no receiver "neverseen"`) {
		t.Errorf("dlq list of an unknown receiver: exit %d, %s", code, errOut)
	}
	for _, verb := range []string{"retry", "purge"} {
		_, errOut, code = e.run("", "dlq", verb, "--receiver", "upper", "1-1", "2-2")
		if code != 1 || !strings.Contains(errOut, "1-1 2-2") {
			t.Errorf("dlq %s of unknown ids: exit %d, %s; want 1 and the ids", verb, code, errOut)
		}
	}

	// Durations in JSON logs are text.
	gw, _ := e.startGateway("--receiver", "upper", "--timeout", "1500ms")
	if rec := gw.waitLog("gateway started"); rec["timeout"] != "1.5s" || rec["read_timeout"] != "1m0s" {
		t.Errorf("gateway started: timeout %v, read_timeout %v; want \"1.5s\" and \"1m0s\"", rec["timeout"], rec["read_timeout"])
	}
}

// TestStatsRateBelowHeartbeat: stats --watch refreshing faster than the
// workers' heartbeats shows their rate in every refresh, not 0 between two
// heartbeats.
func TestStatsRateBelowHeartbeat(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "busy", "--exec", "cat", "--concurrency", "2")
	var lines strings.Builder
	for i := range 20000 {
		fmt.Fprintf(&lines, "{\"content\": \"job %d\"}\n", i)
	}
	jsonl := filepath.Join(t.TempDir(), "jobs.jsonl")
	if err := os.WriteFile(jsonl, []byte(lines.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// A steady load for the whole test: more than the worker gets through.
	e.start("send", "--to", "busy", "--file", jsonl)
	waitFor(t, 30*time.Second, "the worker to process messages", func() bool {
		out, _, _ := e.run("", "stats", "--json", "--receiver", "busy")
		var snap struct {
			Workers []struct {
				Processed int64 `json:"processed"`
			} `json:"workers"`
		}
		return json.Unmarshal([]byte(out), &snap) == nil && len(snap.Workers) == 1 && snap.Workers[0].Processed > 0
	})
	stats := e.start("stats", "--watch", "--json", "--interval", "200ms", "--receiver", "busy")
	var rates []float64
	waitFor(t, 60*time.Second, "25 refreshes", func() bool {
		rates = rates[:0]
		sc := bufio.NewScanner(strings.NewReader(stats.stdout.String()))
		for sc.Scan() {
			var snap struct {
				Receivers []struct {
					Rate float64 `json:"rate"`
				} `json:"receivers"`
			}
			if json.Unmarshal(sc.Bytes(), &snap) == nil && len(snap.Receivers) == 1 {
				rates = append(rates, snap.Receivers[0].Rate)
			}
		}
		return len(rates) >= 25
	})
	for i, r := range rates {
		if r <= 0 {
			t.Fatalf("refresh %d of stats --interval 200ms shows rate %v while the worker is busy; rates: %v", i+1, r, rates)
		}
	}
}

// TestCommandLineErrors: errors name the flag and the variable, not the Go
// field, carry no repeated prefixes, give a hint, and every bad value is
// exit 2, a bad URL included.
func TestCommandLineErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	notRedis := newService(t)
	notRedisURL := "redis://" + strings.TrimPrefix(notRedis.srv.URL, "http://") + "/0"
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"stats", "--redis-url", "localhost:6379"}, 2, "did you mean redis://localhost:6379"},
		{[]string{"stats", "--redis-url", "http://127.0.0.1:6379"}, 2, `--redis-url (DISKER_REDIS_URL) "http://127.0.0.1:6379": scheme "http"`},
		{[]string{"stats", "--redis-url", "redis://127.0.0.1:99999/0"}, 2, `port "99999"`},
		{[]string{"stats", "--redis-url", "redis://127.0.0.1:6379/abc"}, 2, `database "abc"`},
		{[]string{"stats", "--redis-url", "redis://"}, 2, "no host"},
		{[]string{"stats", "--redis-url", "rediss://127.0.0.1:6379/0?skip_verify=true"}, 2, "--tls-insecure-skip-verify"},
		{[]string{"stats", "--redis-url", "redis://127.0.0.1:6379/0", "--tls-ca", "ca.pem"}, 2, "--tls-ca needs a rediss://"},
		{[]string{"stats", "--redis-url", "redis://127.0.0.1:1/0"}, 1, "nothing answers at 127.0.0.1:1 (connection refused): start redis-server there, or set --redis-url (DISKER_REDIS_URL)"},
		{[]string{"stats", "--redis-url", notRedisURL}, 1, "answers, but not as Redis"},
		{[]string{"send", "--to", "x", "--max-message-size", "4", "too long"}, 2, "the content is 8 bytes, over --max-message-size 4"},
	} {
		_, errOut, code := e.run("", c.args...)
		said := withoutLogs(errOut)
		if code != c.code || !strings.Contains(said, c.want) || strings.Count(said, "\n") != 1 {
			t.Errorf("disker %v: exit %d, stderr %q; want exit %d and one line with %q", c.args, code, said, c.code, c.want)
		}
		for _, noise := range []string{"Config.", "redisbroker", "connect: ", "disker: disker:"} {
			if strings.Contains(said, noise) {
				t.Errorf("disker %v: %q says %q", c.args, said, noise)
			}
		}
	}
}

// TestCommandsLogTheirRedis: the long-running commands say at start which
// Redis they use, the password masked; those that run once say it with -v,
// and print nothing on stderr without it.
func TestCommandsLogTheirRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	redisCLI(t, srv.Addr(), "ACL", "SETUSER", "app", "on", ">hunter2", "~*", "&*", "+@all")
	e := newEnv(t)
	e.redisURL = "redis://app:hunter2@" + srv.Addr() + "/0"
	check := func(name, stderr string) {
		t.Helper()
		if strings.Contains(stderr, "hunter2") {
			t.Errorf("%s logs the password:\n%s", name, stderr)
		}
		sc := bufio.NewScanner(strings.NewReader(stderr))
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "using Redis" && rec["redis"] == "redis://app:xxxxx@"+srv.Addr()+"/0" {
				return
			}
		}
		t.Errorf("%s does not log the Redis it uses:\n%s", name, stderr)
	}
	w := e.startWorker("--receiver", "r", "--exec", "cat")
	check("worker", w.stderr.String())
	gw, _ := e.startGateway("--receiver", "r")
	check("gateway", gw.stderr.String())
	for _, args := range [][]string{{"send", "--to", "r", "--wait", "x"}, {"stats"}, {"dlq", "list", "--receiver", "r"},
		{"schedules"}, {"pause", "r"}, {"resume", "r"}, {"cancel", "--receiver", "r", "01m90mn0vjmssp1xq3hqf9yp02"}} {
		if _, errOut, code := e.run("", args...); code != 0 || errOut != "" {
			t.Errorf("disker %v: exit %d, stderr %q; want 0 and nothing", args, code, errOut)
		}
		_, errOut, code := e.run("", append(args, "-v")...)
		if code != 0 {
			t.Errorf("disker %v -v: exit %d %s", args, code, errOut)
		}
		check(args[0]+" -v", errOut)
	}
}

// TestDemoCleansUp: demo --redis-url (--redis is gone) leaves no key behind.
func TestDemoCleansUp(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t)
	if _, errOut, code := e.run("", "demo", "--redis", srv.URL()); code != 2 || !strings.Contains(errOut, "unknown flag: --redis") {
		t.Errorf("demo --redis: exit %d %s; want 2", code, errOut)
	}
	if out, errOut, code := e.run("", "demo", "--redis-url", srv.URL(), "--messages", "60"); code != 0 {
		t.Fatalf("demo --redis-url: exit %d\n%s\n%s", code, out, errOut)
	}
	if keys := redisCLI(t, srv.Addr(), "--scan"); keys != "" {
		t.Errorf("the demo left keys in Redis:\n%s", keys)
	}
}
