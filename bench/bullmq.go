package bench

import (
	"bufio"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// BullMQ runs in node: bullmq/bullmq.mjs, with the versions pinned by
// bullmq/package.json and package-lock.json. The three files are built
// into this program; InstallPeers installs the node modules (npm ci) into
// a cache directory named for the lock file, where the harness writes the
// script too, so any checkout of the harness finds them.

//go:embed bullmq/package.json bullmq/package-lock.json bullmq/bullmq.mjs
var bullmqFiles embed.FS

// bullmqDir returns the cache directory of the node modules: under the
// user's cache directory, named for a hash of the lock file.
func bullmqDir() (string, error) {
	lock, err := bullmqFiles.ReadFile("bullmq/package-lock.json")
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(lock)
	return filepath.Join(cache, "disker-bench", "bullmq-"+hex.EncodeToString(sum[:6])), nil
}

// installedMark is the file that says npm ci completed in a bullmqDir.
const installedMark = ".installed"

// writeBullMQFiles writes the package files and the script into dir.
func writeBullMQFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, f := range []string{"package.json", "package-lock.json", "bullmq.mjs"} {
		b, err := bullmqFiles.ReadFile("bullmq/" + f)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// InstallPeers installs what the peers need that the harness can install
// itself: BullMQ's node modules, with npm ci, into their cache directory,
// unless they are there already. It reports to w what it did and what it
// cannot install (node and npm, PostgreSQL: `make deps` installs them from
// Debian's packages).
func InstallPeers(w io.Writer) error {
	if _, err := postgresBinDir(); err != nil {
		fmt.Fprintf(w, "River: %v\n", err)
	}
	dir, err := bullmqDir()
	if err != nil {
		return err
	}
	if _, err := os.Stat(filepath.Join(dir, installedMark)); err == nil {
		fmt.Fprintf(w, "BullMQ: node modules installed in %s\n", dir)
		return nil
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("BullMQ: %s not found on PATH (make deps installs Debian's nodejs and npm)", tool)
		}
	}
	if err := writeBullMQFiles(dir); err != nil {
		return err
	}
	fmt.Fprintf(w, "BullMQ: npm ci in %s\n", dir)
	cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = w, w
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("BullMQ: npm ci: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, installedMark), nil, 0o644)
}

// bullmqReady returns the directory to run the script in, with the script
// written afresh, or why BullMQ cannot run here.
func bullmqReady() (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", errors.New("node not found on PATH (make deps installs it)")
	}
	dir, err := bullmqDir()
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(dir, installedMark)); err != nil {
		return "", fmt.Errorf("its node modules are not installed in %s (make deps, or go run ./cmd/bench -install-peers, installs them)", dir)
	}
	if err := writeBullMQFiles(dir); err != nil {
		return "", err
	}
	return dir, nil
}

// bullmqImpl is BullMQ's row of fire-and-forget, on the workload's
// redis-server.
func bullmqImpl(pe *peers, n int) redisImpl {
	return redisImpl{name: nameBullMQ, peers: pe, run: func(ctx context.Context, s *redisServer) (sample, error) {
		dir, err := bullmqReady()
		if err != nil {
			return sample{}, pe.missing(nameBullMQ, err)
		}
		return ffBullMQ(ctx, s, dir, n)
	}}
}

// nodeProc is one node process of the BullMQ workload, driven by lines on
// its standard input and output.
type nodeProc struct {
	role   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string // its standard output, closed when it ends
	stderr *strings.Builder
	exited chan struct{} // closed when it has ended; then err is set
	err    error
}

