package disker_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestGroupsRedisRestart kills the broker's Redis (with AOF) while keyed
// messages run, and starts it again: every message is handled, and each
// key's order holds (a message whose acknowledgement was lost runs again
// before its key's next).
func TestGroupsRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	l, _ := newOrderLog(t, 1)
	d := e.open()
	if err := d.Handle("keyed", l.handler("self", 2*time.Millisecond), disker.WithConcurrency(16), disker.WithLease(2*time.Second),
		disker.WithMaxAttempts(1000)); err != nil {
		t.Fatal(err)
	}
	msgs := keyedMessages("keyed", 200, 20)
	if _, err := d.SendEach(ctxTimeout(t, time.Minute), msgs); err != nil {
		t.Fatal(err)
	}
	total := int64(len(msgs))
	waitFor(t, time.Minute, "a quarter handled", func() bool { return l.done(t) >= total/4 })
	srv.Kill()
	time.Sleep(time.Second)
	at := l.done(t)
	srv.Restart()
	waitFor(t, 2*time.Minute, "every message handled", func() bool { return l.done(t) == total })
	t.Logf("Redis killed and restarted with %d of %d messages handled", at, total)
	l.check(t)
	waitFor(t, 30*time.Second, "the queue drained", func() bool {
		st, err := d.Stats(context.Background(), "keyed")
		return err == nil && st.Length == 0 && st.GroupWaiting == 0 && st.DeadLetters == 0
	})
}

// TestGroupsFairness: one key floods 100,000 messages, then 999 other
// keys send one each, while one instance with concurrency 32 serves them.
// Each quiet key's message is queued at once, behind at most one of the
// flood's (whose key lets one out at a time): every one starts before the
// flood's next thousand have (without groups, they would wait behind
// its whole backlog). The test logs how long the quiet messages waited.
func TestGroupsFairness(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const flood, quiet = 100000, 999
		d := e.open()
		var mu sync.Mutex
		var floodStarts int
		quietAt := make(map[string]int, quiet) // quiet key -> flood starts before it started
		quietTook := make([]time.Duration, 0, quiet)
		var sentAt time.Time
		floodAtSend := -1
		err := d.Handle("fair", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			mu.Lock()
			defer mu.Unlock()
			if m.Group == "flood" {
				floodStarts++
			} else if _, ok := quietAt[m.Group]; !ok {
				quietAt[m.Group] = floodStarts
				quietTook = append(quietTook, time.Since(sentAt))
			}
			return nil, nil
		}), disker.WithConcurrency(32))
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 5*time.Minute)
		msgs := make([]disker.Message, flood)
		for i := range msgs {
			msgs[i] = disker.Message{Receiver: "fair", Content: []byte("flood")}
		}
		if _, err := d.SendBatch(ctx, msgs, disker.WithGroup("flood")); err != nil {
			t.Fatal(err)
		}
		out := make([]disker.Outgoing, quiet)
		for i := range out {
			out[i] = disker.Outgoing{Message: disker.Message{Receiver: "fair", Content: []byte("quiet")},
				Options: []disker.SendOption{disker.WithGroup("q" + strconv.Itoa(i))}}
		}
		mu.Lock()
		sentAt, floodAtSend = time.Now(), floodStarts
		mu.Unlock()
		if _, err := d.SendEach(ctx, out); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Minute, "every quiet key's message started", func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(quietAt) == quiet
		})
		mu.Lock()
		defer mu.Unlock()
		most := 0
		for _, n := range quietAt {
			most = max(most, n-floodAtSend)
		}
		slices.Sort(quietTook)
		t.Logf("%d quiet keys behind a flood of %d: the last started %v after the send (median %v), after %d of the flood's messages",
			quiet, flood, quietTook[len(quietTook)-1].Round(time.Millisecond), quietTook[len(quietTook)/2].Round(time.Millisecond), most)
		if most >= 1000 {
			t.Fatalf("a quiet key's message started after %d of the flood's, want fewer than 1,000", most)
		}
		if st, err := d.Stats(ctx, "fair"); err != nil || st.GroupKeys != 1 {
			t.Fatalf("Stats: %+v, %v; want the flood's key alone with messages waiting", st, err)
		}
		loads, err := d.BusiestGroups(ctx, "fair", 3)
		if err != nil || len(loads) != 1 || loads[0].Key != "flood" || loads[0].Waiting < 1 {
			t.Fatalf("BusiestGroups: %v, %v", loads, err)
		}
	})
}

