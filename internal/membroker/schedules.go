package membroker

import (
	"bytes"
	"context"
	"sort"

	"github.com/diskerhq/disker/internal/broker"
)

// schedule is a stored periodic schedule (see broker.Schedules).
type schedule struct {
	rec broker.ScheduleRecord
}

// PutSchedule stores s unless it is stored as it is (same Receiver and
// Def), in one step.
func (b *Broker) PutSchedule(ctx context.Context, s *broker.ScheduleRecord) (broker.ScheduleRecord, error) {
	if err := b.check(ctx); err != nil {
		return broker.ScheduleRecord{}, err
	}
	if err := s.Validate(); err != nil {
		return broker.ScheduleRecord{}, err
	}
	if err := b.lock(ctx); err != nil {
		return broker.ScheduleRecord{}, err
	}
	defer b.c.mu.Unlock()
	if b.c.schedules == nil {
		b.c.schedules = make(map[string]*schedule)
	}
	cur := b.c.schedules[s.Name]
	if cur != nil && cur.rec.Receiver == s.Receiver && bytes.Equal(cur.rec.Def, s.Def) {
		return copyRecord(cur.rec), nil
	}
	// A version greater than any the name had, even before a removal (as
	// Redis's: at least the clock in microseconds).
	v := max(b.c.now().UnixMicro(), b.c.schedVersion+1)
	b.c.schedVersion = v
	rec := broker.ScheduleRecord{Name: s.Name, Receiver: s.Receiver, Def: bytes.Clone(s.Def), Next: s.Next}
	if cur != nil {
		if cur.rec.Receiver == s.Receiver {
			rec.LastTick, rec.LastSent = cur.rec.LastTick, cur.rec.LastSent
		}
	}
	rec.Version = v
	b.c.schedules[s.Name] = &schedule{rec: rec}
	return copyRecord(rec), nil
}

func copyRecord(r broker.ScheduleRecord) broker.ScheduleRecord {
	r.Def = bytes.Clone(r.Def)
	return r
}

// RemoveSchedule deletes the schedule called name.
func (b *Broker) RemoveSchedule(ctx context.Context, name string) (bool, error) {
	if err := broker.CheckName("name", name); err != nil {
		return false, err
	}
	if err := b.lock(ctx); err != nil {
		return false, err
	}
	defer b.c.mu.Unlock()
	_, ok := b.c.schedules[name]
	delete(b.c.schedules, name)
	return ok, nil
}

// ListSchedules returns the stored schedules by name.
func (b *Broker) ListSchedules(ctx context.Context) ([]broker.ScheduleRecord, error) {
	if err := b.lock(ctx); err != nil {
		return nil, err
	}
	defer b.c.mu.Unlock()
	out := make([]broker.ScheduleRecord, 0, len(b.c.schedules))
	for _, s := range b.c.schedules {
		out = append(out, copyRecord(s.rec))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// TickSchedule decides p.Due, and queues its message, in one step (see
// broker.DecideTick).
func (b *Broker) TickSchedule(ctx context.Context, p *broker.TickParams) (broker.TickResult, error) {
	if err := b.check(ctx); err != nil {
		return broker.TickResult{}, err
	}
	if err := p.Validate(); err != nil {
		return broker.TickResult{}, err
	}
	if err := b.checkSize(p.Env); err != nil {
		return broker.TickResult{}, err
	}
	if p.MissedEnv != nil {
		if err := b.checkSize(p.MissedEnv); err != nil {
			return broker.TickResult{}, err
		}
	}
	if err := b.lock(ctx); err != nil {
		return broker.TickResult{}, err
	}
	defer b.c.mu.Unlock()
	now := b.c.now()
	s := b.c.schedules[p.Name]
	var rec broker.ScheduleRecord
	if s != nil && s.rec.Receiver == p.Receiver {
		rec = s.rec
	} else {
		s = nil
	}
	outcome, next := broker.DecideTick(p, s != nil, rec.Version, rec.Next, now)
	var env *broker.Envelope
	switch outcome {
	case broker.TickSent:
		env = p.Env
	case broker.TickCaughtUp:
		env = p.MissedEnv
	}
	if env != nil {
		b.c.send(&broker.SendParams{Env: *env})
		s.rec.LastTick, s.rec.LastSent = p.Due, now
	}
	if s != nil {
		s.rec.Next = next
	}
	return broker.TickResult{Outcome: outcome, Next: next, Version: rec.Version, Now: now}, nil
}
