package disker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// childEnv, when set in the environment of the test binary, makes it run
// as a worker process (runChild) instead of the tests.
const childEnv = "DISKER_TEST_CHILD"

const childLease = time.Second

// longLease is a lease no test waits out, and holderHeartbeat the heartbeat
// interval of a "long-worker" child, that holds its messages with it.
const (
	longLease       = time.Hour
	holderHeartbeat = 200 * time.Millisecond
)

// runScheduler is the child "scheduler": it registers the schedule
// "proc-every-100ms" to the receiver DISKER_TEST_RECEIVER, prints "ready",
// and runs it until killed.
func runScheduler(d *disker.Disker) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.Schedule(ctx, disker.Schedule{Name: "proc-every-100ms", Receiver: os.Getenv("DISKER_TEST_RECEIVER"), Every: 100 * time.Millisecond})
	return childServes(err)
}

// childServes ends the setup of a child that serves: err, from its
// Handle, ends it (2); else it prints "ready" and runs until it is killed
// (3 should the parent go away first: stdin closes).
func childServes(err error) int {
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 3
}

// childRequestTimeout is the timeout of the requester child's Request.
const childRequestTimeout = 8 * time.Second

// runChild runs as the process childEnv names, on the broker at
// DISKER_TEST_URL (key prefix DISKER_TEST_PREFIX), until it is killed by
// the test.
//
// A "worker" serves the receiver named by DISKER_TEST_RECEIVER with a
// handler that prints "started ID ATTEMPT" and then blocks for good. A
// "requester" (instance id DISKER_TEST_INSTANCE, heartbeats every 100ms)
// prints "ready" and makes one Request to that receiver with a timeout of
// childRequestTimeout. A "long-worker" is a worker with longLease that
// heartbeats every holderHeartbeat. A "batch-worker" is a worker with a
// batch handler (serveBatchChild). A "replier" replies before it blocks
// (runReplierChild). A worker's WithMaxAttempts is
// DISKER_TEST_MAX_ATTEMPTS, when set.
func runChild() int {
	cfg := disker.Config{
		RedisURL:  os.Getenv("DISKER_TEST_URL"),
		KeyPrefix: os.Getenv("DISKER_TEST_PREFIX"),
		Logger:    testLogger(),
	}
	requester := os.Getenv(childEnv) == "requester"
	if requester {
		cfg.InstanceID = os.Getenv("DISKER_TEST_INSTANCE")
		cfg.HeartbeatInterval = 100 * time.Millisecond
		cfg.TimeoutMonitorFrequency = 20 * time.Millisecond
		cfg.ReceiverBlockTimeout = 100 * time.Millisecond
	}
	lease := childLease
	if os.Getenv(childEnv) == "long-worker" {
		lease, cfg.HeartbeatInterval = longLease, holderHeartbeat
	}
	d, err := disker.New(context.Background(), cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	switch os.Getenv(childEnv) {
	case "dedup-sender":
		runDedupChild(d)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 3
	case "idem-requester":
		runIdemChild(d)
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 3
	case "batch-children":
		return runBatchChildren(d)
	}
	if requester {
		fmt.Println("ready")
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), childRequestTimeout)
			defer cancel()
			_, _ = d.Request(ctx, disker.Message{Receiver: os.Getenv("DISKER_TEST_RECEIVER"), Content: []byte("question")})
		}()
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 3
	}
	if os.Getenv(childEnv) == "scheduler" {
		return runScheduler(d)
	}
	if os.Getenv(childEnv) == "limited" {
		return runLimitedChild(d)
	}
	if os.Getenv(childEnv) == "keyed" {
		return runKeyedChild(d)
	}
	if os.Getenv(childEnv) == "stream-worker" {
		return runStreamChild(d)
	}
	if os.Getenv(childEnv) == "replier" {
		return runReplierChild(d)
	}
	block := make(chan struct{})
	if os.Getenv(childEnv) == "batch-worker" {
		err = serveBatchChild(d, os.Getenv("DISKER_TEST_RECEIVER"), lease)
	} else {
		opts := []disker.HandleOption{disker.WithLease(lease)}
		if n, err := strconv.Atoi(os.Getenv("DISKER_TEST_MAX_ATTEMPTS")); err == nil {
			opts = append(opts, disker.WithMaxAttempts(n))
		}
		err = d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			fmt.Printf("started %s %d\n", m.ID, m.Attempt)
			<-block
			return nil, nil
		}), opts...)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	fmt.Println("ready")
	// Run until killed; if the parent goes away instead, stdin closes.
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 3
}

