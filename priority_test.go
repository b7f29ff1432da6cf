package disker_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestPriorityOrder: 30,000 messages queued at random levels (of three)
// before a single-slot worker starts are handled every higher level before
// any lower one, and in the order sent within a level, each delivered with
// its level.
func TestPriorityOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		const n = 30000
		ctx := ctxTimeout(t, 2*time.Minute)
		d := e.open()
		levels := []disker.Priority{disker.PriorityLow, disker.PriorityNormal, disker.PriorityHigh}
		for sent := 0; sent < n; {
			byLevel := map[disker.Priority][]disker.Message{}
			for range min(1000, n-sent) {
				p := levels[rand.IntN(len(levels))]
				byLevel[p] = append(byLevel[p], disker.Message{Receiver: "prio", Content: []byte(strconv.Itoa(sent) + " " + strconv.Itoa(int(p)))})
				sent++
			}
			for p, msgs := range byLevel {
				if _, err := d.SendBatch(ctx, msgs, disker.WithPriority(p)); err != nil {
					t.Fatal(err)
				}
			}
		}
		st, err := d.Stats(ctx, "prio")
		if err != nil {
			t.Fatal(err)
		}
		if st.Queued != n || st.QueuedHigh == 0 || st.QueuedLow == 0 {
			t.Fatalf("stats before the worker starts: %+v", st)
		}
		var mu sync.Mutex
		var order []disker.Priority
		var seq []int
		done := make(chan struct{})
		w := e.open()
		if err := w.Handle("prio", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			var i, p int
			if _, err := fmt.Sscan(string(m.Content), &i, &p); err != nil || disker.Priority(p) != m.Priority {
				t.Errorf("message %q delivered with priority %v", m.Content, m.Priority)
			}
			mu.Lock()
			order = append(order, m.Priority)
			seq = append(seq, i)
			if len(order) == n {
				close(done)
			}
			mu.Unlock()
			return nil, nil
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		recv(t, done, 2*time.Minute, "every message handled")
		mu.Lock()
		defer mu.Unlock()
		last := map[disker.Priority]int{}
		for i := 1; i < n; i++ {
			if order[i] > order[i-1] {
				t.Fatalf("message %d of the handling order is at %v after one at %v", i, order[i], order[i-1])
			}
		}
		for i, p := range order {
			if prev, ok := last[p]; ok && seq[i] < prev {
				t.Fatalf("at %v, message %d handled after %d", p, seq[i], prev)
			}
			last[p] = seq[i]
		}
	})
}
