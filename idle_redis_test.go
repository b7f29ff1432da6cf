package disker_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestIdleCommandRateFlatInReceivers: the Redis commands per second of an
// idle instance, heartbeats aside (their HSETs, one per receiver), do not
// grow with its receivers: 200 idle receivers cost Redis at most about
// what 10 do (no poll of each pause flag, no fetch script per block time
// of each stream). It logs both rates and their commands from INFO
// commandstats.
func TestIdleCommandRateFlatInReceivers(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement of several seconds: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t, true, srv.URL())
	rc := rawRedis(t, e)
	measure := func(n int) float64 {
		d := e.open(func(c *disker.Config) {
			c.ReceiverBlockTimeout = disker.DefaultReceiverBlockTimeout
			c.HeartbeatInterval = disker.DefaultHeartbeatInterval
		})
		for i := range n {
			if err := d.Handle("idle-"+strconv.Itoa(i), disker.HandlerFunc(echo)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second) // settle: the first fetches, the first heartbeat
		const window = 5 * time.Second
		calls, _, per := commandsOver(t, rc, window, func(name string) bool {
			return name == "cmdstat_hset" // the heartbeats of the receivers
		})
		ctx := ctxTimeout(t, 30*time.Second)
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		perSec := float64(calls) / window.Seconds()
		t.Logf("%d idle receivers: %.1f Redis commands/s besides heartbeat HSETs (calls in %v: %s)", n, perSec, window, per)
		return perSec
	}
	few := measure(10)
	many := measure(200)
	// 20 times the receivers: a rate that grew with them would be near 20
	// times; flat is about the same. Generous: 3 times, and 20 commands/s.
	if many > 3*few+20 {
		t.Fatalf("idle: %.1f commands/s with 200 receivers, %.1f with 10; want it not to grow with the receivers", many, few)
	}
}
