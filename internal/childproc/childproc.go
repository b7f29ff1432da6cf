// Package childproc ties the processes that a program starts to its own
// life: a harness or a test helper that is killed must not leave its
// children running.
package childproc

import (
	"fmt"
	"os"
	"os/exec"
	"time"
)

// Tie makes cmd's process, not started yet, die with this one where the
// system can: on Linux it gets SIGKILL when the thread that starts it
// ends, which is when this process dies (the Go runtime ends a thread only
// when a goroutine locked to it returns; nothing here locks one). Elsewhere
// it does nothing: the child watches its parent itself (ExitWithParent).
func Tie(cmd *exec.Cmd) { tie(cmd) }

// watchEvery is how often ExitWithParent looks at the parent.
const watchEvery = 500 * time.Millisecond

// ExitWithParent watches this process's parent, for ever, and exits with
// status 1 when it is gone: an orphan is adopted by another process (init,
// or a subreaper), so its parent's pid changes. Run it on a goroutine of
// its own, first thing: it covers the systems where Tie does nothing.
func ExitWithParent() {
	parent := os.Getppid()
	t := time.NewTicker(watchEvery)
	defer t.Stop()
	for range t.C {
		if os.Getppid() != parent {
			fmt.Fprintf(os.Stderr, "childproc: the parent process (%d) is gone: exiting\n", parent)
			os.Exit(1)
		}
	}
}
