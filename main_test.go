package disker_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// sharedRedis is the private redis-server shared by the package's tests,
// and sharedCluster the private Redis Cluster (three masters); each test
// keeps apart by its key prefix. Each starts when a test first asks for it,
// so that a run with no such test starts none, and TestMain stops it.
var (
	sharedRedis   = shared{start: func() (string, func()) { s, stop := redistest.MustStart(); return s.URL(), stop }}
	sharedCluster = shared{start: func() (string, func()) { c, stop := redistest.MustStartCluster(3); return c.URL(), stop }}
)

// shared is a server started once, on first use, by start.
type shared struct {
	start func() (url string, stop func())
	once  sync.Once
	url   string
	stop  func()
	err   any // the panic of a start that failed
}

// URL starts the server if it has not started yet and returns its URL. It
// fails tb if the server cannot start.
func (s *shared) URL(tb testing.TB) string {
	tb.Helper()
	s.once.Do(func() {
		defer func() { s.err = recover() }()
		s.url, s.stop = s.start()
	})
	if s.err != nil {
		tb.Fatalf("%v", s.err)
	}
	return s.url
}

// Stop stops the server if it started.
func (s *shared) Stop() {
	if s.stop != nil {
		s.stop()
	}
}

// redisURL is the URL of the private redis-server, started on first use.
func redisURL(tb testing.TB) string { return sharedRedis.URL(tb) }

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	code := m.Run()
	sharedCluster.Stop()
	sharedRedis.Stop()
	if code == 0 {
		// A rueidis cluster client closes the connections its first
		// topology refresh replaced five seconds later, and delays a
		// topology refresh asked for while it closes by up to a second,
		// each on a goroutine of its own that then exits: not ours.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// backend is a broker the scenario tests run against.
type backend struct {
	name  string
	redis bool
	srv   *shared // of Redis
}

// backends are the embedded broker, a Redis server, and a Redis Cluster
// (where a name's keys and its peer's usually live on different nodes). With
// -short, eachBackend skips the Cluster.
var backends = []backend{{"mem", false, nil}, {"redis", true, &sharedRedis}, {"cluster", true, &sharedCluster}}

// env makes instances that share one broker (a unique mem:// name, or the
// test's key prefix on the private Redis).
type env struct {
	t     *testing.T
	redis bool
	url   string
	base  disker.Config
}

var memNames atomic.Int64

// eachBackend runs f as a parallel subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, e *env)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			if b.srv == &sharedCluster && testing.Short() {
				t.Skip("the Cluster backend runs without -short")
			}
			f(t, newEnv(t, b.redis, b.redisURL(t)))
		})
	}
}

// redisURL returns the backend's Redis URL, starting its server on first
// use, or "" for the embedded broker.
func (b backend) redisURL(tb testing.TB) string {
	if b.srv == nil {
		return ""
	}
	return b.srv.URL(tb)
}

func newEnv(t *testing.T, redis bool, url string) *env {
	e := &env{t: t, redis: redis}
	e.base = disker.Config{
		ReceiverBlockTimeout:    100 * time.Millisecond,
		TimeoutMonitorFrequency: 20 * time.Millisecond,
		HeartbeatInterval:       100 * time.Millisecond,
		Logger:                  testLogger(),
	}
	if redis {
		e.url = url
		e.base.KeyPrefix = redistest.Prefix(t)
	} else {
		e.url = "mem://" + strconv.FormatInt(memNames.Add(1), 10) + "-" + strings.ReplaceAll(t.Name(), "/", "-")
	}
	e.base.RedisURL = e.url
	return e
}

func testLogger() *slog.Logger {
	if os.Getenv("DISKER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// config returns the env's Config changed by mods.
func (e *env) config(mods ...func(*disker.Config)) disker.Config {
	c := e.base
	for _, m := range mods {
		m(&c)
	}
	return c
}

// open starts an instance that closes when the test ends.
func (e *env) open(mods ...func(*disker.Config)) *disker.Disker {
	e.t.Helper()
	d, err := disker.New(context.Background(), e.config(mods...))
	if err != nil {
		e.t.Fatalf("New: %v", err)
	}
	e.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := d.Close(ctx); err != nil {
			e.t.Errorf("Close: %v", err)
		}
	})
	return d
}

// waitFor polls cond until it holds, failing the test after within.
func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		<-tick.C
	}
}

// recv waits for a value on ch, failing the test after within.
func recv[T any](t testing.TB, ch <-chan T, within time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(within):
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
	panic("unreachable")
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func echo(ctx context.Context, m *disker.Message) ([]byte, error) {
	return append([]byte("echo:"), m.Content...), nil
}

// rawRedis returns a plain client of e's Redis, for looking at keys.
func rawRedis(t testing.TB, e *env) rueidis.Client {
	t.Helper()
	rc, err := rueidis.NewClient(rueidis.MustParseURL(e.url))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return rc
}

// scanKeys returns the keys that match pattern, by SCAN on every node.
func scanKeys(t testing.TB, rc rueidis.Client, pattern string) []string {
	t.Helper()
	var keys []string
	for _, node := range rc.Nodes() {
		var cursor uint64
		for {
			entry, err := node.Do(context.Background(), node.B().Scan().Cursor(cursor).Match(pattern).Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatal(err)
			}
			keys = append(keys, entry.Elements...)
			if cursor = entry.Cursor; cursor == 0 {
				break
			}
		}
	}
	return keys
}
