package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
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

// TestGatewayAsync: with --async-retention, a request with "Prefer:
// respond-async" is answered 202 at once with its status URL in Location;
// the status URL, read with an HTTP client, gives the result, and once
// final the worker's HTTP response; an unknown id is 404. Without the
// header the gateway answers as always.
func TestGatewayAsync(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Svc", "yes")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "made %s", r.URL.Path)
	}))
	t.Cleanup(svc.Close)
	e.startWorker("--receiver", "async", "--http", svc.URL)
	_, base := e.startGateway("--receiver", "async", "--async-retention", "1h")
	req, _ := http.NewRequest(http.MethodPost, base+"/thing", strings.NewReader("x"))
	req.Header.Set("Prefer", "respond-async")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || !strings.HasPrefix(loc, "/_disker/results/") {
		t.Fatalf("async POST: %d, Location %q, %s", resp.StatusCode, loc, body)
	}
	var v struct {
		State    string `json:"state"`
		Final    bool   `json:"final"`
		Response *struct {
			Status int                 `json:"status"`
			Header map[string][]string `json:"header"`
			Body   string              `json:"body"`
		} `json:"response"`
	}
	waitFor(t, 30*time.Second, "the async request's final result", func() bool {
		code, out := get(t, base+loc)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", loc, code, out)
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("GET %s: %v: %s", loc, err, out)
		}
		return v.Final
	})
	if v.State != "succeeded" || v.Response == nil || v.Response.Status != http.StatusCreated || v.Response.Body != "made /thing" ||
		v.Response.Header["X-Svc"][0] != "yes" {
		t.Fatalf("the async result: %+v (response %+v)", v, v.Response)
	}
	if code, out := get(t, base+"/_disker/results/01m90mn0vjmssp1xq3hqf9yp02"); code != http.StatusNotFound {
		t.Fatalf("an unknown id: %d %s", code, out)
	}
	if code, out := get(t, base+"/sync"); code != http.StatusCreated || out != "made /sync" {
		t.Fatalf("a plain request: %d %s", code, out)
	}
}
