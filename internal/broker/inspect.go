package broker

import (
	"context"
	"errors"
	"time"
)

// Inspect answers what a dashboard asks in bulk or by message: the stats of
// many receivers at once, the fate of one message, and dead letters page by
// page.
type Inspect interface {
	// StatsMany returns the stats of each receiver, in the order given, in
	// one round trip (one per Cluster node that holds some of them).
	StatsMany(ctx context.Context, receivers []string) ([]ReceiverStats, error)
	// Fate finds message p.ID in p.Receiver's queue or dead letters,
	// reading at most p.MaxScan entries of each, added since p.Since.
	Fate(ctx context.Context, p *FateParams) (Fate, error)
	// DeadLettersAfter lists up to p.Max dead letters of p.Receiver, oldest
	// first, from the first after p.After: a page that starts where the
	// last one ended, without reading the pages before. An After of the
	// wrong form is ErrBadRef.
	DeadLettersAfter(ctx context.Context, p *DeadLettersParams) ([]DeadLetter, error)
}

// State is where a broker found a message (see Inspect.Fate).
type State int

// The states of a message, as far as the broker can tell.
const (
	// StateUnknown: not found in the entries scanned, and the scan
	// stopped at its bound before the end.
	StateUnknown State = iota
	// StateQueued: in the queue, not yet delivered.
	StateQueued
	// StatePending: delivered and not yet acknowledged (in flight, or
	// waiting for a retry or a redelivery).
	StatePending
	// StateDeadLettered: in the dead-letter stream.
	StateDeadLettered
	// StateGone: not found, and the scan covered every entry since
	// FateParams.Since: acknowledged and deleted, purged, or never sent
	// to the receiver.
	StateGone
)

// Fate is where a message is (see Inspect.Fate).
type Fate struct {
	State State
	// Ref is the entry's handle in the queue or the dead letters.
	Ref string
	// Attempts is how many deliveries were made (pending, dead-lettered).
	Attempts int
	// Reason says why it was dead-lettered.
	Reason string
	// At is when its entry was added (queue) or dead-lettered (broker
	// time).
	At time.Time
}

// FateParams are the parameters of Inspect.Fate.
type FateParams struct {
	// Receiver is the receiver the message was sent to.
	Receiver string
	// ID is the message's id.
	ID string
	// Since is a broker time no later than when the message was queued:
	// entries added before it are not read. The zero time reads from the
	// start.
	Since time.Time
	// MaxScan is the most entries read in each of the queue and the dead
	// letters; > 0.
	MaxScan int
}

// Validate returns an error naming the first field that is not valid.
func (p *FateParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("FateParams.Receiver")
	case p.ID == "":
		return empty("FateParams.ID")
	case p.MaxScan <= 0:
		return notPositive("FateParams.MaxScan", p.MaxScan)
	}
	return nil
}

// ErrBadRef is the error of DeadLettersAfter when DeadLettersParams.After
// does not have the form of the broker's dead-letter handles.
var ErrBadRef = errors.New("broker: DeadLettersParams.After is not a dead letter's id")

// DeadLettersParams are the parameters of Inspect.DeadLettersAfter.
type DeadLettersParams struct {
	// Receiver is the receiver whose dead letters are listed.
	Receiver string
	// After is a dead letter's Ref: the list starts after it (it need not
	// be there any more). Empty starts from the oldest.
	After string
	// Max is the most dead letters returned; > 0.
	Max int
}

// Validate returns an error naming the first field that is not valid.
func (p *DeadLettersParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("DeadLettersParams.Receiver")
	case p.Max <= 0:
		return notPositive("DeadLettersParams.Max", p.Max)
	}
	return nil
}
