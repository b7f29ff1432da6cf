package disker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/testhook"
)

// ackCall is one call of testhook.Acked.
type ackCall struct {
	attempt int
	err     error
}

// ackCalls gathers the calls of testhook.Acked for the message ids a test
// watches; every test's instances run through it (set before any test
// starts, so that no instance reads the hook while it is set).
var ackCalls = struct {
	sync.Mutex
	calls map[string][]ackCall // by message id; present when watched
}{calls: map[string][]ackCall{}}

func init() {
	testhook.Acked = func(_, id string, attempt int, err error) {
		ackCalls.Lock()
		defer ackCalls.Unlock()
		if calls, ok := ackCalls.calls[id]; ok {
			ackCalls.calls[id] = append(calls, ackCall{attempt, err})
		}
	}
}

// watchAcks starts gathering the acknowledgements of the message ids.
func watchAcks(t *testing.T, ids ...string) {
	ackCalls.Lock()
	defer ackCalls.Unlock()
	for _, id := range ids {
		ackCalls.calls[id] = nil
	}
	t.Cleanup(func() {
		ackCalls.Lock()
		defer ackCalls.Unlock()
		for _, id := range ids {
			delete(ackCalls.calls, id)
		}
	})
}

func acksOf(id string) []ackCall {
	ackCalls.Lock()
	defer ackCalls.Unlock()
	return append([]ackCall(nil), ackCalls.calls[id]...)
}

// TestAckedHook: testhook.Acked hears, after the call returns, of each
// handled delivery's acknowledgement (batched, keyed, or made at once for
// a dedup key held until settled) with its message id and attempt, and of
// no failed attempt.
func TestAckedHook(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		const receiver = "acked.hook"
		h := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			if string(m.Content) == "retry" && m.Attempt == 1 {
				return nil, errors.New("first attempt fails")
			}
			return nil, nil
		})
		sends := []struct {
			content string
			opts    []disker.SendOption
			attempt int
		}{
			{"plain", nil, 1},
			{"keyed", []disker.SendOption{disker.WithGroup("k")}, 1},
			{"dedup", []disker.SendOption{disker.WithDedupUntilSettled("d", time.Minute)}, 1},
			{"retry", nil, 2},
		}
		// Sent before the receiver is served: watched before handled.
		ids := make([]string, len(sends))
		for i, s := range sends {
			id, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(s.content)}, s.opts...)
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = id
		}
		watchAcks(t, ids...)
		if err := d.Handle(receiver, h, disker.WithBackoff(func(int) time.Duration { return time.Millisecond })); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, "an acknowledgement of each message", func() bool {
			for _, id := range ids {
				if len(acksOf(id)) == 0 {
					return false
				}
			}
			return true
		})
		st, err := d.Stats(ctx, receiver)
		if err != nil {
			t.Fatal(err)
		}
		if st.Length != 0 {
			t.Errorf("Stats after every acknowledgement returned: length %d, want 0", st.Length)
		}
		for i, s := range sends {
			calls := acksOf(ids[i])
			if len(calls) != 1 || calls[0].attempt != s.attempt || calls[0].err != nil {
				t.Errorf("%s: acknowledgements %+v, want one of attempt %d without error", s.content, calls, s.attempt)
			}
		}
	})
}
