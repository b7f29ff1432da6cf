package redistest

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

func TestSentinel(t *testing.T) {
	if testing.Short() {
		t.Skip("a Sentinel test: runs without -short")
	}
	t.Parallel()
	begin := time.Now()
	s := StartSentinel(t)
	t.Logf("StartSentinel took %v", time.Since(begin))

	first, second := s.nodes[0].Addr(), s.nodes[1].Addr()
	for _, a := range []string{first, second, s.sentinel.Addr()} {
		if !strings.HasPrefix(a, "127.0.0.1:") || strings.HasSuffix(a, ":6379") || strings.HasSuffix(a, ":26379") {
			t.Fatalf("address %q, want a private loopback port", a)
		}
	}
	if want := "redis://" + s.sentinel.Addr() + "?master_set=disker"; s.URL() != want {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	if addr, err := s.MasterAddr(); err != nil || addr != first {
		t.Fatalf("MasterAddr() = %q, %v; want %q", addr, err, first)
	}
	if got := do(t, second, "ROLE"); got != "*5" {
		t.Fatalf("ROLE of the replica answers %q, want a 5-element array", got)
	}

	opt, err := rueidis.ParseURL(s.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q): %v", s.URL(), err)
	}
	if opt.Sentinel.MasterSet != "disker" || !slices.Equal(opt.InitAddress, []string{s.sentinel.Addr()}) {
		t.Fatalf("ParseURL(%q): master set %q, addresses %q; want disker, [%s]", s.URL(), opt.Sentinel.MasterSet, opt.InitAddress, s.sentinel.Addr())
	}
	opt.DisableCache = true // as redisbroker does
	client, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("NewClient(%q): %v", s.URL(), err)
	}
	defer client.Close()
	if client.Mode() != rueidis.ClientModeSentinel {
		t.Fatalf("Mode() = %q, want %q", client.Mode(), rueidis.ClientModeSentinel)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	checkMaster(ctx, t, client, first)

	key := Prefix(t) + ":before"
	if err := client.Do(ctx, client.B().Set().Key(key).Value("v").Build()).Error(); err != nil {
		t.Fatalf("SET %s: %v", key, err)
	}
	// The key is on the replica before the failover starts.
	if n, err := client.Do(ctx, client.B().Wait().Numreplicas(1).Timeout(1000).Build()).AsInt64(); err != nil || n != 1 {
		t.Fatalf("WAIT 1 1000 = %d, %v; want 1", n, err)
	}

	begin = time.Now()
	s.Failover(t)
	t.Logf("Failover took %v", time.Since(begin))
	if addr, err := s.MasterAddr(); err != nil || addr != second {
		t.Fatalf("MasterAddr() after failover = %q, %v; want %q", addr, err, second)
	}
	if got := do(t, first, "ROLE"); got != "*5" {
		t.Fatalf("ROLE of the former master answers %q, want a 5-element array", got)
	}
	// The client heard +switch-master while Failover waited for the
	// former master to become a replica.
	followed(ctx, t, client, second, key)

	// A new client goes to the new master from the start.
	fresh, err := rueidis.NewClient(opt)
	if err != nil {
		t.Fatalf("NewClient(%q) after failover: %v", s.URL(), err)
	}
	defer fresh.Close()
	checkMaster(ctx, t, fresh, second)
	if got, err := fresh.Do(ctx, fresh.B().Get().Key(key).Build()).ToString(); err != nil || got != "v" {
		t.Fatalf("GET %s through a new client = %q, %v; want v", key, got, err)
	}

	// And back: the former master is a replica fit for promotion.
	begin = time.Now()
	s.Failover(t)
	t.Logf("second Failover took %v", time.Since(begin))
	if addr, err := s.MasterAddr(); err != nil || addr != first {
		t.Fatalf("MasterAddr() after the second failover = %q, %v; want %q", addr, err, first)
	}
	followed(ctx, t, client, first, key)
	followed(ctx, t, fresh, first, key)

	client.Close()
	fresh.Close()
	s.Stop()
	s.Stop() // twice is fine
	for _, a := range []string{first, second, s.sentinel.Addr()} {
		if err := ping(a, nil); err == nil {
			t.Fatalf("%s still answers after Stop", a)
		}
	}
}

// checkMaster fails t unless client talks to master, and master only, and
// master says it is a master.
func checkMaster(ctx context.Context, t *testing.T, client rueidis.Client, master string) {
	t.Helper()
	if nodes := slices.Collect(maps.Keys(client.Nodes())); !slices.Equal(nodes, []string{master}) {
		t.Fatalf("client nodes %q, want [%s]", nodes, master)
	}
	role, err := client.Do(ctx, client.B().Role().Build()).ToArray()
	if err != nil || len(role) == 0 {
		t.Fatalf("ROLE = %v, %v", role, err)
	}
	if r, err := role[0].ToString(); err != nil || r != "master" {
		t.Fatalf("ROLE through the client = %q, %v; want master", r, err)
	}
}

// followed fails t unless, within ten seconds, client writes to master and
// reads back from it, and reads there the key written before the
// failover.
func followed(ctx context.Context, t *testing.T, client rueidis.Client, master, before string) {
	t.Helper()
	after := Prefix(t) + ":after"
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := client.Do(ctx, client.B().Set().Key(after).Value(master).Build()).Error()
		if err == nil && do(t, master, "GET", after) == master {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client did not write to the new master %s within 10s: SET: %v; nodes %q",
				master, err, slices.Collect(maps.Keys(client.Nodes())))
		}
		<-tick.C
	}
	checkMaster(ctx, t, client, master)
	if got, err := client.Do(ctx, client.B().Get().Key(after).Build()).ToString(); err != nil || got != master {
		t.Fatalf("GET %s = %q, %v; want %q", after, got, err, master)
	}
	if got, err := client.Do(ctx, client.B().Get().Key(before).Build()).ToString(); err != nil || got != "v" {
		t.Fatalf("GET %s on the new master = %q, %v; want v", before, got, err)
	}
}

func TestSentinelMissingRedisServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := startSentinel(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "install") || !strings.Contains(err.Error(), "redis-server") {
		t.Fatalf("startSentinel without redis-server: %v; want an error saying to install redis-server", err)
	}
}
