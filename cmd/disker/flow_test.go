package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestFlowCommands runs send --dedup-key, send --wait --idempotency-key,
// pause, resume and the PAUSED column of stats with the real binary.
func TestFlowCommands(t *testing.T) {
	t.Parallel()
	e := newEnv(t)

	// A duplicate prints the first id and exits 0, and queues nothing.
	first, errOut, code := e.run("", "send", "--to", "dd", "--dedup-key", "k", "one")
	if code != 0 || strings.TrimSpace(first) == "" {
		t.Fatalf("send --dedup-key: exit %d, %q %s", code, first, errOut)
	}
	again, errOut, code := e.run("", "send", "--to", "dd", "--dedup-key", "k", "two")
	if code != 0 || again != first || !strings.Contains(errOut, "a duplicate of message "+strings.TrimSpace(first)) {
		t.Fatalf("send --dedup-key again: exit %d, %q (first %q), stderr %s", code, again, first, errOut)
	}
	if _, _, code := e.run("", "send", "--to", "dd", "--dedup-key", "other", "--dedup-ttl", "1ms", "three"); code != 0 {
		t.Fatalf("send with another key: exit %d", code)
	}
	if r := e.receiverStats("dd"); r.Queued != 2 {
		t.Fatalf("stats of dd: %+v, want 2 queued", r)
	}

	// Idempotent requests: the second gets the first's reply; the worker
	// would answer differently each time.
	w := e.startWorker("--receiver", "stamp", "--shell", "--exec", "cat; date +%s%N")
	r1, errOut, code := e.run("", "send", "--to", "stamp", "--wait", "--idempotency-key", "i", "x")
	if code != 0 || !strings.HasPrefix(r1, "x") {
		t.Fatalf("send --idempotency-key: exit %d, %q %s", code, r1, errOut)
	}
	r2, errOut, code := e.run("", "send", "--to", "stamp", "--wait", "--idempotency-key", "i", "x")
	if code != 0 || r2 != r1 {
		t.Fatalf("send --idempotency-key again: exit %d, %q (first %q) %s", code, r2, r1, errOut)
	}
	r3, _, _ := e.run("", "send", "--to", "stamp", "--wait", "x")
	if r3 == r1 {
		t.Fatalf("a request without the key got the same reply %q", r3)
	}

	// Pause: messages queue and wait; resume: they are handled.
	if out, errOut, code := e.run("", "pause", "stamp"); code != 0 || out != "paused stamp\n" {
		t.Fatalf("pause: exit %d, %q %s", code, out, errOut)
	}
	w.waitLog("disker: receiver paused") // within a second of the pause
	if _, _, code := e.run("", "send", "--to", "stamp", "--fire-and-forget", "wait"); code != 0 {
		t.Fatal("send to a paused receiver failed")
	}
	// It stays in the queue, unhandled: checked for two seconds, twice
	// the pause's bound. (A fetch that was blocked in Redis when the pause
	// came may have taken it: it is then pending, and waits with the
	// worker, leased, for the resume.)
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		if r := e.receiverStats("stamp"); !r.Paused || r.Queued+r.Pending != 1 {
			t.Fatalf("stats while paused: %+v, want the message still there", r)
		}
	}
	out, _, code := e.run("", "stats", "--receiver", "stamp")
	if code != 0 || !strings.Contains(out, "PAUSED") || !strings.Contains(out, "yes") {
		t.Fatalf("stats table while paused (%d):\n%s", code, out)
	}
	if out, errOut, code := e.run("", "resume", "--receiver", "stamp"); code != 0 || out != "resumed stamp\n" {
		t.Fatalf("resume: exit %d, %q %s", code, out, errOut)
	}
	waitFor(t, 30*time.Second, "the queued message to be handled after resume", func() bool {
		r := e.receiverStats("stamp")
		return !r.Paused && r.Queued == 0 && r.Pending == 0
	})
}

// receiverStat is a receiver's line of stats --json.
type receiverStat struct {
	Queued  int64 `json:"queued"`
	Pending int64 `json:"pending"`
	Paused  bool  `json:"paused"`
}

