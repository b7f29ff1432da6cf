package main_test

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestResultCommand: send --retention keeps a message's result, and
// result --wait prints it when the worker handled it (as text and as
// JSON); a message sent without one has none (exit 1), a bad id is a
// usage error (exit 2).
func TestResultCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startWorker("--receiver", "upper", "--exec", "tr a-z A-Z")
	out, errOut, code := e.run("", "send", "--to", "upper", "--from", "me", "--retention", "1h", "hi")
	id := strings.TrimSpace(out)
	if code != 0 || len(id) != 26 {
		t.Fatalf("send --retention: exit %d, %q %s", code, out, errOut)
	}
	out, errOut, code = e.run("", "result", "upper", id, "--wait", "--json")
	if code != 0 {
		t.Fatalf("result --wait --json: exit %d, %q %s", code, out, errOut)
	}
	var v map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("result --json: %v: %q", err, out)
	}
	if v["state"] != "succeeded" || v["final"] != true || v["attempts"] != 1.0 || v["id"] != id || v["finished_at"] == nil {
		t.Fatalf("result --json: %v", v)
	}
	out, errOut, code = e.run("", "result", "upper", id)
	if code != 0 || !strings.Contains(out, "state\tsucceeded") || !strings.Contains(out, "worker\t") {
		t.Fatalf("result: exit %d, %q %s", code, out, errOut)
	}

	out, _, _ = e.run("", "send", "--to", "upper", "plain")
	if _, errOut, code := e.run("", "result", "upper", strings.TrimSpace(out)); code != 1 || !strings.Contains(errOut, "no result") {
		t.Fatalf("result of a message without a retention: exit %d, %s", code, errOut)
	}
	if _, errOut, code := e.run("", "result", "upper", "nope"); code != 2 {
		t.Fatalf("result of a bad id: exit %d, %s", code, errOut)
	}
	if _, errOut, code := e.run("", "send", "--to", "upper", "--retention", "-1s", "x"); code != 2 || !strings.Contains(errOut, "--retention") {
		t.Fatalf("send --retention -1s: exit %d, %s", code, errOut)
	}
}
