package main_test

import (
	"strings"
	"testing"
)

// TestBatchCommand: an unknown batch is exit 1 with "no batch", a
// malformed id a usage error (exit 2).
func TestBatchCommand(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, errOut, code := e.run("", "batch", "done/01jf3m4v0c8x2k5q7r9s1t3w5y"); code != 1 || !strings.Contains(errOut, "no batch") {
		t.Fatalf("batch of an unknown id: exit %d, %s", code, errOut)
	}
	if _, errOut, code := e.run("", "batch", "no-slash"); code != 2 {
		t.Fatalf("batch of a bad id: exit %d, %s", code, errOut)
	}
}
