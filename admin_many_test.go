package disker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestStatsOf shows that StatsOf answers, in order, what Stats answers for
// each of many receivers (on a Cluster, spread over its nodes), with the
// oldest waiting message's time.
func TestStatsOf(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		names := make([]string, 40)
		msgs := []disker.Message{}
		for i := range names {
			names[i] = fmt.Sprintf("many%02d", i)
			for range i % 3 {
				msgs = append(msgs, disker.Message{Receiver: names[i], Content: []byte("x")})
			}
		}
		if _, err := d.SendBatch(ctx, msgs); err != nil {
			t.Fatal(err)
		}
		got, err := d.StatsOf(ctx, names...)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(names) {
			t.Fatalf("StatsOf %d receivers: got %d", len(names), len(got))
		}
		for i, name := range names {
			want, err := d.Stats(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			if got[i] != want || got[i].Queued != int64(i%3) || got[i].OldestQueued.IsZero() != (i%3 == 0) {
				t.Errorf("StatsOf[%d] = %+v; Stats = %+v, want %d queued", i, got[i], want, i%3)
			}
		}
		if _, err := d.StatsOf(ctx, "ok", ""); err == nil {
			t.Errorf("StatsOf with an empty name: got no error")
		}
	})
}

// TestFate follows messages through Fate: queued with nobody serving the
// receiver, in flight while handled, dead-lettered after a failure, gone
// once handled.
func TestFate(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		release := make(chan struct{})
		defer close(release)
		if err := d.Handle("fate", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			switch string(m.Content) {
			case "hold":
				<-release
			case "fail":
				return nil, disker.NoRetry(errors.New("refused"))
			}
			return nil, nil
		}), disker.WithConcurrency(2)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 30*time.Second)
		send := func(receiver, content string) string {
			t.Helper()
			id, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(content)})
			if err != nil {
				t.Fatal(err)
			}
			return id
		}
		fate := func(receiver, id string) disker.MessageFate {
			t.Helper()
			f, err := d.Fate(ctx, receiver, id)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
		queued := send("fate-idle", "waits")
		if f := fate("fate-idle", queued); f.State != disker.MessageQueued || f.At.IsZero() {
			t.Errorf("Fate of a message nobody serves: %+v, want queued", f)
		}
		held := send("fate", "hold")
		waitFor(t, 10*time.Second, "the held message in flight", func() bool {
			f := fate("fate", held)
			return f.State == disker.MessageInFlight && f.Attempts == 1
		})
		failed := send("fate", "fail")
		var f disker.MessageFate
		waitFor(t, 10*time.Second, "the failed message dead-lettered", func() bool {
			f = fate("fate", failed)
			return f.State == disker.MessageDeadLettered
		})
		dls, err := d.DeadLetters(ctx, "fate", 10)
		if err != nil || len(dls) != 1 || f.DeadLetterID != dls[0].ID || !strings.Contains(f.Reason, "refused") || f.Attempts != 1 {
			t.Errorf("Fate of a dead letter: %+v; DeadLetters: %+v, %v", f, dls, err)
		}
		done := send("fate", "ok")
		waitFor(t, 10*time.Second, "the handled message gone", func() bool { return fate("fate", done).State == disker.MessageGone })
		if f := fate("fate", "01m90mn0vjmssp1xq3hqf9yp02"); f.State != disker.MessageGone {
			t.Errorf("Fate of an id never sent: %+v, want gone", f)
		}
		for _, id := range []string{"", "not-an-id-disker-made"} {
			var ve *disker.ValidationError
			if _, err := d.Fate(ctx, "fate", id); !errors.As(err, &ve) {
				t.Errorf("Fate of the malformed id %q: %v, want a *ValidationError", id, err)
			}
		}
	})
}

// TestDeadLettersAfter pages through dead letters, each page after the
// last id of the one before, and refuses an id of the wrong form.
func TestDeadLettersAfter(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		if err := d.Handle("pages", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			return nil, disker.NoRetry(errors.New("down"))
		}), disker.WithConcurrency(1)); err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 30*time.Second)
		for i := range 5 {
			if _, err := d.Send(ctx, disker.Message{Receiver: "pages", Content: fmt.Append(nil, i)}); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 10*time.Second, "five dead letters", func() bool {
			s, err := d.Stats(ctx, "pages")
			return err == nil && s.DeadLetters == 5
		})
		var got []string
		after := ""
		for {
			page, err := d.DeadLettersAfter(ctx, "pages", after, 2)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			for _, dl := range page {
				got = append(got, string(dl.Message.Content))
			}
			after = page[len(page)-1].ID
		}
		if strings.Join(got, "") != "01234" {
			t.Errorf("pages of 2: got %v, want 0 to 4 in order", got)
		}
		var ve *disker.ValidationError
		if _, err := d.DeadLettersAfter(ctx, "pages", "not an id", 2); !errors.As(err, &ve) {
			t.Errorf("DeadLettersAfter with a bad id: got %v, want a ValidationError", err)
		}
	})
}
