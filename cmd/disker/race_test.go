//go:build race

package main_test

// Under the race detector the end-to-end tests build the binary with it
// too, and a race halts the process (GORACE=halt_on_error=1, set in
// TestMain) so that the test that drove it fails.
func init() { buildFlags = append(buildFlags, "-race") }
