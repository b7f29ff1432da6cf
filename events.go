package disker

import "time"

// EventKind says what happened in an Event.
type EventKind int

// The kinds of Event.
const (
	// EventSent: Send accepted a message (Receiver, Sender, MessageID).
	EventSent EventKind = iota + 1
	// EventStarted: a handler started on a delivery (Attempt).
	EventStarted
	// EventHandled: a handler returned without error (Duration).
	EventHandled
	// EventFailed: a handler returned an error or panicked (Err, Duration).
	EventFailed
	// EventRetried: a failed delivery was given back for another attempt.
	EventRetried
	// EventDeadLettered: a message moved to the dead-letter stream (Err).
	EventDeadLettered
	// EventTimedOut: a timeout notice reached this instance for one of its
	// senders, or one of its Requests timed out (Sender, MessageID).
	EventTimedOut
	// EventReplied: a reply was accepted for the sender (Sender is the
	// original sender, MessageID the request's id).
	EventReplied
	// EventLate: a reply was dropped because its request was already
	// settled (ErrLate).
	EventLate
	// EventExpired: a worker dropped a delivery whose deadline had passed
	// without running it, or gave up on one that ran past it.
	EventExpired
	// EventUnavailable: the broker became unreachable (Err). Logged and sent
	// once per change of state.
	EventUnavailable
	// EventAvailable: the broker is reachable again after EventUnavailable.
	EventAvailable
	// EventSlotsLapsed: this instance learnt that the broker no longer
	// counted its global concurrency slots of Receiver
	// (WithGlobalConcurrency): their lease ran out before it renewed them
	// (the instance stalled, or was cut off from the broker), and other
	// instances may have taken them. Its handlers that were running then
	// ran on beside the slots' next holders. Duration is how long before
	// the event the lease ran out at the earliest; it ran out before the
	// event.
	EventSlotsLapsed
)

var eventNames = [...]string{
	EventSent:         "sent",
	EventStarted:      "started",
	EventHandled:      "handled",
	EventFailed:       "failed",
	EventRetried:      "retried",
	EventDeadLettered: "dead_lettered",
	EventTimedOut:     "timed_out",
	EventReplied:      "replied",
	EventLate:         "late",
	EventExpired:      "expired",
	EventUnavailable:  "unavailable",
	EventAvailable:    "available",
	EventSlotsLapsed:  "slots_lapsed",
}

// String returns the kind's name in snake case, such as "dead_lettered", fit
// for a metric label.
func (k EventKind) String() string {
	if k > 0 && int(k) < len(eventNames) {
		return eventNames[k]
	}
	return "unknown"
}

// Event is what Config.OnEvent observes: one step in a message's life in this
// instance. Fields that do not apply to the Kind are zero.
type Event struct {
	// Kind says what happened.
	Kind EventKind
	// Receiver is the receiver concerned.
	Receiver string
	// Sender is the message's sender.
	Sender string
	// MessageID is the message's id.
	MessageID string
	// Attempt is the delivery attempt, from 1.
	Attempt int
	// Duration is how long the handler ran (EventHandled, EventFailed).
	Duration time.Duration
	// Err is the error, if any.
	Err error
}

func (d *Disker) emit(e Event) {
	if d.onEvent != nil {
		d.onEvent(e)
	}
}
