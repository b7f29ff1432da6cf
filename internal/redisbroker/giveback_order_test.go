package redisbroker

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestGivenBackBeforeNewer: an entry the hub read for a waiter that left,
// and gave back (parkFor), is served before an entry sent after it to the
// same level, by every instance: here by another broker, whose reclaim was
// not due (it fetched a moment before), and whose next fetch would read
// only new entries.
func TestGivenBackBeforeNewer(t *testing.T) {
	t.Parallel()
	for _, max := range []int{1, 10} {
		t.Run("max"+strconv.Itoa(max), func(t *testing.T) {
			t.Parallel()
			givenBackBeforeNewer(t, max)
		})
	}
}

// givenBackBeforeNewer is TestGivenBackBeforeNewer with a last fetch of
// up to max entries.
func givenBackBeforeNewer(t *testing.T, max int) {
	prefix := redistest.Prefix(t)
	b := newBrokerOn(t, srv, Config{KeyPrefix: prefix})
	b2 := newBrokerOn(t, srv, Config{KeyPrefix: prefix})
	b.direct = nil // every blocking read through the hub
	ctx := ctxT(t)
	fetch := func(ctx context.Context, receiver string) error {
		_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
		return err
	}
	// b2 has fetched a: its next reclaim is not due for a while.
	if ds := fetch1(t, b2, broker.FetchParams{Receiver: "a", Consumer: "d", Lease: time.Minute}); len(ds) != 0 {
		t.Fatalf("first fetch = %+v; want none", ds)
	}
	endB := leftWaiter(t, ctx, b, fetch)
	if _, err := sendEnv(ctx, b, env("m1", "a")); err != nil {
		t.Fatal(err)
	}
	waitGivenBack(t, ctx, b, "a")
	endB()
	if _, err := sendEnv(ctx, b, env("m2", "a")); err != nil {
		t.Fatal(err)
	}
	p := broker.FetchParams{Receiver: "a", Consumer: "d", Lease: time.Minute, Max: max}
	ds, err := b2.Fetch(ctx, &p)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range ds {
		got = append(got, d.Env.ID+"#"+strconv.Itoa(d.Attempt))
	}
	want := []string{"m1#1", "m2#1"}[:min(max, 2)]
	if !slices.Equal(got, want) {
		t.Fatalf("Fetch of up to %d by another instance after the give-back and a newer send = %v; want %v (m1, given back, first)", max, got, want)
	}
}
