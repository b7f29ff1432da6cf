package broker

import (
	"context"
	"fmt"
)

// Groups are the keyed groups of a receiver's messages: the messages sent
// with one SendParams.GroupKey run at most Concurrency at a time (one, by
// default: one after the other), in the order the broker accepted them,
// and the keys of a receiver run in parallel and in rotation. A message of
// a key that has Concurrency messages out (delivered and not settled, or
// queued for delivery) waits behind them, outside the receiver's queue,
// and is queued when one of them is settled (Ack, Drop, DeadLetter,
// Cancel; and Retry when SkipRetries) and, with a Rate, a token of its key
// is due. So a key with many waiting messages has at most Concurrency of
// them in the queue, and a key with one is queued behind the others' out
// ones only: keys take turns.
//
// A delivery of a keyed message carries its key (Delivery.GroupKey). A
// broker keeps per key only what its waiting and out messages need, and
// nothing once the key is drained: no count of keys to configure.
type Groups interface {
	// ConfigureGroups sets how p.Receiver's groups run, for every
	// instance: the consumers of the receiver call it when they start.
	ConfigureGroups(ctx context.Context, p *GroupConfig) error
	// BusiestGroups returns up to n (1..MaxBusiestGroups) keys of receiver
	// with the most waiting messages, most first (ties: the greater key
	// first).
	BusiestGroups(ctx context.Context, receiver string, n int) ([]GroupLoad, error)
}

// MaxBusiestGroups is the most keys BusiestGroups lists.
const MaxBusiestGroups = 1000

// CheckBusiest returns an error when n is not a count BusiestGroups takes.
func CheckBusiest(n int) error {
	if n < 1 || n > MaxBusiestGroups {
		return fmt.Errorf("broker: n must be in 1..%d, got %d", MaxBusiestGroups, n)
	}
	return nil
}

// MaxGroupConcurrency is the most messages of one key out at a time.
const MaxGroupConcurrency = 1 << 20

// GroupConfig is how a receiver's keyed groups run.
type GroupConfig struct {
	// Receiver is the receiver.
	Receiver string
	// Concurrency is the most messages of one key out at a time, from 1
	// (strict order) to MaxGroupConcurrency.
	Concurrency int
	// Rate, when > 0, is the most messages of one key queued per second
	// (broker time), with bursts of Burst (>= 1): a key's token bucket.
	Rate  float64
	Burst int
	// SkipRetries lets a key go on while one of its messages waits for a
	// retry: a Retry settles the message for its key (the next is queued),
	// and the retried message runs when its delay has passed, outside the
	// key's order and count. Without it the key waits until the message
	// succeeds or is dead-lettered.
	SkipRetries bool
}

// Validate returns an error naming the first field that is not valid.
func (p *GroupConfig) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("GroupConfig.Receiver")
	case p.Concurrency < 1 || p.Concurrency > MaxGroupConcurrency:
		return fmt.Errorf("broker: GroupConfig.Concurrency must be in 1..%d, got %d", MaxGroupConcurrency, p.Concurrency)
	case p.Rate < 0:
		return fmt.Errorf("broker: GroupConfig.Rate must be >= 0, got %v", p.Rate)
	case p.Rate > 0 && p.Burst < 1:
		return notPositive("GroupConfig.Burst", p.Burst)
	}
	return nil
}

// GroupLoad is a key of a receiver and how many of its messages wait.
type GroupLoad struct {
	Key     string
	Waiting int64
}
