//go:build linux

package chaos

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestChildrenDieWithHarness: a harness killed with SIGKILL takes its
// children along (redis-server, the workers and the producers), rather
// than leaving them to retry a Redis that is gone.
func TestChildrenDieWithHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the harness")
	}
	dir := t.TempDir()
	exe := filepath.Join(dir, "chaos")
	build := exec.Command("go", "build", "-o", exe, "./cmd/chaos")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/chaos: %v\n%s", err, out)
	}
	var out bytes.Buffer
	harness := exec.Command(exe, "-duration", "10m", "-fault-every", "1h", "-seed", "1", "-dir", filepath.Join(dir, "run"))
	harness.Stdout, harness.Stderr = &out, &out
	if err := harness.Start(); err != nil {
		t.Fatal(err)
	}
	const want = 7 // redis-server, 3 workers, 3 producers
	var kids []int
	deadline := time.Now().Add(2 * time.Minute)
	for kids = childrenOf(harness.Process.Pid); len(kids) < want; kids = childrenOf(harness.Process.Pid) {
		if time.Now().After(deadline) {
			_ = harness.Process.Kill()
			_ = harness.Wait()
			killAll(kids)
			t.Fatalf("the harness started %d of its %d processes in 2 minutes; its output:\n%s", len(kids), want, out.String())
		}
		time.Sleep(50 * time.Millisecond) // polling /proc
	}
	if err := harness.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = harness.Wait()
	deadline = time.Now().Add(30 * time.Second)
	for left := alive(kids); len(left) > 0; left = alive(left) {
		if time.Now().After(deadline) {
			var names []string
			for _, pid := range left {
				names = append(names, fmt.Sprintf("%d %s", pid, cmdline(pid)))
			}
			killAll(left)
			t.Fatalf("30 s after the harness was killed, %d of its %d processes still ran: %s", len(left), len(kids), strings.Join(names, "; "))
		}
		time.Sleep(50 * time.Millisecond) // polling /proc
	}
}

// childrenOf lists the processes whose parent is ppid, from /proc.
func childrenOf(ppid int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if parent, state, ok := procStat(pid); ok && parent == ppid && state != "Z" {
			kids = append(kids, pid)
		}
	}
	return kids
}

// alive returns the processes of pids that still run (a zombie does not).
func alive(pids []int) []int {
	var left []int
	for _, pid := range pids {
		if _, state, ok := procStat(pid); ok && state != "Z" {
			left = append(left, pid)
		}
	}
	return left
}

// procStat reads a process's parent and state from /proc/PID/stat; the
// command name, in parentheses, may hold spaces.
func procStat(pid int) (ppid int, state string, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, "", false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, "", false
	}
	ppid, err = strconv.Atoi(f[1])
	return ppid, f[0], err == nil
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
}

// killAll kills the processes this test left running, by pid.
func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
