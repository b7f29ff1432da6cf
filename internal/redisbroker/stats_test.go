package redisbroker

import (
	"testing"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestStatsManyAfterScriptFlush shows that StatsMany answers when Redis has
// forgotten the stats script (a restart, SCRIPT FLUSH): the receivers
// answered NOSCRIPT are read again with the script's source.
func TestStatsManyAfterScriptFlush(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	for _, r := range []string{"a", "b", "b"} {
		if _, err := sendEnv(ctx, b, &broker.Envelope{ID: "m", Receiver: r, Content: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := do(t, rawClient(t, s), "SCRIPT", "FLUSH").Error(); err != nil {
			t.Fatal(err)
		}
		got, err := b.StatsMany(ctx, []string{"a", "b", "c"})
		if err != nil {
			t.Fatalf("StatsMany after SCRIPT FLUSH: %v", err)
		}
		for i, want := range []int64{1, 2, 0} {
			if got[i].Queued != want {
				t.Errorf("StatsMany after SCRIPT FLUSH [%d] = %+v, want %d queued", i, got[i], want)
			}
		}
	}
}
