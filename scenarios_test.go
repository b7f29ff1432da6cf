package disker_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// The original's scenarios, each against both brokers.

func TestSendReceiveReply(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		replies := make(chan *disker.Message, 1)
		if err := client.OnReply("client", disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) {
			replies <- r
		})); err != nil {
			t.Fatal(err)
		}
		id, err := client.Send(ctxTimeout(t, 5*time.Second), disker.Message{
			Sender: "client", Receiver: "echo", Content: []byte("hi"), Headers: map[string]string{"k": "v"},
		})
		if err != nil {
			t.Fatal(err)
		}
		r := recv(t, replies, 10*time.Second, "the reply")
		if r.InReplyTo != id || string(r.Content) != "echo:hi" || r.Sender != "echo" || r.Receiver != "client" || r.Error != nil {
			t.Fatalf("reply = %+v, want InReplyTo %s, Content echo:hi, Sender echo, Receiver client", r, id)
		}
	})
}

func TestHandlerSeesMessage(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		got := make(chan *disker.Message, 1)
		var dl time.Time
		if err := d.Handle("inspect", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			dl, _ = ctx.Deadline()
			got <- m
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		before := time.Now()
		id, err := d.Send(ctxTimeout(t, 5*time.Second), disker.Message{Sender: "s", Receiver: "inspect", Content: []byte("c"), Headers: map[string]string{"a": "1"}},
			disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		m := recv(t, got, 10*time.Second, "the message")
		if m.ID != id || m.Sender != "s" || m.Receiver != "inspect" || string(m.Content) != "c" || m.Headers["a"] != "1" ||
			m.Attempt != 1 || m.Deadline.IsZero() || !m.ExpectsReply() {
			t.Fatalf("message = %+v", m)
		}
		// The deadline is a minute after Send, give or take the clock
		// offset estimate.
		if m.Deadline.Before(before.Add(time.Minute-5*time.Second)) || m.Deadline.After(time.Now().Add(time.Minute+5*time.Second)) {
			t.Fatalf("Deadline = %v, want about a minute after %v", m.Deadline, before)
		}
		if !dl.Equal(m.Deadline) {
			t.Fatalf("ctx deadline %v != Message.Deadline %v", dl, m.Deadline)
		}
	})
}

func TestTimeoutReachesTimeoutHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		timeouts := make(chan *disker.Message, 2)
		if err := d.OnTimeout("client", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
			timeouts <- m
		})); err != nil {
			t.Fatal(err)
		}
		// Nobody serves "nobody": both messages time out, and the handler
		// stays registered after the first.
		for i := range 2 {
			id, err := d.Send(ctxTimeout(t, 5*time.Second), disker.Message{
				Sender: "client", Receiver: "nobody", Content: []byte{byte(i)},
			}, disker.WithTimeout(30*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			m := recv(t, timeouts, 10*time.Second, "the timeout notice")
			if m.ID != id || m.Receiver != "nobody" || m.Sender != "client" || len(m.Content) != 1 || m.Content[0] != byte(i) {
				t.Fatalf("timeout notice = %+v, want the message %s", m, id)
			}
		}
		if got := d.LocalStats().TimedOut; got != 2 {
			t.Fatalf("LocalStats.TimedOut = %d, want 2", got)
		}
	})
}

func TestLateReplyDoesNotReachSender(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		var replies atomic.Int64
		timedOut := make(chan string, 1)
		if err := client.OnReply("client", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) { replies.Add(1) })); err != nil {
			t.Fatal(err)
		}
		if err := client.OnTimeout("client", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timedOut <- m.ID })); err != nil {
			t.Fatal(err)
		}
		replyErr := make(chan error, 1)
		if err := worker.Handle("slow", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			<-ctx.Done() // the deadline
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Errorf("handler ctx ended with %v, want DeadlineExceeded", ctx.Err())
			}
			// Reply once the sender has been told about the timeout: the
			// decision is made.
			select {
			case <-timedOut:
			case <-time.After(10 * time.Second):
				t.Error("no timeout notice")
			}
			replyErr <- worker.Reply(context.Background(), m, []byte("too late"))
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		if _, err := client.Send(ctxTimeout(t, 5*time.Second), disker.Message{Sender: "client", Receiver: "slow"},
			disker.WithTimeout(100*time.Millisecond)); err != nil {
			t.Fatal(err)
		}
		if err := recv(t, replyErr, 15*time.Second, "the late Reply"); !errors.Is(err, disker.ErrLate) {
			t.Fatalf("late Reply = %v, want ErrLate", err)
		}
		// A reply accepted by the broker would be in the stream already;
		// wait for the worker to finish, then for a read of the stream.
		waitFor(t, 10*time.Second, "the worker to settle", func() bool {
			return worker.LocalStats().Receivers["slow"].Processed == 1
		})
		if n := replies.Load(); n != 0 {
			t.Fatalf("the sender received %d replies, want 0", n)
		}
		if got := worker.LocalStats().Late; got != 1 {
			t.Fatalf("LocalStats.Late = %d, want 1", got)
		}
	})
}

