package disker_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// wantValidation fails unless err is a *ValidationError for field.
func wantValidation(t *testing.T, err error, field string) {
	t.Helper()
	var ve *disker.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("err = %v, want a *ValidationError for %s", err, field)
	}
	if ve.Field != field || !strings.HasPrefix(err.Error(), "disker: invalid "+field+": ") {
		t.Fatalf("err = %q (field %q), want one for %s", err, ve.Field, field)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		field string
		cfg   disker.Config
	}{
		{"Config.MaxConnectionPoolSize", disker.Config{MaxConnectionPoolSize: -1}},
		{"Config.ReceiverBlockTimeout", disker.Config{ReceiverBlockTimeout: -time.Second}},
		{"Config.ReceiverBlockTimeout", disker.Config{ReceiverBlockTimeout: time.Microsecond}},
		{"Config.TimeoutMonitorFrequency", disker.Config{TimeoutMonitorFrequency: -1}},
		{"Config.HeartbeatInterval", disker.Config{HeartbeatInterval: -1}},
		{"Config.MaxMessageSize", disker.Config{MaxMessageSize: -1}},
		{"Config.MaxMessageSize", disker.Config{MaxMessageSize: disker.MaxMessageSizeLimit + 1}},
		{"Config.KeyPrefix", disker.Config{KeyPrefix: "a{b}"}},
		{"Config.KeyPrefix", disker.Config{KeyPrefix: "a b"}},
		{"Config.InstanceID", disker.Config{InstanceID: "has space"}},
		{"Config.InstanceID", disker.Config{InstanceID: "_reserved"}},
		{"Config.InstanceID", disker.Config{InstanceID: strings.Repeat("x", 101)}},
		{"Config.RedisURL", disker.Config{RedisURL: "http://localhost"}},
		{"Config.RedisURL", disker.Config{RedisURL: "redis://"}},
		{"Config.RedisURL", disker.Config{RedisURL: "redis://%zz"}},
	} {
		t.Run(tc.field, func(t *testing.T) {
			d, err := disker.New(context.Background(), tc.cfg)
			if d != nil {
				t.Fatal("New returned an instance with an error")
			}
			wantValidation(t, err, tc.field)
		})
	}
}

func TestNewUnreachableRedis(t *testing.T) {
	t.Parallel()
	// Port 1 on loopback: nothing listens there.
	d, err := disker.New(context.Background(), disker.Config{RedisURL: "redis://127.0.0.1:1/0", Logger: testLogger()})
	if d != nil || !errors.Is(err, disker.ErrUnavailable) || !strings.HasPrefix(err.Error(), "disker: ") {
		t.Fatalf("New = %v, %v; want an error wrapping ErrUnavailable", d, err)
	}
}

func TestBadInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open(func(c *disker.Config) { c.MaxMessageSize = 16 })
		ctx := ctxTimeout(t, 10*time.Second)
		h := disker.HandlerFunc(echo)

		badNames := map[string]string{
			"empty":      "",
			"too long":   strings.Repeat("n", disker.MaxNameLength+1),
			"space":      "a b",
			"brace":      "a{b}",
			"star":       "a*",
			"slash":      "a/b",
			"non-ascii":  "é",
			"underscore": "_inbox.x",
		}
		for what, name := range badNames {
			t.Run("name "+what, func(t *testing.T) {
				_, err := d.Send(ctx, disker.Message{Sender: "s", Receiver: name})
				wantValidation(t, err, "Message.Receiver")
				if name != "" { // no Sender: fire-and-forget
					_, err = d.Send(ctx, disker.Message{Sender: name, Receiver: "r"})
					wantValidation(t, err, "Message.Sender")
				}
				wantValidation(t, d.Handle(name, h), "receiver")
				wantValidation(t, d.OnReply(name, disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})), "sender")
				wantValidation(t, d.OnTimeout(name, disker.TimeoutHandlerFunc(func(context.Context, *disker.Message) {})), "sender")
				_, err = d.Request(ctx, disker.Message{Receiver: name})
				wantValidation(t, err, "Message.Receiver")
				_, err = d.Stats(ctx, name)
				wantValidation(t, err, "receiver")
			})
		}
		longest := strings.Repeat("n", disker.MaxNameLength)
		if _, err := d.Send(ctx, disker.Message{Sender: "A-z_0.9:x", Receiver: longest}); err != nil {
			t.Fatalf("Send with valid names: %v", err)
		}

		for _, tc := range []struct {
			what  string
			field string
			msg   disker.Message
			opts  []disker.SendOption
		}{
			{"too big", "Message.Content", disker.Message{Sender: "s", Receiver: "r", Content: make([]byte, 17)}, nil},
			{"negative timeout", "WithTimeout", disker.Message{Sender: "s", Receiver: "r"}, []disker.SendOption{disker.WithTimeout(-time.Second)}},
			{"sub-millisecond timeout", "WithTimeout", disker.Message{Sender: "s", Receiver: "r"}, []disker.SendOption{disker.WithTimeout(time.Microsecond)}},
			{"timed fire-and-forget", "WithTimeout", disker.Message{Receiver: "r"}, []disker.SendOption{disker.WithTimeout(time.Second)}},
			{"priority above high", "WithPriority", disker.Message{Receiver: "r"}, []disker.SendOption{disker.WithPriority(disker.PriorityHigh + 1)}},
			{"priority below low", "WithPriority", disker.Message{Receiver: "r"}, []disker.SendOption{disker.WithPriority(-5)}},
		} {
			t.Run("Send "+tc.what, func(t *testing.T) {
				id, err := d.Send(ctx, tc.msg, tc.opts...)
				if id != "" {
					t.Fatalf("Send returned id %q with an error", id)
				}
				wantValidation(t, err, tc.field)
			})
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "r", Content: make([]byte, 16)}); err != nil {
			t.Fatalf("Send at the size limit: %v", err)
		}
		_, err := d.Request(ctx, disker.Message{Receiver: "r", Content: make([]byte, 17)})
		wantValidation(t, err, "Message.Content")
		_, err = d.Request(ctx, disker.Message{Sender: "s", Receiver: "r"})
		wantValidation(t, err, "Message.Sender")
		_, err = d.Request(ctx, disker.Message{Receiver: "r"}, disker.WithTimeout(-time.Second))
		wantValidation(t, err, "WithTimeout")
		_, err = d.Request(ctx, disker.Message{Receiver: "r"}, disker.WithPriority(2))
		wantValidation(t, err, "WithPriority")
		_, err = d.SendBatch(ctx, []disker.Message{{Receiver: "r"}}, disker.WithPriority(2))
		wantValidation(t, err, "WithPriority")

		wantValidation(t, d.Handle("r", nil), "Handler")
		wantValidation(t, disker.HandleWithPool[int](d, "r", nil, func(context.Context, int, *disker.Message) ([]byte, error) { return nil, nil }), "Pool")
		wantValidation(t, d.OnReply("s", nil), "ReplyHandler")
		wantValidation(t, d.OnTimeout("s", nil), "TimeoutHandler")
		for _, tc := range []struct {
			field string
			opt   disker.HandleOption
		}{
			{"WithConcurrency", disker.WithConcurrency(0)},
			{"WithPrefetch", disker.WithPrefetch(-1)},
			{"WithMaxAttempts", disker.WithMaxAttempts(0)},
			{"WithBackoff", disker.WithBackoff(nil)},
			{"WithLease", disker.WithLease(time.Millisecond)},
			{"WithGlobalConcurrency", disker.WithGlobalConcurrency(0)},
			{"WithRateLimit.rate", disker.WithRateLimit(0, 1)},
			{"WithRateLimit.rate", disker.WithRateLimit(-5, 1)},
			{"WithRateLimit.rate", disker.WithRateLimit(math.NaN(), 1)},
			{"WithRateLimit.rate", disker.WithRateLimit(math.Inf(1), 1)},
			{"WithRateLimit.burst", disker.WithRateLimit(10, 0)},
		} {
			wantValidation(t, d.Handle("r", h, tc.opt), tc.field)
		}

		if err := d.Handle("r", h); err != nil {
			t.Fatal(err)
		}
		if err := d.Handle("r", h); !errors.Is(err, disker.ErrAlreadyRegistered) || errors.Is(err, disker.ErrDuplicate) {
			t.Fatalf("second Handle = %v, want ErrAlreadyRegistered", err)
		}
		rh := disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})
		th := disker.TimeoutHandlerFunc(func(context.Context, *disker.Message) {})
		if err := d.OnReply("s", rh); err != nil {
			t.Fatal(err)
		}
		if err := d.OnReply("s", rh); !errors.Is(err, disker.ErrAlreadyRegistered) {
			t.Fatalf("second OnReply = %v, want ErrAlreadyRegistered", err)
		}
		if err := d.OnTimeout("s", th); err != nil {
			t.Fatal(err)
		}
		if err := d.OnTimeout("s", th); !errors.Is(err, disker.ErrAlreadyRegistered) {
			t.Fatalf("second OnTimeout = %v, want ErrAlreadyRegistered", err)
		}
		if err := d.RemoveReplyHandler("s"); err != nil {
			t.Fatal(err)
		}
		if err := d.RemoveReplyHandler("s"); !errors.Is(err, disker.ErrNotHandled) {
			t.Fatalf("second RemoveReplyHandler = %v, want ErrNotHandled", err)
		}
		if err := d.RemoveTimeoutHandler("s"); err != nil {
			t.Fatal(err)
		}
		if err := d.RemoveTimeoutHandler("s"); !errors.Is(err, disker.ErrNotHandled) {
			t.Fatalf("second RemoveTimeoutHandler = %v, want ErrNotHandled", err)
		}
		if err := d.OnReply("s", rh); err != nil {
			t.Fatalf("OnReply after removal: %v", err)
		}
		if err := d.Unhandle(ctx, "r"); err != nil {
			t.Fatal(err)
		}
		if err := d.Unhandle(ctx, "r"); !errors.Is(err, disker.ErrNotHandled) {
			t.Fatalf("second Unhandle = %v, want ErrNotHandled", err)
		}
		if err := d.Handle("r", h); err != nil {
			t.Fatalf("Handle after Unhandle: %v", err)
		}

		if err := d.Reply(ctx, &disker.Message{ID: "x", Receiver: "r"}, nil); !errors.Is(err, disker.ErrFireAndForget) {
			t.Fatalf("Reply to fire-and-forget = %v, want ErrFireAndForget", err)
		}
		wantValidation(t, d.Reply(ctx, nil, nil), "Message")
		wantValidation(t, d.Reply(ctx, &disker.Message{ID: "x", Sender: "s", Receiver: "r"}, make([]byte, 17)), "response")
		_, err = d.DeadLetters(ctx, "r", 0)
		wantValidation(t, err, "max")
	})
}

