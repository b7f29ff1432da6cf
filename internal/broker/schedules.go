package broker

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Schedules are the periodic schedules: named records, each of which sends
// a message to one receiver at each of its ticks. The broker stores them
// and decides each tick; the client computes the tick times (from an
// interval or a cron expression it keeps, encoded, in the record's Def) and
// builds the messages.
//
// A tick is decided once: TickSchedule is one atomic step that compares the
// schedule's next tick with the one the caller saw, checks by broker time
// that it is due, moves the next tick on, and queues the tick's message.
// However many instances call it for the same tick, one of them sends it
// and the others learn that it was taken.
type Schedules interface {
	// PutSchedule stores s (Name, Receiver, Def, Next) and returns the
	// schedule as stored. When a schedule of that name exists with the
	// same Receiver and Def it is left as it is (its Next, last tick and
	// Version stay): registering one schedule again, from any number of
	// instances, changes nothing. Otherwise it replaces it, with Next from
	// s, the last tick kept, and a Version greater than any the name had.
	PutSchedule(ctx context.Context, s *ScheduleRecord) (ScheduleRecord, error)

	// RemoveSchedule deletes the schedule called name, and reports
	// whether there was one. Once it returns, no tick of the schedule is
	// sent.
	RemoveSchedule(ctx context.Context, name string) (bool, error)

	// ListSchedules returns every stored schedule, in no particular order.
	ListSchedules(ctx context.Context) ([]ScheduleRecord, error)

	// TickSchedule decides the tick p.Due of schedule p.Name in one atomic
	// step (see TickParams and TickOutcome).
	TickSchedule(ctx context.Context, p *TickParams) (TickResult, error)
}

// ScheduleRecord is a schedule as the broker stores it.
type ScheduleRecord struct {
	// Name is the schedule's name, unique in the broker.
	Name string
	// Receiver is the receiver its messages go to.
	Receiver string
	// Def is the schedule's definition, encoded by the client (its timing,
	// what to send); the broker only compares and returns it.
	Def []byte
	// Next is the time of the next tick, broker time.
	Next time.Time
	// Version is set by the broker: it grows each time the schedule is
	// replaced (PutSchedule with another Receiver or Def).
	Version int64
	// LastTick is the time of the last tick that sent a message (zero
	// when none did yet), and LastSent the broker time it was sent at.
	LastTick, LastSent time.Time
}

// Validate returns an error naming the first field that is not valid for
// PutSchedule.
func (s *ScheduleRecord) Validate() error {
	switch {
	case s.Name == "":
		return empty("ScheduleRecord.Name")
	case s.Receiver == "":
		return empty("ScheduleRecord.Receiver")
	case len(s.Def) == 0:
		return empty("ScheduleRecord.Def")
	case s.Next.IsZero():
		return errors.New("broker: ScheduleRecord.Next is zero")
	}
	return nil
}

// TickParams are the parameters of Schedules.TickSchedule: the tick the
// caller wants decided, the schedule's state as the caller last saw it,
// and what to send.
type TickParams struct {
	// Name and Receiver name the schedule, as last seen.
	Name, Receiver string
	// Version is the schedule's Version as last seen.
	Version int64
	// Due is the tick decided: the schedule's Next as last seen.
	Due time.Time
	// Following is the tick after Due; after Due.
	Following time.Time
	// Resume is where the schedule goes on when ticks were missed: the
	// first tick after broker-now as the caller estimates it; not before
	// Following.
	Resume time.Time
	// MissedAfter: the tick Due counts as missed when, at the decision,
	// Following is due too and Due is at least MissedAfter old (>= 0).
	MissedAfter time.Duration
	// Env is the message of the tick Due, sent when Due is not missed. Its
	// Receiver is Receiver and it has no Timeout.
	Env *Envelope
	// MissedEnv is sent in place of Env when Due was missed; nil skips
	// missed ticks (nothing is sent). Its Receiver is Receiver and it has
	// no Timeout.
	MissedEnv *Envelope
}

