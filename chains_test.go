package disker_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// chainOf returns the options of a chain of steps from..to to receiver r
// (content the step's number), the first step's message first.
func chainOf(r string, from, to int) (disker.Message, []disker.SendOption) {
	var opts []disker.SendOption
	for k := to; k > from; k-- {
		opts = []disker.SendOption{disker.WithThen(disker.Message{Receiver: r, Content: []byte(strconv.Itoa(k))}, opts...)}
	}
	return disker.Message{Receiver: r, Content: []byte(strconv.Itoa(from))}, opts
}

// TestChains: a chain of 10 runs each step once, in order, each after the
// one before succeeded; a step that fails stops the chain; bad chains are
// refused, nothing sent.
func TestChains(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := t.Context()
		var mu sync.Mutex
		var ran []string
		last := make(chan struct{})
		err := d.Handle("chain-step", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			mu.Lock()
			ran = append(ran, string(m.Content))
			mu.Unlock()
			switch string(m.Content) {
			case "10", "23":
				close(last)
			case "33":
				return nil, disker.NoRetry(errors.New("step 33 fails"))
			}
			return nil, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		first, opts := chainOf("chain-step", 1, 10)
		if _, err := d.Send(ctx, first, opts...); err != nil {
			t.Fatal(err)
		}
		<-last
		mu.Lock()
		if got := fmt.Sprint(ran); got != "[1 2 3 4 5 6 7 8 9 10]" {
			t.Fatalf("steps ran %s, want 1 to 10 in order, once each", got)
		}
		ran = nil
		mu.Unlock()

		// Step 33 fails: 34 and 35 never run. A chain sent after it ends
		// in step 23, which shows the receiver went on.
		last = make(chan struct{})
		first, opts = chainOf("chain-step", 31, 35)
		if _, err := d.Send(ctx, first, opts...); err != nil {
			t.Fatal(err)
		}
		first, opts = chainOf("chain-step", 21, 23)
		if _, err := d.Send(ctx, first, opts...); err != nil {
			t.Fatal(err)
		}
		<-last
		time.Sleep(200 * time.Millisecond) // a step 34 queued by mistake would run by now
		mu.Lock()
		defer mu.Unlock()
		for _, s := range ran {
			if s == "34" || s == "35" {
				t.Fatalf("steps ran %v: the chain went on after step 33 failed", ran)
			}
		}

		bad := []disker.SendOption{
			disker.WithThen(disker.Message{Receiver: "chain-step", Sender: "me"}),
			disker.WithThen(disker.Message{Receiver: "chain-step"}, disker.WithDelay(time.Second)),
			disker.WithThen(disker.Message{Receiver: ""}),
		}
		for _, o := range bad {
			var ve *disker.ValidationError
			if _, err := d.Send(ctx, disker.Message{Receiver: "chain-bad"}, o); !errors.As(err, &ve) {
				t.Fatalf("a bad chain: %v, want a *ValidationError", err)
			}
		}
		if st, err := d.Stats(ctx, "chain-bad"); err != nil || st.Length != 0 {
			t.Fatalf("after bad chains: %+v, %v", st, err)
		}
	})
}
