package main_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// deferred returns the deferred count of receiver from disker stats.
func (e *env) deferred(t *testing.T, receiver string) int64 {
	t.Helper()
	out, errOut, code := e.run("", "stats", "--json", "--receiver", receiver)
	var snap struct {
		Receivers []struct {
			Deferred int64 `json:"deferred"`
			Pending  int64 `json:"pending"`
		} `json:"receivers"`
	}
	if code != 0 || json.Unmarshal([]byte(out), &snap) != nil {
		t.Fatalf("stats: exit %d, %q %s", code, out, errOut)
	}
	if len(snap.Receivers) == 0 {
		return 0
	}
	return snap.Receivers[0].Deferred
}

// TestSendLaterAndCancel: send --delay and --at schedule a message (stats
// counts it), cancel unschedules it and says so, and a second cancel says
// not found; a delayed --wait gets its reply; a message being handled is
// cancelled in flight.
func TestSendLaterAndCancel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	out, errOut, code := e.run("", "send", "--to", "later", "--delay", "1h", "remind me")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 26 {
		t.Fatalf("send --delay: exit %d, %q %s", code, out, errOut)
	}
	if n := e.deferred(t, "later"); n != 1 {
		t.Fatalf("stats: %d deferred, want 1", n)
	}
	if out, _, _ := e.run("", "stats", "--receiver", "later"); !strings.Contains(out, "DEFERRED") {
		t.Errorf("stats has no DEFERRED column: %s", out)
	}
	if out, errOut, code := e.run("", "cancel", "--receiver", "later", id); code != 0 || !strings.Contains(out, "cancelled while deferred") {
		t.Fatalf("cancel: exit %d, %q %s", code, out, errOut)
	}
	if out, errOut, code := e.run("", "cancel", "--receiver", "later", id); code != 0 || !strings.Contains(out, "not found") {
		t.Fatalf("cancel again: exit %d, %q %s", code, out, errOut)
	}
	if n := e.deferred(t, "later"); n != 0 {
		t.Fatalf("stats after cancel: %d deferred, want 0", n)
	}

	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z")
	began := time.Now()
	if out, errOut, code := e.run("", "send", "--to", "upper", "--delay", "500ms", "--timeout", "5s", "--wait", "hi"); code != 0 || out != "HI" {
		t.Fatalf("send --delay --wait: exit %d, %q %s", code, out, errOut)
	}
	if took := time.Since(began); took < 500*time.Millisecond {
		t.Fatalf("send --delay 500ms --wait answered after %v", took)
	}
	past := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	if out, errOut, code := e.run("", "send", "--to", "upper", "--at", past, "--wait", "hi"); code != 0 || out != "HI" {
		t.Fatalf("send --at in the past --wait: exit %d, %q %s", code, out, errOut)
	}

	e.startWorker("--receiver", "sleepy", "--exec", "sleep 60")
	out, errOut, code = e.run("", "send", "--to", "sleepy", "zzz")
	id = strings.TrimSpace(out)
	if code != 0 {
		t.Fatalf("send: exit %d, %s", code, errOut)
	}
	waitFor(t, 20*time.Second, "the message in flight", func() bool {
		out, _, _ := e.run("", "stats", "--json", "--receiver", "sleepy")
		return strings.Contains(out, `"pending":1`)
	})
	if out, errOut, code := e.run("", "cancel", "--receiver", "sleepy", id); code != 0 || !strings.Contains(out, "in flight") {
		t.Fatalf("cancel in flight: exit %d, %q %s", code, out, errOut)
	}
}

// TestSendLaterAndCancelErrors: bad --delay, --at and ids are usage errors
// (exit 2) that name the flag or the id.
func TestSendLaterAndCancelErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"send", "--to", "x", "--delay", "-1s", "hi"}, "--delay"},
		{[]string{"send", "--to", "x", "--delay", "1s", "--at", "2030-01-01T00:00:00Z", "hi"}, "--delay and --at"},
		{[]string{"send", "--to", "x", "--at", "tomorrow", "hi"}, "--at"},
		{[]string{"send", "--to", "x", "--delay", "1000000h", "hi"}, "--delay"},
		{[]string{"cancel", "--receiver", "x"}, "cancel needs at least one ID"},
		{[]string{"cancel", "--receiver", "x", "not-an-id"}, `invalid message id "not-an-id"`},
		{[]string{"cancel", "01jf3m4v0c8x2k5q7r9s1t3w5y"}, "--receiver"},
	} {
		_, errOut, code := e.run("", c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("disker %v: exit %d, %q; want exit 2 naming %s", c.args, code, errOut, c.want)
		}
	}
}