func TestCallsAfterClose(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d, err := disker.New(context.Background(), e.config())
		if err != nil {
			t.Fatal(err)
		}
		ctx := ctxTimeout(t, 10*time.Second)
		if err := d.Handle("r", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(ctx); err != nil {
			t.Fatalf("second Close = %v, want nil", err)
		}
		h := disker.HandlerFunc(echo)
		_, sendErr := d.Send(ctx, disker.Message{Receiver: "r"})
		_, reqErr := d.Request(ctx, disker.Message{Receiver: "r"})
		_, wErr := d.Workers(ctx)
		_, rErr := d.Receivers(ctx)
		_, sErr := d.Stats(ctx, "r")
		_, dlErr := d.DeadLetters(ctx, "r", 1)
		_, rdErr := d.RetryDeadLetters(ctx, "r")
		_, pdErr := d.PurgeDeadLetters(ctx, "r")
		for what, err := range map[string]error{
			"Send": sendErr, "Request": reqErr, "Workers": wErr, "Receivers": rErr, "Stats": sErr,
			"DeadLetters": dlErr, "RetryDeadLetters": rdErr, "PurgeDeadLetters": pdErr,
			"Handle":             d.Handle("q", h),
			"Unhandle":           d.Unhandle(ctx, "r"),
			"OnReply":            d.OnReply("s", disker.ReplyHandlerFunc(func(context.Context, *disker.Message) {})),
			"OnTimeout":          d.OnTimeout("s", disker.TimeoutHandlerFunc(func(context.Context, *disker.Message) {})),
			"RemoveReplyHandler": d.RemoveReplyHandler("s"),
			"Reply":              d.Reply(ctx, &disker.Message{ID: "x", Sender: "s", Receiver: "r"}, nil),
		} {
			if !errors.Is(err, disker.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", what, err)
			}
		}
	})
}

