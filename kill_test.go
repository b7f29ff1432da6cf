package disker_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// childEnv, when set in the environment of the test binary, makes it run
// as a worker process (runChild) instead of the tests.
const childEnv = "DISKER_TEST_CHILD"

const childLease = time.Second

// runChild serves the receiver named by DISKER_TEST_RECEIVER on the broker
// at DISKER_TEST_URL (key prefix DISKER_TEST_PREFIX) with a handler that
// prints "started ID ATTEMPT" and then blocks for good. It is killed by the
// test.
func runChild() int {
	d, err := disker.New(disker.Config{
		RedisURL:  os.Getenv("DISKER_TEST_URL"),
		KeyPrefix: os.Getenv("DISKER_TEST_PREFIX"),
		Logger:    testLogger(),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	block := make(chan struct{})
	err = d.Handle(os.Getenv("DISKER_TEST_RECEIVER"), disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		fmt.Printf("started %s %d\n", m.ID, m.Attempt)
		<-block
		return nil, nil
	}), disker.WithLease(childLease))
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
	t.Parallel()
	e := newEnv(t, true, redisURL)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=worker",
		"DISKER_TEST_URL="+e.url, "DISKER_TEST_PREFIX="+e.base.KeyPrefix, "DISKER_TEST_RECEIVER=jobs")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe() // kept open: the child runs while it is
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		s := bufio.NewScanner(out)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	if l := recv(t, lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}

	d := e.open()
	id, err := d.Send(ctxTimeout(t, 5*time.Second), disker.Message{Receiver: "jobs", Content: []byte("job")}, disker.WithFireAndForget())
	if err != nil {
		t.Fatal(err)
	}
	if l := recv(t, lines, 30*time.Second, "the child to start the job"); l != "started "+id+" 1" {
		t.Fatalf("child said %q, want %q", l, "started "+id+" 1")
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	err = cmd.Wait()
	for range lines { // the pipe closes with the process
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want killed by SIGKILL", err)
	}

	got := make(chan *disker.Message, 2)
	if err := d.Handle("jobs", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		got <- m
		return nil, nil
	}), disker.WithLease(childLease)); err != nil {
		t.Fatal(err)
	}
	m := recv(t, got, 30*time.Second, "the redelivery")
	if m.ID != id || m.Attempt != 2 || string(m.Content) != "job" {
		t.Fatalf("redelivered %s attempt %d content %q, want %s attempt 2 content job", m.ID, m.Attempt, m.Content, id)
	}
	waitFor(t, 10*time.Second, "the queue to be empty", func() bool {
		s, err := d.Stats(context.Background(), "jobs")
		return err == nil && s.Length == 0 && s.Pending == 0
	})
}
