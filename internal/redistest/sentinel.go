package redistest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// SentinelTimeout bounds how long a Sentinel start waits for the replica to
// replicate and the sentinel to know both nodes, and how long
// [Sentinel.Failover] waits for a failover to complete.
const SentinelTimeout = 30 * time.Second

// SentinelMasterSet is the name under which the sentinel monitors the
// master: the master_set of [Sentinel.URL].
const SentinelMasterSet = "disker"

// Sentinel is a running (or stopped) private Redis Sentinel setup: a master
// and one replica, each a redis-server on its own free loopback port and in
// its own directory, without persistence, watched by one sentinel (a
// redis-server in sentinel mode) that monitors them as [SentinelMasterSet]
// with a quorum of 1.
//
// The sentinel polls the nodes faster than Redis's defaults (INFO, PING
// and hellos every 100 ms instead of every 10, 1 and 2 s), so that a
// failover, with the demoted master's turn to replica, takes about two
// seconds rather than more than ten.
type Sentinel struct {
	nodes    [2]*Server // the data nodes; either may be the master
	sentinel *Server

	stopOnce sync.Once
}

// StartSentinel starts a master, a replica and a sentinel for tb and stops
// them when tb ends. It fails tb if redis-server is missing, a process does
// not start, or within [SentinelTimeout] the replica has not caught up with
// the master or the sentinel does not know both.
//
// When it returns, the master streams its writes to the replica, so that
// WAIT 1 after a write answers at once. That takes a start about a
// second: after its full sync a replica acknowledges it, and is sent the
// writes that followed, only at its next replication cron.
func StartSentinel(tb testing.TB) *Sentinel {
	tb.Helper()
	s, err := startSentinel(tb.TempDir())
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

func startSentinel(dir string) (*Sentinel, error) {
	if err := needRedisServer(); err != nil {
		return nil, err
	}
	s := &Sentinel{}
	err := withFreshPorts(func() error { return s.launch(dir) }, s.kill)
	if err == nil {
		err = s.settle()
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// launch starts the two data nodes and the sentinel, all at once, and
// waits for each to answer PING. Both nodes start as masters: the second
// becomes a replica in settle.
func (s *Sentinel) launch(dir string) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	names := []string{"node0", "node1", "sentinel"}
	servers := make([]*Server, len(names))
	for i, name := range names {
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
		servers[i] = &Server{dir: d, port: ports[i]}
	}
	s.nodes = [2]*Server{servers[0], servers[1]}
	s.sentinel = servers[2]

	// Sentinel rewrites its configuration file as it learns: it must be
	// writable, and fresh on each attempt, since an earlier one names
	// other ports.
	conf := strings.Join([]string{
		"port " + strconv.Itoa(s.sentinel.port),
		"bind 127.0.0.1",
		"dir " + strconv.Quote(s.sentinel.dir),
		"daemonize no",
		`logfile "redis.log"`,
		// Everything is an IP address on loopback: no name lookups.
		"sentinel resolve-hostnames no",
		"sentinel announce-hostnames no",
		"sentinel monitor " + SentinelMasterSet + " 127.0.0.1 " + strconv.Itoa(s.nodes[0].port) + " 1",
		"sentinel down-after-milliseconds " + SentinelMasterSet + " 1000",
		"sentinel failover-timeout " + SentinelMasterSet + " 5000",
		"sentinel parallel-syncs " + SentinelMasterSet + " 1",
		"",
	}, "\n")
	confPath := filepath.Join(s.sentinel.dir, "sentinel.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}

	dataArgs := func(n *Server) []string {
		return append(n.baseArgs(),
			"--appendonly", "no",
			// Full syncs go straight from memory to memory, at once:
			// nothing on disk, and no five-second wait for more replicas.
			"--repl-diskless-sync", "yes",
			"--repl-diskless-sync-delay", "0",
			"--repl-diskless-load", "swapdb",
		)
	}
	errs := make([]error, len(servers))
	var wg sync.WaitGroup
	for i, n := range s.nodes {
		wg.Go(func() { errs[i] = n.run(dataArgs(n)) })
	}
	wg.Go(func() { errs[2] = s.sentinel.run([]string{confPath, "--sentinel"}) })
	wg.Wait()
	return errors.Join(errs...)
}

// settle makes node1 a replica of node0 and waits until it has caught up
// and the sentinel knows both nodes in their roles.
func (s *Sentinel) settle() error {
	deadline := time.Now().Add(SentinelTimeout)
	q := newQuerier()
	defer q.close()
	master, replica := s.nodes[0], s.nodes[1]

	// With Redis's defaults the sentinel asks each node for INFO every
	// 10 s and waits 8 s (four hello periods) before making a demoted
	// master a replica: too slow for tests. And it pings each node once a
	// second, so that a node whose link the sentinel drops, as it does on
	// promoting or demoting one, seems down for a moment when the last
	// answer to PING is older than down-after-milliseconds (1 s). Redis's
	// own Sentinel tests shorten the periods the same way; there is no
	// configuration directive for them, only this command.
	if _, err := q.do(s.sentinel.Addr(), "SENTINEL", "DEBUG",
		"info-period", "100", "publish-period", "100", "ping-period", "100"); err != nil {
		return fmt.Errorf("redistest: sentinel %s: SENTINEL DEBUG: %w", s.sentinel.Addr(), err)
	}
	// REPLICAOF connects at once, where --replicaof at start would wait
	// for the replication cron, up to a second.
	if _, err := q.do(replica.Addr(), "REPLICAOF", "127.0.0.1", strconv.Itoa(master.port)); err != nil {
		return fmt.Errorf("redistest: replica %s: REPLICAOF: %w", replica.Addr(), err)
	}

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for time.Now().Before(deadline) {
		if last = s.settled(q, master, replica); last == nil {
			return nil
		}
		<-tick.C
	}
	return fmt.Errorf("redistest: the sentinel setup did not settle within %v: %v%s", SentinelTimeout, last, s.logs())
}

// settled reports whether replica has its link to master up and the
// sentinel names master as master and knows replica as a healthy replica.
func (s *Sentinel) settled(q *querier, master, replica *Server) error {
	info, err := q.do(replica.Addr(), "INFO", "replication")
	if err != nil {
		return fmt.Errorf("replica %s: INFO replication: %w", replica.Addr(), err)
	}
	text, _ := info.(string)
	if !slices.Contains(strings.Split(strings.ReplaceAll(text, "\r", ""), "\n"), "master_link_status:up") {
		return fmt.Errorf("replica %s: INFO replication lacks master_link_status:up: %q", replica.Addr(), text)
	}
	addr, err := s.masterAddr(q)
	if err != nil {
		return err
	}
	if addr != master.Addr() {
		return fmt.Errorf("sentinel names %s as master, not %s", addr, master.Addr())
	}
	if err := s.knowsReplica(q, replica, master); err != nil {
		return err
	}
	return streams(q, master)
}

// streams reports whether master streams its writes to its replica, which
// acknowledges them: a PUBLISH, replicated but leaving nothing behind, is
// acknowledged within 100 ms. After a diskless full sync the master holds
// back the stream until the replica acknowledges the sync, which it may
// do only at its next replication cron, up to a second after it reports
// its link up; a WAIT in that second would wait for it.
func streams(q *querier, master *Server) error {
	if _, err := q.do(master.Addr(), "PUBLISH", "redistest:settle", "1"); err != nil {
		return fmt.Errorf("master %s: PUBLISH: %w", master.Addr(), err)
	}
	n, err := q.do(master.Addr(), "WAIT", "1", "100")
	if err != nil {
		return fmt.Errorf("master %s: WAIT: %w", master.Addr(), err)
	}
	if n != "1" {
		return fmt.Errorf("master %s: WAIT 1 100 = %v: the replica has not acknowledged a write yet", master.Addr(), n)
	}
	return nil
}

// knowsReplica reports whether the sentinel lists replica as a replica of
// master that it can reach and that reaches master.
func (s *Sentinel) knowsReplica(q *querier, replica, master *Server) error {
	v, err := q.do(s.sentinel.Addr(), "SENTINEL", "REPLICAS", SentinelMasterSet)
	if err != nil {
		return fmt.Errorf("sentinel: SENTINEL REPLICAS: %w", err)
	}
	list, _ := v.([]any)
	var seen []string
	for _, r := range list {
		m := strMap(r)
		seen = append(seen, fmt.Sprintf("%s:%s %s %s", m["ip"], m["port"], m["flags"], m["master-link-status"]))
		if net.JoinHostPort(m["ip"], m["port"]) != replica.Addr() {
			continue
		}
		flags := strings.Split(m["flags"], ",")
		switch {
		case !slices.Contains(flags, "slave"),
			slices.Contains(flags, "s_down"),
			slices.Contains(flags, "o_down"),
			slices.Contains(flags, "disconnected"):
			return fmt.Errorf("sentinel lists replica %s with flags %q", replica.Addr(), m["flags"])
		case m["master-link-status"] != "ok":
			return fmt.Errorf("sentinel lists replica %s with master-link-status %q", replica.Addr(), m["master-link-status"])
		case net.JoinHostPort(m["master-host"], m["master-port"]) != master.Addr():
			return fmt.Errorf("sentinel lists replica %s as replicating %s:%s, not %s", replica.Addr(), m["master-host"], m["master-port"], master.Addr())
		}
		return nil
	}
	return fmt.Errorf("sentinel does not list replica %s; it lists %q", replica.Addr(), seen)
}

// masterAddr asks the sentinel for the master's host:port.
func (s *Sentinel) masterAddr(q *querier) (string, error) {
	v, err := q.do(s.sentinel.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMasterSet)
	if err != nil {
		return "", fmt.Errorf("sentinel %s: SENTINEL GET-MASTER-ADDR-BY-NAME: %w", s.sentinel.Addr(), err)
	}
	hp, ok := v.([]any)
	if !ok || len(hp) != 2 {
		return "", fmt.Errorf("sentinel %s: SENTINEL GET-MASTER-ADDR-BY-NAME answered %v", s.sentinel.Addr(), v)
	}
	host, _ := hp[0].(string)
	port, _ := hp[1].(string)
	return net.JoinHostPort(host, port), nil
}

// URL returns the sentinel's address with the master set, as
// rueidis.ParseURL reads it:
// redis://127.0.0.1:PORT?master_set=disker. A client made from it asks the
// sentinel for the master and follows the sentinel's failovers.
func (s *Sentinel) URL() string {
	return "redis://" + s.sentinel.Addr() + "?master_set=" + SentinelMasterSet
}

// MasterAddr asks the sentinel for the host:port of the current master.
func (s *Sentinel) MasterAddr() (string, error) {
	q := newQuerier()
	defer q.close()
	addr, err := s.masterAddr(q)
	if err != nil {
		return "", fmt.Errorf("redistest: %w", err)
	}
	return addr, nil
}

// Failover has the sentinel promote the replica (SENTINEL FAILOVER) and
// waits until the sentinel names it as master, it answers ROLE as master,
// and the former master, which the sentinel turns into a replica of it,
// answers ROLE as a connected replica and is known to the sentinel as such,
// and the new master streams its writes to it: the setup is back to a
// master and a replica, the other way round, and can fail over again. It
// fails tb, with the last state seen, if that takes longer than
// [SentinelTimeout].
//
// SENTINEL FAILOVER does not pause the master: writes to the former master
// are lost if its replica had not received them when promoted, or if they
// come after, until the former master becomes a replica (a client made
// from [Sentinel.URL] has normally left it by then). Use WAIT before
// Failover to keep a write.
//
// A client made from [Sentinel.URL] moves to the new master when the
// sentinel announces it (+switch-master), which happens before Failover
// returns.
func (s *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(SentinelTimeout)
	q := newQuerier()
	defer q.close()
	oldAddr, err := s.masterAddr(q)
	if err != nil {
		tb.Fatalf("redistest: failover: %v", err)
	}
	var oldMaster, newMaster *Server
	for i, n := range s.nodes {
		if n.Addr() == oldAddr {
			oldMaster, newMaster = n, s.nodes[1-i]
		}
	}
	if oldMaster == nil {
		tb.Fatalf("redistest: failover: the sentinel names %s as master, which is neither %s nor %s", oldAddr, s.nodes[0].Addr(), s.nodes[1].Addr())
	}

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var (
		started time.Time // when the sentinel last accepted SENTINEL FAILOVER
		last    error
	)
	for time.Now().Before(deadline) {
		// The sentinel refuses while it thinks no replica fit to promote
		// (NOGOODSLAVE), and a failover it accepted can still abort for
		// that reason (-failover-abort-no-good-slave) when its view of the
		// replica is stale: ask until it agrees, and again when a failover
		// it accepted has not moved the master within a second (while one
		// is under way it answers INPROG, which changes nothing).
		if started.IsZero() || time.Since(started) > time.Second {
			if addr, err := s.masterAddr(q); err == nil && addr == oldAddr {
				_, err := q.do(s.sentinel.Addr(), "SENTINEL", "FAILOVER", SentinelMasterSet)
				switch {
				case err == nil, strings.Contains(err.Error(), "INPROG"):
					started = time.Now()
				case started.IsZero():
					last = fmt.Errorf("SENTINEL FAILOVER: %w", err)
				}
			}
		}
		if !started.IsZero() {
			if last = s.failedOver(q, oldMaster, newMaster); last == nil {
				return
			}
		}
		<-tick.C
	}
	tb.Fatalf("redistest: failover from %s to %s did not complete within %v: %v%s", oldMaster.Addr(), newMaster.Addr(), SentinelTimeout, last, s.logs())
}

// failedOver reports whether the failover from oldMaster to newMaster is
// complete.
func (s *Sentinel) failedOver(q *querier, oldMaster, newMaster *Server) error {
	addr, err := s.masterAddr(q)
	if err != nil {
		return err
	}
	if addr != newMaster.Addr() {
		return fmt.Errorf("sentinel still names %s as master", addr)
	}
	role, err := q.do(newMaster.Addr(), "ROLE")
	if err != nil {
		return fmt.Errorf("new master %s: ROLE: %w", newMaster.Addr(), err)
	}
	if r, _ := role.([]any); len(r) == 0 || r[0] != "master" {
		return fmt.Errorf("new master %s: ROLE answered %v", newMaster.Addr(), role)
	}
	role, err = q.do(oldMaster.Addr(), "ROLE")
	if err != nil {
		return fmt.Errorf("former master %s: ROLE: %w", oldMaster.Addr(), err)
	}
	// A replica answers [slave host port state offset].
	r, _ := role.([]any)
	if len(r) != 5 || r[0] != "slave" || r[3] != "connected" {
		return fmt.Errorf("former master %s: ROLE answered %v", oldMaster.Addr(), role)
	}
	if host, _ := r[1].(string); host != "127.0.0.1" || r[2] != strconv.Itoa(newMaster.port) {
		return fmt.Errorf("former master %s: ROLE answered %v, a replica of another master", oldMaster.Addr(), role)
	}
	if err := s.knowsReplica(q, oldMaster, newMaster); err != nil {
		return err
	}
	return streams(q, newMaster)
}

// logs returns the last lines of every process's log, for an error.
func (s *Sentinel) logs() string {
	var b strings.Builder
	for _, n := range []*Server{s.nodes[0], s.nodes[1], s.sentinel} {
		if n != nil {
			fmt.Fprintf(&b, "; log of %s: %s", n.Addr(), n.logTail())
		}
	}
	return b.String()
}

// Stop kills the master, the replica and the sentinel (SIGKILL: there is
// nothing on disk to keep) and waits for each to exit. It is safe to call
// more than once.
func (s *Sentinel) Stop() {
	s.stopOnce.Do(s.kill)
}

// kill kills and reaps the running processes.
func (s *Sentinel) kill() {
	for _, n := range []*Server{s.nodes[0], s.nodes[1], s.sentinel} {
		if n != nil {
			n.Kill()
		}
	}
}

// querier sends admin commands to several servers, over one connection
// to each, dialled when first needed and again after an error: Sentinel
// kills the normal clients of a node it promotes or demotes.
type querier struct {
	conns map[string]*respConn
}

func newQuerier() *querier {
	return &querier{conns: make(map[string]*respConn)}
}

// queryTimeout bounds each command of a querier, dial included.
const queryTimeout = 2 * time.Second

// do sends one command to addr and returns its answer, as
// [respConn.value] reads it, within [queryTimeout].
func (q *querier) do(addr string, args ...string) (any, error) {
	deadline := time.Now().Add(queryTimeout)
	rc := q.conns[addr]
	if rc == nil {
		var err error
		if rc, err = dialRESP(addr, deadline); err != nil {
			return nil, err
		}
		q.conns[addr] = rc
	}
	rc.deadline = deadline
	v, err := rc.doValue(args...)
	var re redisError
	if err != nil && !errors.As(err, &re) {
		// The connection may be out of step or dead: start afresh.
		rc.Close()
		delete(q.conns, addr)
	}
	return v, err
}

func (q *querier) close() {
	for _, rc := range q.conns {
		rc.Close()
	}
}

// redisError is an error reply.
type redisError string

func (e redisError) Error() string { return string(e) }

// doValue sends one command and returns its whole answer: a string for a
// simple string, bulk string or integer, nil for a null, and []any for an
// array. An error reply is a redisError, at the top or inside an array.
func (rc *respConn) doValue(args ...string) (any, error) {
	_ = rc.SetDeadline(rc.deadline)
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := rc.Write([]byte(b.String())); err != nil {
		return nil, err
	}
	v, err := rc.value()
	if err != nil {
		return nil, err
	}
	if e, ok := v.(redisError); ok {
		return nil, e
	}
	return v, nil
}

// value reads one RESP2 value.
func (rc *respConn) value() (any, error) {
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return nil, errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return redisError(line[1:]), nil
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad bulk reply %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < -1 {
			return nil, fmt.Errorf("bad array reply %q", line)
		}
		if n == -1 {
			return nil, nil
		}
		vs := make([]any, n)
		for i := range vs {
			if vs[i], err = rc.value(); err != nil {
				return nil, err
			}
		}
		return vs, nil
	}
	return nil, fmt.Errorf("unexpected reply %q", line)
}

// strMap reads a flat array of field names and values, as SENTINEL
// REPLICAS gives each replica, into a map.
func strMap(v any) map[string]string {
	m := make(map[string]string)
	kv, _ := v.([]any)
	for i := 0; i+1 < len(kv); i += 2 {
		k, _ := kv[i].(string)
		val, _ := kv[i+1].(string)
		m[k] = val
	}
	return m
}
