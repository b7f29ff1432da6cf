package disker

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// The ticker runs the schedules stored in the broker on an instance that
// serves a receiver or registered a schedule. It lists them every
// tickerRefresh (and at once after this instance's Schedule or
// RemoveSchedule), waits for the earliest next tick by the local clock
// corrected to the broker's (broker.Clock.Local), and asks the broker to
// decide each due tick (broker.Schedules.TickSchedule): one atomic step
// that sends the tick's message, or tells that another instance did, or
// that it is not due yet by the broker's clock. Every instance may ask for
// the same tick; one sends it.

// tickerRefresh is how often the ticker lists the stored schedules: a
// schedule registered elsewhere starts ticking here within it.
const tickerRefresh = time.Second

// maxTicksInARow bounds the ticks of one schedule decided in one round
// (a schedule catching up after a pause), so that others get their turn.
const maxTicksInARow = 100

// ticker is the instance's loop of schedules.
type ticker struct {
	d    *Disker
	wake chan struct{} // poke: list the schedules now
	// scheds is the loop's own: name -> state.
	scheds map[string]*tickState
	warned map[string]int64 // name -> version reported as not runnable
}

// tickState is a schedule as the ticker runs it.
type tickState struct {
	rec    broker.ScheduleRecord
	s      Schedule
	tm     *timing
	notBfr time.Time // local time before which not to ask (the broker said not due)
}

// startTicker starts the ticker if it is not running. Callers hold d.mu.
func (d *Disker) startTicker() {
	if d.tk != nil || d.closed.Load() {
		return
	}
	d.tk = &ticker{d: d, wake: make(chan struct{}, 1), scheds: map[string]*tickState{}, warned: map[string]int64{}}
	if !d.manual { // by hand, the kit ticks the schedules (manual.go)
		d.wg.Go(func() { d.tk.run(d.bgCtx) })
	}
}

// poke makes the ticker list the schedules now.
func (t *ticker) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *ticker) run(ctx context.Context) {
	var p pacer
	refreshAt := time.Time{}
	for ctx.Err() == nil {
		now := time.Now()
		if !now.Before(refreshAt) {
			if err := t.refresh(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				t.d.health.fail("schedules", err)
				if !p.wait(ctx.Done()) {
					return
				}
				continue
			}
			refreshAt = time.Now().Add(tickerRefresh)
		}
		wakeAt, err := t.tickDue(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			t.d.health.fail("schedule tick", err)
			if !p.wait(ctx.Done()) {
				return
			}
			continue
		}
		p.reset()
		if wakeAt.IsZero() {
			refreshAt = time.Time{} // a schedule changed: list again
			continue
		}
		wakeAt = minTime(wakeAt, refreshAt)
		timer := time.NewTimer(time.Until(wakeAt))
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-t.wake:
			refreshAt = time.Time{}
		case <-timer.C:
		}
		timer.Stop()
	}
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// refresh lists the stored schedules, keeping what it knows of those that
// did not change.
func (t *ticker) refresh(ctx context.Context) error {
	recs, err := t.d.b.ListSchedules(ctx)
	if err != nil {
		return err
	}
	t.d.health.ok()
	seen := make(map[string]bool, len(recs))
	for i := range recs {
		rec := recs[i]
		seen[rec.Name] = true
		if st := t.scheds[rec.Name]; st != nil && st.rec.Version == rec.Version && st.rec.Receiver == rec.Receiver {
			if rec.Next.After(st.rec.Next) {
				st.rec.Next = rec.Next
			}
			continue
		}
		if t.warned[rec.Name] == rec.Version {
			continue // reported: this instance cannot run this version
		}
		s, tm, err := decodeSchedule(&rec)
		if err == nil && len(s.Content) > t.d.cfg.MaxMessageSize {
			err = fmt.Errorf("its content is %d bytes, over this instance's limit of %d (Config.MaxMessageSize)", len(s.Content), t.d.cfg.MaxMessageSize)
		}
		if err != nil {
			delete(t.scheds, rec.Name)
			if t.warned[rec.Name] != rec.Version {
				t.warned[rec.Name] = rec.Version
				t.d.log.Warn("disker: this instance cannot run a schedule", "schedule", rec.Name, "error", err)
			}
			continue
		}
		t.scheds[rec.Name] = &tickState{rec: rec, s: s, tm: tm}
	}
	for name := range t.scheds {
		if !seen[name] {
			delete(t.scheds, name)
		}
	}
	return nil
}

