package bench

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100
// per second on Linux.
const clockTick = 10 * time.Millisecond

// procStat is what /proc/PID/stat says of a process: its parent and the
// CPU time (user and system) it and its reaped children used.
type procStat struct {
	pid, ppid int
	cpu       time.Duration // utime + stime + cutime + cstime
}

// readProcStat reads /proc/PID/stat; false where it cannot be read (not
// Linux, or the process is gone).
func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	// The command name, in parentheses, may hold spaces: the fields
	// counted from 3 (state) start after its last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime 14..17.
	if len(f) < 15 {
		return procStat{}, false
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, false
	}
	var ticks int64
	for _, s := range f[11:15] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return procStat{}, false
		}
		ticks += n
	}
	return procStat{pid: pid, ppid: ppid, cpu: time.Duration(ticks) * clockTick}, true
}

// processTree returns root and its descendants alive now.
func processTree(root int) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return []int{root}
	}
	children := map[int][]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok {
			children[st.ppid] = append(children[st.ppid], pid)
		}
	}
	tree := []int{root}
	for i := 0; i < len(tree); i++ {
		tree = append(tree, children[tree[i]]...)
	}
	return tree
}

// treeCPU returns the CPU time used by the processes of root's tree alive
// now and by the children they reaped (a reaped child's time moves into its
// parent's cutime and cstime).
func treeCPU(root int) time.Duration {
	var total time.Duration
	for _, pid := range processTree(root) {
		if st, ok := readProcStat(pid); ok {
			total += st.cpu
		}
	}
	return total
}
