package diskertest

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/membroker"
	"github.com/diskerhq/disker/internal/testhook"
)

// TB is the part of testing.TB that the kit uses: *testing.T, *testing.B
// and *testing.F have it. The kit reports a failure with Fatalf, so call
// its methods from the test's goroutine, as with t.Fatal.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Kit is a test's Disker on an in-memory broker of its own, whose clock
// moves only when the test says (Advance), with the means to run its
// handlers (Drain) and to look at what happened (Sent, Delivered,
// Replies, DeadLetters and the Require assertions). Make one with New, one
// per test: kits share nothing, so tests that use them can run in
// parallel. Its methods are safe for concurrent use (two Advances run one
// after the other); those that can fail the test must be called from the
// test's goroutine, as t.Fatal must.
type Kit struct {
	t   TB
	d   *disker.Disker
	in  testhook.Instance
	rec *recorder
	clk clock

	advancing sync.Mutex // one Advance at a time
}

// clock is the kit's clock, the broker's: it moves only when set.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Option configures a Kit (New).
type Option func(*options)

type options struct {
	start time.Time
	cfg   disker.Config
	err   string
}

// WithStart sets the time on the kit's clock when the kit starts; by
// default the time New was called, to the millisecond, in UTC. Code under
// test that computes due times from time.Now (WithDeliverAt, WithExpireAt)
// reads best with the default.
func WithStart(t time.Time) Option {
	return func(o *options) {
		if t.IsZero() {
			o.err = "WithStart: the zero time is not a start"
		}
		o.start = t
	}
}

// WithConfig sets the Config of the kit's Disker: its Logger (by default
// the test's log, from level Warn: a failed handler's retry and dead
// letter show in a failing test's output), OnEvent (which the kit calls
// too), MaxMessageSize, InstanceID and the rest. RedisURL must be empty:
// the kit runs on its own in-memory broker. TimeoutMonitorFrequency does
// not matter: the kit settles timeouts itself when its clock moves.
func WithConfig(cfg disker.Config) Option {
	return func(o *options) {
		if cfg.RedisURL != "" {
			o.err = "WithConfig: Config.RedisURL is " + cfg.RedisURL + ": leave it empty, the kit runs on an in-memory broker of its own"
		}
		o.cfg = cfg
	}
}

// New returns a kit for the test t: a Disker on an in-memory broker of
// its own, whose clock starts at the time New was called (WithStart) and
// moves only by Advance. The Disker is closed when t ends (t.Cleanup).
// New fails the test on a bad option.
//
// The kit's Disker is a plain *disker.Disker, to hand to the code under
// test, with one difference: what it would do in its own goroutines when
// messages come or time passes, it does when the test says. The handlers
// registered with Handle run in Drain, as do the ReplyHandlers and
// TimeoutHandlers of OnReply and OnTimeout; the ticks of schedules are
// sent, and timeouts settled, in Advance.
func New(t TB, opts ...Option) *Kit {
	t.Helper()
	o := options{start: time.Now().UTC().Truncate(time.Millisecond)}
	for _, opt := range opts {
		opt(&o)
	}
	if o.err != "" {
		t.Fatalf("diskertest: New: %s", o.err)
	}
	k := &Kit{t: t}
	k.clk.now = o.start
	mb := membroker.New(membroker.Options{MaxMessageSize: o.cfg.MaxMessageSize, Now: k.clk.Now})
	k.rec = newRecorder(mb, k.clk.Now)
	cfg := o.cfg
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: dropTime}))
	}
	user := cfg.OnEvent
	cfg.OnEvent = func(e disker.Event) {
		k.rec.event(e)
		if user != nil {
			user(e)
		}
	}
	d, in, err := testhook.Open(context.Background(), cfg, k.rec)
	if err != nil {
		_ = mb.Close()
		t.Fatalf("diskertest: New: %v", err)
	}
	k.d, k.in = d.(*disker.Disker), in
	t.Cleanup(k.close)
	return k
}

// close closes the kit's Disker, and with it the broker.
func (k *Kit) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := k.d.Close(ctx); err != nil {
		k.t.Errorf("diskertest: closing the kit's Disker: %v", err)
	}
}

// logWriter writes each log line to the test's log.
type logWriter struct{ t TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", bytes.TrimSuffix(p, []byte("\n")))
	return len(p), nil
}

// dropTime leaves the time out of log lines: the test's log has its own.
func dropTime(groups []string, a slog.Attr) slog.Attr {
	if len(groups) == 0 && a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

// Disker returns the kit's Disker, for the code under test: it sends,
// serves receivers (Handle), replies and schedules as any Disker does, on
// the kit's broker and clock.
func (k *Kit) Disker() *disker.Disker { return k.d }

// Now returns the time on the kit's clock: the broker's time, by which
// due times, deadlines, expiries, retry delays, leases, rate limits and
// the ticks of schedules are decided.
func (k *Kit) Now() time.Time { return k.clk.Now() }

// Advance moves the kit's clock forward by d, and does on the way what
// comes due as a live instance would: each due tick of a schedule is sent
// at its own time, in order (so that an Every schedule sends a message
// for each interval d covers, not one for all of them), and the timeouts
// whose deadline passed are settled, each sender getting its notice in
// its reply stream (Drain hands it to the sender's TimeoutHandler). The
// kit's Disker stays alive over the move: its entry in the registry of
// workers and its inbox do not lapse.
//
// Advance runs no handler: the messages that came due (deferred ones,
// retries, expired leases) wait for the next Drain, which runs them at
// the new time. Its time grows with the ticks it crosses (some tens of
// microseconds each). It fails the test when d is negative or the broker
// fails.
func (k *Kit) Advance(d time.Duration) {
	k.t.Helper()
	if d < 0 {
		k.t.Fatalf("diskertest: Advance(%v): the clock does not go back", d)
	}
	k.advancing.Lock()
	defer k.advancing.Unlock()
	ctx := context.Background()
	target := k.Now().Add(d)
	for {
		next, err := k.in.Tick(ctx)
		if err != nil {
			k.t.Fatalf("diskertest: Advance: schedules: %v", err)
		}
		if next.IsZero() || !next.After(k.Now()) || !next.Before(target) {
			break
		}
		k.moveTo(ctx, next)
	}
	k.moveTo(ctx, target)
}

// moveTo sets the clock to t, keeping the instance alive over the move,
// then sends the due ticks and settles the timeouts.
func (k *Kit) moveTo(ctx context.Context, t time.Time) {
	k.t.Helper()
	if jump := t.Sub(k.Now()); jump > 0 {
		if err := k.in.KeepAlive(ctx, jump); err != nil {
			k.t.Fatalf("diskertest: Advance: %v", err)
		}
	}
	k.clk.set(t)
	if _, err := k.in.Tick(ctx); err != nil {
		k.t.Fatalf("diskertest: Advance: schedules: %v", err)
	}
	if err := k.in.Expire(ctx); err != nil {
		k.t.Fatalf("diskertest: Advance: timeouts: %v", err)
	}
}
