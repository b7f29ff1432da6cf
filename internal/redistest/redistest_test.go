package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// do sends one command in RESP and returns the first line of the answer.
func do(t *testing.T, addr string, args ...string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write([]byte(b.String())); err != nil {
		t.Fatalf("write: %v", err)
	}
	r := bufio.NewReader(conn)
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if strings.HasPrefix(line, "$") && line != "$-1\r\n" {
		line, err = r.ReadString('\n')
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	}
	return strings.TrimSpace(line)
}

func TestStartAnswersAndStops(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if got := do(t, s.Addr(), "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	if want := "redis://" + s.Addr() + "/0"; s.URL() != want {
		t.Fatalf("URL() = %q, want %q", s.URL(), want)
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") || strings.HasSuffix(s.Addr(), ":6379") {
		t.Fatalf("Addr() = %q, want a private loopback port", s.Addr())
	}
	s.Stop()
	s.Stop() // twice is fine
	if s.Running() {
		t.Fatal("Running() after Stop")
	}
	if err := ping(s.Addr(), nil); err == nil {
		t.Fatal("server still answers after Stop")
	}
}

func TestRestartWithAOFKeepsData(t *testing.T) {
	t.Parallel()
	s := Start(t, WithAOF())
	if got := do(t, s.Addr(), "SET", "k", "v"); got != "+OK" {
		t.Fatalf("SET = %q", got)
	}
	s.Kill()
	if s.Running() {
		t.Fatal("Running() after Kill")
	}
	if err := ping(s.Addr(), nil); err == nil {
		t.Fatal("server answers after Kill")
	}
	addr := s.Addr()
	s.Restart()
	if s.Addr() != addr {
		t.Fatalf("Restart moved the server from %s to %s", addr, s.Addr())
	}
	if got := do(t, s.Addr(), "GET", "k"); got != "v" {
		t.Fatalf("GET after restart = %q, want v", got)
	}
	s.Restart() // restart of a running server
	if got := do(t, s.Addr(), "GET", "k"); got != "v" {
		t.Fatalf("GET after second restart = %q, want v", got)
	}
}

func TestRestartWithoutAOFStartsEmpty(t *testing.T) {
	t.Parallel()
	s := Start(t)
	do(t, s.Addr(), "SET", "k", "v")
	s.Restart()
	if got := do(t, s.Addr(), "GET", "k"); got != "$-1" {
		t.Fatalf("GET after restart without AOF = %q, want nil", got)
	}
}

func TestMustStart(t *testing.T) {
	t.Parallel()
	s, stop := MustStart()
	dir := s.Dir()
	if got := do(t, s.Addr(), "PING"); got != "+PONG" {
		t.Fatalf("PING = %q", got)
	}
	stop()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("directory %s left after stop: %v", dir, err)
	}
}

func TestMissingRedisServer(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := start(t.TempDir(), false, nil)
	if err == nil || !strings.Contains(err.Error(), "install") || !strings.Contains(err.Error(), "redis-server") {
		t.Fatalf("start without redis-server: %v; want an error saying to install redis-server", err)
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "install") {
			t.Fatalf("MustStart without redis-server: recovered %v; want a panic saying to install redis-server", r)
		}
	}()
	MustStart()
}

func TestPrefixUnique(t *testing.T) {
	t.Parallel()
	a, b := Prefix(t), Prefix(t)
	if a == b {
		t.Fatalf("Prefix returned %q twice", a)
	}
	if strings.ContainsAny(a, "{}*?[]\\/ ") {
		t.Fatalf("Prefix %q has special characters", a)
	}
}

func TestTLS(t *testing.T) {
	t.Parallel()
	s := Start(t, WithTLS())
	if !strings.HasPrefix(s.URL(), "rediss://127.0.0.1:") {
		t.Fatalf("URL() = %q, want rediss://", s.URL())
	}
	if err := ping(s.Addr(), nil); err == nil {
		t.Fatal("a TLS server answered plain PING")
	}
	if err := ping(s.Addr(), s.TLSConfig()); err != nil {
		t.Fatalf("PING over TLS: %v", err)
	}
	if Start(t).TLSConfig() != nil {
		t.Fatal("TLSConfig() of a plain server is not nil")
	}
}
