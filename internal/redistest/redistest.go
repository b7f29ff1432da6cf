// Package redistest runs a private redis-server for tests.
//
// Each server listens on a free loopback port and keeps its files in its own
// temporary directory. Use [Start] in a test (the server stops when the test
// ends), or [MustStart] in TestMain to share one server across a package:
//
//	func TestMain(m *testing.M) {
//		srv, stop := redistest.MustStart()
//		url = srv.URL()
//		code := m.Run()
//		stop()
//		os.Exit(code)
//	}
//
// Tests sharing a server keep apart by key prefix ([Prefix]). [StartCutProxy]
// puts a proxy in front of a server that can drop its answers, to show what
// a client does when a write went through and its answer was lost;
// [StartStallProxy] one that can hold all traffic with every socket open (a
// stalled connection) or reset every connection.
//
// redis-server must be on PATH; when it is not, Start fails the test and
// MustStart panics, with a message saying to install it. Nothing is skipped.
package redistest

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/childproc"
)

// StartTimeout bounds how long a start waits for the server to answer PING.
const StartTimeout = 20 * time.Second

// Option configures a server.
type Option func(*options)

type options struct {
	aof bool
	tls bool
}

// WithAOF turns on the append-only file with appendfsync always, so that
// every acknowledged write survives [Server.Kill] and [Server.Restart].
// Without it the server keeps nothing on disk and a restart starts empty.
func WithAOF() Option {
	return func(o *options) { o.aof = true }
}

// WithTLS makes the server speak TLS only, with a certificate for
// 127.0.0.1 signed by a CA made for it: [Server.URL] is then rediss://, and
// [Server.TLSConfig] trusts that CA.
func WithTLS() Option {
	return func(o *options) { o.tls = true }
}

// Server is a running (or killed) private redis-server.
type Server struct {
	opts    options
	dir     string
	ownsDir bool
	port    int

	tlsConfig *tls.Config // nil without WithTLS

	mu   sync.Mutex
	proc *process // nil when not running
}

// process is one run of redis-server; done closes when it has exited and
// been reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a server for tb and stops it when tb ends. It fails tb if
// redis-server is missing or does not start.
func Start(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	s, err := start(tb.TempDir(), false, opts)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(s.Stop)
	return s
}

// MustStart starts a server in a new temporary directory, for TestMain. It
// returns the server and a function that stops it and removes the
// directory. It panics if redis-server is missing or does not start.
func MustStart(opts ...Option) (*Server, func()) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		panic(fmt.Sprintf("redistest: %v", err))
	}
	s, err := start(dir, true, opts)
	if err != nil {
		_ = os.RemoveAll(dir)
		panic(err.Error())
	}
	return s, s.Stop
}

func start(dir string, ownsDir bool, opts []Option) (*Server, error) {
	if err := needRedisServer(); err != nil {
		return nil, err
	}
	s := &Server{dir: dir, ownsDir: ownsDir}
	for _, o := range opts {
		o(&s.opts)
	}
	if s.opts.tls {
		cfg, err := makeCerts(dir)
		if err != nil {
			return nil, err
		}
		s.tlsConfig = cfg
	}
	err := withFreshPorts(func() error {
		var err error
		if s.port, err = freePort(); err != nil {
			return err
		}
		return s.launch()
	}, func() {})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// needRedisServer fails with instructions when redis-server is not on PATH.
func needRedisServer() error {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return errors.New("redistest: redis-server not found on PATH: the tests need a real Redis (7 or newer); " +
			"install it, e.g. `apt-get install redis-server` or `brew install redis`, and run the tests again")
	}
	return nil
}

// withFreshPorts runs launch, which picks free ports and starts servers on
// them, up to five times: a free port can be taken by someone else between
// the probe and the server's bind. After a failed try it runs kill, to stop
// what that try started.
func withFreshPorts(launch func() error, kill func()) error {
	var err error
	for range 5 {
		if err = launch(); err == nil {
			return nil
		}
		kill()
	}
	return err
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redistest: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// acceptPairs accepts connections on ln until it is closed, dials target
// for each, and hands the pair to serve, which starts their forwarding on
// wg. Once ln is closed, it closes every connection it made and waits for
// wg.
func acceptPairs(ln net.Listener, target string, serve func(c, s net.Conn, wg *sync.WaitGroup)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var mu sync.Mutex
	var open []net.Conn
	defer func() {
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", target)
		if err != nil {
			c.Close()
			continue
		}
		mu.Lock()
		open = append(open, c, s)
		mu.Unlock()
		serve(c, s, &wg)
	}
}

// listenLoopback listens on a free loopback port for a proxy (what, in the
// error), failing tb when it cannot.
func listenLoopback(tb testing.TB, what string) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("redistest: %s: %v", what, err)
	}
	return ln
}

