package diskertest_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskertest"
)

// TestDrainBatchHandler drains a receiver served by a batch handler
// (HandleBatch): its due messages run in batches of up to the batch size,
// each message settled by its own outcome.
func TestDrainBatchHandler(t *testing.T) {
	t.Parallel()
	kit := diskertest.New(t)
	var sizes []int
	must(t, kit.Disker().HandleBatch("rows", disker.BatchHandlerFunc(func(_ context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
		sizes = append(sizes, len(msgs))
		outs := make([]disker.Outcome, len(msgs))
		for i, m := range msgs {
			if string(m.Content) == "bad" {
				outs[i].Err = disker.NoRetry(errors.New("bad row"))
			}
		}
		return outs, nil
	}), disker.WithBatchSize(2)))
	for _, c := range []string{"r1", "bad", "r2"} {
		send(t, kit, disker.Message{Receiver: "rows", Content: []byte(c)})
	}
	ds := kit.Drain()
	if !slices.Equal(sizes, []int{2, 1}) {
		t.Fatalf("batches of %v, want [2 1]", sizes)
	}
	if got, want := outcomes(ds), []diskertest.Outcome{diskertest.Handled, diskertest.DeadLettered, diskertest.Handled}; !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	kit.RequireDeadLetter("rows", diskertest.Content("bad"), diskertest.Reason("bad row"))
}
