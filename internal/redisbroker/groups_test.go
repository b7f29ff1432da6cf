package redisbroker

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// TestGroupsLeaveNothing shows that keys, once drained (and their token
// buckets full), leave nothing in Redis: 10,000 keys of one message each,
// with a rate, leave the keys that a receiver without groups has, and the
// groups hash holds only its configuration.
func TestGroupsLeaveNothing(t *testing.T) {
	b := newBroker(t)
	ctx := ctxT(t)
	c := rawClient(t, srv)
	const r, keys = "r", 10000
	drain := func() {
		t.Helper()
		for {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "w", Max: 1000, Lease: time.Minute})
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if len(ds) == 0 {
				return
			}
			refs := make([]string, len(ds))
			for i, d := range ds {
				refs[i] = d.Ref
			}
			if err := b.Ack(ctx, r, refs...); err != nil {
				t.Fatalf("Ack: %v", err)
			}
		}
	}
	send := func(key string) {
		t.Helper()
		env := broker.Envelope{ID: fmt.Sprintf("m-%s-%d", key, time.Now().UnixNano()), Sender: "s", Receiver: r, Content: []byte("x")}
		if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: env, GroupKey: key}); err != nil {
			t.Fatalf("Send: %v", err)
		}
	}
	if err := b.ConfigureGroups(ctx, &broker.GroupConfig{Receiver: r, Concurrency: 1, Rate: 100, Burst: 1}); err != nil {
		t.Fatal(err)
	}
	settle := func() {
		t.Helper()
		drain()
		time.Sleep(20 * time.Millisecond) // the buckets fill (rate 100/s, burst 1)
		// The next fetch script forgets the full buckets: at once after a
		// forced reclaim, else within the stream's reclaim period.
		b.forceReclaim(b.keys.queue(r))
		drain()
	}
	send("first")
	settle()
	before := keysOf(t, c, b.keys.prefix)
	for i := range keys {
		send(fmt.Sprintf("key-%d", i))
	}
	if st, err := b.Stats(ctx, r); err != nil || st.Queued != keys || st.GroupWaiting != 0 {
		t.Fatalf("Stats after %d keys of one message: %+v, %v", keys, st, err)
	}
	settle()
	if after := keysOf(t, c, b.keys.prefix); !slices.Equal(before, after) {
		t.Fatalf("keys before: %v\nafter: %v", before, after)
	}
	fields, err := do(t, c, "HKEYS", b.keys.groups(r)).AsStrSlice()
	if err != nil || !slices.Equal(fields, []string{"c"}) {
		t.Fatalf("fields of the groups hash: %v, %v; want only c", fields, err)
	}
}

// TestGroupsOddKeys shows keys are kept whole whatever their bytes: the
// separators of the groups hash, digits, newlines, UTF-8, the longest.
func TestGroupsOddKeys(t *testing.T) {
	b := newBroker(t)
	ctx := ctxT(t)
	const r = "r"
	keys := []string{"a:b", "1:2", "k\n3", "0", " ", "ключ🙂", "m:0:a", strings.Repeat("z", broker.MaxKeyLen)}
	for round := range 2 {
		for i, key := range keys {
			env := broker.Envelope{ID: fmt.Sprintf("m%d-%d", i, round), Sender: "s", Receiver: r, Content: []byte(fmt.Sprint(round))}
			if _, err := broker.SendOne(ctx, b, broker.SendParams{Env: env, GroupKey: key}); err != nil {
				t.Fatalf("Send: %v", err)
			}
		}
	}
	loads, err := b.BusiestGroups(ctx, r, 100)
	if err != nil || len(loads) != len(keys) {
		t.Fatalf("BusiestGroups: %v, %v", loads, err)
	}
	for round := range 2 {
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "w", Max: 100, Lease: time.Minute})
		if err != nil || len(ds) != len(keys) {
			t.Fatalf("Fetch of round %d: %d deliveries, %v", round, len(ds), err)
		}
		for i, d := range ds {
			if d.GroupKey != keys[i] || string(d.Env.Content) != fmt.Sprint(round) {
				t.Fatalf("delivery %d of round %d: key %q content %q, want %q", i, round, d.GroupKey, d.Env.Content, keys[i])
			}
			if err := b.Ack(ctx, r, d.Ref); err != nil {
				t.Fatal(err)
			}
		}
	}
}
