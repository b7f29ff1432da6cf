package disker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestSendBatch sends a batch of 300 fire-and-forget messages and one timed
// message nobody serves: a one-at-a-time handler sees the 300 in batch
// order, and the timed one reaches its sender's timeout handler.
func TestSendBatch(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		seen := make(chan string, 400)
		if err := d.Handle("batch", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			seen <- string(m.Content)
			return nil, nil
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		timedOut := make(chan string, 1)
		if err := d.OnTimeout("batcher", disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) { timedOut <- m.ID })); err != nil {
			t.Fatal(err)
		}
		var msgs []disker.Message
		for i := range 300 {
			msgs = append(msgs, disker.Message{Receiver: "batch", Content: fmt.Append(nil, i)})
		}
		msgs = append(msgs, disker.Message{Sender: "batcher", Receiver: "nobody-serves"})
		ids, err := d.SendBatch(ctx, msgs[:300])
		if err != nil || len(ids) != 300 {
			t.Fatalf("SendBatch = %d ids, %v; want 300, nil", len(ids), err)
		}
		timed, err := d.SendBatch(ctx, msgs[300:], disker.WithTimeout(50*time.Millisecond))
		ids = append(ids, timed...)
		if err != nil || len(ids) != len(msgs) {
			t.Fatalf("SendBatch = %d ids, %v; want %d, nil", len(ids), err, len(msgs))
		}
		if slices.Contains(ids, "") || len(slices.Compact(slices.Sorted(slices.Values(ids)))) != len(ids) {
			t.Fatalf("SendBatch ids are not all set and distinct: %v", ids)
		}
		for i := range 300 {
			if got := recv(t, seen, 20*time.Second, "a batch message"); got != fmt.Sprint(i) {
				t.Fatalf("message %d handled as %q: want batch order", i, got)
			}
		}
		if got := recv(t, timedOut, 20*time.Second, "the timed message's notice"); got != ids[300] {
			t.Fatalf("timeout notice for %s, want %s", got, ids[300])
		}
		if msgs[0].ID != "" {
			t.Fatalf("SendBatch changed the caller's message: ID %q", msgs[0].ID)
		}
	})
}

// TestSendBatchValidation: a bad message fails the whole batch, named by
// its index, and nothing is sent; an empty batch is no error; after Close
// SendBatch returns ErrClosed.
func TestSendBatchValidation(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		ok := disker.Message{Receiver: "valid"}
		for _, c := range []struct {
			bad   disker.Message
			field string
		}{
			{disker.Message{Receiver: ""}, "msgs[2].Receiver"},
			{disker.Message{Receiver: "x", Sender: "_reserved"}, "msgs[2].Sender"},
			{disker.Message{Receiver: "x", Content: make([]byte, 2<<20)}, "msgs[2].Content"},
		} {
			ids, err := d.SendBatch(ctx, []disker.Message{ok, ok, c.bad, ok})
			var ve *disker.ValidationError
			if !errors.As(err, &ve) || ve.Field != c.field || ids != nil {
				t.Fatalf("SendBatch with a bad message: got %v, %v; want a ValidationError for %s", ids, err, c.field)
			}
		}
		// The options apply to every message: a timeout on a fire-and-forget
		// one fails the batch, naming the option and the message.
		timed := disker.Message{Sender: "s", Receiver: "valid"}
		ids, err := d.SendBatch(ctx, []disker.Message{timed, timed, ok}, disker.WithTimeout(time.Second))
		var ve *disker.ValidationError
		if !errors.As(err, &ve) || ve.Field != "WithTimeout" || !strings.Contains(ve.Reason, "msgs[2]") || ids != nil {
			t.Fatalf("SendBatch with a timed fire-and-forget message: got %v, %v; want a ValidationError for WithTimeout at msgs[2]", ids, err)
		}
		st, err := d.Stats(ctx, "valid")
		if err != nil || st.Queued != 0 {
			t.Fatalf("Stats after refused batches = %+v, %v; want nothing queued", st, err)
		}
		if ids, err := d.SendBatch(ctx, nil); err != nil || len(ids) != 0 {
			t.Fatalf("SendBatch of nothing = %v, %v; want no ids, nil", ids, err)
		}
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := d.SendBatch(ctx, []disker.Message{ok}); !errors.Is(err, disker.ErrClosed) {
			t.Fatalf("SendBatch after Close = %v, want ErrClosed", err)
		}
	})
}

// TestSendBatchPartialFailure breaks one receiver's queue in Redis (its key
// holds a string): SendBatch sends the other messages and reports that one
// in a *BatchError, with "" for its id.
func TestSendBatchPartialFailure(t *testing.T) {
	e := newEnv(t, true, redisURL(t))
	d := e.open()
	ctx := ctxTimeout(t, 30*time.Second)
	rc := rawRedis(t, e)
	if err := rc.Do(ctx, rc.B().Set().Key(e.base.KeyPrefix+":{broken}:q").Value("not a stream").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	msgs := []disker.Message{
		{Receiver: "fine"},
		{Receiver: "broken"},
		{Receiver: "fine"},
	}
	ids, err := d.SendBatch(ctx, msgs)
	var be *disker.BatchError
	if !errors.As(err, &be) || len(be.Errs) != 3 || be.Errs[0] != nil || be.Errs[1] == nil || be.Errs[2] != nil {
		t.Fatalf("SendBatch = %v; want a BatchError for message 1 only", err)
	}
	if len(ids) != 3 || ids[0] == "" || ids[1] != "" || ids[2] == "" {
		t.Fatalf("ids = %q; want message 1's empty, the others set", ids)
	}
	st, err := d.Stats(ctx, "fine")
	if err != nil || st.Queued != 2 {
		t.Fatalf("Stats(fine) = %+v, %v; want the 2 others queued", st, err)
	}
}
