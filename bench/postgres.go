package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// pgServer is a private PostgreSQL: the machine's own binaries (Debian's
// postgresql package), a cluster made by initdb in a temporary directory,
// and a postgres process of this program's, on a free loopback port, never
// the machine's running server. It runs as the postgres system user when
// the harness runs as root (PostgreSQL refuses root).
type pgServer struct {
	dir  string
	port int
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// postgresBinDir finds the directory of initdb and postgres: pg_config's
// BINDIR, else the newest /usr/lib/postgresql/N/bin (Debian's layout, whose
// binaries are not on PATH), else initdb's directory on PATH.
func postgresBinDir() (string, error) {
	has := func(dir string) bool {
		for _, b := range []string{"initdb", "postgres"} {
			if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
				return false
			}
		}
		return true
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); has(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	for _, dir := range dirs {
		if has(dir) {
			return dir, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if p, err = filepath.EvalSymlinks(p); err == nil && has(filepath.Dir(p)) {
			return filepath.Dir(p), nil
		}
	}
	return "", errors.New("PostgreSQL's initdb and postgres not found (pg_config, /usr/lib/postgresql/*/bin, PATH); " +
		"make deps installs Debian's postgresql")
}

// pgMajor is the version number in /usr/lib/postgresql/N/bin, 0 if none.
func pgMajor(dir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
	return n
}

// pgSettings are the server's settings beyond the defaults: loopback only,
// and no waits for the disk (no fsync, commits not waiting for the WAL to
// be flushed, no full-page writes), as the workloads' redis-server keeps
// nothing on disk either.
var pgSettings = []string{
	"listen_addresses=127.0.0.1",
	"fsync=off",
	"synchronous_commit=off",
	"full_page_writes=off",
}

// startPostgres makes a cluster in a temporary directory and starts it.
func startPostgres() (*pgServer, error) {
	bin, err := postgresBinDir()
	if err != nil {
		return nil, err
	}
	cred, err := unprivilegedUser("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, PostgreSQL needs an unprivileged user: %w", err)
	}
	dir, err := os.MkdirTemp("", "bench-pg-")
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	data := filepath.Join(dir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "bench", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync")
	initdb.Dir = dir
	initdb.SysProcAttr = childAttr(syscall.SIGKILL, cred)
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(string(out), 5))
	}
	s := &pgServer{dir: dir, log: filepath.Join(dir, "postgres.log")}
	var last error
	for range 5 { // a free port can be taken before the server binds it
		if s.port, last = freeLoopbackPort(); last != nil {
			break
		}
		if last = s.launch(bin, data, cred); last == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, last
}

// launch starts postgres on s.port and waits until it accepts a
// connection. Its socket goes to s.dir, not the machine's socket directory.
func (s *pgServer) launch(bin, data string, cred *syscall.Credential) error {
	args := []string{"-D", data, "-p", strconv.Itoa(s.port), "-k", s.dir}
	for _, kv := range pgSettings {
		args = append(args, "-c", kv)
	}
	logf, err := os.Create(s.log)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGQUIT is PostgreSQL's immediate shutdown: it stops the backends too.
	cmd.SysProcAttr = childAttr(syscall.SIGQUIT, cred)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := pgx.Connect(ctx, s.url())
		cancel()
		if err == nil {
			_ = c.Close(context.Background())
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("postgres exited at start: %s", s.logTail())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return fmt.Errorf("postgres did not accept connections within 30 s: %v; log: %s", err, s.logTail())
		}
	}
}

// url is the server's connection string.
func (s *pgServer) url() string {
	return fmt.Sprintf("postgres://bench@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// stop shuts the server down (SIGINT: PostgreSQL's fast shutdown), killing
// it if it has not stopped within 10 s.
func (s *pgServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// close stops the server and removes its directory.
func (s *pgServer) close() {
	s.stop()
	_ = os.RemoveAll(s.dir)
}

func (s *pgServer) logTail() string {
	b, _ := os.ReadFile(s.log)
	return lastLines(string(b), 5)
}

// cpu is the CPU time of the postmaster, its processes alive now and the
// ones it reaped.
func (s *pgServer) cpu() (time.Duration, error) { return treeCPU(s.cmd.Process.Pid), nil }

// ioCalls reports nothing: PostgreSQL's processes talk on their sockets
// with recv and send, which /proc/PID/io does not count (it counts read,
// write and their vector forms), so its counts would not be the server's
// system calls.
func (s *pgServer) ioCalls() (ioCalls, bool) { return ioCalls{}, false }

// freeLoopbackPort returns a loopback port free now.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastLines returns the last n lines of s, joined by " | ".
func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, " | ")
}
