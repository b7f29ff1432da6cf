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
		d, err := disker.New(e.config())
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
			reply, err := d.Request(ctx, "jobs", []byte(content))
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
	_, err := d.Request(ctx, "big", nil)
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
}