// TestKilledWorkerMessageRedelivered kills a worker process with SIGKILL
// while its handler runs, and shows another process handles the message
// again, as its second attempt, once the lease has ended.
func TestKilledWorkerMessageRedelivered(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	d, id := killHolder(t, e, "worker", "jobs")
	m := recv(t, serve(t, d, "jobs", childLease), 30*time.Second, "the redelivery")
	if m.ID != id || m.Attempt != 2 || string(m.Content) != "job" {
		t.Fatalf("redelivered %s attempt %d content %q, want %s attempt 2 content job", m.ID, m.Attempt, m.Content, id)
	}
	waitFor(t, 10*time.Second, "the queue to be empty", func() bool {
		s, err := d.Stats(context.Background(), "jobs")
		return err == nil && s.Length == 0 && s.Pending == 0
	})
}

// TestKilledHolderReclaimedByHeartbeat kills a worker process that holds
// a message with a lease of an hour: its heartbeat lapses after 3
// intervals, and a survivor, itself with an hour's lease, gets the message
// then, not after either lease.
func TestKilledHolderReclaimedByHeartbeat(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	d, id := killHolder(t, e, "long-worker", "held")
	if m := recv(t, serve(t, d, "held", longLease), 30*time.Second, "the redelivery of a dead holder's message"); m.ID != id || m.Attempt != 2 {
		t.Fatalf("redelivered %s attempt %d, want %s attempt 2", m.ID, m.Attempt, id)
	}
}

// TestKilledWorkersDeadLetterResult kills the worker process that runs a
// message twice (SIGKILL), with WithMaxAttempts(2): the next worker's
// fetch dead-letters it, and its retained result becomes final there,
// dead-lettered after 2 attempts, as does that of a batch's only child,
// whose batch completes.
func TestKilledWorkersDeadLetterResult(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	const receiver = "doomed"
	d := e.open()
	ctx := ctxTimeout(t, time.Minute)
	b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "doomed-done"}})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte("kept")}, disker.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	member, err := b.Send(ctx, disker.Message{Receiver: receiver, Content: []byte("child")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	start := func() *child {
		c := startChild(t, e, "worker", receiver, "", "DISKER_TEST_MAX_ATTEMPTS=2")
		if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
			t.Fatalf("child said %q, want ready", l)
		}
		return c
	}
	for attempt := 1; attempt <= 2; attempt++ {
		c := start()
		started := map[string]bool{}
		for len(started) < 2 {
			l := recv(t, c.lines, 30*time.Second, "the child to start both messages")
			id, n, _ := strings.Cut(strings.TrimPrefix(l, "started "), " ")
			if (id != kept && id != member) || n != strconv.Itoa(attempt) {
				t.Fatalf("child said %q, want attempt %d of %s or %s", l, attempt, kept, member)
			}
			started[id] = true
		}
		c.kill(t)
	}
	c := start()
	for _, id := range []string{kept, member} {
		res, err := d.WaitResult(ctx, receiver, id)
		if err != nil {
			t.Fatalf("WaitResult %s: %v", id, err)
		}
		if res.State != disker.ResultDeadLettered || res.Attempts != 2 || res.Err == nil || !strings.Contains(res.Err.Text, "lease expired") {
			t.Fatalf("the result of %s: %+v, want dead-lettered after 2 attempts", id, res)
		}
	}
	waitFor(t, 30*time.Second, "the batch to complete", func() bool {
		info, err := d.Batch(ctx, b.ID())
		if err != nil {
			t.Fatal(err)
		}
		if info.State == disker.BatchCompleted && (info.DeadLettered != 1 || info.Settled != 1 || !info.CompletionSent) {
			t.Fatalf("the completed batch: %+v, want its child dead-lettered", info)
		}
		return info.State == disker.BatchCompleted
	})
	if dls, err := d.DeadLetters(ctx, receiver, 10); err != nil || len(dls) != 2 {
		t.Fatalf("DeadLetters: %+v, %v; want the 2 messages", dls, err)
	}
	select {
	case l := <-c.lines:
		t.Fatalf("the third worker said %q: a delivery beyond 2 attempts", l)
	default:
	}
}

