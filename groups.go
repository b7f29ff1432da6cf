package disker

import (
	"context"
	"math"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// WithGroup puts the message in its receiver's group key: the messages of
// one key are handled one at a time, in the order the broker accepted
// them (or WithGroupConcurrency at a time), while the messages of other
// keys, and those without a key, run in parallel up to the receiver's
// concurrency.
//
// A message of a key waits, outside the receiver's queue, while its key
// has as many messages out (queued or being handled) as it may; it is
// queued when one of them is settled: handled and acknowledged, dead-
// lettered, dropped as expired, or cancelled. A message being retried
// holds its key until it succeeds or is dead-lettered, unless the receiver
// is served WithGroupSkipRetries. A key with many waiting messages has at
// most its concurrency of them in the queue, so every other key's next
// message is queued behind at most that many of it: keys take turns, and
// a key that floods does not hold back a quiet one. A message whose
// worker died is delivered again, before the next of its key, once its
// lease ends.
//
// Each decision is one atomic step in the broker (in Redis, the script
// that settles a message queues its key's next, in the receiver's slot),
// so the order holds across every instance and under kill -9. It goes with
// every other option: a deferred or debounced message joins its key when
// it comes due; a priority is the level it is queued at when its turn
// comes (a key's order is its send order, whatever the levels); a
// duplicate (WithDedupKey) never joins. key must not be empty (at most
// MaxKeyLen bytes). See docs/groups.md.
func WithGroup(key string) SendOption {
	return func(o *sendOptions) { o.group, o.groupSet = key, true }
}

// MaxGroupConcurrency is the most WithGroupConcurrency accepts.
const MaxGroupConcurrency = broker.MaxGroupConcurrency

// WithGroupConcurrency lets up to n messages of one key of the receiver
// (WithGroup) be out at a time, across every instance; default 1, which
// is strict order. n must be in 1..MaxGroupConcurrency.
//
// The groups' settings (this option, WithGroupRate and
// WithGroupSkipRetries) are the receiver's, in the broker: each instance
// that serves the receiver sets them when it starts serving it, so give
// every instance the same ones. An instance without them sets the
// defaults.
func WithGroupConcurrency(n int) HandleOption {
	return func(o *handleOptions) {
		if n < 1 || n > MaxGroupConcurrency {
			o.setErr(invalid("WithGroupConcurrency", "must be in 1..%d, got %d", MaxGroupConcurrency, n))
		}
		o.groups.Concurrency = n
	}
}

// WithGroupRate limits how fast each key of the receiver (WithGroup) has
// its messages queued: rate per second on average (> 0, may be
// fractional), with bursts of up to burst (>= 1), a token bucket per key
// on the broker's clock, across every instance. A message whose key has
// no token waits behind its key, not in the queue, and is queued when the
// token is due; a key that has been quiet long enough to fill its bucket
// is forgotten.
func WithGroupRate(rate float64, burst int) HandleOption {
	return func(o *handleOptions) {
		switch {
		case !(rate > 0) || math.IsInf(rate, 1):
			o.setErr(invalid("WithGroupRate.rate", "must be > 0 and finite, got %v", rate))
		case burst < 1:
			o.setErr(invalid("WithGroupRate.burst", "must be >= 1, got %d", burst))
		}
		o.groups.Rate, o.groups.Burst = rate, burst
	}
}

// WithGroupSkipRetries lets a key of the receiver (WithGroup) go on while
// one of its messages waits for a retry: the failed message leaves its
// key's order (the key's next is queued at once) and runs again after its
// backoff, outside the key's count. Without it, the default, a key waits
// until its failed message succeeds or is dead-lettered, as SQS FIFO
// queues do: order before progress.
func WithGroupSkipRetries() HandleOption {
	return func(o *handleOptions) { o.groups.SkipRetries = true }
}

// configureGroups sets the receiver's groups in the broker, as its
// options say (the defaults without any).
func (c *consumer) configureGroups(ctx context.Context) error {
	return c.d.b.ConfigureGroups(ctx, groupConfig(c.name, c.o.groups))
}

// configureGroups sets receiver's groups in the broker, as Handle's
// options g say, within groupsTimeout.
func (d *Disker) configureGroups(receiver string, g broker.GroupConfig) error {
	ctx, cancel := context.WithTimeout(d.opCtx, groupsTimeout)
	defer cancel()
	_, err := call(d, "configure groups", func() (struct{}, error) {
		return struct{}{}, d.b.ConfigureGroups(ctx, groupConfig(receiver, g))
	})
	return err
}

// groupsTimeout bounds Handle's setting of the groups in the broker.
const groupsTimeout = 10 * time.Second

// groupConfig is the broker's configuration of receiver's groups from
// Handle's options g.
func groupConfig(receiver string, g broker.GroupConfig) *broker.GroupConfig {
	g.Receiver = receiver
	if g.Concurrency == 0 {
		g.Concurrency = 1
	}
	return &g
}

// BusiestGroups returns up to n keys of receiver (WithGroup) with the most
// messages waiting behind them, most first: where a backlog of keyed
// messages is. n must be in 1..MaxBusiestGroups.
func (d *Disker) BusiestGroups(ctx context.Context, receiver string, n int) ([]GroupLoad, error) {
	if err := checkName("receiver", receiver); err != nil {
		return nil, err
	}
	if n < 1 || n > MaxBusiestGroups {
		return nil, invalid("n", "must be in 1..%d, got %d", MaxBusiestGroups, n)
	}
	loads, err := call(d, "busiest groups", func() ([]broker.GroupLoad, error) { return d.b.BusiestGroups(ctx, receiver, n) })
	if err != nil {
		return nil, err
	}
	out := make([]GroupLoad, len(loads))
	for i, l := range loads {
		out[i] = GroupLoad(l)
	}
	return out, nil
}

// MaxBusiestGroups is the most keys BusiestGroups lists.
const MaxBusiestGroups = broker.MaxBusiestGroups

// GroupLoad is a group key of a receiver and how many of its messages
// wait behind it.
type GroupLoad struct {
	Key     string
	Waiting int64
}
