package disker_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes, for a logger.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestTimeoutHandlerWithoutReplyHandler: a sender with only a
// TimeoutHandler gets the default reply handler, which logs each reply at
// Info with the sender and the request's id and counts it; OnReply then
// replaces the default, and RemoveReplyHandler brings it back.
func TestTimeoutHandlerWithoutReplyHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker := e.open()
		if err := worker.Handle("answer", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		var logs syncBuffer
		d := e.open(func(c *disker.Config) {
			c.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
		})
		ctx := ctxTimeout(t, 30*time.Second)
		timedOut := make(chan string, 1)
		if err := d.OnTimeout("asker", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timedOut <- m.ID })); err != nil {
			t.Fatal(err)
		}

		id, err := d.Send(ctx, disker.Message{Sender: "asker", Receiver: "answer", Content: []byte("q")}, disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		// The default handler counts the reply, then logs it.
		waitFor(t, 20*time.Second, "the reply to be counted and logged", func() bool {
			return d.LocalStats().UnhandledReplies == 1 && strings.Contains(logs.String(), "id="+id)
		})
		line := ""
		for l := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(l, "id="+id) {
				line = l
			}
		}
		if !strings.Contains(line, "level=INFO") || !strings.Contains(line, "sender=asker") {
			t.Fatalf("no Info log line with sender=asker and id=%s:\n%s", id, logs.String())
		}

		// The timeout handler still gets the notices.
		lost, err := d.Send(ctx, disker.Message{Sender: "asker", Receiver: "nobody-serves"}, disker.WithTimeout(50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		if got := recv(t, timedOut, 20*time.Second, "the timeout notice"); got != lost {
			t.Fatalf("timeout notice for %s, want %s", got, lost)
		}

		// OnReply replaces the default.
		replies := make(chan string, 1)
		if err := d.OnReply("asker", disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) { replies <- m.InReplyTo })); err != nil {
			t.Fatalf("OnReply after OnTimeout: %v", err)
		}
		id, err = d.Send(ctx, disker.Message{Sender: "asker", Receiver: "answer"}, disker.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if got := recv(t, replies, 20*time.Second, "the reply"); got != id {
			t.Fatalf("reply to %s, want %s", got, id)
		}
		if n := d.LocalStats().UnhandledReplies; n != 1 {
			t.Fatalf("UnhandledReplies = %d after OnReply, want 1", n)
		}

		// Removing it brings the default back; the default itself is not
		// removable on its own.
		if err := d.RemoveReplyHandler("asker"); err != nil {
			t.Fatal(err)
		}
		if err := d.RemoveReplyHandler("asker"); !errors.Is(err, disker.ErrNotHandled) {
			t.Fatalf("RemoveReplyHandler of the default = %v, want ErrNotHandled", err)
		}
		if _, err := d.Send(ctx, disker.Message{Sender: "asker", Receiver: "answer"}, disker.WithTimeout(time.Minute)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "the second reply to be counted", func() bool { return d.LocalStats().UnhandledReplies == 2 })
		if err := d.RemoveTimeoutHandler("asker"); err != nil {
			t.Fatal(err)
		}
		if err := d.OnReply("asker", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})); err != nil {
			t.Fatalf("OnReply after RemoveTimeoutHandler: %v", err)
		}
	})
}
