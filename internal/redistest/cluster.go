package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/keyslot"
)

// ClusterTimeout bounds how long a cluster start waits for the cluster to
// form: every node answering, agreeing that all slots are served, and a
// cluster client reaching every node.
const ClusterTimeout = 30 * time.Second

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// Cluster is a running (or stopped) private Redis Cluster of masters
// without replicas, each a redis-server on its own free loopback port.
// The 16384 slots are split evenly between the masters, in order: the
// first master serves the lowest slots.
type Cluster struct {
	dir      string
	ownsDir  bool
	nodes    []*Server
	busPorts []int // cluster bus port of each node

	stopOnce sync.Once
}

// StartCluster starts a cluster of masters nodes for tb and stops it when
// tb ends. It fails tb if redis-server is missing, a node does not start or
// the cluster does not form within [ClusterTimeout].
//
// A start takes about two seconds whatever the number of masters: a new
// cluster master refuses writes for its first two seconds (Redis's
// CLUSTER_WRITABLE_DELAY). Tests that can share a cluster should do so, with
// [MustStartCluster] in TestMain.
func StartCluster(tb testing.TB, masters int) *Cluster {
	tb.Helper()
	c, err := startCluster(tb.TempDir(), false, masters)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// MustStartCluster starts a cluster of masters nodes in a new temporary
// directory, for TestMain. It returns the cluster and a function that stops
// it and removes the directory. It panics if redis-server is missing, a
// node does not start or the cluster does not form within
// [ClusterTimeout].
func MustStartCluster(masters int) (*Cluster, func()) {
	dir, err := os.MkdirTemp("", "redistest-cluster-")
	if err != nil {
		panic(fmt.Sprintf("redistest: %v", err))
	}
	c, err := startCluster(dir, true, masters)
	if err != nil {
		_ = os.RemoveAll(dir)
		panic(err.Error())
	}
	return c, c.Stop
}

func startCluster(dir string, ownsDir bool, masters int) (*Cluster, error) {
	if masters < 1 || masters > clusterSlots {
		return nil, fmt.Errorf("redistest: a cluster needs 1 to %d masters, not %d", clusterSlots, masters)
	}
	if err := needRedisServer(); err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir, ownsDir: ownsDir}
	err := withFreshPorts(func() error { return c.launch(masters) }, c.kill)
	if err == nil {
		err = c.form()
	}
	if err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// launch starts the nodes, all at once, each in its own directory with a
// client port and a cluster bus port that differ from every other node's.
func (c *Cluster) launch(masters int) error {
	ports, err := freePorts(2 * masters)
	if err != nil {
		return err
	}
	c.nodes = make([]*Server, masters)
	c.busPorts = make([]int, masters)
	for i := range c.nodes {
		dir := filepath.Join(c.dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("redistest: %w", err)
		}
		// nodes.conf of an earlier attempt names other ports.
		if err := os.Remove(filepath.Join(dir, "nodes.conf")); err != nil && !os.IsNotExist(err) {
			return fmt.Errorf("redistest: %w", err)
		}
		c.nodes[i] = &Server{dir: dir, port: ports[2*i]}
		c.busPorts[i] = ports[2*i+1]
	}
	errs := make([]error, masters)
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Go(func() { errs[i] = launchNode(n, c.busPorts[i]) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// freePorts returns n distinct free loopback ports, holding each open
// until all are found so that none comes twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("redistest: find a free port: %w", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}

// launchNode starts s as a cluster node with its bus on busPort and waits
// for it to answer PING.
func launchNode(s *Server, busPort int) error {
	return s.run(append(s.baseArgs(),
		"--appendonly", "no",
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-port", strconv.Itoa(busPort),
	))
}

// form joins the running nodes into one cluster and waits until it serves
// every slot.
func (c *Cluster) form() error {
	deadline := time.Now().Add(ClusterTimeout)
	conns := make([]*respConn, len(c.nodes))
	defer func() {
		for _, rc := range conns {
			if rc != nil {
				rc.Close()
			}
		}
	}()
	for i, n := range c.nodes {
		rc, err := dialRESP(n.Addr(), deadline)
		if err != nil {
			return fmt.Errorf("redistest: cluster node %s: %w", n.Addr(), err)
		}
		conns[i] = rc
	}
	for i, rc := range conns {
		lo, hi := slotRange(i, len(c.nodes))
		// Distinct config epochs spare the nodes resolving a collision
		// before they agree on who serves which slots.
		for _, args := range [][]string{
			{"CLUSTER", "SET-CONFIG-EPOCH", strconv.Itoa(i + 1)},
			{"CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(lo), strconv.Itoa(hi)},
		} {
			if _, err := rc.do(args...); err != nil {
				return fmt.Errorf("redistest: cluster node %s: %s: %w", c.nodes[i].Addr(), strings.Join(args, " "), err)
			}
		}
	}
	// Node 0 meeting the others would do, but then the others learn of
	// each other by gossip, which comes about once a second: every pair
	// meets instead, which forms the cluster as soon as Redis allows.
	for i := range c.nodes {
		for j := i + 1; j < len(c.nodes); j++ {
			args := []string{"CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.nodes[j].port), strconv.Itoa(c.busPorts[j])}
			if _, err := conns[i].do(args...); err != nil {
				return fmt.Errorf("redistest: cluster node %s: %s: %w", c.nodes[i].Addr(), strings.Join(args, " "), err)
			}
		}
	}

	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	wantKnown := "cluster_known_nodes:" + strconv.Itoa(len(c.nodes))
	var last error
	for {
		if last = c.agreed(conns, wantKnown); last == nil {
			if last = c.probe(deadline); last == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	var logs strings.Builder
	for _, n := range c.nodes {
		fmt.Fprintf(&logs, "; log of %s: %s", n.Addr(), n.logTail())
	}
	return fmt.Errorf("redistest: the cluster of %d nodes did not form within %v: %v%s", len(c.nodes), ClusterTimeout, last, logs.String())
}

// slotRange returns the first and last slot of node i of n.
func slotRange(i, n int) (lo, hi int) {
	return i * clusterSlots / n, (i+1)*clusterSlots/n - 1
}

// nodeOfSlot returns the node of n that serves slot: the last i with
// i*16384/n <= slot, that is with i < (slot+1)*n/16384.
func nodeOfSlot(slot, n int) int {
	return ((slot+1)*n+clusterSlots-1)/clusterSlots - 1
}

// agreed reports whether every node says the cluster is ok and knows all
// the nodes.
func (c *Cluster) agreed(conns []*respConn, wantKnown string) error {
	for i, rc := range conns {
		info, err := rc.do("CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER INFO: %w", c.nodes[i].Addr(), err)
		}
		lines := strings.Split(strings.ReplaceAll(info, "\r", ""), "\n")
		for _, want := range []string{"cluster_state:ok", wantKnown} {
			ok := false
			for _, l := range lines {
				ok = ok || l == want
			}
			if !ok {
				return fmt.Errorf("node %s: CLUSTER INFO lacks %s: %q", c.nodes[i].Addr(), want, info)
			}
		}
	}
	return nil
}

// probe writes, reads and deletes one key per node through a cluster
// client, with hash tags chosen so that each key lands on a different
// node.
func (c *Cluster) probe(deadline time.Time) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	// One seed only: with several, rueidis dials them all at once and,
	// when a late dial lands during its first topology refresh, leaves a
	// goroutine behind for five seconds.
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: c.Addrs()[:1], DisableCache: true})
	if err != nil {
		return fmt.Errorf("cluster client: %w", err)
	}
	defer client.Close()
	if client.Mode() != rueidis.ClientModeCluster {
		return fmt.Errorf("cluster client in mode %q", client.Mode())
	}
	keys := make([]string, len(c.nodes))
	for n, left := 0, len(keys); left > 0; n++ {
		k := "redistest:probe:{" + strconv.Itoa(n) + "}"
		if i := nodeOfSlot(int(keyslot.Of(k)), len(keys)); keys[i] == "" {
			keys[i] = k
			left--
		}
	}
	for _, key := range keys {
		if err := client.Do(ctx, client.B().Set().Key(key).Value("ok").Build()).Error(); err != nil {
			return fmt.Errorf("SET %s: %w", key, err)
		}
		got, err := client.Do(ctx, client.B().Get().Key(key).Build()).ToString()
		if err != nil || got != "ok" {
			return fmt.Errorf("GET %s = %q, %v; want ok", key, got, err)
		}
		if err := client.Do(ctx, client.B().Del().Key(key).Build()).Error(); err != nil {
			return fmt.Errorf("DEL %s: %w", key, err)
		}
	}
	return nil
}

// Addrs returns the host:port of each master, in slot order: the first
// serves the lowest slots.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// URL returns a redis:// URL naming every master, the first as host and
// the others as addr parameters, as rueidis.ParseURL reads it:
// redis://127.0.0.1:P1?addr=127.0.0.1:P2&addr=127.0.0.1:P3.
func (c *Cluster) URL() string {
	addrs := c.Addrs()
	var b strings.Builder
	b.WriteString("redis://" + addrs[0])
	for i, a := range addrs[1:] {
		if i == 0 {
			b.WriteString("?addr=")
		} else {
			b.WriteString("&addr=")
		}
		b.WriteString(a)
	}
	return b.String()
}

// Stop kills every node (SIGKILL: there is nothing on disk to keep) and
// waits for each to exit, and for a cluster made by [MustStartCluster]
// removes its directory. It is safe to call more than once.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.kill()
		if c.ownsDir {
			_ = os.RemoveAll(c.dir)
		}
	})
}

// kill kills and reaps the running nodes.
func (c *Cluster) kill() {
	for _, n := range c.nodes {
		if n != nil {
			n.Kill()
		}
	}
}

// respConn is a plain RESP connection for the admin commands that form a
// cluster.
type respConn struct {
	net.Conn
	r        *bufio.Reader
	deadline time.Time
}

func dialRESP(addr string, deadline time.Time) (*respConn, error) {
	d := &net.Dialer{Deadline: deadline}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &respConn{Conn: conn, r: bufio.NewReader(conn), deadline: deadline}, nil
}

// do sends one command and returns its answer: the text of a simple or
// bulk string, or the number of an integer. An error reply is an error.
func (rc *respConn) do(args ...string) (string, error) {
	_ = rc.SetDeadline(rc.deadline)
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := rc.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := rc.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", fmt.Errorf("bad bulk reply %q", line)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(rc.r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", line)
}

// NodeOf returns the index in [Cluster.Addrs] of the master that serves
// slot.
func (c *Cluster) NodeOf(slot uint16) int { return nodeOfSlot(int(slot), len(c.nodes)) }

// StopNode kills master i with SIGKILL, as a crash would: commands for its
// slots fail from then on. The other masters keep serving theirs until
// their node timeout (Redis's default, 15 s) declares the cluster down.
func (c *Cluster) StopNode(i int) { c.nodes[i].Kill() }