func (s *Server) launch() error {
	args := s.baseArgs()
	if s.opts.tls {
		args[1] = "0" // no plain port
		args = append(args, "--tls-port", strconv.Itoa(s.port),
			"--tls-cert-file", "server.crt", "--tls-key-file", "server.key",
			"--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no")
	}
	if s.opts.aof {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	return s.run(args)
}

// baseArgs are the redis-server arguments every server here starts with:
// its port (first, as "--port" and the number), loopback only, its
// directory, no snapshots, a log file.
func (s *Server) baseArgs() []string {
	return []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "",
		"--logfile", "redis.log",
		"--maxclients", "4000",
	}
}

// run starts redis-server with args in s's directory, waits for it to
// answer PING, and makes it s's running process.
func (s *Server) run(args []string) error {
	cmd := exec.Command("redis-server", args...)
	cmd.Dir = s.dir
	childproc.Tie(cmd) // a test binary or harness that is killed takes it along
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	if err := s.waitReady(p); err != nil {
		p.kill()
		return err
	}
	s.mu.Lock()
	s.proc = p
	s.mu.Unlock()
	return nil
}

func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

func (s *Server) waitReady(p *process) error {
	deadline := time.Now().Add(StartTimeout)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var last error
	for time.Now().Before(deadline) {
		if last = ping(s.Addr(), s.tlsConfig); last == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("redistest: redis-server exited at start: %s", s.logTail())
		case <-tick.C:
		}
	}
	return fmt.Errorf("redistest: redis-server at %s did not answer PING within %v: %v; log: %s", s.Addr(), StartTimeout, last, s.logTail())
}

func ping(addr string, tlsConfig *tls.Config) error {
	var conn net.Conn
	var err error
	d := &net.Dialer{Timeout: time.Second}
	if tlsConfig != nil {
		conn, err = tls.DialWithDialer(d, "tcp", addr, tlsConfig)
	} else {
		conn, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// URL returns the server's address as a redis:// URL on database 0
// (rediss:// with [WithTLS]).
func (s *Server) URL() string {
	if s.tlsConfig != nil {
		return "rediss://" + s.Addr() + "/0"
	}
	return "redis://" + s.Addr() + "/0"
}

// TLSConfig returns a client configuration that trusts the server's
// certificate, or nil for a server without [WithTLS].
func (s *Server) TLSConfig() *tls.Config {
	if s.tlsConfig == nil {
		return nil
	}
	return s.tlsConfig.Clone()
}

// Dir returns the server's working directory (log, AOF files).
func (s *Server) Dir() string {
	return s.dir
}

// Kill ends the server with SIGKILL, as a crash would, and waits for it to
// exit. Data not yet on disk is lost. It does nothing if the server is not
// running. Use [Server.Restart] to bring it back.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	s.proc.kill()
	s.proc = nil
}

// Restart kills the server if it runs and starts it again on the same port
// and directory: with [WithAOF] the data survives. It panics if the server
// does not come back, since the test cannot go on.
func (s *Server) Restart() {
	s.Kill()
	var err error
	// The old process is gone, but its port may linger for a moment.
	deadline := time.Now().Add(StartTimeout)
	for {
		if err = s.launch(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		panic(fmt.Sprintf("redistest: restart: %v", err))
	}
}

// Running reports whether the server process is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 10 seconds) and,
// for a server made by [MustStart], removes its directory. It is safe to
// call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	if p := s.proc; p != nil {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			p.kill()
		}
		s.proc = nil
	}
	s.mu.Unlock()
	if s.ownsDir {
		_ = os.RemoveAll(s.dir)
	}
}

var prefixes atomic.Int64

// Prefix returns a key prefix unique within the test binary, readable in
// the keyspace: "t<n>-<test name>" with the name cleaned of characters that
// are special in keys and SCAN patterns.
func Prefix(tb testing.TB) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			return r
		}
		return '_'
	}, tb.Name())
	if len(name) > 40 {
		name = name[:40]
	}
	return "t" + strconv.FormatInt(prefixes.Add(1), 10) + "-" + name
}