func TestWorkerNeverStartsExpiredMessage(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		timedOut := make(chan string, 1)
		if err := d.OnTimeout("client", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timedOut <- m.ID })); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 10*time.Second)
		expired, err := d.Send(ctx, disker.Message{Sender: "client", Receiver: "later"}, disker.WithTimeout(20*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if id := recv(t, timedOut, 10*time.Second, "the timeout"); id != expired {
			t.Fatalf("timeout for %s, want %s", id, expired)
		}
		marker, err := d.Send(ctx, disker.Message{Receiver: "later"})
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan string, 2)
		if err := d.Handle("later", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			started <- m.ID
			return nil, nil
		})); err != nil {
			t.Fatal(err)
		}
		if id := recv(t, started, 10*time.Second, "the marker"); id != marker {
			t.Fatalf("the worker started %s, want only the marker %s", id, marker)
		}
		waitFor(t, 10*time.Second, "the expired message to be dropped", func() bool {
			return d.LocalStats().Receivers["later"].Expired == 1
		})
		select {
		case id := <-started:
			t.Fatalf("the worker started %s after the marker", id)
		default:
		}
	})
}

func TestThousandMessagesWithReplies(t *testing.T) {
	if testing.Short() {
		t.Skip("a stress test: runs without -short")
	}
	const n = 1000
	for _, senders := range []int{1, n} {
		t.Run(fmt.Sprintf("senders=%d", senders), func(t *testing.T) {
			eachBackend(t, func(t *testing.T, e *env) {
				// The default intervals: each sender's reply stream has a
				// reader, and each sender is watched for timeouts.
				defaults := func(c *disker.Config) {
					c.ReceiverBlockTimeout, c.TimeoutMonitorFrequency, c.HeartbeatInterval = 0, 0, 0
				}
				worker, client := e.open(defaults), e.open(defaults)
				if err := worker.Handle("echo", disker.HandlerFunc(echo), disker.WithConcurrency(32)); err != nil {
					t.Fatal(err)
				}
				var mu sync.Mutex
				got := make(map[string]string, n)
				for s := range senders {
					name := fmt.Sprintf("sender-%d", s)
					if err := client.OnReply(name, disker.ReplyHandlerFunc(func(_ context.Context, r *disker.Message) {
						mu.Lock()
						got[r.InReplyTo] = r.Receiver + "/" + string(r.Content)
						mu.Unlock()
					})); err != nil {
						t.Fatal(err)
					}
				}
				want := make(map[string]string, n)
				// Generous bounds, not timings: with 1,000 senders the client
				// opens a blocking connection for each sender's reader, which
				// took 25-35 s with the race detector on 2 CPUs, and over 60 s
				// once while other packages' tests ran beside it.
				ctx := ctxTimeout(t, 3*time.Minute)
				for i := range n {
					sender := fmt.Sprintf("sender-%d", i%senders)
					content := fmt.Sprint(i)
					id, err := client.Send(ctx, disker.Message{Sender: sender, Receiver: "echo", Content: []byte(content)})
					if err != nil {
						t.Fatal(err)
					}
					want[id] = sender + "/echo:" + content
				}
				waitFor(t, 3*time.Minute, "all replies", func() bool {
					mu.Lock()
					defer mu.Unlock()
					return len(got) == n
				})
				mu.Lock()
				defer mu.Unlock()
				for id, w := range want {
					if got[id] != w {
						t.Fatalf("reply to %s = %q, want %q", id, got[id], w)
					}
				}
			})
		})
	}
}

// TestTimeoutNoticeReachesOtherInstance: the instance that sent a timed
// message stops before the deadline; another instance of the same sender
// settles the timeout and its handler gets the notice.
func TestTimeoutNoticeReachesOtherInstance(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		other := e.open()
		timeouts := make(chan string, 1)
		if err := other.OnTimeout("shared", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timeouts <- m.ID })); err != nil {
			t.Fatal(err)
		}
		sender, err := disker.New(context.Background(), e.config())
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 20*time.Second)
		id, err := sender.Send(ctx, disker.Message{Sender: "shared", Receiver: "nobody"}, disker.WithTimeout(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if err := sender.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if got := recv(t, timeouts, 10*time.Second, "the timeout notice"); got != id {
			t.Fatalf("notice for %s, want %s", got, id)
		}
	})
}
