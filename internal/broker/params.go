package broker

import (
	"fmt"
	"time"
)

// The parameters of the operations that take more than three arguments.
// Each has one Validate, which every broker calls first: the checks of a
// call live here, once, and both brokers reject bad input with the same
// error (brokertest asserts it). Callers on a hot path keep one params
// value per loop and pass a pointer to it, so a call allocates nothing.

// FetchParams are the parameters of Queue.Fetch.
type FetchParams struct {
	// Receiver is the receiver whose queue is read.
	Receiver string
	// Consumer is the name the deliveries are leased to.
	Consumer string
	// Max is the most deliveries returned; > 0.
	Max int
	// Block is how long to wait when nothing is there; 0 (or less) does
	// not block.
	Block time.Duration
	// Lease is how long the deliveries stay with Consumer; > 0.
	Lease time.Duration
	// MaxAttempts dead-letters a message delivered this many times
	// instead of delivering it again, writing its record's final state
	// (ResultDeadLettered, with the attempts) in the same step when it has
	// one; 0 (or less) means no limit.
	MaxAttempts int
	// Wake, when set, lets a Fetch that finds nothing and would wait for
	// new entries return at once, with none, leaving the wait registered
	// in the broker as Wait, so that no goroutine waits. Wake is then
	// called, on a goroutine of the broker's, when the next Fetch with
	// these params may find something or has something to do: entries
	// came, the block time ended (a broker may wait on past it while a
	// Fetch would only wait again), or the broker closed; ctx is the
	// caller's to watch. It must return quickly and call no broker method;
	// it may be called more than once, and spuriously. A broker may also
	// wait as without Wake.
	Wake func()
	// Wait is the wait a Fetch with Wake left registered, nil if none: the
	// next Fetch with these params takes it up (what it read) and clears
	// it; a caller that fetches no more ends it with Wait.Cancel.
	Wait Wait
}

// Wait is a wait for entries left registered by a Fetch (see
// FetchParams.Wake).
type Wait interface {
	// Cancel ends the wait and gives back what it read, if anything.
	Cancel()
}

// Validate returns an error naming the first field that is not valid.
func (p *FetchParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("FetchParams.Receiver")
	case p.Consumer == "":
		return empty("FetchParams.Consumer")
	case p.Max <= 0:
		return notPositive("FetchParams.Max", p.Max)
	case p.Lease <= 0:
		return notPositive("FetchParams.Lease", p.Lease)
	}
	return nil
}

// ExtendParams are the parameters of Queue.Extend.
type ExtendParams struct {
	// Receiver is the receiver whose deliveries are extended.
	Receiver string
	// Consumer is the holder of the leases.
	Consumer string
	// Refs are the deliveries' refs.
	Refs []string
	// Lease is the new lease, from now; > 0.
	Lease time.Duration
}

// Validate returns an error naming the first field that is not valid.
func (p *ExtendParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("ExtendParams.Receiver")
	case p.Consumer == "":
		return empty("ExtendParams.Consumer")
	case p.Lease <= 0:
		return notPositive("ExtendParams.Lease", p.Lease)
	}
	return nil
}

// RetryParams are the parameters of Queue.Retry.
type RetryParams struct {
	// Receiver is the receiver whose delivery is retried.
	Receiver string
	// Consumer is the holder of the delivery's lease.
	Consumer string
	// Ref is the delivery's ref.
	Ref string
	// Delay is how long until the message is delivered again; >= 0.
	Delay time.Duration
	// Lease is the lease the consumer holds the delivery for (a broker
	// that ages leases to delay a retry needs it); > 0.
	Lease time.Duration
	// Uncounted gives the delivery back without counting it as an
	// attempt: the next delivery has the same Attempt as this one (the
	// message could not start here for a reason of the consumer's, such as
	// a pool of workers that cannot make one).
	Uncounted bool
}

// Validate returns an error naming the first field that is not valid.
func (p *RetryParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("RetryParams.Receiver")
	case p.Consumer == "":
		return empty("RetryParams.Consumer")
	case p.Ref == "":
		return empty("RetryParams.Ref")
	case p.Delay < 0:
		return negative("RetryParams.Delay", p.Delay)
	case p.Lease <= 0:
		return notPositive("RetryParams.Lease", p.Lease)
	}
	return nil
}

// ReadRepliesParams are the parameters of Replies.ReadReplies.
type ReadRepliesParams struct {
	// Sender is the sender whose reply stream is read.
	Sender string
	// Consumer is the name the entries are leased to (instances of one
	// sender share its stream as competing consumers).
	Consumer string
	// Max is the most entries returned; > 0.
	Max int
	// Block is how long to wait when nothing is there; 0 (or less) does
	// not block.
	Block time.Duration
	// Lease is how long the entries stay with Consumer before another
	// consumer may read them again; > 0.
	Lease time.Duration
}

