package cli

import (
	"os/exec"
	"syscall"
)

// setProcessGroup starts cmd in a process group of its own, and makes its
// cancellation kill the whole group, so that a shell's children die with it.
// The command is also killed when the worker dies, even by SIGKILL or a
// second signal (Pdeathsig), so that no command outlives its worker.
func setProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error {
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}
