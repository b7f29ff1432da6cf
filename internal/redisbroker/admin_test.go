package redisbroker

import (
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

func TestAcquireRelease(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	acquire := func(owner string, ttl time.Duration) bool {
		t.Helper()
		ok, err := b.Acquire(ctx, "r", owner, ttl)
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return ok
	}
	if !acquire("A", time.Hour) {
		t.Fatal("A could not take a free lock")
	}
	if acquire("B", time.Hour) {
		t.Fatal("B took A's lock")
	}
	if !acquire("A", time.Hour) {
		t.Fatal("A could not renew its lock")
	}
	if err := b.Release(ctx, "r", "B"); err != nil {
		t.Fatal(err)
	}
	if acquire("B", time.Hour) {
		t.Fatal("B's Release freed A's lock")
	}
	if err := b.Release(ctx, "r", "A"); err != nil {
		t.Fatal(err)
	}
	if !acquire("B", 20*time.Millisecond) {
		t.Fatal("B could not take a released lock")
	}
	eventually(t, "B's lock to expire", func() bool { return acquire("A", time.Hour) })
}

func TestWorkersRegistry(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := broker.WorkerInfo{ID: "a", Host: "h1", PID: 1, Receivers: []string{"orders", "mail"},
		Concurrency: map[string]int{"orders": 4}, InFlight: 2, Processed: 10, Failed: 1, StartedAt: started}
	c := broker.WorkerInfo{ID: "c", Host: "h2", Receivers: []string{"orders"}}
	before, _ := b.Now(ctx)
	for _, w := range []broker.WorkerInfo{c, a} {
		if err := b.Heartbeat(ctx, w, time.Hour); err != nil {
			t.Fatal(err)
		}
	}
	ws, err := b.Workers(ctx)
	if err != nil || len(ws) != 2 {
		t.Fatalf("Workers = %+v, %v", ws, err)
	}
	if ws[0].LastSeen.Before(before.Truncate(time.Millisecond)) {
		t.Fatalf("LastSeen %v before %v", ws[0].LastSeen, before)
	}
	got := ws[0]
	got.LastSeen = time.Time{}
	got.StartedAt = got.StartedAt.UTC()
	if !reflect.DeepEqual(got, a) || ws[1].ID != "c" {
		t.Fatalf("Workers[0] = %+v, want %+v", got, a)
	}
	rs, err := b.Receivers(ctx)
	if err != nil || !reflect.DeepEqual(rs, []string{"mail", "orders"}) {
		t.Fatalf("Receivers = %v, %v", rs, err)
	}
	if err := b.Deregister(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// A worker whose heartbeat expires leaves by itself.
	if err := b.Heartbeat(ctx, c, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	eventually(t, "c to expire", func() bool {
		ws, err := b.Workers(ctx)
		return err == nil && len(ws) == 0
	})
	// The next heartbeat sweeps the expired ids.
	if err := b.Heartbeat(ctx, broker.WorkerInfo{ID: "d"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	if err := b.Deregister(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	// What stays: the departed workers, which forget a departure after
	// departedFor, and the reclaim epoch, which counted a, c and d
	// leaving. A heartbeat writes nothing per receiver.
	if ks := keysOf(t, rawClient(t, srv), b.keys.prefix); len(ks) != 2 || ks[0] != ":{workers}:departed zset" || ks[1] != ":{workers}:reclaim string" {
		t.Fatalf("keys left by the registry: %v, want only the departed workers and the reclaim epoch", ks)
	}
	if n, _ := do(t, rawClient(t, srv), "GET", b.keys.reclaimEpoch()).AsInt64(); n != 3 {
		t.Fatalf("reclaim epoch = %d, want 3 (a and d left, c lapsed)", n)
	}
	if ids, _ := do(t, rawClient(t, srv), "ZRANGE", b.keys.departed(), "0", "-1").AsStrSlice(); strings.Join(ids, ",") != "a,c,d" {
		t.Fatalf("departed workers: %v, want a, c and d", ids)
	}
	if b.departedWorkers() == nil {
		t.Fatal("the broker's heartbeat did not read the departed workers")
	}
}

func TestReceiversFromStreams(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	if rs, err := b.Receivers(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("Receivers of an empty broker = %v, %v", rs, err)
	}
	for _, r := range []string{"b*[x]", "a"} {
		if _, err := sendEnv(ctx, b, env("m", r)); err != nil {
			t.Fatal(err)
		}
	}
	// Replies and dead letters: only the dead letters make a receiver.
	if err := b.Reply(ctx, &broker.Envelope{ID: "r", Receiver: "web", InReplyTo: "m"}, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	if _, err := sendEnv(ctx, b, env("m", "dead")); err != nil {
		t.Fatal(err)
	}
	d := fetch1(t, b, broker.FetchParams{Receiver: "dead", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})[0]
	if err := b.DeadLetter(ctx, "dead", d, "x"); err != nil {
		t.Fatal(err)
	}
	rs, err := b.Receivers(ctx)
	if want := []string{"a", "b*[x]", "dead"}; err != nil || !reflect.DeepEqual(rs, want) {
		t.Fatalf("Receivers = %v, %v; want %v", rs, err, want)
	}
	// A drained queue no longer counts.
	d = fetch1(t, b, broker.FetchParams{Receiver: "a", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})[0]
	if err := b.Ack(ctx, "a", d.Ref); err != nil {
		t.Fatal(err)
	}
	rs, _ = b.Receivers(ctx)
	if want := []string{"b*[x]", "dead"}; !reflect.DeepEqual(rs, want) {
		t.Fatalf("Receivers after draining a = %v; want %v", rs, want)
	}
}

func TestNewValidation(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		cfg  Config
		want string
	}{
		"no URL":       {Config{}, "Config.URL: empty"},
		"bad scheme":   {Config{URL: "http://localhost"}, "Config.URL: scheme"},
		"no host":      {Config{URL: "redis://"}, "no host"},
		"bad port":     {Config{URL: "redis://localhost:99999"}, "port"},
		"bad db":       {Config{URL: "redis://localhost/x"}, "database"},
		"bad URL":      {Config{URL: "redis://user:secret@local host/0"}, "Config.URL"},
		"prefix":       {Config{URL: "redis://localhost", KeyPrefix: "a{b}"}, "Config.KeyPrefix"},
		"pool":         {Config{URL: "redis://localhost", MaxConnectionPoolSize: -1}, "Config.MaxConnectionPoolSize"},
		"blocking":     {Config{URL: "redis://localhost", MaxBlockingConnections: -1}, "Config.MaxBlockingConnections"},
		"message size": {Config{URL: "redis://localhost", MaxMessageSize: -1}, "Config.MaxMessageSize"},
		"dial":         {Config{URL: "redis://localhost", DialTimeout: -1}, "Config.DialTimeout"},
		"io":           {Config{URL: "redis://localhost", IOTimeout: -1}, "Config.IOTimeout"},
	}
	for name, tc := range tests {
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "redisbroker: ") {
			t.Errorf("%s: New = %v; want an error about %q", name, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%s: the error shows the password: %v", name, err)
		}
	}
}

func TestNewUnreachable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = New(Config{URL: "redis://" + addr})
	if !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "Redis at "+addr+" is unreachable") {
		t.Fatalf("New on a closed port = %v; want ErrUnavailable naming %s", err, addr)
	}
}

func TestURLOptions(t *testing.T) {
	t.Parallel()
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	// An ACL user with a password, and database 3.
	if err := do(t, raw, "ACL", "SETUSER", "disker-test", "on", ">s3cret", "~*", "&*", "+@all").Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { do(t, raw, "ACL", "DELUSER", "disker-test") })
	prefix := "url-options"
	b, err := New(Config{URL: "redis://disker-test:s3cret@" + srv.Addr() + "/3", KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if _, err := sendEnv(ctx, b, env("m", "r")); err != nil {
		t.Fatal(err)
	}
	if n, _ := do(t, raw, "EXISTS", b.keys.queue("r")).AsInt64(); n != 0 {
		t.Fatal("the message went to database 0")
	}
	ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0})
	if len(ds) != 1 {
		t.Fatalf("Fetch on database 3 = %+v", ds)
	}
	if err := b.Ack(ctx, "r", ds[0].Ref); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{URL: "redis://disker-test:wrong@" + srv.Addr() + "/3"}); err == nil || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("New with a wrong password = %v; want an error without the password", err)
	}
}

func TestStatsCounts(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	st, err := b.Stats(ctx, "never-used")
	if err != nil || st != (broker.ReceiverStats{Receiver: "never-used"}) {
		t.Fatalf("Stats of an unknown receiver = %+v, %v", st, err)
	}
	for range 5 {
		if _, err := sendEnv(ctx, b, env("m", "r")); err != nil {
			t.Fatal(err)
		}
	}
	ds, _ := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 2, Block: 0, Lease: time.Minute, MaxAttempts: 0})
	if err := b.DeadLetter(ctx, "r", ds[0], "x"); err != nil {
		t.Fatal(err)
	}
	st, _ = b.Stats(ctx, "r")
	if want := (broker.ReceiverStats{Receiver: "r", Queued: 3, Pending: 1, DeadLetters: 1, Length: 4, OldestQueued: st.OldestQueued}); st != want || st.OldestQueued.IsZero() {
		t.Fatalf("Stats = %+v, want %+v", st, want)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	blocked := make(chan error, 1)
	go func() {
		_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "r", Consumer: "c", Max: 1, Block: time.Minute, Lease: time.Minute, MaxAttempts: 0})
		blocked <- err
	}()
	raw := rawClient(t, s)
	eventually(t, "the fetch to block", func() bool {
		n, _ := do(t, raw, "CLIENT", "LIST").ToString()
		return strings.Contains(n, "cmd=xreadgroup")
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if err := <-blocked; !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch blocked during Close = %v; want ErrClosed", err)
	}
	if _, err := sendEnv(ctx, b, env("m", "r")); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Send after Close = %v; want ErrClosed", err)
	}
	if _, err := b.Now(ctx); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Now after Close = %v; want ErrClosed", err)
	}
}

