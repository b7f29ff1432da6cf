package disker_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestInboxDeletedOnClose shows an instance that made Requests leaves no
// key of its inbox in Redis after Close, and that a reply which comes
// later, to a Request that gave up, is dropped (ErrLate) without
// re-creating it.
func TestInboxDeletedOnClose(t *testing.T) {
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	late := make(chan disker.Event, 1)
	worker := e.open(func(c *disker.Config) {
		c.OnEvent = func(ev disker.Event) {
			if ev.Kind == disker.EventLate {
				late <- ev
			}
		}
	})
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
		t.Fatal(err)
	}
	if err := worker.Handle("slow", disker.HandlerFunc(func(ctx context.Context, _ *disker.Message) ([]byte, error) {
		started <- struct{}{}
		select {
		case <-release:
			return []byte("an answer nobody waits for"), nil
		case <-ctx.Done(): // the test failed before it released the handler
			return nil, ctx.Err()
		}
	})); err != nil {
		t.Fatal(err)
	}

	client, err := disker.New(context.Background(), e.config())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := client.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo", Content: []byte("timed")}); err != nil || string(m.Content) != "echo:timed" {
		t.Fatalf("timed Request: got %v, %v", m, err)
	}
	type result struct {
		m   *disker.Message
		err error
	}
	untimed := make(chan result, 1)
	go func() {
		m, err := client.Request(context.Background(), disker.Message{Receiver: "echo", Content: []byte("untimed")})
		untimed <- result{m, err}
	}()
	if r := recv(t, untimed, 30*time.Second, "the untimed Request"); r.err != nil || string(r.m.Content) != "echo:untimed" {
		t.Fatalf("untimed Request: got %v, %v", r.m, r.err)
	}
	// A Request abandoned by Close, not by its context (a cancelled
	// context would cancel its message, and the handler would not reply).
	abandoned := make(chan error, 1)
	go func() {
		_, err := client.Request(context.Background(), disker.Message{Receiver: "slow", Content: []byte("no deadline")})
		abandoned <- err
	}()
	recv(t, started, 30*time.Second, "the slow handler to start")

	rc := rawRedis(t, e)
	pattern := e.base.KeyPrefix + ":{_inbox.*"
	if keys := scanKeys(t, rc, pattern); len(keys) == 0 {
		t.Fatal("no inbox keys before Close: the scan is wrong")
	}
	if err := client.Close(ctxTimeout(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := recv(t, abandoned, 30*time.Second, "the abandoned Request"); !errors.Is(err, disker.ErrClosed) {
		t.Fatalf("abandoned Request: got %v, want ErrClosed", err)
	}
	if keys := scanKeys(t, rc, pattern); len(keys) != 0 {
		t.Fatalf("inbox keys left after Close: %v", keys)
	}

	close(release)
	ev := recv(t, late, 30*time.Second, "the late reply to the closed inbox")
	if ev.Receiver != "slow" || !errors.Is(ev.Err, disker.ErrLate) {
		t.Fatalf("late event %+v, want one of receiver slow with ErrLate", ev)
	}
	if keys := scanKeys(t, rc, pattern); len(keys) != 0 {
		t.Fatalf("the late reply re-created inbox keys: %v", keys)
	}
}

// TestRequestTakesFirstReply shows what a second reply to a Request gets
// (its deadline leaves room for a loaded machine): the requester returns
// the first; a second reply from the instance that answered, before the
// deadline or after it, returns an error matching ErrLate that says the
// message was already answered.
func TestRequestTakesFirstReply(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		worker, client := e.open(), e.open()
		handled := make(chan *disker.Message, 1)
		if err := worker.Handle("twice", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if err := worker.Reply(ctx, m, []byte("first")); err != nil {
				t.Errorf("first Reply: %v", err)
			}
			handled <- m
			return []byte("second"), nil
		})); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		r, err := client.Request(ctx, disker.Message{Receiver: "twice"})
		if err != nil || string(r.Content) != "first" {
			t.Fatalf("Request = %v, %v; want the first reply", r, err)
		}
		m := <-handled
		if err := worker.Reply(t.Context(), m, []byte("third")); !errors.Is(err, disker.ErrLate) || !strings.Contains(err.Error(), "already answered") {
			t.Fatalf("Reply before the deadline, after the first: %v, want an error that says it was already answered", err)
		}
		time.Sleep(time.Until(m.Deadline) + 50*time.Millisecond)
		if err := worker.Reply(t.Context(), m, []byte("late")); !errors.Is(err, disker.ErrLate) {
			t.Fatalf("Reply after the deadline: %v, want ErrLate", err)
		}
	})
}
