package disker_test

import (
	"context"
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
