package disker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestProgressStreamed shows Message.Progress on a message from a
// RequestStream: its caller gets each progress in order with the partial
// replies (Part.Progress set), without a retention as with one (then the
// result keeps the latest too); after the final reply, Progress is late.
func TestProgressStreamed(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		after := make(chan error, 1)
		if err := worker.Handle("prog", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			for _, step := range []func() error{
				func() error { return m.Progress(ctx, []byte("1/2")) },
				func() error { return m.Partial(ctx, []byte("a")) },
				func() error { return m.Progress(ctx, []byte("2/2")) },
				func() error { return m.Partial(ctx, []byte("b")) },
			} {
				if err := step(); err != nil {
					return nil, err
				}
			}
			if err := worker.Reply(ctx, m, []byte("done")); err != nil {
				return nil, err
			}
			after <- m.Progress(ctx, []byte("late"))
			return nil, disker.ErrReplyLater
		})); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		want := []disker.Part{{Content: []byte("1/2"), Progress: true, Attempt: 1}, {Content: []byte("a"), Attempt: 1},
			{Content: []byte("2/2"), Progress: true, Attempt: 1}, {Content: []byte("b"), Attempt: 1}}
		for _, retained := range []bool{false, true} {
			var opts []disker.SendOption
			if retained {
				opts = append(opts, disker.WithRetention(time.Hour), disker.WithTimeout(30*time.Second))
			}
			var id string
			parts, reply, err := streamItems(t, client.RequestStream(ctx, disker.Message{Receiver: "prog"}, opts...))
			if err != nil || reply == nil || string(reply.Content) != "done" {
				t.Fatalf("retained %v: final item: %v, %v; want the reply done", retained, reply, err)
			}
			id = reply.InReplyTo
			if len(parts) != len(want) {
				t.Fatalf("retained %v: got %d parts %+v, want %d", retained, len(parts), parts, len(want))
			}
			for i, p := range parts {
				w := want[i]
				if string(p.Content) != string(w.Content) || p.Progress != w.Progress || p.Attempt != w.Attempt || p.Restart {
					t.Fatalf("retained %v: part %d: %+v, want %+v", retained, i, p, w)
				}
			}
			err = recv(t, after, 10*time.Second, "the progress after the reply")
			if !errors.Is(err, disker.ErrResultFinal) {
				t.Fatalf("retained %v: Progress after the final reply = %v, want ErrResultFinal", retained, err)
			}
			if !retained {
				continue
			}
			r, err := client.WaitResult(ctx, "prog", id)
			if err != nil || r.State != disker.ResultSucceeded || string(r.Progress) != "2/2" {
				t.Fatalf("the retained result: %+v, %v; want succeeded with progress 2/2", r, err)
			}
		}
	})
}

// TestResultDeadLetteredRequest: a Request dead-lettered before its
// deadline keeps its dead letter as its result after the deadline passed:
// its sender got the dead-letter error, not a timeout.
func TestResultDeadLetteredRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		if err := worker.Handle("poison", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			return nil, disker.NoRetry(errors.New("poison"))
		})); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, time.Minute)
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := client.Request(rctx, disker.Message{Receiver: "poison"}, disker.WithRetention(time.Hour))
		var remote *disker.RemoteError
		if !errors.As(err, &remote) || remote.Code != disker.CodeDeadLetter {
			t.Fatalf("Request: %v, want the dead-letter error", err)
		}
		<-rctx.Done()
		r, err := client.WaitResult(ctx, "poison", remote.MessageID)
		if err != nil || r.State != disker.ResultDeadLettered {
			t.Fatalf("the result after the deadline: %+v, %v; want dead_lettered", r, err)
		}
	})
}