// receiverStats returns receiver's line of disker stats --json.
func (e *env) receiverStats(receiver string) receiverStat {
	e.t.Helper()
	out, errOut, code := e.run("", "stats", "--json", "--receiver", receiver)
	var snap struct {
		Receivers []receiverStat `json:"receivers"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil || len(snap.Receivers) != 1 {
		e.t.Fatalf("stats --json --receiver %s: exit %d, %s %s", receiver, code, out, errOut)
	}
	return snap.Receivers[0]
}

// TestGatewayIdempotencyKey sends concurrent HTTP requests with one
// Idempotency-Key through two gateways: the service is called once, and
// every client gets its one response.
func TestGatewayIdempotencyKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var calls atomic.Int64
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		time.Sleep(50 * time.Millisecond) // still running when the others come
		fmt.Fprintf(w, "call %d", n)
	}))
	t.Cleanup(svc.Close)
	e.startWorker("--receiver", "pay", "--http", svc.URL)
	_, g1 := e.startGateway("--receiver", "pay")
	_, g2 := e.startGateway("--receiver", "pay")
	post := func(url, key string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, url+"/charge", strings.NewReader("100"))
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var wg sync.WaitGroup
	bodies := make([]string, 10)
	for i := range bodies {
		wg.Go(func() {
			url := g1
			if i%2 == 1 {
				url = g2
			}
			code, body := post(url, "order-1")
			if code != http.StatusOK {
				t.Errorf("request %d: %d %s", i, code, body)
			}
			bodies[i] = body
		})
	}
	wg.Wait()
	for i, b := range bodies {
		if b != bodies[0] {
			t.Fatalf("response %d is %q, response 0 %q", i, b, bodies[0])
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the service was called %d times, want once", n)
	}
	if _, body := post(g1, ""); body == bodies[0] {
		t.Fatalf("a request without the key got the same response %q", body)
	}
}

// TestFlowUsage: bad values of the flow-control flags and commands are
// usage errors (exit 2) that name the flag.
func TestFlowUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, cmd := range [][]string{{"pause"}, {"resume"}} {
		out, _, code := e.run("", append(cmd, "--help")...)
		if code != 0 || !strings.Contains(out, "Usage:") || !strings.Contains(out, "Examples:") {
			t.Errorf("disker %v --help: exit %d\n%s", cmd, code, out)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "--to", "x", "--dedup-key", "", "hi"}, "--dedup-key"},
		{[]string{"send", "--to", "x", "--dedup-key", "k", "--dedup-ttl", "0s", "hi"}, "--dedup-ttl"},
		{[]string{"send", "--to", "x", "--dedup-key", "k", "--dedup-ttl", "-1s", "hi"}, "--dedup-ttl"},
		{[]string{"send", "--to", "x", "--dedup-ttl", "1m", "hi"}, "--dedup-ttl needs --dedup-key"},
		{[]string{"send", "--to", "x", "--dedup-key", "k", "--wait", "hi"}, "--dedup-key"},
		{[]string{"send", "--to", "x", "--dedup-key", strings.Repeat("k", 1025), "hi"}, "--dedup-key"},
		{[]string{"send", "--to", "x", "--idempotency-key", "k", "hi"}, "--idempotency-key needs --wait"},
		{[]string{"send", "--to", "x", "--wait", "--idempotency-key", "", "hi"}, "--idempotency-key"},
		{[]string{"pause"}, "pause needs RECEIVER (or --receiver NAME)"},
		{[]string{"pause", "bad name"}, `invalid --receiver "bad name"`},
		{[]string{"resume", "--receiver", "_inbox.x"}, `invalid --receiver "_inbox.x"`},
		{[]string{"pause", "a", "b"}, `pause takes one RECEIVER, got 2: "a" "b"`},
		{[]string{"pause", "a", "--receiver", "b"}, "disagree"},
	} {
		_, errOut, code := e.run("", c.args...)
		errOut = withoutLogs(errOut)
		if code != 2 || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("disker %v: exit %d, stderr %q; want exit 2 and one line with %q", c.args, code, errOut, c.want)
		}
	}
}

// TestPauseThreeWorkers runs three worker processes of one receiver while
// messages are sent: after "disker pause", no worker starts a message once
// a second has passed, while the messages queue; after "disker resume"
// they start again within a second, and each message is handled exactly
// once. Each handler appends its start time (Unix ns) and its message to a
// file shared by the workers.
func TestPauseThreeWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	log := filepath.Join(t.TempDir(), "starts")
	var workers []*proc
	for range 3 {
		workers = append(workers, e.startWorker("--receiver", "paced", "--concurrency", "4", "--shell",
			"--exec", `echo "$(date +%s%N) $(cat)" >> `+log))
	}
	type start struct {
		at  time.Time
		msg string
	}
	starts := func() []start {
		b, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		var out []start
		for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
			ns, msg, ok := strings.Cut(l, " ")
			n, err := strconv.ParseInt(ns, 10, 64)
			if !ok || err != nil {
				continue // a line being written
			}
			out = append(out, start{time.Unix(0, n), msg})
		}
		return out
	}
	lastStart := func() time.Time {
		var last time.Time
		for _, s := range starts() {
			if s.at.After(last) {
				last = s.at
			}
		}
		return last
	}

	// A steady stream of messages, each with its own content.
	var sent atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, errOut, code := e.run("", "send", "--to", "paced", "--fire-and-forget", fmt.Sprint("m", i)); code != 0 {
				t.Errorf("send: %s", errOut)
				return
			}
			sent.Add(1)
		}
	}()
	stopSending := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		<-done
	}
	defer stopSending()
	waitFor(t, 60*time.Second, "messages to be handled", func() bool { return len(starts()) >= 10 })

	if out, errOut, code := e.run("", "pause", "paced"); code != 0 {
		t.Fatalf("pause: exit %d, %q %s", code, out, errOut)
	}
	paused := time.Now()
	for _, w := range workers {
		w.waitLog("disker: receiver paused")
	}
	before := sent.Load()
	waitFor(t, 60*time.Second, "sends during the pause, 2s after it", func() bool {
		return sent.Load() >= before+5 && time.Since(paused) > 2*time.Second
	})
	if late := lastStart().Sub(paused); late > time.Second {
		t.Fatalf("a message started %v after pause returned, want within 1s", late)
	}
	t.Logf("the last start was %v after pause returned", lastStart().Sub(paused).Round(time.Millisecond))
	if r := e.receiverStats("paced"); !r.Paused || r.Queued+r.Pending < 5 {
		t.Fatalf("stats while paused: %+v, want paused with the new messages waiting", r)
	}

	if _, errOut, code := e.run("", "resume", "paced"); code != 0 {
		t.Fatalf("resume: exit %d, %s", code, errOut)
	}
	resumed := time.Now()
	waitFor(t, 60*time.Second, "a start after resume", func() bool { return lastStart().After(resumed) })
	first := time.Time{}
	for _, s := range starts() {
		if s.at.After(resumed) && (first.IsZero() || s.at.Before(first)) {
			first = s.at
		}
	}
	t.Logf("the first start was %v after resume returned", first.Sub(resumed).Round(time.Millisecond))
	if first.Sub(resumed) > time.Second {
		t.Fatalf("the first start was %v after resume returned, want within 1s", first.Sub(resumed))
	}

	stopSending()
	total := int(sent.Load())
	waitFor(t, 60*time.Second, "every message to be handled", func() bool { return len(starts()) >= total })
	seen := map[string]int{}
	for _, s := range starts() {
		seen[s.msg]++
	}
	if len(seen) != total {
		t.Fatalf("%d distinct messages handled, %d sent", len(seen), total)
	}
	for m, n := range seen {
		if n != 1 {
			t.Fatalf("message %s handled %d times", m, n)
		}
	}
}