func TestEventKindString(t *testing.T) {
	t.Parallel()
	want := map[disker.EventKind]string{
		disker.EventSent: "sent", disker.EventDeadLettered: "dead_lettered", disker.EventLate: "late",
		disker.EventAvailable: "available", disker.EventSlotsLapsed: "slots_lapsed", 0: "unknown", 99: "unknown",
	}
	for k, w := range want {
		if got := k.String(); got != w {
			t.Errorf("%d.String() = %q, want %q", int(k), got, w)
		}
	}
}

func TestEvents(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		events := make(chan disker.Event, 64)
		d := e.open(func(c *disker.Config) { c.OnEvent = func(ev disker.Event) { events <- ev } })
		if err := d.Handle("echo", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		if _, err := d.Request(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo"}); err != nil {
			t.Fatal(err)
		}
		seen := map[disker.EventKind]bool{}
		for len(seen) < 4 {
			ev := recv(t, events, 10*time.Second, "the events of a request")
			seen[ev.Kind] = true
			if ev.Kind == disker.EventHandled && (ev.Receiver != "echo" || ev.Attempt != 1 || ev.MessageID == "") {
				t.Fatalf("handled event = %+v", ev)
			}
		}
		for _, k := range []disker.EventKind{disker.EventSent, disker.EventStarted, disker.EventReplied, disker.EventHandled} {
			if !seen[k] {
				t.Fatalf("no %v event in %v", k, seen)
			}
		}
	})
}

// TestMaxMessageSizeAboveDefault sends, and replies with, 2 MiB with
// Config.MaxMessageSize 4 MiB: both brokers take the instance's limit,
// not their default of 1 MiB.
func TestMaxMessageSizeAboveDefault(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		big := func(c *disker.Config) { c.MaxMessageSize = 4 << 20 }
		worker, client := e.open(big), e.open(big)
		if err := worker.Handle("echo", disker.HandlerFunc(echo)); err != nil {
			t.Fatal(err)
		}
		content := bytes.Repeat([]byte("x"), 2<<20)
		m, err := client.Request(ctxTimeout(t, 30*time.Second), disker.Message{Receiver: "echo", Content: content})
		if err != nil {
			t.Fatalf("Request of 2 MiB: %v", err)
		}
		if want := append([]byte("echo:"), content...); !bytes.Equal(m.Content, want) {
			t.Fatalf("reply of %d bytes, want the %d bytes of echo:content", len(m.Content), len(want))
		}
		over := make([]byte, 4<<20+1)
		_, err = client.Send(ctxTimeout(t, 10*time.Second), disker.Message{Receiver: "echo", Content: over})
		wantValidation(t, err, "Message.Content")
	})
}

