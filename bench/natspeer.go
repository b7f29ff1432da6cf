package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS runs as a nats-server embedded in this program (the Go module, not
// a binary of the machine), started as a child process of it so that its
// CPU and system calls are counted apart from the clients', as
// redis-server's are: the harness runs its own executable with
// natsServerEnv set, and main (and the tests' TestMain) hand such a
// process to ServePeerIfAsked.

// natsServerEnv names the environment variable that makes this program a
// nats-server; its value is the JetStream store directory.
const natsServerEnv = "DISKER_BENCH_NATS_STORE"

// ServePeerIfAsked serves NATS with JetStream, until its standard input
// closes, when the harness started this process as its nats-server, and
// then reports true; it reports false at once in any other process. The
// bench command's main and the tests' TestMain call it first.
func ServePeerIfAsked() bool {
	dir, ok := os.LookupEnv(natsServerEnv)
	if !ok {
		return false
	}
	if err := serveNATS(dir, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "nats-server:", err)
		os.Exit(1)
	}
	return true
}

// serveNATS runs the server on a free loopback port, writes its client URL
// as one line to out, and stops it when in reaches its end.
func serveNATS(dir string, in io.Reader, out io.Writer) error {
	ns, err := server.NewServer(&server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  dir,
		NoSigs:    true,
		NoLog:     true,
	})
	if err != nil {
		return err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return errors.New("not ready for connections within 10 s")
	}
	if _, err := fmt.Fprintln(out, ns.ClientURL()); err != nil {
		ns.Shutdown()
		return err
	}
	_, _ = io.Copy(io.Discard, in)
	ns.Shutdown()
	ns.WaitForShutdown()
	return nil
}

// natsServer is the child process serving NATS.
type natsServer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	url   string
	dir   string
}

// startNATS starts this program as a nats-server with a temporary store
// directory and waits for its URL.
func startNATS() (*natsServer, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-nats-")
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), natsServerEnv+"="+dir)
	cmd.SysProcAttr = childAttr(syscall.SIGKILL, nil)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start nats-server: %w", err)
	}
	s := &natsServer{cmd: cmd, stdin: stdin, done: make(chan struct{}), dir: dir}
	first := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		if sc.Scan() {
			first <- sc.Text()
		}
		close(first)
		_, _ = io.Copy(io.Discard, stdout)
		_ = cmd.Wait() // after the last read of the pipe
		close(s.done)
	}()
	select {
	case url := <-first:
		if strings.HasPrefix(url, "nats://") {
			s.url = url
			return s, nil
		}
		s.close()
		return nil, fmt.Errorf("nats-server did not start: %q %s", url, strings.TrimSpace(stderr.String()))
	case <-time.After(20 * time.Second):
		s.close()
		return nil, errors.New("nats-server gave no URL within 20 s")
	}
}

