package disker_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestStatsOf shows that StatsOf answers, in order, what Stats answers for
// each of many receivers (on a Cluster, spread over its nodes), with the
// oldest waiting message's time.
func TestStatsOf(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		names := make([]string, 40)
		msgs := []disker.Message{}
		for i := range names {
			names[i] = fmt.Sprintf("many%02d", i)
			for range i % 3 {
				msgs = append(msgs, disker.Message{Receiver: names[i], Content: []byte("x"), FireAndForget: true})
			}
		}
		if _, err := d.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		got, err := d.StatsOf(ctx, names...)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(names) {
			t.Fatalf("StatsOf %d receivers: got %d", len(names), len(got))
		}
		for i, name := range names {
			want, err := d.Stats(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got[i] != want || got[i].Queued != int64(i%3) || got[i].OldestQueued.IsZero() != (i%3 == 0) {
				t.Errorf("StatsOf[%d] = %+v; Stats = %+v, want %d queued", i, got[i], want, i%3)
			}
		}
		if _, err := d.StatsOf(ctx, "ok", ""); err == nil {
			t.Errorf("StatsOf with an empty name: got no error")
		}
	})
}
