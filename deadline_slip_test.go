package disker_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestRequestDeadlineIsSenders: a Request whose way to Redis is held up
// after its deadline was measured (here its inbox, made while Redis holds
// writes back: CLIENT PAUSE WRITE) gives its message the deadline of its
// context, not one counted from when the send reached Redis: the worker is
// given (Message.Deadline) no later deadline than the sender's, but for
// the error of the clocks' estimate (the same host's clock here), so that
// it never starts the message after its sender's deadline, and a reply
// after that deadline is refused.
func TestRequestDeadlineIsSenders(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, true, srv.URL())
	worker, client := e.open(), e.open()
	given := make(chan time.Time, 1)
	if err := worker.Handle("deadlines", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		select {
		case given <- m.Deadline:
		default:
		}
		return []byte("ok"), nil
	})); err != nil {
		t.Fatal(err)
	}
	const hold = 1500 * time.Millisecond
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Arbitrary("CLIENT", "PAUSE").Args(ms(hold), "WRITE").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hold+3*time.Second)
	defer cancel()
	dl, _ := ctx.Deadline()
	if _, err := client.Request(ctx, disker.Message{Receiver: "deadlines", Content: []byte("x")}); err != nil {
		t.Fatalf("Request: %v", err)
	}
	got := recv(t, given, time.Minute, "the handler to start")
	// The slack is for the estimate of Redis's clock (a round trip's half
	// at most), far less than the hold that a deadline counted from the
	// send would add.
	if slack := hold / 3; got.After(dl.Add(slack)) {
		t.Fatalf("the worker was given the deadline %v after the sender's (writes held back %v before the send): want at most %v",
			got.Sub(dl), hold, slack)
	}
}

func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
