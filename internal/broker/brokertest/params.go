package brokertest

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// paramCase is a call with invalid params, and the Validate of its params.
type paramCase struct {
	name  string
	valid func() error
	call  func() error
}

// invalidCall returns the case of call with p.
func invalidCall[P interface{ Validate() error }](name string, p P, call func(P) error) paramCase {
	return paramCase{name: name, valid: p.Validate, call: func() error { return call(p) }}
}

// testInvalidParams shows that a broker rejects each params value that is
// not valid with the error of its Validate, before it does anything: the
// checks live in one place, and every broker answers the same.
func testInvalidParams(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	send(t, b, newEnv(r, "stays"))
	fetch := func(p *broker.FetchParams) error { _, err := b.Fetch(ctx, p); return err }
	extend := func(p *broker.ExtendParams) error { _, err := b.Extend(ctx, p); return err }
	retry := func(p *broker.RetryParams) error { return b.Retry(ctx, p) }
	read := func(p *broker.ReadRepliesParams) error { _, err := b.ReadReplies(ctx, p); return err }
	fate := func(p *broker.FateParams) error { _, err := b.Fate(ctx, p); return err }
	dlAfter := func(p *broker.DeadLettersParams) error { _, err := b.DeadLettersAfter(ctx, p); return err }
	send := func(p *broker.SendParams) error { return b.Send(ctx, []broker.SendParams{*p}) }
	env := func(edit func(e *broker.Envelope)) broker.Envelope {
		e := newEnv(r, "x")
		if edit != nil {
			edit(e)
		}
		return *e
	}
	longKey := string(make([]byte, broker.MaxKeyLen+1))
	cancel := func(p *broker.CancelParams) error { _, err := b.Cancel(ctx, p); return err }
	refs := []string{"1-1"}
	tokens := func(p *broker.TokensParams) error { _, _, err := b.TakeTokens(ctx, p); return err }
	slots := func(p *broker.SlotsParams) error { _, _, err := b.Slots(ctx, p); return err }
	cases := []paramCase{
		invalidCall("Fetch", &broker.FetchParams{Consumer: "c", Max: 1, Lease: longLease}, fetch),
		invalidCall("Fetch", &broker.FetchParams{Receiver: r, Max: 1, Lease: longLease}, fetch),
		invalidCall("Fetch", &broker.FetchParams{Receiver: r, Consumer: "c", Lease: longLease}, fetch),
		invalidCall("Fetch", &broker.FetchParams{Receiver: r, Consumer: "c", Max: 1}, fetch),
		invalidCall("Extend", &broker.ExtendParams{Consumer: "c", Refs: refs, Lease: longLease}, extend),
		invalidCall("Extend", &broker.ExtendParams{Receiver: r, Refs: refs, Lease: longLease}, extend),
		invalidCall("Extend", &broker.ExtendParams{Receiver: r, Consumer: "c", Refs: refs}, extend),
		invalidCall("Retry", &broker.RetryParams{Consumer: "c", Ref: "1-1", Lease: longLease}, retry),
		invalidCall("Retry", &broker.RetryParams{Receiver: r, Ref: "1-1", Lease: longLease}, retry),
		invalidCall("Retry", &broker.RetryParams{Receiver: r, Consumer: "c", Lease: longLease}, retry),
		invalidCall("Retry", &broker.RetryParams{Receiver: r, Consumer: "c", Ref: "1-1", Delay: -time.Second, Lease: longLease}, retry),
		invalidCall("Retry", &broker.RetryParams{Receiver: r, Consumer: "c", Ref: "1-1"}, retry),
		invalidCall("ReadReplies", &broker.ReadRepliesParams{Consumer: "c", Max: 1, Lease: longLease}, read),
		invalidCall("ReadReplies", &broker.ReadRepliesParams{Sender: r, Max: 1, Lease: longLease}, read),
		invalidCall("ReadReplies", &broker.ReadRepliesParams{Sender: r, Consumer: "c", Lease: longLease}, read),
		invalidCall("ReadReplies", &broker.ReadRepliesParams{Sender: r, Consumer: "c", Max: 1}, read),
		invalidCall("Fate", &broker.FateParams{ID: "m", MaxScan: 1}, fate),
		invalidCall("Fate", &broker.FateParams{Receiver: r, MaxScan: 1}, fate),
		invalidCall("Fate", &broker.FateParams{Receiver: r, ID: "m"}, fate),
		invalidCall("DeadLettersAfter", &broker.DeadLettersParams{Max: 1}, dlAfter),
		invalidCall("DeadLettersAfter", &broker.DeadLettersParams{Receiver: r}, dlAfter),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Receiver = "" })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.ID = "" })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Route = 9 })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Sender = "" })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Timeout = -time.Second })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Timeout, e.Route = time.Second, broker.RouteNone })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Priority = 2 })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.IdempotencyKey = longKey }), IdemTTL: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.IdempotencyKey = "k" })}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), Delay: -time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), Delay: broker.MaxDelay + 1}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), Delay: time.Second, DeliverAt: time.Now()}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DeliverAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DedupKey: longKey, DedupTTL: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DedupKey: "k"}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), Expiry: -time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DedupUntilSettled: true}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DebounceKey: "k", DebounceMax: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DebounceKey: "k", DebounceWait: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), DebounceKey: "k", DebounceWait: time.Second, DebounceMax: time.Second, Delay: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(func(e *broker.Envelope) { e.Timeout = time.Second }), DebounceKey: "k", DebounceWait: time.Second, DebounceMax: time.Second}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), Expiry: time.Second, ExpireAt: time.Now()}, send),
		invalidCall("Send", &broker.SendParams{Env: env(nil), ExpireAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)}, send),
		invalidCall("TakeTokens", &broker.TokensParams{Want: 1, Rate: 1, Burst: 1}, tokens),
		invalidCall("TakeTokens", &broker.TokensParams{Receiver: r, Rate: 1, Burst: 1}, tokens),
		invalidCall("TakeTokens", &broker.TokensParams{Receiver: r, Want: 1, Rate: -1, Burst: 1}, tokens),
		invalidCall("TakeTokens", &broker.TokensParams{Receiver: r, Want: 1, Rate: 1}, tokens),
		invalidCall("Slots", &broker.SlotsParams{Holder: "h", Limit: 1, Lease: longLease}, slots),
		invalidCall("Slots", &broker.SlotsParams{Receiver: r, Limit: 1, Lease: longLease}, slots),
		invalidCall("Slots", &broker.SlotsParams{Receiver: r, Holder: "h", Lease: longLease}, slots),
		invalidCall("Slots", &broker.SlotsParams{Receiver: r, Holder: "h", Limit: 1}, slots),
		invalidCall("Cancel", &broker.CancelParams{ID: "m", MaxScan: 1}, cancel),
		invalidCall("Cancel", &broker.CancelParams{Receiver: r, MaxScan: 1}, cancel),
		invalidCall("Cancel", &broker.CancelParams{Receiver: r, ID: "m"}, cancel),
	}
	for _, tc := range cases {
		want := tc.valid()
		if want == nil {
			t.Fatalf("%s: the case's params are valid; the suite is wrong", tc.name)
		}
		if got := tc.call(); got == nil || got.Error() != want.Error() {
			t.Errorf("%s with invalid params: got %v, want Validate's error %q", tc.name, got, want)
		}
	}
	// Nothing was done: the message is still there, never delivered.
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1, Pending: 0, DeadLetters: 0})
	ack(t, b, r, fetchOne(t, b, r, "c", longLease).Ref)
}