// killHolder starts a child of kind serving receiver, sends it a message,
// and kills it with SIGKILL once its handler has started: it returns the
// sending instance and the message's id.
func killHolder(t *testing.T, e *env, kind, receiver string) (*disker.Disker, string) {
	t.Helper()
	c := startChild(t, e, kind, receiver, "")
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}
	d := e.open()
	id, err := d.Send(ctxTimeout(t, 5*time.Second), disker.Message{Receiver: receiver, Content: []byte("job")})
	if err != nil {
		t.Fatal(err)
	}
	if l := recv(t, c.lines, 30*time.Second, "the child to start the job"); l != "started "+id+" 1" {
		t.Fatalf("child said %q, want %q", l, "started "+id+" 1")
	}
	c.kill(t)
	return d, id
}

// serve handles receiver on d with lease and hands each delivery to the
// channel it returns.
func serve(t *testing.T, d *disker.Disker, receiver string, lease time.Duration) <-chan *disker.Message {
	t.Helper()
	got := make(chan *disker.Message, 2)
	if err := d.Handle(receiver, disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		got <- m
		return nil, nil
	}), disker.WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	return got
}

// child is a test binary started as a child process (runChild).
type child struct {
	cmd    *exec.Cmd
	lines  chan string // its stdout, line by line; closed when it ends
	killed bool
}

// startChild starts the test binary as a child of kind ("worker" or
// "requester") on e's Redis, for receiver; instance is the requester's
// instance id. The child is killed when the test ends, if it was not.
func startChild(t *testing.T, e *env, kind, receiver, instance string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+kind,
		"DISKER_TEST_URL="+e.url, "DISKER_TEST_PREFIX="+e.base.KeyPrefix,
		"DISKER_TEST_RECEIVER="+receiver, "DISKER_TEST_INSTANCE="+instance)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // kept open: the child runs while it is
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close() })
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, lines: make(chan string, 4)}
	go func() {
		defer close(c.lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			c.lines <- s.Text()
		}
	}()
	t.Cleanup(func() {
		if !c.killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

// kill kills the child with SIGKILL and waits for it to end.
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.killed = true
	err := c.cmd.Wait()
	for range c.lines { // the pipe closes with the process
	}
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}
}

// TestKilledRequesterInboxExpires kills a process (SIGKILL) while its
// Request waits for a reply: the state of its inbox in Redis, its reply
// stream and nothing else, stays while it lives, and expires once its
// heartbeats have stopped, a little after the Request's deadline.
func TestKilledRequesterInboxExpires(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	const instance = "killed-requester"
	c := startChild(t, e, "requester", "questions", instance)
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}

	d := e.open()
	got := make(chan *disker.Message, 1)
	if err := d.Handle("questions", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		got <- m
		<-ctx.Done() // its deadline: the reply is late and dropped
		return []byte("too late"), nil
	})); err != nil {
		t.Fatal(err)
	}
	m := recv(t, got, 30*time.Second, "the child's request")
	inbox := "_inbox." + instance
	if m.Sender != inbox {
		t.Fatalf("request from %q, want %q", m.Sender, inbox)
	}
	rc := rawRedis(t, e)
	pattern := e.base.KeyPrefix + ":{" + inbox + "}:*"
	// No pending timeout ("t") and no copy of the request ("tm"): the
	// requester settles its Requests in the reply stream itself.
	if keys, want := scanKeys(t, rc, pattern), e.base.KeyPrefix+":{"+inbox+"}:r"; len(keys) != 1 || keys[0] != want {
		t.Fatalf("while the requester lives, its inbox keys are %v; want only %s", keys, want)
	}

	c.kill(t)
	waitFor(t, time.Minute, "the inbox keys of the killed requester to expire", func() bool {
		return len(scanKeys(t, rc, pattern)) == 0
	})
}
