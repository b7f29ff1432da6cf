package redisbroker

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.uber.org/goleak"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
	"github.com/diskerhq/disker/internal/wire"
)

// srv is the Redis server the package's tests share, each with its own
// key prefix.
var srv *redistest.Server

func TestMain(m *testing.M) {
	s, stop := redistest.MustStart()
	srv = s
	code := m.Run()
	stop()
	if code == 0 {
		// When rueidis.NewClient fails after a connection was made (the
		// TLS test's untrusted certificate), it leaves a cluster-refresh
		// goroutine that sleeps about a second and exits; and a cluster
		// client closes the connections its first topology refresh
		// replaced five seconds later, on a goroutine of its own. Neither
		// is ours.
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"),
			goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2")); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// newBroker returns a Broker on srv with a fresh key prefix, closed when t
// ends.
func newBroker(t testing.TB) *Broker {
	t.Helper()
	return newBrokerOn(t, srv, Config{})
}

func newBrokerOn(t testing.TB, s *redistest.Server, cfg Config) *Broker {
	t.Helper()
	cfg.URL = s.URL()
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = redistest.Prefix(t)
	}
	b, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// rawClient returns a plain rueidis client of s, for looking at keys.
func rawClient(t testing.TB, s *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatalf("raw client: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

func do(t testing.TB, c rueidis.Client, args ...string) rueidis.RedisResult {
	t.Helper()
	return c.Do(context.Background(), c.B().Arbitrary(args[0]).Args(args[1:]...).Build())
}

// keysOf returns the keys under prefix with their types, sorted.
func keysOf(t testing.TB, c rueidis.Client, prefix string) []string {
	t.Helper()
	ks, err := do(t, c, "KEYS", globEscape(prefix)+":*").AsStrSlice()
	if err != nil {
		t.Fatalf("KEYS: %v", err)
	}
	out := make([]string, 0, len(ks))
	for _, k := range ks {
		typ, err := do(t, c, "TYPE", k).ToString()
		if err != nil {
			t.Fatalf("TYPE: %v", err)
		}
		out = append(out, strings.TrimPrefix(k, prefix)+" "+typ)
	}
	slices.Sort(out)
	return out
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds or 10 seconds pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		<-tick.C
	}
}

func encodeForTest(e *broker.Envelope) []byte { return wire.Encode(e) }

// sendEnv sends env alone, due now and with no key (the form of Send most
// tests need), and returns its deadline.
func sendEnv(ctx context.Context, b broker.Queue, env *broker.Envelope) (time.Time, error) {
	res, err := broker.SendOne(ctx, b, broker.SendParams{Env: *env})
	return res.Deadline, err
}

// sendRequest is sendEnv of env from its inbox (env.Sender): it sets the
// route, as a requester does.
func sendRequest(ctx context.Context, b broker.Queue, env *broker.Envelope) (time.Time, error) {
	env.Route = broker.RouteInbox
	return sendEnv(ctx, b, env)
}

// sendEnvs sends envs in one Send, due now and with no key, and returns
// their deadlines, and the first message's error.
func sendEnvs(ctx context.Context, b broker.Queue, envs []*broker.Envelope) ([]time.Time, error) {
	ps := make([]broker.SendParams, len(envs))
	for i, env := range envs {
		ps[i].Env = *env
	}
	if err := b.Send(ctx, ps); err != nil {
		return nil, err
	}
	deadlines := make([]time.Time, len(ps))
	var first error
	for i := range ps {
		deadlines[i] = ps[i].Result.Deadline
		if first == nil {
			first = ps[i].Result.Err
		}
	}
	return deadlines, first
}
