package redisbroker

import (
	"slices"
	"testing"
	"time"
)

// TestReturningWorkerLeavesTheDeparted: a worker whose registry entry
// lapsed (a stall longer than its heartbeat's ttl) and that heartbeats
// again is no longer departed for its peers after their next heartbeat,
// so that their fetches stop reclaiming its deliveries at once.
func TestReturningWorkerLeavesTheDeparted(t *testing.T) {
	t.Parallel()
	prefix := newBroker(t).keys.prefix
	a := newBrokerOn(t, srv, Config{KeyPrefix: prefix})
	b := newBrokerOn(t, srv, Config{KeyPrefix: prefix})
	ctx := ctxT(t)
	beat := func(x *Broker, id string, ttl time.Duration) { heartbeat(t, x, id, ttl) }
	beat(b, "b", time.Hour)
	beat(a, "a", 20*time.Millisecond)
	eventually(t, "a's entry to lapse", func() bool {
		ws, err := b.Workers(ctx)
		return err == nil && len(ws) == 1
	})
	beat(b, "b", time.Hour) // sweeps a into the departed
	if !slices.Contains(b.departedWorkers(), "a") {
		t.Fatalf("b's departed workers %v, want a among them", b.departedWorkers())
	}
	beat(a, "a", time.Hour) // a is back
	if slices.Contains(a.departedWorkers(), "a") {
		t.Errorf("a's departed workers %v after its heartbeat: a among them", a.departedWorkers())
	}
	beat(b, "b", time.Hour)
	if slices.Contains(b.departedWorkers(), "a") {
		t.Errorf("b's departed workers %v after a came back and b's next heartbeat: a among them", b.departedWorkers())
	}
}