func startNode(dir, role string, args ...string) (*nodeProc, error) {
	cmd := exec.Command("node", append([]string{"bullmq.mjs", role}, args...)...)
	cmd.Dir = dir
	cmd.SysProcAttr = childAttr(syscall.SIGKILL, nil)
	p := &nodeProc{role: role, cmd: cmd, lines: make(chan string, 4), stderr: &strings.Builder{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	var err error
	if p.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start node: %w", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.err = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// expect waits for the line want from p.
func (p *nodeProc) expect(ctx context.Context, want string) error {
	select {
	case l, ok := <-p.lines:
		if ok && l == want {
			return nil
		}
		if !ok {
			<-p.exited
			return fmt.Errorf("bullmq %s ended before %q (%v): %s", p.role, want, p.err, lastLines(p.stderr.String(), 5))
		}
		return fmt.Errorf("bullmq %s said %q, want %q", p.role, l, want)
	case <-ctx.Done():
		return fmt.Errorf("bullmq %s: waiting for %q: %w", p.role, want, ctx.Err())
	}
}

func (p *nodeProc) say(line string) error {
	_, err := io.WriteString(p.stdin, line+"\n")
	return err
}

// stop tells p to close and waits for it to end, killing it after 30 s.
func (p *nodeProc) stop() error {
	_ = p.say("stop")
	_ = p.stdin.Close()
	go func() {
		for range p.lines { // whatever it still prints
		}
	}()
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("bullmq %s did not stop within 30 s", p.role)
	}
	if p.err != nil {
		return fmt.Errorf("bullmq %s: %w: %s", p.role, p.err, lastLines(p.stderr.String(), 5))
	}
	return nil
}

// ffBullMQ runs fire-and-forget on BullMQ: a worker process (Worker with
// concurrency ffHandlers) and a producer process (Queue.add from
// ffProducers concurrent loops), each with its ioredis connection to s.
// The clock runs from the producer's "go" until the worker has processed
// n jobs. The clients' CPU and system calls are the two node processes'
// over that time.
func ffBullMQ(ctx context.Context, s *redisServer, dir string, n int) (smp sample, err error) {
	ctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	const queue = "bench-ff"
	var procs []*nodeProc
	defer func() {
		for _, p := range procs {
			if serr := p.stop(); err == nil {
				err = serr
			}
		}
	}()
	for _, role := range []struct {
		name string
		par  int
	}{{"worker", ffHandlers}, {"producer", ffProducers}} {
		p, err := startNode(dir, role.name, s.url(), queue, strconv.Itoa(n), strconv.Itoa(role.par))
		if err != nil {
			return sample{}, err
		}
		procs = append(procs, p)
		if err := p.expect(ctx, "ready"); err != nil {
			return sample{}, err
		}
	}
	worker, producer := procs[0], procs[1]
	cpu0, io0 := nodeUsage(procs)
	t0 := time.Now()
	if err := producer.say("go"); err != nil {
		return sample{}, err
	}
	if err := worker.expect(ctx, "done"); err != nil {
		return sample{}, err
	}
	smp = sample{elapsed: time.Since(t0), ops: n}
	if err := producer.expect(ctx, "sent"); err != nil {
		return sample{}, err
	}
	cpu1, io1 := nodeUsage(procs)
	smp.clientCPU = cpu1 - cpu0
	smp.work.clientExternal = true
	smp.work.clientIO = ioCalls{reads: io1.reads - io0.reads, writes: io1.writes - io0.writes}
	smp.work.clientIOOK = io0.ok && io1.ok
	return smp, nil
}

// nodeIO is the summed system calls of node processes, ok if all were read.
type nodeIO struct {
	ioCalls
	ok bool
}

// nodeUsage returns the CPU time and the system calls of procs so far.
func nodeUsage(procs []*nodeProc) (time.Duration, nodeIO) {
	var cpu time.Duration
	sum := nodeIO{ok: true}
	for _, p := range procs {
		if st, ok := readProcStat(p.cmd.Process.Pid); ok {
			cpu += st.cpu
		}
		c, ok := readIOCalls(strconv.Itoa(p.cmd.Process.Pid))
		sum.ok = sum.ok && ok
		sum.reads += c.reads
		sum.writes += c.writes
	}
	return cpu, sum
}