func TestPipelineMultiplex(t *testing.T) {
	t.Parallel()
	tests := []struct{ maxConns, procs, want int }{
		{1, 8, -1}, {2, 8, 1}, {3, 8, 1}, {10, 8, 2}, {10, 2, 1}, {10, 1, -1}, {4, 3, 1},
	}
	for _, tc := range tests {
		if got := pipelineMultiplex(tc.maxConns, tc.procs); got != tc.want {
			t.Errorf("pipelineMultiplex(%d, %d) = %d, want %d", tc.maxConns, tc.procs, got, tc.want)
		}
	}
}

func TestTLSURL(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.WithTLS())
	b, err := New(Config{URL: s.URL(), TLSConfig: s.TLSConfig(), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatalf("New over TLS: %v", err)
	}
	defer b.Close()
	ctx := ctxT(t)
	if _, err := sendEnv(ctx, b, env("m", "r")); err != nil {
		t.Fatal(err)
	}
	if ds := fetch1(t, b, broker.FetchParams{Receiver: "r", Consumer: "c", Lease: time.Minute, MaxAttempts: 0}); len(ds) != 1 {
		t.Fatalf("Fetch over TLS = %+v", ds)
	}
	// Without the CA, the server's certificate is not trusted.
	if _, err := New(Config{URL: s.URL()}); !errors.Is(err, broker.ErrUnavailable) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("New over TLS without the CA = %v; want an unavailable error about the certificate", err)
	}
}
