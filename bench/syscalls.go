package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// ioCalls counts a process's read and write system calls (syscr and syscw of
// /proc/PID/io: read, write and their vector and socket forms).
type ioCalls struct{ reads, writes int64 }

// readIOCalls returns the counts of process pid ("self" for this one), and
// false where /proc/PID/io cannot be read (not Linux, or not permitted).
func readIOCalls(pid string) (ioCalls, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/io")
	if err != nil {
		return ioCalls{}, false
	}
	var c ioCalls
	found := 0
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "syscr":
			c.reads, found = n, found+1
		case "syscw":
			c.writes, found = n, found+1
		}
	}
	return c, found == 2
}

// sub returns the calls from b to c.
func (c ioCalls) sub(b ioCalls) ioCalls {
	return ioCalls{reads: c.reads - b.reads, writes: c.writes - b.writes}
}

// callsPerOp renders the clients' and the server's read and write system
// calls per op, for the -cmdstats progress lines, or "" when neither was
// read.
func (w work) callsPerOp(ops int) string {
	var parts []string
	client, server := "go", "redis"
	if w.clientExternal {
		client = "node"
	}
	if w.commands < 0 {
		server = "server"
	}
	if w.clientIOOK {
		parts = append(parts, fmt.Sprintf("%s read %.2f write %.2f", client, perOpOf(w.clientIO.reads, ops), perOpOf(w.clientIO.writes, ops)))
	}
	if w.serverIOOK {
		parts = append(parts, fmt.Sprintf("%s read %.2f write %.2f", server, perOpOf(w.serverIO.reads, ops), perOpOf(w.serverIO.writes, ops)))
	}
	return strings.Join(parts, ", ")
}

func perOpOf(n int64, ops int) float64 { return float64(n) / float64(max(ops, 1)) }
