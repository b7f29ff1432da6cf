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

// ioProbe takes the counts of this process and of redis-server around a
// run, for the -cmdstats progress lines.
type ioProbe struct {
	redisPID      string
	go0, redis0   ioCalls
	goOK, redisOK bool
}

// startIOProbe reads the counts before a run of s.
func startIOProbe(s *redisServer) *ioProbe {
	p := &ioProbe{}
	p.go0, p.goOK = readIOCalls("self")
	if pid, err := s.pid(); err == nil {
		p.redisPID = pid
		p.redis0, p.redisOK = readIOCalls(pid)
	}
	return p
}

// perOp renders the calls since startIOProbe per op, or "" when neither
// process's counts could be read.
func (p *ioProbe) perOp(ops int) string {
	var parts []string
	if g, ok := readIOCalls("self"); ok && p.goOK {
		parts = append(parts, fmt.Sprintf("go read %.2f write %.2f", perOpOf(g.reads-p.go0.reads, ops), perOpOf(g.writes-p.go0.writes, ops)))
	}
	if p.redisOK {
		if r, ok := readIOCalls(p.redisPID); ok {
			parts = append(parts, fmt.Sprintf("redis read %.2f write %.2f", perOpOf(r.reads-p.redis0.reads, ops), perOpOf(r.writes-p.redis0.writes, ops)))
		}
	}
	return strings.Join(parts, ", ")
}

func perOpOf(n int64, ops int) float64 { return float64(n) / float64(max(ops, 1)) }
