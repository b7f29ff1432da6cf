// Package testhook is how package diskertest, the test kit, drives a
// disker.Disker by hand, and how the fault-injection harness observes one.
// Package disker sets Open when it is initialised; the kit calls it. The
// harness sets Acked; package disker calls it. It is not an API: nothing
// else uses it.
//
// An instance made by Open runs on the broker it is given, and its loops
// that wait for time to pass (the fetching of its receivers, the reading of
// its reply streams, the ticking of schedules, the settling of timeouts)
// do not run in goroutines of their own: the kit runs each step of them
// on its own goroutine, through Instance, when the test says.
package testhook

import (
	"context"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Open makes a *disker.Disker (returned as any) from cfg, a disker.Config,
// on b instead of the broker cfg selects, driven by hand through the
// Instance it returns. Set by package disker.
var Open func(ctx context.Context, cfg any, b broker.Broker) (any, Instance, error)

// Instance is what the kit drives of an instance made by Open: the steps
// that an instance otherwise takes in its own goroutines, taken on the
// caller's goroutine. Each returns the first error of the broker.
type Instance interface {
	// Drain runs the messages of receiver that are due, one at a time (a
	// batch handler's in batches of up to its batch size), each through
	// the receiver's handler and the settling of its outcome
	// (acknowledgement, reply, retry, dead letter), until none is due, the
	// receiver is paused or its flow limits allow no more, or max were
	// fetched. It returns how many it fetched.
	Drain(ctx context.Context, receiver string, max int) (int, error)
	// DrainReplies hands the entries of sender's reply stream (replies
	// and timeout notices) to the handlers registered for sender, up to
	// max, and acknowledges them. It returns how many it handed on.
	DrainReplies(ctx context.Context, sender string, max int) (int, error)
	// Names returns, sorted, the receivers the instance serves and the
	// senders it has reply or timeout handlers for.
	Names() (receivers, senders []string)
	// Tick sends the ticks of the stored schedules that are due, when the
	// instance runs the schedules (it serves a receiver or registered a
	// schedule), and returns the time of the next tick, broker time; zero
	// when there is none.
	Tick(ctx context.Context) (time.Time, error)
	// Expire settles the expired timeouts of the senders the instance
	// watches.
	Expire(ctx context.Context) error
	// KeepAlive renews the instance's entry in the registry of workers
	// and its inbox, if open, for extra beyond their usual lifetime: the
	// broker's clock is about to move forward by extra, over which a live
	// instance would have renewed them.
	KeepAlive(ctx context.Context, extra time.Duration) error
}

// Acked is told, when set, how each acknowledgement of a handled delivery
// ended, after the call that carried it returned (with its retries, if it
// failed): the receiver, the message's id, the delivery's attempt, and the
// call's error (nil: the broker deleted the entry). Package disker calls
// it, on the goroutine that acknowledged, in every instance of the
// process; the fault-injection harness (internal/chaos) sets it, before it
// opens an instance, to record when each acknowledgement was made.
var Acked func(receiver, id string, attempt int, err error)
