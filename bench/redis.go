package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// redisServer is a private redis-server on a free loopback port in a
// temporary directory, with persistence off, started by internal/redistest.
type redisServer struct {
	srv  *redistest.Server
	stop func()
	addr string
	// pidText is redis-server's process id, once asked (ioCalls).
	pidText string
}

// startRedis starts a redis-server and waits until it answers PING.
// redistest.MustStart panics when it cannot; that becomes an error here.
func startRedis() (s *redisServer, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = nil, fmt.Errorf("bench: %v", v)
		}
	}()
	srv, stop := redistest.MustStart()
	return &redisServer{srv: srv, stop: stop, addr: srv.Addr()}, nil
}

// url returns the server's address as a redis:// URL.
func (s *redisServer) url() string { return s.srv.URL() }

// close stops the server and removes its directory.
func (s *redisServer) close() { s.stop() }

// flushAll empties the server between runs.
func (s *redisServer) flushAll() error {
	_, err := s.do("FLUSHALL", "+OK")
	return err
}

// cpu returns the CPU time (user and system) redis-server has used.
func (s *redisServer) cpu() (time.Duration, error) {
	info, err := s.do("INFO cpu", "$")
	if err != nil {
		return 0, err
	}
	var total float64
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("bench: INFO cpu: %s: %w", k, err)
			}
			total += f
		}
	}
	return time.Duration(total * 1e9), nil
}

// pid returns redis-server's process id, from INFO server.
func (s *redisServer) pid() (string, error) {
	info, err := s.do("INFO server", "$")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "process_id:"); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("bench: INFO server has no process_id")
}

// ioCalls returns redis-server's read and write system calls so far
// (/proc/PID/io); false where they cannot be read. The first call asks for
// the process id (INFO server).
func (s *redisServer) ioCalls() (ioCalls, bool) {
	if s.pidText == "" {
		pid, err := s.pid()
		if err != nil {
			return ioCalls{}, false
		}
		s.pidText = pid
	}
	return readIOCalls(s.pidText)
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	cmd   string  // the command, lower case
	calls int64   // its calls
	usec  float64 // the time Redis spent running them
}

// commandStatsSince returns INFO commandstats: each command's calls and
// time since the last CONFIG RESETSTAT (commands run by scripts included).
func (s *redisServer) commandStatsSince() ([]cmdStat, error) {
	info, err := s.do("INFO commandstats", "$")
	if err != nil {
		return nil, err
	}
	var stats []cmdStat
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		calls, rest, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		usec, _, _ := strings.Cut(strings.TrimPrefix(rest, "usec="), ",")
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bench: INFO commandstats: %q: %w", l, err)
		}
		u, err := strconv.ParseFloat(usec, 64)
		if err != nil {
			return nil, fmt.Errorf("bench: INFO commandstats: %q: %w", l, err)
		}
		stats = append(stats, cmdStat{strings.TrimPrefix(name, "cmdstat_"), n, u})
	}
	return stats, nil
}

// commandCount returns the commands run since the last CONFIG RESETSTAT,
// leaving out the harness's own INFO and CONFIG.
func (s *redisServer) commandCount() (int64, error) {
	stats, err := s.commandStatsSince()
	var total int64
	for _, st := range stats {
		if st.cmd != "info" && st.cmd != "config" {
			total += st.calls
		}
	}
	return total, err
}

// commandStats renders the calls of each command since the last CONFIG
// RESETSTAT per op, with the Redis CPU time they took per op in
// parentheses (INFO's usec), most frequent first, leaving out the rare ones.
func (s *redisServer) commandStats(ops int) (string, error) {
	stats, err := s.commandStatsSince()
	if err != nil {
		return "", err
	}
	sort.Slice(stats, func(i, j int) bool { return stats[i].calls > stats[j].calls })
	var b strings.Builder
	for _, st := range stats {
		if per := float64(st.calls) / float64(ops); per >= 0.005 {
			fmt.Fprintf(&b, "%s %.2f (%.1fµs)  ", st.cmd, per, st.usec/float64(ops))
		}
	}
	return strings.TrimSpace(b.String()), nil
}

// commandTime returns the time redis-server spent running commands since
// the last CONFIG RESETSTAT: the sum of INFO commandstats' usec, which
// leaves out reading, parsing and writing on the connections.
func (s *redisServer) commandTime() (time.Duration, error) {
	stats, err := s.commandStatsSince()
	var total float64
	for _, st := range stats {
		total += st.usec
	}
	return time.Duration(total * 1e3), err
}

// do sends an inline command on a fresh connection. The reply's first line
// must start with want; a bulk reply ("$n") is returned whole.
func (s *redisServer) do(cmd, want string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSpace(line)
	if !strings.HasPrefix(line, want) {
		return "", errors.New("bench: " + cmd + " answered " + line)
	}
	if !strings.HasPrefix(line, "$") {
		return line, nil
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 {
		return "", errors.New("bench: " + cmd + " answered " + line)
	}
	body := make([]byte, n+2)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body[:n]), nil
}
