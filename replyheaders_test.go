package disker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestReplyHeaders checks that the headers a handler sets with
// SetReplyHeader reach the requester with the reply, on every backend,
// whether the handler returns its response or calls Reply.
func TestReplyHeaders(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d, err := disker.New(context.Background(), e.config())
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close(context.Background())
		err = d.Handle("jobs", disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) ([]byte, error) {
			msg.SetReplyHeader("handled-by", "jobs")
			if string(msg.Content) == "reply" {
				return nil, d.Reply(ctx, msg, []byte("sent"))
			}
			return []byte("returned"), nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, content := range []string{"return", "reply"} {
			reply, err := d.Request(ctx, disker.Message{Receiver: "jobs", Content: []byte(content)})
			if err != nil {
				t.Fatal(err)
			}
			if got := reply.Headers["handled-by"]; got != "jobs" {
				t.Errorf("%s: the reply's headers are %v, want handled-by=jobs", content, reply.Headers)
			}
		}
	})
}

// TestOversizedReplyDeadLetteredAtOnce: a handler whose reply is over
// MaxMessageSize is not retried (no retry can make it fit): the message is
// dead-lettered at once with the reason, and the requester learns it at
// once, not at its deadline.
func TestOversizedReplyDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, "")
	d := e.open(func(c *disker.Config) { c.MaxMessageSize = 1024 })
	if err := d.Handle("big", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		return make([]byte, 2048), nil
	})); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := d.Request(ctx, disker.Message{Receiver: "big"})
	var re *disker.RemoteError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "over the limit") {
		t.Fatalf("Request = %v, want a remote error that says the reply is over the limit", err)
	}
	s := d.LocalStats().Receivers["big"]
	if s.Retried != 0 || s.DeadLettered != 1 {
		t.Fatalf("retried %d, dead-lettered %d; want 0 and 1", s.Retried, s.DeadLettered)
	}
	dls, err := d.DeadLetters(ctx, "big", 10)
	if err != nil || len(dls) != 1 || !strings.Contains(dls[0].Reason, "over the limit") {
		t.Fatalf("DeadLetters = %+v, %v; want one, with the reason", dls, err)
	}
	if re.MessageID == "" || re.MessageID != dls[0].Message.ID {
		t.Fatalf("RemoteError.MessageID = %q, want the dead-lettered message's id %q", re.MessageID, dls[0].Message.ID)
	}
}

// TestReplyLater: a handler that returns ErrReplyLater sends no reply; a
// Reply from elsewhere, before the deadline, is the one the requester
// gets, and a second Reply returns an error that says so (matching
// ErrLate), never nil.
func TestReplyLater(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		held := make(chan *disker.Message, 1)
		if err := d.Handle("later", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			held <- m
			return nil, disker.ErrReplyLater
		})); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		type result struct {
			m   *disker.Message
			err error
		}
		res := make(chan result, 1)
		go func() {
			m, err := d.Request(ctx, disker.Message{Receiver: "later", Content: []byte("q")})
			res <- result{m, err}
		}()
		m := recv(t, held, 30*time.Second, "the request")
		waitFor(t, 10*time.Second, "the handler to be done", func() bool {
			return d.LocalStats().Receivers["later"].Processed == 1
		})
		if err := d.Reply(ctx, m, []byte("answer")); err != nil {
			t.Fatalf("Reply: %v", err)
		}
		r := recv(t, res, 30*time.Second, "the Request to return")
		if r.err != nil || string(r.m.Content) != "answer" {
			t.Fatalf("Request = %v, %v; want the later reply %q", r.m, r.err, "answer")
		}
		err := d.Reply(ctx, m, []byte("again"))
		if !errors.Is(err, disker.ErrLate) || !strings.Contains(err.Error(), "already answered") {
			t.Fatalf("a second Reply = %v, want an error that says the message was already answered", err)
		}
	})
}
