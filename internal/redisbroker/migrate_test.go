package redisbroker

import (
	"strconv"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// TestLegacyKeysMigrated writes what an instance of version 0.1 left
// under the former key names (a deferred message due now and one due
// later, a retry, a periodic schedule), and shows that this broker finds
// each under the current names and leaves nothing under the former ones:
// the due message is delivered, the later one cancelled, the schedule
// listed.
func TestLegacyKeysMigrated(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	rc := rawClient(t, srv)
	r := "legacy"
	fetch1(t, b, broker.FetchParams{Receiver: r, Consumer: "setup", Lease: time.Minute}) // the group
	now := time.Now().UnixMilli()
	due, later := env("due", r), env("later", r)
	for _, m := range []struct {
		env *broker.Envelope
		at  int64
	}{{due, now - 1000}, {later, now + 3_600_000}} {
		do(t, rc, "ZADD", b.keys.legacyDeferred(r), strconv.FormatInt(m.at, 10), m.env.ID)
		do(t, rc, "HSET", b.keys.legacyDeferredMessages(r), m.env.ID, ":"+string(wire.Encode(m.env)))
	}
	do(t, rc, "ZADD", b.keys.legacyRetries(r), strconv.FormatInt(now+3_600_000, 10), "1-1")
	do(t, rc, "HSET", b.keys.legacySchedule(r, "nightly"), "def", "{}", "v", "1", "next", strconv.FormatInt(now+60_000, 10), "lt", "", "ls", "")
	do(t, rc, "HSET", b.keys.scheduleIndex(), "nightly", r)

	var got []broker.Delivery
	eventually(t, "the legacy deferred message due now", func() bool {
		got = append(got, fetch1(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Lease: time.Minute})...)
		return len(got) > 0
	})
	if len(got) != 1 || got[0].Env.ID != due.ID {
		t.Fatalf("delivered %+v, want %s", got, due.ID)
	}
	if c, err := b.Cancel(ctx, &broker.CancelParams{Receiver: r, ID: later.ID, MaxScan: 10}); err != nil || c.State != broker.CancelDeferred {
		t.Fatalf("Cancel of the legacy deferred message: %+v, %v", c, err)
	}
	if n, _ := do(t, rc, "ZCARD", b.keys.retries(r)).AsInt64(); n != 1 {
		t.Fatalf("retries: %d entries, want the legacy one", n)
	}
	recs, err := b.ListSchedules(ctx)
	if err != nil || len(recs) != 1 || recs[0].Name != "nightly" || recs[0].Receiver != r {
		t.Fatalf("ListSchedules: %+v, %v; want the legacy schedule", recs, err)
	}
	for _, k := range []string{b.keys.legacyDeferred(r), b.keys.legacyDeferredMessages(r), b.keys.legacyRetries(r), b.keys.legacySchedule(r, "nightly")} {
		if n, _ := do(t, rc, "EXISTS", k).AsInt64(); n != 0 {
			t.Fatalf("%s is left behind", k)
		}
	}
}
