package brokertest

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// testTokens: a bucket starts full (burst), gives no more than it holds,
// says how long until the next token, refills at the rate on broker time,
// and takes back unused tokens up to burst.
func testTokens(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	take := func(want int) (int, time.Duration) {
		t.Helper()
		took, wait, err := b.TakeTokens(ctx, &broker.TokensParams{Receiver: r, Want: want, Rate: 20, Burst: 5})
		if err != nil {
			t.Fatalf("TakeTokens(%d): %v", want, err)
		}
		return took, wait
	}
	if took, _ := take(3); took != 3 {
		t.Fatalf("first take of 3 from a bucket of 5: took %d", took)
	}
	if took, _ := take(10); took != 2 {
		t.Fatalf("take of 10 with 2 left: took %d, want 2", took)
	}
	took, wait := take(1)
	if took != 0 || wait <= 0 || wait > 60*time.Millisecond {
		t.Fatalf("take from an empty bucket refilled at 20/s: took %d, wait %v; want 0 and a wait in (0, 50ms]", took, wait)
	}
	if took, _ := take(-2); took != 0 {
		t.Fatalf("putting back 2: took %d, want 0", took)
	}
	if took, _ := take(2); took != 2 {
		t.Fatalf("take of the 2 put back: took %d", took)
	}
	// Refill: within Patience at 20/s, the bucket is full again, and never
	// holds more than burst.
	start, _ := b.Now(ctx)
	waitBrokerTime(t, b, start.Add(300*time.Millisecond))
	if took, _ := take(10); took != 5 {
		t.Fatalf("take of 10 after 300ms at 20/s: took %d, want the burst, 5", took)
	}
	if _, _, err := b.TakeTokens(ctx, &broker.TokensParams{Receiver: r, Want: 1, Rate: 0, Burst: 5}); err == nil {
		t.Fatal("TakeTokens with Rate 0: no error")
	}
}

// testSlots: holders share a limit; giving back frees slots; a holder
// whose lease ran out (broker time) loses its slots to the others.
func testSlots(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	var had int // what the last call found the holder held
	slots := func(holder string, delta int, lease time.Duration) int {
		t.Helper()
		n, h, err := b.Slots(ctx, &broker.SlotsParams{Receiver: r, Holder: holder, Delta: delta, Limit: 5, Lease: lease})
		if err != nil {
			t.Fatalf("Slots(%s, %d): %v", holder, delta, err)
		}
		had = h
		return n
	}
	if n := slots("a", 3, shortLease); n != 3 {
		t.Fatalf("a takes 3 of 5: holds %d", n)
	}
	if n := slots("b", 4, longLease); n != 2 {
		t.Fatalf("b asks 4 with 2 free: holds %d, want 2", n)
	}
	if n := slots("c", 1, longLease); n != 0 {
		t.Fatalf("c asks 1 with none free: holds %d, want 0", n)
	}
	if n := slots("b", -1, longLease); n != 1 {
		t.Fatalf("b gives back 1 of 2: holds %d, want 1", n)
	}
	if n := slots("c", 2, longLease); n != 1 {
		t.Fatalf("c asks 2 with 1 free: holds %d, want 1", n)
	}
	if n := slots("c", 0, longLease); n != 1 || had != 1 {
		t.Fatalf("c renews: holds %d (had %d), want 1 (had 1)", n, had)
	}
	// a stops renewing: once its lease has run out, its 3 slots are free.
	eventually(t, "a's slots freed after its lease", func() bool { return slots("c", 3, longLease) == 4 })
	if n := slots("a", 0, shortLease); n != 0 || had != 0 {
		t.Fatalf("a, whose lease ran out, renews: holds %d (had %d), want 0 (had 0)", n, had)
	}
	slots("b", -10, longLease)
	slots("c", -10, longLease)
	if n := slots("a", 9, longLease); n != 5 || had != 0 {
		t.Fatalf("a alone after the others gave all back: holds %d, want 5", n)
	}
	slots("a", -5, longLease)
}

// testRetryUncounted: a delivery given back uncounted comes back with the
// same attempt, at once.
func testRetryUncounted(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	env := newEnv(r, "job")
	send(t, b, env)
	d1 := fetchOne(t, b, r, "first", longLease)
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "first", Ref: d1.Ref, Lease: longLease, Uncounted: true}); err != nil {
		t.Fatalf("Retry uncounted: %v", err)
	}
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "second", Lease: longLease, MaxAttempts: 1})
	if len(ds) != 1 || ds[0].Attempt != 1 || ds[0].Ref != d1.Ref {
		t.Fatalf("after an uncounted retry with MaxAttempts 1: got %+v, want the message again at attempt 1", ds)
	}
	checkEnv(t, "given back", ds[0].Env, env)
	ack(t, b, r, ds[0].Ref)
}
