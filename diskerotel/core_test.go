package diskerotel_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestCoreHasNoOpenTelemetry checks that OpenTelemetry stays in this
// module: the core module's go.mod and go.sum do not name it, and the
// disker command (cmd/disker, a module of its own) compiles none of it in.
func TestCoreHasNoOpenTelemetry(t *testing.T) {
	for _, f := range []string{"../go.mod", "../go.sum"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "go.opentelemetry.io") {
			t.Errorf("%s names go.opentelemetry.io: the core module must not depend on OpenTelemetry", f)
		}
	}
	cmd := exec.Command("go", "list", "-deps", ".")
	cmd.Dir = "../cmd/disker"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "github.com/diskerhq/disker/internal/cli") {
		t.Fatalf("go list -deps of cmd/disker does not list internal/cli:\n%s", out)
	}
	for line := range strings.Lines(string(out)) {
		if strings.HasPrefix(line, "go.opentelemetry.io") {
			t.Errorf("the core's disker command imports %s", strings.TrimSpace(line))
		}
	}
}