// TestChainAndBatchRefusals: each combination of WithBatch and WithThen
// that is not supported, and a chain or a completion with a bad message
// or option, is refused at the send with a clear error, and nothing is
// queued.
func TestChainAndBatchRefusals(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open(func(c *disker.Config) { c.MaxMessageSize = 16 })
		ctx := ctxTimeout(t, 20*time.Second)
		done := disker.Message{Receiver: "refused-done"}
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: done})
		if err != nil {
			t.Fatal(err)
		}
		// Sealed empty, it queues its completion at once.
		sealed, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "refused-sealed"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sealed.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		next := disker.Message{Receiver: "refused-next"}
		then := disker.WithThen(next)
		tooLong := disker.WithThen(next)
		for range disker.MaxChainLength - 1 {
			tooLong = disker.WithThen(next, tooLong)
		}
		msg := disker.Message{Receiver: "refused-r"}
		send := func(opts ...disker.SendOption) func() error {
			return func() error { _, err := d.Send(ctx, msg, opts...); return err }
		}
		newBatch := func(opts ...disker.SendOption) func() error {
			return func() error {
				_, err := d.NewBatch(ctx, disker.BatchOptions{Completion: done, CompletionOptions: opts})
				return err
			}
		}
		for _, tc := range []struct {
			what  string
			field string // the *ValidationError's, or "" for want
			want  error
			call  func() error
		}{
			{"WithBatch and WithDebounce", "WithBatch", nil, send(disker.WithBatch(b.ID()), disker.WithDebounce("k", time.Second, time.Minute))},
			{"WithBatch of a malformed id", "WithBatch", nil, send(disker.WithBatch("no-slash"))},
			{"WithThen and WithDebounce", "WithThen", nil, send(then, disker.WithDebounce("k", time.Second, time.Minute))},
			{"WithRetention and WithDebounce", "WithRetention", nil, send(disker.WithRetention(time.Hour), disker.WithDebounce("k", time.Second, time.Minute))},
			{"WithThen with SendEach", "WithThen", nil, func() error {
				_, err := d.SendEach(ctx, []disker.Outgoing{{Message: msg, Options: []disker.SendOption{then}}})
				return err
			}},
			{"WithThen with SendBatch", "WithThen", nil, func() error { _, err := d.SendBatch(ctx, []disker.Message{msg}, then); return err }},
			{"WithThen with Batch.SendEach", "WithThen", nil, func() error { _, err := b.SendEach(ctx, []disker.Outgoing{{Message: msg}}, then); return err }},
			{"WithThen with Request", "WithThen", nil, func() error { _, err := d.Request(ctx, msg, then); return err }},
			{"WithBatch with Request", "WithBatch", nil, func() error { _, err := d.Request(ctx, msg, disker.WithBatch(b.ID())); return err }},
			{"WithThen with RequestStream", "WithThen", nil, func() error {
				for _, err := range d.RequestStream(ctx, msg, then) {
					return err
				}
				return nil
			}},
			{"next without a receiver", "WithThen.next.Receiver", nil, send(disker.WithThen(disker.Message{}))},
			{"next to a bad receiver", "WithThen.next.Receiver", nil, send(disker.WithThen(disker.Message{Receiver: "a b"}))},
			{"next too big", "WithThen.next.Content", nil, send(disker.WithThen(disker.Message{Receiver: "refused-next", Content: make([]byte, 17)}))},
			{"next with a Sender", "WithThen.next.Sender", nil, send(disker.WithThen(disker.Message{Receiver: "refused-next", Sender: "s"}))},
			{"a bad step further on", "WithThen.next.Receiver", nil, send(disker.WithThen(next, disker.WithThen(disker.Message{Receiver: "a*"})))},
			{"next with WithDelay", "WithThen", nil, send(disker.WithThen(next, disker.WithDelay(time.Second)))},
			{"next with WithBatch", "WithThen", nil, send(disker.WithThen(next, disker.WithBatch(b.ID())))},
			{"next with a retention of 0", "WithThen", nil, send(disker.WithThen(next, disker.WithRetention(0)))},
			{"a chain too long", "WithThen", nil, send(tooLong)},
			{"a chain into a sealed batch", "", disker.ErrBatchSealed, send(then, disker.WithBatch(sealed.ID()))},
			{"a chain into an unknown batch", "", disker.ErrBatchNotFound, send(then, disker.WithBatch("refused-done/nope"))},
			{"a completion with WithDelay", "BatchOptions.CompletionOptions", nil, newBatch(disker.WithDelay(time.Second))},
			{"a completion with a malformed WithBatch", "BatchOptions.CompletionOptions", nil, newBatch(disker.WithBatch("no-slash"))},
			{"a completion with a bad next step", "WithThen.next.Receiver", nil, newBatch(disker.WithThen(disker.Message{}))},
			{"a completion nested in a sealed batch", "", disker.ErrBatchSealed, newBatch(disker.WithBatch(sealed.ID()))},
		} {
			t.Run(tc.what, func(t *testing.T) {
				err := tc.call()
				if tc.want != nil {
					if !errors.Is(err, tc.want) {
						t.Fatalf("err = %v, want %v", err, tc.want)
					}
					return
				}
				wantValidation(t, err, tc.field)
				if strings.Contains(tc.what, "WithDebounce") && !strings.Contains(err.Error(), "never settled") {
					t.Fatalf("err = %v, want it to say that a replaced debounced message is never settled", err)
				}
			})
		}
		for _, r := range []string{"refused-r", "refused-next", "refused-done"} {
			if st, err := d.Stats(ctx, r); err != nil || st.Length != 0 || st.Deferred != 0 {
				t.Fatalf("%s after refused sends: %+v, %v", r, st, err)
			}
		}
		if info, err := d.Batch(ctx, b.ID()); err != nil || info.Children != 0 {
			t.Fatalf("the batch after refused sends: %+v, %v", info, err)
		}
	})
}
