package redistest

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/keyslot"
)

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	begin := time.Now()
	c := StartCluster(t, 3)
	t.Logf("StartCluster(3) took %v", time.Since(begin))

	addrs := c.Addrs()
	if len(addrs) != 3 {
		t.Fatalf("Addrs() = %q, want 3", addrs)
	}
	for _, a := range addrs {
		if !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":6379") {
			t.Fatalf("Addrs() = %q, want private loopback ports", addrs)
		}
	}
	if want := "redis://" + addrs[0] + "?addr=" + addrs[1] + "&addr=" + addrs[2]; c.URL() != want {
		t.Fatalf("URL() = %q, want %q", c.URL(), want)
	}
	opt, err := rueidis.ParseURL(c.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", c.URL(), err)
	}
	if !slices.Equal(opt.InitAddress, addrs) {
		t.Fatalf("ParseURL(%q).InitAddress = %q, want %q", c.URL(), opt.InitAddress, addrs)
	}
	client := clusterClient(t, opt)
	defer client.Close()
	if client.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("Mode() = %q, want %q", client.Mode(), rueidis.ClientModeCluster)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// A key per hash tag {a} to {z}; the slot of each, as the server
	// computes it, must be ours too.
	var keys []string
	for r := 'a'; r <= 'z'; r++ {
		k := "{" + string(r) + "}:x"
		keys = append(keys, k)
		if got := do(t, addrs[0], "CLUSTER", "KEYSLOT", k); got != ":"+strconv.Itoa(int(keyslot.Of(k))) {
			t.Fatalf("CLUSTER KEYSLOT %s = %s, keySlot = %d", k, got, keyslot.Of(k))
		}
	}
	for _, k := range keys {
		if err := client.Do(ctx, client.B().Set().Key(k).Value("v"+k).Build()).Error(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	for _, k := range keys {
		if got, err := client.Do(ctx, client.B().Get().Key(k).Build()).ToString(); err != nil || got != "v"+k {
			t.Fatalf("GET %s = %q, %v; want %q", k, got, err, "v"+k)
		}
	}
	// Each node holds the keys of its slots, the first the lowest: ask
	// each one directly.
	want := make([]int, len(addrs))
	for _, k := range keys {
		want[nodeOfSlot(int(keyslot.Of(k)), len(addrs))]++
	}
	var sizes []string
	holding := 0
	for i, a := range addrs {
		got := do(t, a, "DBSIZE")
		n, err := strconv.Atoi(strings.TrimPrefix(got, ":"))
		if err != nil {
			t.Fatalf("DBSIZE on %s = %q", a, got)
		}
		sizes = append(sizes, fmt.Sprintf("%s:%d/%d", a, n, want[i]))
		if n != want[i] {
			t.Errorf("node %d (%s) holds %d keys, want %d", i, a, n, want[i])
		}
		if n > 0 {
			holding++
		}
	}
	t.Logf("keys per node (held/expected): %s", strings.Join(sizes, " "))
	if holding < 2 {
		t.Fatalf("keys per node: %s; want keys on at least two nodes", strings.Join(sizes, " "))
	}

	// A script on two keys of one hash tag runs on the node of that tag.
	const script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[2])"
	got, err := client.Do(ctx, client.B().Eval().Script(script).Numkeys(2).Key("{a}:y", "{a}:x").Arg("w").Build()).ToString()
	if err != nil || got != "v{a}:x" {
		t.Fatalf("EVAL on {a}:y {a}:x = %q, %v; want %q", got, err, "v{a}:x")
	}
	if got, err := client.Do(ctx, client.B().Get().Key("{a}:y").Build()).ToString(); err != nil || got != "w" {
		t.Fatalf("GET {a}:y after EVAL = %q, %v; want w", got, err)
	}
	// Two slots in one script: the cluster refuses it. (rueidis refuses to
	// build such a command with keys, so the keys go as plain arguments.)
	if keyslot.Of("{a}:x") == keyslot.Of("{b}:x") {
		t.Fatal("{a} and {b} share a slot")
	}
	err = client.Do(ctx, client.B().Arbitrary("EVAL").Args(script, "2", "{a}:x", "{b}:x", "w").Build()).Error()
	if err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
		t.Fatalf("EVAL on {a}:x {b}:x: %v; want a CROSSSLOT error", err)
	}
	for _, a := range addrs {
		if got := do(t, a, "EVAL", script, "2", "{a}:x", "{b}:x", "w"); !strings.HasPrefix(got, "-CROSSSLOT") {
			t.Fatalf("EVAL on {a}:x {b}:x sent to %s = %q; want a CROSSSLOT error", a, got)
		}
	}
	client.Close()

	ports := clusterPorts(c)
	c.Stop()
	c.Stop() // twice is fine
	for _, a := range ports {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			conn.Close()
			t.Fatalf("%s still accepts connections after Stop", a)
		}
	}
}

