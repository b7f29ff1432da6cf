package main_test

import (
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/diskerhq/disker/internal/redistest"
)

// firstLine returns the first line of s without its newline.
func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// TestNewcomerMistakes types what a newcomer types when something is
// wrong, and reads the exit status and the first line of stderr: each says
// what went wrong in the user's words, and a mistake on the command line is
// refused before Redis is used.
func TestNewcomerMistakes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	locked := redistest.Start(t)
	redisCLI(t, locked.Addr(), "CONFIG", "SET", "requirepass", "sekret")
	e.startWorker("--receiver", "failing", "--exec", "false", "--max-attempts", "1")

	down := "DISKER_REDIS_URL=redis://127.0.0.1:1/0" // nothing there: a usage error comes first
	for _, c := range []struct {
		args []string
		env  string
		code int
		line string
	}{
		// A typo in a command of dlq or schedule is no success.
		{[]string{"dlq", "frob"}, down, 2, `disker: unknown command "frob" for "disker dlq"; the commands are list, purge or retry (see 'disker dlq --help')`},
		{[]string{"schedule", "frob"}, down, 2, `disker: unknown command "frob" for "disker schedule"; the commands are add, list or remove (see 'disker schedule --help')`},
		{[]string{"dlq", "purgee", "--all"}, down, 2, `disker: unknown command "purgee" for "disker dlq"; did you mean "purge"? (see 'disker dlq --help')`},
		{[]string{"dlq"}, down, 2, `disker: dlq needs a command: list, purge or retry (see 'disker dlq --help')`},
		{[]string{"completion", "frob"}, down, 2, `disker: unknown command "frob" for "disker completion"; the commands are bash, fish, powershell or zsh (see 'disker completion --help')`},
		// No words of Go or of another library.
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--admin", "notaport"}, down, 2,
			`disker: invalid --admin "notaport": want HOST:PORT or :PORT, such as 127.0.0.1:9090 or :9090 (see 'disker worker --help')`},
		{[]string{"worker", "--receiver", "r", "--exec", "cat"}, "DISKER_ADMIN=notaport", 2,
			`disker: invalid --admin (DISKER_ADMIN) "notaport": want HOST:PORT or :PORT, such as 127.0.0.1:9090 or :9090 (see 'disker worker --help')`},
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--admin", busy.Addr().String()}, "", 1,
			`disker: cannot listen on --admin ` + busy.Addr().String() + `: the address is in use: another process listens there`},
		{[]string{"send", "--to", "r", "--max-message-size", "10", "more than ten bytes"}, down, 2,
			`disker: the content is 19 bytes, over --max-message-size 10 (see 'disker send --help')`},
		{[]string{"worker", "--receiver", "r", "--exec", "cat"}, "DISKER_CONCURRENCY=abc", 2,
			`disker: invalid DISKER_CONCURRENCY "abc" (for --concurrency): want a whole number (see 'disker worker --help')`},
		{[]string{"send", "--to", "failing", "--wait", "hi"}, "", 1,
			`disker: the message failed on every attempt and went to the dead letters of "failing": false: exit status 1 (see 'disker dlq list --receiver failing')`},
		{[]string{"pause", "a", "b"}, down, 2, `disker: pause takes one RECEIVER, got 2: "a" "b" (see 'disker pause --help')`},
		{[]string{"send", "--to", "r", "hello", "world"}, down, 2, `disker: send takes one DATA, got 2: "hello" "world" (quote DATA that has spaces) (see 'disker send --help')`},
		{[]string{"stats"}, "DISKER_REDIS_URL=" + locked.URL(), 1,
			`disker: cannot use Redis at ` + locked.URL() + `: Redis wants a password (NOAUTH) and --redis-url (DISKER_REDIS_URL) gives none: redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@HOST:PORT/DB for an ACL user`},
		{[]string{"stats"}, "DISKER_REDIS_URL=redis://:wrong@" + locked.Addr() + "/0", 1,
			`disker: cannot use Redis at redis://:xxxxx@` + locked.Addr() + `/0: Redis refused the user and password (WRONGPASS): check them in --redis-url (DISKER_REDIS_URL)`},
		// Flags where they mean nothing.
		{[]string{"worker", "--receiver", "r", "--exec", "cat", "--max-body", "2MiB"}, down, 2, `disker: --max-body needs --http (see 'disker worker --help')`},
		{[]string{"schedule", "add", "s", "--receiver", "r", "--every", "1m", "--tz", "UTC"}, down, 2, `disker: --tz needs --cron (see 'disker schedule add --help')`},
		// One behaviour for an unknown receiver, and for a malformed id.
		{[]string{"stats", "--receiver", "ghost"}, "", 1, `disker: no receiver "ghost" under --key-prefix "` + e.prefix + `" (receivers known: failing)`},
		{[]string{"dlq", "list", "--receiver", "ghost"}, "", 1, `disker: no receiver "ghost" under --key-prefix "` + e.prefix + `" (receivers known: failing)`},
		{[]string{"cancel", "--receiver", "failing", "not-an-id"}, down, 2,
			`disker: invalid message id "not-an-id": want 26 characters as "disker send" prints them (see 'disker cancel --help')`},
	} {
		e.extra = nil
		if c.env != "" {
			e.extra = []string{c.env}
		}
		_, errOut, code := e.run("", c.args...)
		if code != c.code || firstLine(errOut) != c.line {
			t.Errorf("%s disker %q: exit %d, first line of stderr:\n  %s\nwant exit %d and:\n  %s", c.env, c.args, code, firstLine(errOut), c.code, c.line)
		}
	}

	// The dashboard answers a malformed id as the command does: refused,
	// not "gone".
	e.extra = nil
	_, url := e.startDashboard()
	resp, err := http.Get(url + "/message?receiver=failing&id=not-an-id")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("the dashboard's message page of a malformed id: %d, want 400", resp.StatusCode)
	}
}

// startDashboard starts a dashboard on a free port and returns it and its
// URL.
func (e *env) startDashboard(args ...string) (*proc, string) {
	p := e.start(append([]string{"dashboard", "--listen", "127.0.0.1:0"}, args...)...)
	rec := p.waitLog("dashboard started")
	return p, strings.TrimSuffix(rec["url"].(string), "/")
}
