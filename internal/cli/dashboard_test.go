package cli

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
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