// clusterClient returns a rueidis client made with opt.
//
// rueidis dials every InitAddress at once and goes on with the first to
// answer; when a later dial lands during the client's first topology
// refresh, it leaves a goroutine sleeping for five seconds, which goleak
// reports. So dials to the other addresses wait until the client is made.
func clusterClient(t *testing.T, opt rueidis.ClientOption) rueidis.Client {
	t.Helper()
	opt.DisableCache = true
	first := opt.InitAddress[0]
	made := make(chan struct{})
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		if addr != first {
			select {
			case <-made:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return d.DialContext(ctx, "tcp", addr)
	}
	client, err := rueidis.NewClient(opt)
	close(made)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	return client
}

// clusterPorts returns the client and bus addresses of c's nodes.
func clusterPorts(c *Cluster) []string {
	var out []string
	for i, a := range c.Addrs() {
		out = append(out, a, net.JoinHostPort("127.0.0.1", strconv.Itoa(c.busPorts[i])))
	}
	return out
}

func TestNodeOfSlot(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 3, 5, 7, 1000, clusterSlots} {
		for i := range n {
			lo, hi := slotRange(i, n)
			if lo > hi {
				t.Fatalf("slotRange(%d, %d) = %d, %d", i, n, lo, hi)
			}
			for _, s := range []int{lo, hi} {
				if got := nodeOfSlot(s, n); got != i {
					t.Fatalf("nodeOfSlot(%d, %d) = %d, want %d", s, n, got, i)
				}
			}
		}
		if _, hi := slotRange(n-1, n); hi != clusterSlots-1 {
			t.Fatalf("slotRange(%d, %d) ends at %d", n-1, n, hi)
		}
	}
}

// TestMustStartCluster also covers a cluster of one master, whose URL
// names a single address and still makes a cluster client.
func TestMustStartCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c, stop := MustStartCluster(1)
	dir := c.dir
	if got := do(t, c.Addrs()[0], "CLUSTER", "INFO"); got != "cluster_state:ok" {
		t.Fatalf("CLUSTER INFO starts %q, want cluster_state:ok", got)
	}
	if want := "redis://" + c.Addrs()[0]; c.URL() != want {
		t.Fatalf("URL() = %q, want %q", c.URL(), want)
	}
	opt, err := rueidis.ParseURL(c.URL())
	if err != nil {
		t.Fatalf("ParseURL: %v", err)
	}
	client := clusterClient(t, opt)
	if client.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("Mode() = %q, want %q", client.Mode(), rueidis.ClientModeCluster)
	}
	client.Close()
	ports := clusterPorts(c)
	stop()
	stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s left after stop: %v", dir, err)
	}
	for _, a := range ports {
		if conn, err := net.DialTimeout("tcp", a, time.Second); err == nil {
			conn.Close()
			t.Fatalf("%s still accepts connections after stop", a)
		}
	}
}

func TestClusterErrors(t *testing.T) {
	for _, n := range []int{0, -1, clusterSlots + 1} {
		if _, err := startCluster(t.TempDir(), false, n); err == nil || !strings.Contains(err.Error(), "masters") {
			t.Fatalf("startCluster with %d masters: %v; want an error about the number of masters", n, err)
		}
	}
	t.Setenv("PATH", t.TempDir())
	_, err := startCluster(t.TempDir(), false, 3)
	if err == nil || !strings.Contains(err.Error(), "install") || !strings.Contains(err.Error(), "redis-server") {
		t.Fatalf("startCluster without redis-server: %v; want an error saying to install redis-server", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "install") {
			t.Fatalf("MustStartCluster without redis-server: recovered %v; want a panic saying to install redis-server", r)
		}
	}()
	MustStartCluster(3)
}
