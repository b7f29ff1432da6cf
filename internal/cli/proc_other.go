//go:build !unix

package cli

import "os/exec"

// setProcessGroup does nothing where there are no process groups: the
// cancellation kills the command's own process only.
func setProcessGroup(*exec.Cmd) {}
