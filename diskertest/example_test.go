package diskertest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
)

// Retries come when the kit's clock reaches them: here a handler that
// fails twice, retried after a minute, then two.
func ExampleKit_Advance() {
	t := new(testing.T) // example: a test has its own t
	kit := diskertest.New(t)
	defer kit.Disker().Close(context.Background()) // example: in a test, t.Cleanup closes the kit
	d := kit.Disker()

	flaky := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		if m.Attempt < 3 {
			return nil, errors.New("not yet")
		}
		return nil, nil
	})
	backoff := func(attempt int) time.Duration { return time.Duration(attempt) * time.Minute }
	if err := d.Handle("sync", flaky, disker.WithBackoff(backoff)); err != nil {
		t.Fatal(err)
	}
	start := kit.Now()
	d.Send(context.Background(), disker.Message{Receiver: "sync"})
	for range 4 {
		for _, dv := range kit.Drain() {
			fmt.Printf("at +%v: attempt %d %v", kit.Now().Sub(start), dv.Message.Attempt, dv.Outcome)
			if dv.Outcome == diskertest.Retried {
				fmt.Printf(", again at +%v", dv.RetryAt.Sub(start))
			}
			fmt.Println()
		}
		kit.Advance(time.Minute)
	}
	// Output:
	// at +0s: attempt 1 retried, again at +1m0s
	// at +1m0s: attempt 2 retried, again at +3m0s
	// at +3m0s: attempt 3 handled
}

// A schedule sends a message for each of its ticks that Advance crosses.
func ExampleKit_Advance_schedule() {
	t := new(testing.T) // example: a test has its own t
	kit := diskertest.New(t, diskertest.WithStart(time.Date(2030, 1, 1, 8, 0, 0, 0, time.UTC)))
	defer kit.Disker().Close(context.Background()) // example: in a test, t.Cleanup closes the kit
	d := kit.Disker()

	err := d.Schedule(context.Background(), disker.Schedule{Name: "standup", Receiver: "chat", Cron: "30 9 * * 1-5", Content: []byte("standup!")})
	if err != nil {
		t.Fatal(err)
	}
	kit.Advance(7 * 24 * time.Hour)
	for _, s := range kit.Sent("chat") {
		fmt.Println(s.Due.Format("Mon 15:04"), string(s.Message.Content))
	}
	// Output:
	// Tue 09:30 standup!
	// Wed 09:30 standup!
	// Thu 09:30 standup!
	// Fri 09:30 standup!
	// Mon 09:30 standup!
}

// Request sends, runs the handler, and returns the reply, as a caller of
// Disker.Request gets it.
func ExampleKit_Request() {
	t := new(testing.T) // example: a test has its own t
	kit := diskertest.New(t)
	defer kit.Disker().Close(context.Background()) // example: in a test, t.Cleanup closes the kit
	d := kit.Disker()

	err := d.Handle("greet", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		if len(m.Content) == 0 {
			return nil, disker.NoRetry(errors.New("whom?"))
		}
		return fmt.Appendf(nil, "hello, %s", m.Content), nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	reply, err := kit.Request(disker.Message{Receiver: "greet", Content: []byte("ann")})
	fmt.Println(string(reply.Content), err)
	_, err = kit.Request(disker.Message{Receiver: "greet"})
	var re *disker.RemoteError
	if errors.As(err, &re) {
		fmt.Println(re.Code, re.Text)
	}
	// Output:
	// hello, ann <nil>
	// dead_letter whom?
}
