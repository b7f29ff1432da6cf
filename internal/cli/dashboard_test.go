package cli

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDashboardUsage checks the refusals of "disker dashboard" and of
// --admin-dashboard, which happen before any connection.
func TestDashboardUsage(t *testing.T) {
	t.Parallel()
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"dashboard", "--listen", ":0", "--allow-actions"}, "not a loopback address, needs"},
		{[]string{"dashboard", "--listen", "0.0.0.0:8090", "--allow-actions"}, "not a loopback address, needs"},
		{[]string{"dashboard", "--basic-auth", "nopassword"}, "invalid --basic-auth"},
		{[]string{"dashboard", "--basic-auth-file", filepath.Join(t.TempDir(), "missing")}, "invalid --basic-auth-file"},
		{[]string{"dashboard", "--token-file", empty}, "it is empty"},
		{[]string{"dashboard", "--token", "a", "--token-file", empty}, "not both"},
		{[]string{"worker", "--receiver", "x", "--exec", "cat", "--admin-dashboard"}, "--admin-dashboard needs --admin"},
	} {
		var stderr bytes.Buffer
		code := Run(context.Background(), c.args, strings.NewReader(""), &bytes.Buffer{}, &stderr)
		if code != ExitUsage || !strings.Contains(stderr.String(), c.want) {
			t.Errorf("disker %s: exit %d, %q; want %d and %q", strings.Join(c.args, " "), code, stderr.String(), ExitUsage, c.want)
		}
	}
}

// TestDashboardInProcess runs a worker with --admin-dashboard and "disker
// dashboard" on one in-memory broker, and reads both dashboards.
func TestDashboardInProcess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wOut, dOut syncBuffer
	codes := make(chan int, 2)
	broker := "mem://cli-dashboard"
	go func() {
		codes <- Run(ctx, []string{"worker", "--receiver", "jobs", "--exec", "cat", "--redis-url", broker, "--log-format", "json",
			"--admin", "127.0.0.1:0", "--admin-dashboard"}, strings.NewReader(""), io.Discard, &wOut)
	}()
	admin := "http://" + logField(t, &wOut, "worker started", "admin") + "/dashboard"
	go func() {
		codes <- Run(ctx, []string{"dashboard", "--listen", "127.0.0.1:0", "--redis-url", broker, "--log-format", "json",
			"--interval", "100ms"}, strings.NewReader(""), io.Discard, &dOut)
	}()
	dash := strings.TrimSuffix(logField(t, &dOut, "dashboard started", "url"), "/")
	for _, base := range []string{admin, dash} {
		deadline := time.Now().Add(20 * time.Second)
		for {
			code, body := httpGet(t, base+"/api/snapshot")
			if code == http.StatusOK && strings.Contains(body, `"name":"jobs"`) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s/api/snapshot: %d %s: no receiver jobs", base, code, body)
			}
			<-time.After(50 * time.Millisecond)
		}
		if code, body := httpGet(t, base+"/workers"); code != http.StatusOK || !strings.Contains(body, "jobs (") {
			t.Errorf("%s/workers: %d, without the worker", base, code)
		}
	}
	if code, _ := httpGet(t, admin+"/receivers/jobs/dead-letters/purge?all=1"); code != http.StatusForbidden {
		t.Errorf("the admin dashboard's purge: %d, want 403 (read-only)", code)
	}
	http.DefaultClient.CloseIdleConnections()
	cancel()
	for range 2 {
		if code := <-codes; code != ExitOK {
			t.Errorf("exit code %d after the context ended\nworker:\n%s\ndashboard:\n%s", code, wOut.String(), dOut.String())
		}
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