// Validate returns an error naming the first field that is not valid.
func (p *ReadRepliesParams) Validate() error {
	switch {
	case p.Sender == "":
		return empty("ReadRepliesParams.Sender")
	case p.Consumer == "":
		return empty("ReadRepliesParams.Consumer")
	case p.Max <= 0:
		return notPositive("ReadRepliesParams.Max", p.Max)
	case p.Lease <= 0:
		return notPositive("ReadRepliesParams.Lease", p.Lease)
	}
	return nil
}

// TokensParams are the parameters of Limits.TakeTokens.
type TokensParams struct {
	// Receiver is the receiver whose bucket is used.
	Receiver string
	// Want is how many tokens to take; < 0 puts -Want back; not 0.
	Want int
	// Rate is how many tokens the bucket gains per second; > 0.
	Rate float64
	// Burst is how many tokens the bucket holds at most; >= 1.
	Burst int
}

// Validate returns an error naming the first field that is not valid.
func (p *TokensParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("TokensParams.Receiver")
	case p.Want == 0:
		return fmt.Errorf("broker: TokensParams.Want must not be 0")
	case !(p.Rate > 0):
		return fmt.Errorf("broker: TokensParams.Rate must be > 0, got %v", p.Rate)
	case p.Burst < 1:
		return notPositive("TokensParams.Burst", p.Burst)
	}
	return nil
}

// SlotsParams are the parameters of Limits.Slots.
type SlotsParams struct {
	// Receiver is the receiver whose slots are held.
	Receiver string
	// Holder is the name the slots are held under (an instance).
	Holder string
	// Delta is how many slots to take (> 0) or give back (< 0).
	Delta int
	// Limit is how many slots the holders of Receiver may hold together;
	// > 0.
	Limit int
	// Lease is how long the holder's slots stay held unless renewed; > 0.
	Lease time.Duration
}

// Validate returns an error naming the first field that is not valid.
func (p *SlotsParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("SlotsParams.Receiver")
	case p.Holder == "":
		return empty("SlotsParams.Holder")
	case p.Limit <= 0:
		return notPositive("SlotsParams.Limit", p.Limit)
	case p.Lease <= 0:
		return notPositive("SlotsParams.Lease", p.Lease)
	}
	return nil
}

// CancelParams are the parameters of Cancels.Cancel.
type CancelParams struct {
	// Receiver is the receiver the message was sent to.
	Receiver string
	// ID is the message's id.
	ID string
	// Since is a broker time no later than when the message was sent:
	// queue entries added before it are not read. The zero time reads
	// from the start.
	Since time.Time
	// MaxScan is the most queue entries read to find the message; > 0.
	MaxScan int
}

// Validate returns an error naming the first field that is not valid.
func (p *CancelParams) Validate() error {
	switch {
	case p.Receiver == "":
		return empty("CancelParams.Receiver")
	case p.ID == "":
		return empty("CancelParams.ID")
	case p.MaxScan <= 0:
		return notPositive("CancelParams.MaxScan", p.MaxScan)
	}
	return nil
}

// CheckName returns an error naming field when v is empty: the check of
// a name argument of an operation without a params type, shared by the
// brokers.
func CheckName(field, v string) error {
	if v == "" {
		return empty(field)
	}
	return nil
}

// CheckPositive returns an error naming field when v is not > 0: the
// check of a count or duration argument of an operation without a params
// type, shared by the brokers.
func CheckPositive[T int | time.Duration](field string, v T) error {
	if v <= 0 {
		return notPositive(field, v)
	}
	return nil
}

func empty(field string) error { return fmt.Errorf("broker: %s is empty", field) }

func notPositive[T int | time.Duration](field string, v T) error {
	return fmt.Errorf("broker: %s must be > 0, got %v", field, v)
}

func negative[T int | time.Duration](field string, v T) error {
	return fmt.Errorf("broker: %s must be >= 0, got %v", field, v)
}

// PartialParams are the parameters of Streams.Partial.
type PartialParams struct {
	// Inbox is the requester's inbox (the message's Sender).
	Inbox string
	// RequestID is the id of the streamed request.
	RequestID string
	// Attempt is the delivery attempt of the handler that sends it; > 0.
	Attempt int
	// Kind is what the partial carries; PartData when 0.
	Kind PartKind
	// Data is the partial's content.
	Data []byte
	// Deadline is the request's deadline, broker time; zero for none.
	Deadline time.Time
	// Max is the most partials an attempt may append; > 0.
	Max int
}

// Validate returns an error naming the first field that is not valid.
func (p *PartialParams) Validate() error {
	if err := CheckName("PartialParams.Inbox", p.Inbox); err != nil {
		return err
	}
	if err := CheckName("PartialParams.RequestID", p.RequestID); err != nil {
		return err
	}
	if err := CheckPositive("PartialParams.Attempt", p.Attempt); err != nil {
		return err
	}
	if p.Kind < 0 || p.Kind > PartProgress {
		return fmt.Errorf("broker: PartialParams.Kind %d is not a PartKind", p.Kind)
	}
	return CheckPositive("PartialParams.Max", p.Max)
}
