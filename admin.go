package disker

import (
	"context"
	"errors"
	"sort"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// WorkerInfo describes a live instance in the registry of workers.
type WorkerInfo struct {
	// ID is the instance's id (Config.InstanceID).
	ID string `json:"id"`
	// Host is the host name of the machine it runs on.
	Host string `json:"host"`
	// PID is its process id.
	PID int `json:"pid"`
	// Receivers are the receivers it serves, sorted.
	Receivers []string `json:"receivers"`
	// Concurrency is the concurrency of each receiver it serves.
	Concurrency map[string]int `json:"concurrency"`
	// GlobalConcurrency is WithGlobalConcurrency of each receiver it
	// serves that has one.
	GlobalConcurrency map[string]int `json:"global_concurrency,omitempty"`
	// RateLimit and RateBurst are WithRateLimit of each receiver it serves
	// that has one.
	RateLimit map[string]float64 `json:"rate_limit,omitempty"`
	RateBurst map[string]int     `json:"rate_burst,omitempty"`
	// InFlight is how many messages it was handling at its last heartbeat.
	InFlight int64 `json:"in_flight"`
	// Processed is how many messages it handled successfully.
	Processed int64 `json:"processed"`
	// Failed is how many handler calls failed.
	Failed int64 `json:"failed"`
	// StartedAt is when it started.
	StartedAt time.Time `json:"started_at"`
	// LastSeen is when its last heartbeat reached the broker (broker time).
	LastSeen time.Time `json:"last_seen"`
}

// ReceiverStats is a snapshot of one receiver's queue in the broker.
type ReceiverStats struct {
	// Receiver is the receiver's name.
	Receiver string `json:"receiver"`
	// Queued counts messages not yet delivered.
	Queued int64 `json:"queued"`
	// Pending counts messages delivered and not yet acknowledged: in flight,
	// or waiting for a retry or for redelivery.
	Pending int64 `json:"pending"`
	// DeadLetters counts messages in the dead-letter stream.
	DeadLetters int64 `json:"dead_letters"`
	// Length counts every message in the queue (queued and pending).
	Length int64 `json:"length"`
	// Deferred counts messages sent for later (WithDelay, WithDeliverAt)
	// that are not due yet: they are in none of the counts above.
	Deferred int64 `json:"deferred"`
	// OldestQueued is when the oldest message not yet delivered was queued
	// (broker time); zero when none waits.
	OldestQueued time.Time `json:"oldest_queued,omitzero"`
	// Paused reports whether the receiver is paused (Pause): its messages
	// queue, and no instance starts them until Resume.
	Paused bool `json:"paused"`
	// QueuedHigh and QueuedLow count the messages of Queued sent with
	// PriorityHigh and PriorityLow (the others are at PriorityNormal).
	QueuedHigh int64 `json:"queued_high,omitempty"`
	QueuedLow  int64 `json:"queued_low,omitempty"`
	// Expired counts the messages dropped because their expiry
	// (WithExpiry) or deadline (WithTimeout) had passed: never started, or
	// failed after the deadline (not retried: nobody waits for them), by
	// every instance, since the receiver's first.
	Expired int64 `json:"expired"`
	// GroupWaiting counts the keyed messages (WithGroup) waiting behind
	// their key, in none of the counts above; GroupKeys counts the keys
	// that have some (BusiestGroups lists them).
	GroupWaiting int64 `json:"group_waiting,omitempty"`
	GroupKeys    int64 `json:"group_keys,omitempty"`

	// Scheduled is Deferred, under its former name (in JSON too, for
	// readers of the former name).
	//
	// Deprecated: use Deferred. "Schedule" names the periodic schedules
	// (Schedule) alone.
	Scheduled int64 `json:"scheduled"`
}

// receiverStats is the ReceiverStats of the broker's snapshot s.
func receiverStats(s broker.ReceiverStats) ReceiverStats {
	return ReceiverStats{
		Receiver:     s.Receiver,
		Queued:       s.Queued,
		Pending:      s.Pending,
		DeadLetters:  s.DeadLetters,
		Length:       s.Length,
		Deferred:     s.Deferred,
		OldestQueued: s.OldestQueued,
		Paused:       s.Paused,
		QueuedHigh:   s.QueuedHigh,
		QueuedLow:    s.QueuedLow,
		Expired:      s.Expired,
		GroupWaiting: s.GroupWaiting,
		GroupKeys:    s.GroupKeys,
		Scheduled:    s.Deferred,
	}
}

// DeadLetter is a message in a receiver's dead-letter stream.
type DeadLetter struct {
	// ID is the dead-letter entry's id: pass it to RetryDeadLetters or
	// PurgeDeadLetters. It differs from Message.ID.
	ID string `json:"id"`
	// Message is the message as it was sent. Its ID is empty for an entry
	// that could not be decoded; Raw then holds its bytes.
	Message Message `json:"message"`
	// Raw is the undecodable entry, if any.
	Raw []byte `json:"raw,omitempty"`
	// Reason says why the message was dead-lettered (the last error).
	Reason string `json:"reason"`
	// Attempts is how many deliveries were made.
	Attempts int `json:"attempts"`
	// At is when it was dead-lettered (broker time).
	At time.Time `json:"at"`
}

// ReceiverLocalStats are the counters of one receiver served by this
// instance (see LocalStats).
type ReceiverLocalStats struct {
	// Concurrency is the receiver's handler concurrency: messages handled
	// at a time, or batches for a batch handler (HandleBatch).
	Concurrency int
	// BatchSize is the most messages of a batch of a batch handler
	// (WithBatchSize); 0 for a Handler.
	BatchSize int
	// Exclusive tells whether it was registered WithExclusive; HoldsLock
	// whether this instance holds its lock now.
	Exclusive, HoldsLock bool
	// InFlight counts messages being handled now, and those fetched ahead
	// that wait for a free handler (WithPrefetch).
	InFlight int64
	// Processed counts messages handled successfully.
	Processed int64
	// Failed counts handler calls that failed (errors and panics).
	Failed int64
	// Retried counts failed deliveries given back for another attempt.
	Retried int64
	// DeadLettered counts messages this instance moved to the dead-letter
	// stream.
	DeadLettered int64
	// Expired counts messages dropped because their deadline or expiry
	// had passed (see ReceiverStats.Expired).
	Expired int64
	// GivenBack counts messages given back without counting an attempt
	// (HandleWithPool: no worker could be had, or it was broken).
	GivenBack int64
	// DroppedReplies counts the replies the handler returned to
	// fire-and-forget messages (sent without a Sender, not idempotent):
	// nobody receives them. The first is logged, as a hint of a forgotten
	// Sender.
	DroppedReplies int64
	// GlobalConcurrency is the receiver's WithGlobalConcurrency (0 when
	// none), and HeldSlots how many of its slots this instance holds now.
	GlobalConcurrency, HeldSlots int
	// RateLimit and RateBurst are the receiver's WithRateLimit (0 when
	// none).
	RateLimit float64
	RateBurst int
}

// LocalStats are this instance's counters since New.
type LocalStats struct {
	// Receivers holds the counters of each receiver served now.
	Receivers map[string]ReceiverLocalStats
	// Sent counts messages sent (Send and Request).
	Sent int64
	// Replied counts replies the broker accepted from this instance.
	Replied int64
	// Late counts replies dropped because their request was already
	// settled (ErrLate).
	Late int64
	// TimedOut counts the timeouts this instance's senders received:
	// timeout notices for messages sent with Send, and Requests that
	// timed out.
	TimedOut int64
	// UnhandledReplies counts the replies to a sender that had a
	// TimeoutHandler but no ReplyHandler here: the default reply handler
	// logged them (see OnTimeout).
	UnhandledReplies int64
}

// LocalStats returns this instance's counters. It does no I/O.
func (d *Disker) LocalStats() LocalStats {
	s := LocalStats{
		Receivers: make(map[string]ReceiverLocalStats),
		Sent:      d.sent.Load(),
		Replied:   d.replied.Load(),
		Late:      d.late.Load(),
		TimedOut:  d.timedOut.Load(),

		UnhandledReplies: d.unhandledReplies.Load(),
	}
	d.mu.Lock()
	for name, c := range d.consumers {
		s.Receivers[name] = c.stats()
	}
	d.mu.Unlock()
	return s
}

// Workers lists the live instances connected to the broker, by id.
func (d *Disker) Workers(ctx context.Context) ([]WorkerInfo, error) {
	ws, err := call(d, "workers", func() ([]broker.WorkerInfo, error) { return d.b.Workers(ctx) })
	if err != nil {
		return nil, err
	}
	out := make([]WorkerInfo, len(ws))
	for i, w := range ws {
		out[i] = WorkerInfo(w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Receivers lists the receivers the broker knows: served by an instance, or
// holding messages or dead letters. Sorted.
func (d *Disker) Receivers(ctx context.Context) ([]string, error) {
	rs, err := call(d, "receivers", func() ([]string, error) { return d.b.Receivers(ctx) })
	if err != nil {
		return nil, err
	}
	out := rs[:0]
	for _, r := range rs {
		// Not a name a user can choose: Disker's own (such as the
		// dead letters of an inbox).
		if validName(r) == "" {
			out = append(out, r)
		}
	}
	sort.Strings(out)
	return out, nil
}

// Stats returns a snapshot of receiver's queue.
func (d *Disker) Stats(ctx context.Context, receiver string) (ReceiverStats, error) {
	if err := checkName("receiver", receiver); err != nil {
		return ReceiverStats{}, err
	}
	s, err := call(d, "stats", func() (broker.ReceiverStats, error) { return d.b.Stats(ctx, receiver) })
	if err != nil {
		return ReceiverStats{}, err
	}
	return receiverStats(s), nil
}

// DeadLetters lists up to max dead letters of receiver, oldest first.
func (d *Disker) DeadLetters(ctx context.Context, receiver string, max int) ([]DeadLetter, error) {
	return d.DeadLettersAfter(ctx, receiver, "", max)
}

// DeadLettersAfter lists up to max dead letters of receiver, oldest first,
// starting after the dead letter with id after (which need not exist any
// more): pass the last id of a page to read the next one without reading
// the pages before. An empty after starts from the oldest.
func (d *Disker) DeadLettersAfter(ctx context.Context, receiver, after string, max int) ([]DeadLetter, error) {
	if err := checkName("receiver", receiver); err != nil {
		return nil, err
	}
	if max < 1 {
		return nil, invalid("max", "must be >= 1, got %d", max)
	}
	dls, err := call(d, "dead letters", func() ([]broker.DeadLetter, error) {
		return d.b.DeadLettersAfter(ctx, &broker.DeadLettersParams{Receiver: receiver, After: after, Max: max})
	})
	if errors.Is(err, broker.ErrBadRef) {
		return nil, invalid("after", "%q is not a dead letter's id", after)
	}
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(dls))
	for i := range dls {
		dl := &dls[i]
		out[i] = DeadLetter{
			ID:       dl.Ref,
			Message:  *d.messageOf(&dl.Env, time.Time{}, 0),
			Raw:      dl.Raw,
			Reason:   dl.Reason,
			Attempts: dl.Attempts,
			At:       dl.At,
		}
	}
	return out, nil
}

// RetryDeadLetters moves the dead letters with the given ids (all of them
// when none is given) back to receiver's queue, with their attempts reset.
// It returns how many moved; undecodable entries stay.
func (d *Disker) RetryDeadLetters(ctx context.Context, receiver string, ids ...string) (int, error) {
	if err := checkName("receiver", receiver); err != nil {
		return 0, err
	}
	return call(d, "retry dead letters", func() (int, error) { return d.b.RetryDeadLetters(ctx, receiver, ids...) })
}

// PurgeDeadLetters deletes the dead letters with the given ids (all of them
// when none is given) and returns how many it deleted.
func (d *Disker) PurgeDeadLetters(ctx context.Context, receiver string, ids ...string) (int, error) {
	if err := checkName("receiver", receiver); err != nil {
		return 0, err
	}
	return call(d, "purge dead letters", func() (int, error) { return d.b.PurgeDeadLetters(ctx, receiver, ids...) })
}

// StatsOf returns the stats of each receiver, in the order given, read in
// one round trip to Redis (one per node of a Cluster holding some of them):
// what a dashboard polls, where calling Stats for each receiver would cost
// a round trip each.
func (d *Disker) StatsOf(ctx context.Context, receivers ...string) ([]ReceiverStats, error) {
	for _, r := range receivers {
		if err := checkName("receiver", r); err != nil {
			return nil, err
		}
	}
	ss, err := call(d, "stats", func() ([]broker.ReceiverStats, error) { return d.b.StatsMany(ctx, receivers) })
	if err != nil {
		return nil, err
	}
	out := make([]ReceiverStats, len(ss))
	for i, s := range ss {
		out[i] = receiverStats(s)
	}
	return out, nil
}

// MessageState says where a message is (see Fate).
type MessageState string

// The states Fate reports.
const (
	// MessageQueued: in the receiver's queue, not yet delivered.
	MessageQueued MessageState = "queued"
	// MessageInFlight: delivered and not yet acknowledged: being handled,
	// or waiting for a retry or a redelivery.
	MessageInFlight MessageState = "in_flight"
	// MessageDeadLettered: in the receiver's dead letters.
	MessageDeadLettered MessageState = "dead_lettered"
	// MessageGone: nowhere in the receiver's queue or dead letters:
	// handled and acknowledged, purged, or never sent to this receiver.
	MessageGone MessageState = "gone"
	// MessageUnknown: not found among the entries Fate reads, which
	// stopped at its bound (FateScan) before the end.
	MessageUnknown MessageState = "unknown"
)

// MessageFate is where a message is (see Fate).
type MessageFate struct {
	// State says where it is.
	State MessageState `json:"state"`
	// Attempts is how many deliveries were made (in flight, dead-lettered).
	Attempts int `json:"attempts,omitempty"`
	// Reason says why it was dead-lettered.
	Reason string `json:"reason,omitempty"`
	// DeadLetterID is its dead letter's id, for RetryDeadLetters and
	// PurgeDeadLetters.
	DeadLetterID string `json:"dead_letter_id,omitempty"`
	// At is when it was queued (queued, in flight) or dead-lettered
	// (broker time); zero otherwise.
	At time.Time `json:"at,omitzero"`
}

// FateScan is the most entries Fate reads in each of a receiver's queue
// and dead letters, from about when the message was sent.
const FateScan = 10000

// fateSkew is how long before an id's time Fate starts reading: the
// sender's clock may run ahead of Redis's by up to that.
const fateSkew = time.Minute

// Fate tells where message id, sent to receiver, is now: queued, in flight
// (with its attempts), dead-lettered (with the reason), or gone
// (acknowledged, purged, or never sent there). Nothing indexes messages by
// id, so Fate reads the entries added since the id was made (a minute
// earlier, for clocks that differ), up to FateScan of the queue and as many
// of the dead letters, in one read-only step; past that bound it answers
// MessageUnknown. A malformed id (not one that Send returns) is a
// *ValidationError, as for Cancel.
func (d *Disker) Fate(ctx context.Context, receiver, id string) (MessageFate, error) {
	if err := checkName("receiver", receiver); err != nil {
		return MessageFate{}, err
	}
	at, ok := idTime(id)
	if !ok {
		return MessageFate{}, invalid("id", "%q is not a message id (26 characters of Crockford base32, as Send returns)", id)
	}
	p := broker.FateParams{Receiver: receiver, ID: id, MaxScan: FateScan, Since: at.Add(-fateSkew)}
	f, err := call(d, "fate", func() (broker.Fate, error) { return d.b.Fate(ctx, &p) })
	if err != nil {
		return MessageFate{}, err
	}
	out := MessageFate{Attempts: f.Attempts, Reason: f.Reason, At: f.At}
	switch f.State {
	case broker.StateQueued:
		out.State = MessageQueued
	case broker.StatePending:
		out.State = MessageInFlight
	case broker.StateDeadLettered:
		out.State, out.DeadLetterID = MessageDeadLettered, f.Ref
	case broker.StateGone:
		out.State = MessageGone
	default:
		out.State = MessageUnknown
	}
	return out, nil
}
