package disker

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/membroker"
)

// TestDrainStartsOnlyOnLiveSlots: an instance driven by hand (Drain)
// starts a handler only on a global concurrency slot the broker still
// counts for it, as its fetch loop does: a delivery fetched on a slot
// whose lease ran out, and which another holder took, is given back
// without starting, and starts once the slot is free again.
func TestDrainStartsOnlyOnLiveSlots(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := membroker.New(membroker.Options{})
	var lapses atomic.Int32
	cfg := Config{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnEvent: func(e Event) {
			if e.Kind == EventSlotsLapsed {
				lapses.Add(1)
			}
		},
	}
	v, in, err := openByHand(ctx, cfg, b)
	if err != nil {
		t.Fatal(err)
	}
	d := v.(*Disker)
	defer d.Close(context.Background())
	const receiver, lease = "byhand", 300 * time.Millisecond
	other := &broker.SlotsParams{Receiver: receiver, Holder: "other", Limit: 1, Lease: time.Minute}
	var started []string
	h := HandlerFunc(func(_ context.Context, m *Message) ([]byte, error) {
		started = append(started, string(m.Content))
		if string(m.Content) == "first" {
			// The broker stops counting this instance's slot and another
			// holder takes it, as when its lease lapses in a stall; the
			// handler outlasts the lease the instance last saw, so the
			// next start asks the broker again.
			if _, _, err := b.Slots(ctx, &broker.SlotsParams{Receiver: receiver, Holder: d.ID(), Delta: -1, Limit: 1, Lease: lease}); err != nil {
				t.Error(err)
			}
			other.Delta = 1
			if n, _, err := b.Slots(ctx, other); err != nil || n != 1 {
				t.Errorf("the other holder takes the slot: holds %d, %v", n, err)
			}
			time.Sleep(lease + 50*time.Millisecond)
		}
		return nil, nil
	})
	if err := d.Handle(receiver, h, WithGlobalConcurrency(1), WithLease(lease)); err != nil {
		t.Fatal(err)
	}
	for _, content := range []string{"first", "second"} {
		if _, err := d.Send(ctx, Message{Receiver: receiver, Content: []byte(content)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.Drain(ctx, receiver, 2); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(started, []string{"first"}) {
		t.Fatalf("started %q while another holder held the only slot; want only first", started)
	}
	if lapses.Load() == 0 {
		t.Error("no EventSlotsLapsed")
	}
	if st := d.LocalStats().Receivers[receiver]; st.GivenBack != 1 {
		t.Errorf("given back %d, want 1 (the second, fetched on the lapsed slot)", st.GivenBack)
	}

	other.Delta = -1
	if _, _, err := b.Slots(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Drain(ctx, receiver, 1); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(started, []string{"first", "second"}) {
		t.Fatalf("started %q; want first, then second once the slot was free", started)
	}
}