// Validate returns an error naming the first field that is not valid.
func (p *TickParams) Validate() error {
	switch {
	case p.Name == "":
		return empty("TickParams.Name")
	case p.Receiver == "":
		return empty("TickParams.Receiver")
	case p.Due.IsZero():
		return errors.New("broker: TickParams.Due is zero")
	case !p.Following.After(p.Due):
		return fmt.Errorf("broker: TickParams.Following (%v) is not after Due (%v)", p.Following, p.Due)
	case p.Resume.Before(p.Following):
		return fmt.Errorf("broker: TickParams.Resume (%v) is before Following (%v)", p.Resume, p.Following)
	case p.MissedAfter < 0:
		return negative("TickParams.MissedAfter", p.MissedAfter)
	case p.Env == nil:
		return errors.New("broker: TickParams.Env is nil")
	}
	for _, c := range []struct {
		field string
		env   *Envelope
	}{{"TickParams.Env", p.Env}, {"TickParams.MissedEnv", p.MissedEnv}} {
		switch {
		case c.env == nil:
		case c.env.Receiver != p.Receiver:
			return fmt.Errorf("broker: %s.Receiver is %q, not the schedule's %q", c.field, c.env.Receiver, p.Receiver)
		case c.env.ID == "":
			return empty(c.field + ".ID")
		case c.env.Timeout != 0:
			return fmt.Errorf("broker: %s.Timeout must be 0, got %v", c.field, c.env.Timeout)
		}
	}
	return nil
}

// TickOutcome says what TickSchedule did.
type TickOutcome int

// The outcomes of TickSchedule.
const (
	// TickSent: Due was due and not missed; Env was queued and the next
	// tick is Following.
	TickSent TickOutcome = iota + 1
	// TickCaughtUp: Due was missed; MissedEnv was queued for it and the
	// ticks up to Resume, and the next tick is Resume.
	TickCaughtUp
	// TickSkipped: Due was missed and MissedEnv is nil; nothing was queued
	// and the next tick is Resume.
	TickSkipped
	// TickNotDue: broker-now is before Due; nothing was done.
	TickNotDue
	// TickTaken: the schedule's Next or Version is not the caller's (the
	// tick was decided by another call, or the schedule was replaced);
	// nothing was done.
	TickTaken
	// TickGone: there is no schedule of that name (it was removed, or
	// moved to another receiver); nothing was done.
	TickGone
)

// String returns the outcome's name.
func (o TickOutcome) String() string {
	switch o {
	case TickSent:
		return "sent"
	case TickCaughtUp:
		return "caught-up"
	case TickSkipped:
		return "skipped"
	case TickNotDue:
		return "not-due"
	case TickTaken:
		return "taken"
	case TickGone:
		return "gone"
	}
	return fmt.Sprintf("TickOutcome(%d)", int(o))
}

// TickResult is what TickSchedule did, and the schedule's state after it.
type TickResult struct {
	// Outcome says what was done.
	Outcome TickOutcome
	// Next and Version are the schedule's after the call (zero when Gone).
	Next    time.Time
	Version int64
	// Now is the broker time of the decision.
	Now time.Time
}

// DecideTick is the decision of TickSchedule, for a broker that holds the
// schedule's state in memory: given the schedule's Version and Next (ok
// false when there is none) and broker-now, it returns the outcome and the
// next tick. The envelope to queue, if any, is p.Env for TickSent and
// p.MissedEnv for TickCaughtUp.
func DecideTick(p *TickParams, ok bool, version int64, next, now time.Time) (TickOutcome, time.Time) {
	switch {
	case !ok:
		return TickGone, time.Time{}
	case version != p.Version || !next.Equal(p.Due):
		return TickTaken, next
	case now.Before(p.Due):
		return TickNotDue, next
	case !now.Before(p.Following) && now.Sub(p.Due) >= p.MissedAfter:
		if p.MissedEnv == nil {
			return TickSkipped, p.Resume
		}
		return TickCaughtUp, p.Resume
	}
	return TickSent, p.Following
}