// TestGroupsRate: 20 keys of 60 messages each, rate 10/s and burst 2 per
// key (WithGroupRate), served for 5 s. The limit decides when a key's
// messages are queued: the k-th (from 0) of a key is queued no sooner
// than (k+1-burst)/rate after the first was sent, so no 1 s window holds
// more than burst+rate of a key's queueings. A start can lag its queueing
// (and starts bunch after a lag), never lead it: the test checks that no
// message starts sooner than its token allows, and that the keys got
// their rate, and logs the most starts of a key in any 1 s and 5 s window.
func TestGroupsRate(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const keys, each, rate, burst = 20, 60, 10, 2
		d := e.open()
		var mu sync.Mutex
		starts := make(map[string][]int64)
		err := d.Handle("rated", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			mu.Lock()
			starts[m.Group] = append(starts[m.Group], time.Now().UnixMicro())
			mu.Unlock()
			return nil, nil
		}), disker.WithConcurrency(32), disker.WithGroupConcurrency(100), disker.WithGroupRate(rate, burst))
		if err != nil {
			t.Fatal(err)
		}
		msgs := keyedMessages("rated", keys, each)
		sent := time.Now().UnixMicro()
		if _, err := d.SendEach(ctxTimeout(t, time.Minute), msgs); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		if len(starts) != keys {
			t.Fatalf("%d keys started, want %d", len(starts), keys)
		}
		least, most1, most5 := each, 0, 0
		for key, at := range starts {
			slices.Sort(at)
			for k := burst; k < len(at); k++ {
				// The broker's clock rounds to the millisecond.
				if soonest := sent + int64(k+1-burst)*1e6/rate - 2000; at[k] < soonest {
					t.Fatalf("key %s: message %d started %v after the send, sooner than its token (%v)", key, k,
						time.Duration(at[k]-sent)*time.Microsecond, time.Duration(k+1-burst)*time.Second/rate)
				}
			}
			least = min(least, len(at))
			most1, most5 = max(most1, mostWithin(at, time.Second)), max(most5, mostWithin(at, 5*time.Second))
		}
		t.Logf("%d keys at %d/s, burst %d, for 5s: the most starts of a key in 1s %d, in 5s %d; the least started %d", keys, rate, burst, most1, most5, least)
		if least < 3*rate {
			t.Fatalf("a key started only %d messages in 5s, want more than %d at %d/s", least, 3*rate, rate)
		}
	})
}

// TestGroupsValidation: the group options refuse bad values with a
// *ValidationError naming them.
func TestGroupsValidation(t *testing.T) {
	d := newEnv(t, false, "").open()
	ctx := ctxTimeout(t, 10*time.Second)
	msg := disker.Message{Receiver: "r", Content: []byte("x")}
	h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) { return nil, nil })
	cases := []struct {
		field string
		err   error
	}{
		{"WithGroup", second(d.Send(ctx, msg, disker.WithGroup("")))},
		{"WithGroup", second(d.Send(ctx, msg, disker.WithGroup(string(make([]byte, disker.MaxKeyLen+1)))))},
		{"WithGroupConcurrency", d.Handle("a", h, disker.WithGroupConcurrency(0))},
		{"WithGroupConcurrency", d.Handle("a", h, disker.WithGroupConcurrency(disker.MaxGroupConcurrency+1))},
		{"WithGroupRate.rate", d.Handle("a", h, disker.WithGroupRate(0, 1))},
		{"WithGroupRate.rate", d.Handle("a", h, disker.WithGroupRate(-1, 1))},
		{"WithGroupRate.burst", d.Handle("a", h, disker.WithGroupRate(1, 0))},
		{"n", second(d.BusiestGroups(ctx, "r", 0))},
		{"n", second(d.BusiestGroups(ctx, "r", disker.MaxBusiestGroups+1))},
	}
	for i, c := range cases {
		var ve *disker.ValidationError
		if !errors.As(c.err, &ve) || ve.Field != c.field {
			t.Errorf("case %d: got %v, want a *ValidationError of %s", i, c.err, c.field)
		}
	}
}

func second[T any](_ T, err error) error { return err }

// TestGroupsRequest: a Request in a group, deferred and urgent at once,
// gets its reply after the key's earlier message, which holds the key.
func TestGroupsRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		release := make(chan struct{})
		err := d.Handle("keyed-rr", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if string(m.Content) == "first" {
				<-release
			}
			return append([]byte(m.Group+":"), m.Content...), nil
		}), disker.WithConcurrency(4))
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 30*time.Second)
		if _, err := d.Send(ctx, disker.Message{Receiver: "keyed-rr", Content: []byte("first")}, disker.WithGroup("k")); err != nil {
			t.Fatal(err)
		}
		type result struct {
			m   *disker.Message
			err error
		}
		got := make(chan result, 1)
		go func() {
			m, err := d.Request(ctx, disker.Message{Receiver: "keyed-rr", Content: []byte("second")},
				disker.WithGroup("k"), disker.WithDelay(50*time.Millisecond), disker.WithPriority(disker.PriorityHigh))
			got <- result{m, err}
		}()
		waitFor(t, 10*time.Second, "the request waiting behind its key", func() bool {
			st, err := d.Stats(ctx, "keyed-rr")
			return err == nil && st.GroupWaiting == 1
		})
		select {
		case r := <-got:
			t.Fatalf("the Request returned while its key's first message ran: %v, %v", r.m, r.err)
		default:
		}
		close(release)
		r := <-got
		if r.err != nil || string(r.m.Content) != "k:second" {
			t.Fatalf("Request: %v, %v; want the reply k:second", r.m, r.err)
		}
	})
}