// tickDue decides the due ticks of every schedule, and returns when to
// look again (local time), or the zero time to list the schedules first.
func (t *ticker) tickDue(ctx context.Context) (time.Time, error) {
	wakeAt := time.Now().Add(tickerRefresh)
	names := make([]string, 0, len(t.scheds))
	for name := range t.scheds {
		names = append(names, name)
	}
	slices.Sort(names)
	relist := false
	for _, name := range names {
		st := t.scheds[name]
		waiting := false // the loop found the schedule's next tick ahead, or left it
		for range maxTicksInARow {
			at := t.d.b.Local(st.rec.Next)
			if st.notBfr.After(at) {
				at = st.notBfr
			}
			if now := time.Now(); at.After(now) {
				wakeAt = minTime(wakeAt, at)
				waiting = true
				break
			}
			res, err := t.tick(ctx, st)
			if err != nil {
				return time.Time{}, err
			}
			if res.Outcome == broker.TickGone || res.Version != st.rec.Version {
				delete(t.scheds, name)
				relist, waiting = true, true
				break
			}
			st.rec.Next = res.Next
			if res.Outcome == broker.TickNotDue {
				st.notBfr = time.Now().Add(res.Next.Sub(res.Now))
			}
		}
		if !waiting { // still catching up: go on at once, after the others
			wakeAt = time.Now()
		}
	}
	if relist {
		return time.Time{}, nil
	}
	return wakeAt, nil
}

// tick asks the broker to decide st's next tick.
func (t *ticker) tick(ctx context.Context, st *tickState) (broker.TickResult, error) {
	due := st.rec.Next
	// The broker's clock as this instance estimates it, for where the
	// schedule resumes after missed ticks; the broker decides whether
	// they were missed, by its own clock.
	estNow := time.Now().Add(due.Sub(t.d.b.Local(due)))
	resume, count := st.tm.resume(due, estNow)
	following := st.tm.following(due)
	p := broker.TickParams{
		Name: st.rec.Name, Receiver: st.rec.Receiver, Version: st.rec.Version,
		Due: due, Following: following, Resume: resume, MissedAfter: missedAfter,
		Env: t.envelope(st, due, 0),
	}
	if st.s.Missed == MissedOne {
		p.MissedEnv = t.envelope(st, due, count)
	}
	res, err := t.d.b.TickSchedule(ctx, &p)
	if err != nil {
		return res, wrapBroker("schedule tick", err)
	}
	var sent *broker.Envelope
	switch res.Outcome {
	case broker.TickSent:
		sent = p.Env
	case broker.TickCaughtUp:
		sent = p.MissedEnv
	}
	if sent != nil {
		t.d.sent.Add(1)
		t.d.emit(Event{Kind: EventSent, Receiver: sent.Receiver, MessageID: sent.ID})
	}
	return res, nil
}

// envelope returns the message of st's tick due; missed > 0 makes it the
// one sent in place of that many missed ticks.
func (t *ticker) envelope(st *tickState, due time.Time, missed int) *broker.Envelope {
	h := make(map[string]string, len(st.s.Headers)+3)
	for k, v := range st.s.Headers {
		h[k] = v
	}
	h[HeaderSchedule] = st.rec.Name
	h[HeaderTick] = due.UTC().Format(TickTimeFormat)
	if missed > 0 {
		h[HeaderMissed] = strconv.Itoa(missed)
	}
	return &broker.Envelope{
		ID:       newID(),
		Receiver: st.rec.Receiver,
		Content:  st.s.Content,
		Headers:  h,
		Route:    broker.RouteNone,
	}
}

// sortSchedules sorts infos by name.
func sortSchedules(infos []ScheduleInfo) {
	slices.SortFunc(infos, func(a, b ScheduleInfo) int { return strings.Compare(a.Name, b.Name) })
}
