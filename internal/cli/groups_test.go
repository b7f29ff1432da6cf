package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// cliEnv runs the command in this process against one broker, under a key
// prefix of the test's own.
type cliEnv struct {
	t    *testing.T
	conn []string // --redis-url and --key-prefix
}

func newRedisEnv(t *testing.T) *cliEnv {
	srv := redistest.Start(t)
	return &cliEnv{t: t, conn: []string{"--redis-url", srv.URL(), "--key-prefix", redistest.Prefix(t)}}
}

// run runs the command line args (the broker's flags added) to its end.
func (e *cliEnv) run(stdin string, args ...string) (stdout, stderr string, code int) {
	e.t.Helper()
	var out, errOut syncBuffer
	code = Run(context.Background(), append(slices.Clone(args), e.conn...), strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), code
}

// mustRun runs args and fails the test unless it exits 0.
func (e *cliEnv) mustRun(args ...string) string {
	e.t.Helper()
	out, errOut, code := e.run("", args...)
	if code != ExitOK {
		e.t.Fatalf("disker %q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
	}
	return out
}

// startWorker runs "disker worker" with args until the test ends, and
// returns once it has started.
func (e *cliEnv) startWorker(args ...string) {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var errOut syncBuffer
	code := make(chan int, 1)
	go func() {
		code <- Run(ctx, append(append([]string{"worker", "--log-format", "json"}, args...), e.conn...), strings.NewReader(""), io.Discard, &errOut)
	}()
	e.t.Cleanup(func() {
		cancel()
		if c := <-code; c != ExitOK {
			e.t.Errorf("worker %q: exit %d\n%s", args, c, errOut.String())
		}
	})
	logField(e.t, &errOut, "worker started", "receiver")
}

// receiverJSON returns the receiver's row of "disker stats --json
// --receiver NAME".
func (e *cliEnv) receiverJSON(name string) receiverRow {
	e.t.Helper()
	var snap statsSnapshot
	out := e.mustRun("stats", "--json", "--receiver", name)
	if err := json.Unmarshal([]byte(out), &snap); err != nil || len(snap.Receivers) != 1 {
		e.t.Fatalf("stats --json: %v\n%s", err, out)
	}
	return snap.Receivers[0]
}

// handled returns the lines of a worker's log, waiting until there are n.
func handled(t *testing.T, log string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := os.ReadFile(log)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		lines := strings.Fields(strings.ReplaceAll(strings.TrimSpace(string(b)), " ", "_"))
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages handled after 60s, want %d: %q", len(lines), n, lines)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkKeyOrder checks that each key's messages, lines "KEY_N", were
// handled in the order of their N, and that there are want of them.
func checkKeyOrder(t *testing.T, lines []string, want int) {
	t.Helper()
	if len(lines) != want {
		t.Fatalf("%d messages handled, want %d: %q", len(lines), want, lines)
	}
	last := map[string]int{}
	for _, l := range lines {
		key, num, _ := strings.Cut(l, "_")
		n, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("a handled message %q is not KEY N", l)
		}
		if prev, ok := last[key]; ok && n != prev+1 {
			t.Fatalf("key %s: message %d handled after %d, want %d; the whole order: %q", key, n, prev, prev+1, lines)
		}
		last[key] = n
	}
}

// TestSendGroupsWorkerInOrder: a --file of keyed messages (a line's own
// "group", and --group for the lines without one) waits behind its keys
// ("disker stats" counts them and lists the busiest keys of a receiver
// named), and a worker of 8 handlers then runs each key's messages one
// at a time in the order of the file, across 3 batches sent after one
// another. With --wait, 8 requests in flight at once are sent in the
// order of the file too: each handler sleeps less than the one before it
// of its key, so an order lost would show.
func TestSendGroupsWorkerInOrder(t *testing.T) {
	t.Parallel()
	e := newRedisEnv(t)
	dir := t.TempDir()

	// 250 lines: key a every second line, b every fourth, c (by --group)
	// the rest.
	var file strings.Builder
	count := map[string]int{}
	for i := range 250 {
		key := map[int]string{0: "a", 1: "b", 2: "a", 3: "c"}[i%4]
		count[key]++
		line := map[string]any{"content": fmt.Sprintf("%s %d 0", key, count[key])}
		if key != "c" {
			line["group"] = key
		}
		b, _ := json.Marshal(line)
		file.Write(append(b, '\n'))
	}
	jobs := filepath.Join(dir, "jobs.jsonl")
	if err := os.WriteFile(jobs, []byte(file.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := e.run("", "send", "--to", "ordered", "--group", "c", "--file", jobs)
	if code != ExitOK || !strings.Contains(errOut, "sent 250 of 250 messages to ordered") {
		t.Fatalf("send --file: exit %d, %s", code, errOut)
	}

	// One message of each key is queued; the others wait behind it.
	row := e.receiverJSON("ordered")
	if row.Queued != 3 || row.GroupWaiting != 247 || row.GroupKeys != 3 {
		t.Fatalf("stats --json: queued %d, group_waiting %d, group_keys %d; want 3, 247, 3", row.Queued, row.GroupWaiting, row.GroupKeys)
	}
	want := []groupLoad{{"a", 124}, {"b", 62}, {"c", 61}}
	if !slices.Equal(row.BusiestGroups, want) {
		t.Fatalf("stats --json: busiest_groups %v, want %v", row.BusiestGroups, want)
	}
	out := e.mustRun("stats", "--receiver", "ordered")
	header := strings.Fields(strings.SplitN(out, "\n", 2)[0])
	if i := slices.Index(header, "GROUPS"); i < 0 || !strings.Contains(out, "247 (3 keys)") {
		t.Fatalf("stats: no GROUPS column with 247 (3 keys):\n%s", out)
	}
	busiest := regexpLines(out, `^ordered +(a|b|c) +(\d+)$`)
	if fmt.Sprint(busiest) != "[a 124 b 62 c 61]" {
		t.Fatalf("stats --receiver ordered lists the busiest keys %v, want a 124, b 62, c 61:\n%s", busiest, out)
	}
	if out := e.mustRun("stats"); strings.Contains(out, "GROUP KEY") {
		t.Fatalf("stats without --receiver lists keys:\n%s", out)
	}

	log := filepath.Join(dir, "handled")
	e.startWorker("--receiver", "ordered", "--concurrency", "8", "--shell",
		"--exec", `read key n s; sleep "$s"; echo "$key $n" >> `+log+`; echo "$key $n"`)
	checkKeyOrder(t, handled(t, log, 250), 250)
	if row := e.receiverJSON("ordered"); row.GroupWaiting != 0 || row.GroupKeys != 0 || row.BusiestGroups != nil {
		t.Fatalf("stats after the worker ran every key: %+v", row)
	}
	if out := e.mustRun("stats", "--receiver", "ordered"); !strings.Contains(out, " - ") || strings.Contains(out, "GROUP KEY") {
		t.Fatalf("stats of a receiver without keyed messages waiting:\n%s", out)
	}

	// With --wait: 8 at once, the later of a key sleeping less.
	if err := os.Remove(log); err != nil {
		t.Fatal(err)
	}
	file.Reset()
	for i := range 16 {
		key, n := "x", i/2+1
		if i%2 == 1 {
			key = "y"
		}
		fmt.Fprintf(&file, `{"content": "%s %d 0.%02d", "group": "%s"}`+"\n", key, n, 40-5*n, key)
	}
	replies, errOut, code := e.run(file.String(), "send", "--to", "ordered", "--wait", "--concurrency", "8", "--file", "-")
	if code != ExitOK || strings.Count(replies, `"reply":`) != 16 {
		t.Fatalf("send --wait --file: exit %d\n%s\n%s", code, replies, errOut)
	}
	checkKeyOrder(t, handled(t, log, 16), 16)
}

// regexpLines returns the submatches of pattern in the lines of text.
func regexpLines(text, pattern string) []string {
	re := regexp.MustCompile(pattern)
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if m := re.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			out = append(out, m[1:]...)
		}
	}
	return out
}

// TestSendFlagsCompose: the flags that the library lets go together do,
// on the command line too: --group with --delay and --priority, a key's
// messages handled in the order sent whatever their levels, the deferred
// one joining its key when it comes due; a dedup key with --delay, --from
// and --timeout; an idempotency key without --wait; a dedup key with
// --wait, whose duplicate has no reply to wait for.
func TestSendFlagsCompose(t *testing.T) {
	t.Parallel()
	e := newRedisEnv(t)
	log := filepath.Join(t.TempDir(), "handled")

	e.mustRun("send", "--to", "mixed", "--group", "g", "--priority", "low", "g 1 0")
	e.mustRun("send", "--to", "mixed", "--group", "g", "--priority", "high", "--delay", "300ms", "--expiry", "1h", "g 3 0")
	e.mustRun("send", "--to", "mixed", "--group", "g", "--priority", "high", "g 2 0")
	if row := e.receiverJSON("mixed"); row.Deferred != 1 || row.Queued != 1 || row.GroupWaiting != 1 {
		t.Fatalf("stats: %+v; want 1 deferred, 1 queued and 1 waiting behind its key", row)
	}
	e.startWorker("--receiver", "mixed", "--concurrency", "4", "--shell",
		"--exec", `read key n s; echo "$key $n" >> `+log)
	checkKeyOrder(t, handled(t, log, 3), 3)

	id := strings.TrimSpace(e.mustRun("send", "--to", "later", "--priority", "high", "--delay", "1s", "hi"))
	if len(id) != 26 {
		t.Fatalf("send --priority high --delay 1s printed %q, want an id", id)
	}
	first := e.mustRun("send", "--to", "later", "--dedup-key", "k", "--delay", "1s", "--from", "s", "--timeout", "5s", "one")
	again, errOut, code := e.run("", "send", "--to", "later", "--dedup-key", "k", "--delay", "1s", "--from", "s", "--timeout", "5s", "two")
	if code != ExitOK || again != first || !strings.Contains(errOut, "not sent: a duplicate of message "+strings.TrimSpace(first)) {
		t.Fatalf("the same dedup key again: exit %d, %q (first %q), %s", code, again, first, errOut)
	}
	one := e.mustRun("send", "--to", "later", "--idempotency-key", "i", "--at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "one")
	if two := e.mustRun("send", "--to", "later", "--idempotency-key", "i", "two"); two != one {
		t.Fatalf("a second send with the idempotency key printed %q, the first %q: want the same message", two, one)
	}

	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z")
	if reply := e.mustRun("send", "--to", "upper", "--wait", "--dedup-key", "w", "--group", "g", "--priority", "high", "hi"); reply != "HI" {
		t.Fatalf("send --wait --dedup-key: %q, want HI", reply)
	}
	reply, errOut, code := e.run("", "send", "--to", "upper", "--wait", "--dedup-key", "w", "hi")
	if code != ExitOK || reply != "" || !strings.Contains(errOut, "not sent: a duplicate of message") || !strings.Contains(errOut, "no reply to wait for") {
		t.Fatalf("send --wait with a dedup key taken: exit %d, %q, %s", code, reply, errOut)
	}
	lines := `{"content": "a", "dedup_key": "d"}` + "\n" + `{"content": "b", "dedup_key": "d"}` + "\n"
	replies, errOut, code := e.run(lines, "send", "--to", "upper", "--wait", "--concurrency", "1", "--file", "-")
	if code != ExitOK || !strings.Contains(replies, `"reply":"A"`) || !strings.Contains(replies, `{"line":2,"duplicate_of":"`) {
		t.Fatalf("send --wait --file with one dedup key twice: exit %d\n%s\n%s", code, replies, errOut)
	}
	_, errOut, code = e.run(lines, "send", "--to", "upper", "--file", "-")
	if code != ExitOK || !strings.Contains(errOut, `sent 0 of 2 messages to upper; not sent, as duplicates (their "dedup_key" was taken within --dedup-ttl): 2`) {
		t.Fatalf("send --file of duplicates: exit %d, %s", code, errOut)
	}
}

// TestGroupUsageErrors: bad group keys and group settings, keys of one
// message given for a --file, and a combination of flags that the library
// refuses, are usage errors (exit 2) of one line that say why, and
// nothing is sent.
func TestGroupUsageErrors(t *testing.T) {
	t.Parallel()
	e := newRedisEnv(t)
	long := strings.Repeat("k", disker.MaxKeyLen+1)
	dir := t.TempDir()
	file := func(line string) string {
		p := filepath.Join(dir, fmt.Sprint(len(line), "-", strings.Count(line, "k")))
		if err := os.WriteFile(p, []byte(line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	at := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "--to", "r", "--group", "", "hi"}, "invalid --group: must not be empty"},
		{[]string{"send", "--to", "r", "--group", long, "hi"}, fmt.Sprintf("invalid --group: %d bytes, over the limit of %d", len(long), disker.MaxKeyLen)},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x", "group": ""}`)}, `:1: invalid group: must not be empty`},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x", "dedup_key": "` + long + `"}`)}, `:1: invalid dedup_key: 1025 bytes`},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x", "idempotency_key": ""}`)}, `:1: invalid idempotency_key: must not be empty`},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x", "group": 7}`)}, `"group": a JSON number where a string belongs`},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x"}`), "--dedup-key", "k"}, `give each line its own "dedup_key"`},
		{[]string{"send", "--to", "r", "--file", file(`{"content": "x"}`), "--idempotency-key", "k"}, `give each line its own "idempotency_key"`},
		{[]string{"send", "--to", "r", "--delay", "1s", "--at", at, "hi"}, "invalid --delay: --delay and --at both give the message a due time: give one"},
		{[]string{"send", "--to", "r", "--delay", "1s", "--at", at, "--file", file(`{"content": "x"}`)}, "invalid --delay: --delay and --at both give the message a due time: give one"},
		{[]string{"send", "--to", "r", "--expiry", "-1s", "hi"}, "invalid --expiry -1s"},
		{[]string{"send", "--to", "r", "--expiry", "1000000h", "hi"}, "invalid --expiry 1000000h0m0s: over the limit"},
		{[]string{"send", "--to", "r", "--wait", "--timeout", "1ns", "hi"}, "invalid --timeout 1ns: must be at least 1ms"},
		{[]string{"send", "--to", "r", "--from", "s", "--timeout", "-1s", "hi"}, "invalid --timeout -1s"},
		{[]string{"send", "--to", "r", "--from", "s", "--file", file(`{"content": "x"}`), "hi"}, "give either --file or DATA"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-concurrency", "0"}, "invalid --group-concurrency 0: must be in 1..1048576"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-concurrency", "1048577"}, "invalid --group-concurrency 1048577"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-rate", "0"}, "invalid --group-rate 0: must be > 0"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-rate", "-2"}, "invalid --group-rate -2"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-rate", "+Inf"}, "invalid --group-rate +Inf"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-rate", "5", "--group-burst", "0"}, "invalid --group-burst 0: must be >= 1"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-burst", "5"}, "--group-burst needs --group-rate"},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--group-skip-retries=maybe"}, "--group-skip-retries"},
	} {
		out, errOut, code := e.run("", c.args...)
		if code != ExitUsage || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 || out != "" {
			t.Errorf("disker %q: exit %d, stdout %q, stderr %q; want exit 2 and one line with %q", c.args, code, out, errOut, c.want)
		}
	}
	// Nothing was sent: Redis knows no receiver.
	var snap statsSnapshot
	if out := e.mustRun("stats", "--json"); json.Unmarshal([]byte(out), &snap) != nil || len(snap.Receivers) != 0 {
		t.Errorf("stats after the refused sends: %s", out)
	}
}

// TestWorkerGroupSettings: the group flags of "disker worker" set the
// receiver's groups: --group-concurrency 2 lets two messages of a key out
// at once (the others wait behind it), --group-rate queues a key's
// messages no faster than its tokens, and --group-skip-retries lets a key
// go on while its failed message waits for its retries (without it, the
// key would wait for the 1,000 attempts of the failing one).
func TestWorkerGroupSettings(t *testing.T) {
	t.Parallel()
	e := newRedisEnv(t)

	// Handlers that run until the worker stops: two of the key's messages
	// are out, being handled, and the other three wait.
	e.startWorker("--receiver", "pair", "--exec", "sleep 60", "--shutdown-timeout", "1ms", "--group-concurrency", "2")
	for i := range 5 {
		e.mustRun("send", "--to", "pair", "--group", "g", fmt.Sprint(i))
	}
	if row := e.receiverJSON("pair"); row.GroupWaiting != 3 || row.GroupKeys != 1 {
		t.Fatalf("--group-concurrency 2, 5 messages of a key sent: %d waiting in %d keys, want 3 in 1", row.GroupWaiting, row.GroupKeys)
	}

	e.startWorker("--receiver", "slow", "--exec", "cat", "--group-concurrency", "10", "--group-rate", "0.001", "--group-burst", "1")
	for i := range 3 {
		e.mustRun("send", "--to", "slow", "--group", "g", fmt.Sprint(i))
	}
	if row := e.receiverJSON("slow"); row.GroupWaiting != 2 || row.GroupKeys != 1 {
		t.Fatalf("--group-rate 0.001, 3 messages of a key sent: %d waiting in %d keys, want 2 in 1", row.GroupWaiting, row.GroupKeys)
	}

	log := filepath.Join(t.TempDir(), "handled")
	e.startWorker("--receiver", "skip", "--group-skip-retries", "--max-attempts", "1000", "--shell",
		"--exec", `read x; echo "$x" >> `+log+`; [ "$x" != fail ]`)
	e.mustRun("send", "--to", "skip", "--group", "g", "fail")
	e.mustRun("send", "--to", "skip", "--group", "g", "ok")
	if lines := handled(t, log, 2); !slices.Contains(lines, "ok") {
		t.Fatalf("handled %q: the message after a failing one of its key did not run", lines)
	}
}

// TestSendWaitExpired: a request with --expiry that no worker started in
// time fails (exit 1) saying that it expired, and stats counts it.
func TestSendWaitExpired(t *testing.T) {
	t.Parallel()
	e := newRedisEnv(t)
	// One handler, busy for 2s with the first message: the second waits
	// in the queue past its expiry.
	e.startWorker("--receiver", "busy", "--concurrency", "1", "--shell", "--exec", `read s; sleep "$s"`)
	e.mustRun("send", "--to", "busy", "2")
	deadline := time.Now().Add(30 * time.Second)
	for e.receiverJSON("busy").Pending != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the first message was not taken within 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out, errOut, code := e.run("", "send", "--to", "busy", "--wait", "--timeout", "20s", "--expiry", "100ms", "0")
	if code != ExitRuntime || out != "" || !strings.Contains(errOut, `the message expired: no worker of "busy" started it within --expiry 100ms of its delivery`) {
		t.Fatalf("send --wait --expiry behind a busy worker: exit %d, %q, %s", code, out, errOut)
	}
	if row := e.receiverJSON("busy"); row.Expired != 1 {
		t.Fatalf("stats: %d expired, want 1", row.Expired)
	}
}