// close stops the server (it stops when its standard input closes) and
// removes its store.
func (s *natsServer) close() {
	_ = s.stdin.Close()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

func (s *natsServer) cpu() (time.Duration, error) {
	st, ok := readProcStat(s.cmd.Process.Pid)
	if !ok {
		return 0, errors.New("nats-server: /proc/PID/stat cannot be read")
	}
	return st.cpu, nil
}

func (s *natsServer) ioCalls() (ioCalls, bool) {
	return readIOCalls(strconv.Itoa(s.cmd.Process.Pid))
}

// natsImpls are the NATS rows of fire-and-forget: a JetStream work-queue
// stream in memory and on file, each served by a durable pull consumer
// with explicit acks.
func natsImpls(pe *peers, n int) []redisImpl {
	row := func(name string, storage jetstream.StorageType) redisImpl {
		return redisImpl{name: name, peers: pe, server: natsProbe(pe, name), run: func(ctx context.Context, _ *redisServer) (sample, error) {
			return ffJetStream(ctx, pe, storage, n)
		}}
	}
	return []redisImpl{row(nameJetStreamMem, jetstream.MemoryStorage), row(nameJetStreamFile, jetstream.FileStorage)}
}

// natsProbe returns the server function of a NATS row: the suite's
// nats-server, or errNotRun when it cannot start.
func natsProbe(pe *peers, row string) func() (serverProbe, error) {
	return func() (serverProbe, error) {
		ns, err := pe.natsServer()
		if err != nil {
			return nil, pe.missing(row, err)
		}
		return ns, nil
	}
}

// The JetStream stream and consumer of fire-and-forget.
const (
	jsStream   = "BENCHFF"
	jsSubject  = "bench.ff"
	jsConsumer = "workers"
)

// ffJetStream runs fire-and-forget on JetStream: ffProducers producers
// publish n messages between them, each waiting for the stream's
// acknowledgement (Publish), to a work-queue stream with the given
// storage, created afresh for the run; a durable pull consumer with
// explicit acks (Consume, default pull options) hands each message to one
// of ffHandlers goroutines, which acks it. The producers and the worker
// use a connection each, as two processes would.
func ffJetStream(ctx context.Context, pe *peers, storage jetstream.StorageType, n int) (smp sample, err error) {
	ns, err := pe.natsServer()
	if err != nil {
		return sample{}, err
	}
	pc, err := nats.Connect(ns.url)
	if err != nil {
		return sample{}, err
	}
	defer pc.Close()
	wc, err := nats.Connect(ns.url)
	if err != nil {
		return sample{}, err
	}
	defer wc.Close()
	pjs, err := jetstream.New(pc)
	if err != nil {
		return sample{}, err
	}
	wjs, err := jetstream.New(wc)
	if err != nil {
		return sample{}, err
	}
	if _, err := pjs.CreateStream(ctx, jetstream.StreamConfig{
		Name:      jsStream,
		Subjects:  []string{jsSubject},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   storage,
	}); err != nil {
		return sample{}, err
	}
	defer func() {
		if derr := pjs.DeleteStream(context.Background(), jsStream); err == nil {
			err = derr
		}
	}()
	cons, err := wjs.CreateOrUpdateConsumer(ctx, jsStream, jetstream.ConsumerConfig{
		Durable:   jsConsumer,
		AckPolicy: jetstream.AckExplicitPolicy,
	})
	if err != nil {
		return sample{}, err
	}
	cd := newCountdown(n)
	errc := make(chan error, 1)
	msgs := make(chan jetstream.Msg)
	var handlers sync.WaitGroup
	handlers.Add(ffHandlers)
	for range ffHandlers {
		go func() {
			defer handlers.Done()
			for m := range msgs {
				if err := m.Ack(); err != nil {
					select {
					case errc <- err:
					default:
					}
					continue
				}
				cd.add()
			}
		}()
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { msgs <- m })
	if err != nil {
		close(msgs)
		handlers.Wait()
		return sample{}, err
	}
	smp, err = timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			_, err := pjs.Publish(ctx, jsSubject, payload)
			return err
		})
	})
	cc.Stop()
	<-cc.Closed()
	close(msgs)
	handlers.Wait()
	return smp, err
}

// natsRequestImpl is the NATS row of request/reply: core NATS requests
// (no JetStream) to rrWorkers subscribers of one queue group, which echo
// the content.
func natsRequestImpl(pe *peers, n, r int) redisImpl {
	return redisImpl{name: nameNATSRequest, peers: pe, server: natsProbe(pe, nameNATSRequest), run: func(ctx context.Context, _ *redisServer) (sample, error) {
		return rrNATS(ctx, pe, n, r)
	}}
}

// rrNATS runs request/reply on core NATS: r requesters share n requests
// (RequestWithContext, with the rrTimeout), on one connection, to
// rrWorkers queue subscribers on another that reply with the content.
func rrNATS(ctx context.Context, pe *peers, n, r int) (sample, error) {
	ns, err := pe.natsServer()
	if err != nil {
		return sample{}, err
	}
	wc, err := nats.Connect(ns.url)
	if err != nil {
		return sample{}, err
	}
	defer wc.Close()
	for range rrWorkers {
		if _, err := wc.QueueSubscribe("bench.rr", "workers", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
			return sample{}, err
		}
	}
	if err := wc.Flush(); err != nil {
		return sample{}, err
	}
	rc, err := nats.Connect(ns.url)
	if err != nil {
		return sample{}, err
	}
	defer rc.Close()
	return runRequests(ctx, n, r, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, rrTimeout)
		defer cancel()
		m, err := rc.RequestWithContext(ctx, "bench.rr", payload)
		if err != nil {
			return err
		}
		if string(m.Data) != string(payload) {
			return fmt.Errorf("bench: wrong reply %q", m.Data)
		}
		return nil
	})
}
