package brokertest

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// The conformance cases of broker.Schedules. Times are whole milliseconds,
// as the client makes them (Redis keeps milliseconds).

// brokerNowMS returns the broker's clock, to the millisecond.
func brokerNowMS(t *testing.T, b broker.Broker) time.Time {
	t.Helper()
	now, err := b.Now(ctxT(t))
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	return now.Truncate(time.Millisecond)
}

func putSchedule(t *testing.T, b broker.Broker, s broker.ScheduleRecord) broker.ScheduleRecord {
	t.Helper()
	got, err := b.PutSchedule(ctxT(t), &s)
	if err != nil {
		t.Fatalf("PutSchedule %s: %v", s.Name, err)
	}
	return got
}

// listed returns the stored schedule called name, or false.
func listed(t *testing.T, b broker.Broker, name string) (broker.ScheduleRecord, bool) {
	t.Helper()
	all, err := b.ListSchedules(ctxT(t))
	if err != nil {
		t.Fatalf("ListSchedules: %v", err)
	}
	for _, s := range all {
		if s.Name == name {
			return s, true
		}
	}
	return broker.ScheduleRecord{}, false
}

func tick(t *testing.T, b broker.Broker, p broker.TickParams) broker.TickResult {
	t.Helper()
	res, err := b.TickSchedule(ctxT(t), &p)
	if err != nil {
		t.Fatalf("TickSchedule %s at %v: %v", p.Name, p.Due, err)
	}
	return res
}

// tickParams returns the params of the tick s.Next of s, with a message.
func tickParams(s broker.ScheduleRecord, following, resume time.Time) broker.TickParams {
	return broker.TickParams{
		Name: s.Name, Receiver: s.Receiver, Version: s.Version,
		Due: s.Next, Following: following, Resume: resume, MissedAfter: time.Second,
		Env: &broker.Envelope{ID: name("tick"), Receiver: s.Receiver, Content: []byte("tick"), Route: broker.RouteNone},
	}
}

// testSchedulePutList shows that a schedule is stored, listed, kept as it
// is when put again unchanged, replaced with a greater version when
// changed, and removed.
func testSchedulePutList(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	now := brokerNowMS(t, b)
	s := broker.ScheduleRecord{Name: name("sched"), Receiver: name("recv"), Def: []byte("def-1"), Next: now.Add(time.Hour)}
	first := putSchedule(t, b, s)
	if first.Version <= 0 || !first.Next.Equal(s.Next) || !first.LastTick.IsZero() {
		t.Fatalf("PutSchedule: got %+v", first)
	}
	got, ok := listed(t, b, s.Name)
	if !ok || got.Receiver != s.Receiver || !bytes.Equal(got.Def, s.Def) || got.Version != first.Version || !got.Next.Equal(s.Next) {
		t.Fatalf("ListSchedules: got %+v (listed %v), want %+v", got, ok, first)
	}
	// The same again, with another Next: nothing changes.
	again := s
	again.Next = now.Add(2 * time.Hour)
	if got := putSchedule(t, b, again); got.Version != first.Version || !got.Next.Equal(first.Next) {
		t.Fatalf("PutSchedule unchanged: got %+v, want %+v", got, first)
	}
	// Changed: replaced, with a greater version and the new Next.
	changed := again
	changed.Def = []byte("def-2")
	second := putSchedule(t, b, changed)
	if second.Version <= first.Version || !second.Next.Equal(changed.Next) {
		t.Fatalf("PutSchedule changed: got %+v after %+v", second, first)
	}
	// Moved to another receiver: listed there.
	moved := changed
	moved.Receiver = name("recv")
	third := putSchedule(t, b, moved)
	if got, _ := listed(t, b, s.Name); got.Receiver != moved.Receiver || got.Version != third.Version || third.Version <= second.Version {
		t.Fatalf("PutSchedule moved: listed %+v, put %+v", got, third)
	}
	// The old receiver's tick finds it gone.
	old := second
	if res := tick(t, b, tickParams(old, old.Next.Add(time.Hour), old.Next.Add(time.Hour))); res.Outcome != broker.TickGone {
		t.Fatalf("tick at the former receiver: got %v, want gone", res.Outcome)
	}
	removed, err := b.RemoveSchedule(ctx, s.Name)
	if err != nil || !removed {
		t.Fatalf("RemoveSchedule: %v, %v; want true", removed, err)
	}
	if _, ok := listed(t, b, s.Name); ok {
		t.Fatal("ListSchedules lists a removed schedule")
	}
	if removed, err := b.RemoveSchedule(ctx, s.Name); err != nil || removed {
		t.Fatalf("RemoveSchedule again: %v, %v; want false, nil", removed, err)
	}
	if res := tick(t, b, tickParams(third, third.Next.Add(time.Hour), third.Next.Add(time.Hour))); res.Outcome != broker.TickGone {
		t.Fatalf("tick after RemoveSchedule: got %v, want gone", res.Outcome)
	}
	// Put again after the removal: a version greater than any before.
	if got := putSchedule(t, b, moved); got.Version <= third.Version {
		t.Fatalf("PutSchedule after removal: version %d, not above %d", got.Version, third.Version)
	}
	if _, err := b.RemoveSchedule(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
}

// testScheduleTickOnce races many callers on one tick: exactly one sends
// its message, the others find the tick taken, and the next tick is not
// due yet.
func testScheduleTickOnce(t *testing.T, b broker.Broker) {
	now := brokerNowMS(t, b)
	r := name("recv")
	s := putSchedule(t, b, broker.ScheduleRecord{Name: name("sched"), Receiver: r, Def: []byte("d"), Next: now})
	following := now.Add(time.Hour)
	const callers = 20
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		outcomes = map[broker.TickOutcome]int{}
	)
	for range callers {
		wg.Go(func() {
			p := tickParams(s, following, following)
			res, err := b.TickSchedule(ctxT(t), &p)
			if err != nil {
				t.Errorf("TickSchedule: %v", err)
				return
			}
			if !res.Next.Equal(following) || res.Version != s.Version {
				t.Errorf("TickSchedule: %v left next %v version %d, want %v, %d", res.Outcome, res.Next, res.Version, following, s.Version)
			}
			mu.Lock()
			outcomes[res.Outcome]++
			mu.Unlock()
		})
	}
	wg.Wait()
	if outcomes[broker.TickSent] != 1 || outcomes[broker.TickTaken] != callers-1 {
		t.Fatalf("outcomes of %d callers of one tick: %v, want 1 sent and the rest taken", callers, outcomes)
	}
	d := fetchOne(t, b, r, "c", longLease)
	if string(d.Env.Content) != "tick" || d.Env.Receiver != r {
		t.Fatalf("the tick's message: %+v", d.Env)
	}
	ack(t, b, r, d.Ref)
	got, _ := listed(t, b, s.Name)
	if !got.Next.Equal(following) || !got.LastTick.Equal(now) || got.LastSent.Before(now) {
		t.Fatalf("after the tick: %+v, want next %v, last tick %v", got, following, now)
	}
	// The next one is an hour away: not due.
	s.Next = following
	if res := tick(t, b, tickParams(s, following.Add(time.Hour), following.Add(time.Hour))); res.Outcome != broker.TickNotDue || !res.Next.Equal(following) {
		t.Fatalf("tick before it is due: got %v next %v", res.Outcome, res.Next)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r})
	if _, err := b.RemoveSchedule(ctxT(t), s.Name); err != nil {
		t.Fatal(err)
	}
}

// testScheduleMissed shows the three ways a late tick goes: sent when
// its following tick is not due yet; skipped, or sent once in place of all
// missed ticks, when it is (and the tick is older than MissedAfter).
func testScheduleMissed(t *testing.T, b broker.Broker) {
	now := brokerNowMS(t, b)
	resume := now.Add(time.Hour)
	for _, tc := range []struct {
		name      string
		due       time.Time
		following time.Time
		missedEnv bool
		want      broker.TickOutcome
		wantNext  time.Time
		content   string
	}{
		{"late", now.Add(-10 * time.Second), now.Add(time.Minute), true, broker.TickSent, now.Add(time.Minute), "tick"},
		{"recent", now.Add(-200 * time.Millisecond), now.Add(-100 * time.Millisecond), true, broker.TickSent, now.Add(-100 * time.Millisecond), "tick"},
		{"skip", now.Add(-10 * time.Second), now.Add(-9 * time.Second), false, broker.TickSkipped, resume, ""},
		{"one", now.Add(-10 * time.Second), now.Add(-9 * time.Second), true, broker.TickCaughtUp, resume, "missed"},
	} {
		r := name("recv")
		s := putSchedule(t, b, broker.ScheduleRecord{Name: name("sched"), Receiver: r, Def: []byte("d"), Next: tc.due})
		p := tickParams(s, tc.following, resume)
		if tc.missedEnv {
			p.MissedEnv = &broker.Envelope{ID: name("tick"), Receiver: r, Content: []byte("missed"), Route: broker.RouteNone}
		}
		res := tick(t, b, p)
		if res.Outcome != tc.want || !res.Next.Equal(tc.wantNext) {
			t.Errorf("%s: got %v next %v, want %v next %v", tc.name, res.Outcome, res.Next, tc.want, tc.wantNext)
		}
		ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Lease: longLease})
		switch {
		case tc.content == "" && len(ds) != 0:
			t.Errorf("%s: %d messages queued, want none", tc.name, len(ds))
		case tc.content != "" && (len(ds) != 1 || string(ds[0].Env.Content) != tc.content):
			t.Errorf("%s: queued %v, want one %q", tc.name, ds, tc.content)
		}
		for _, d := range ds {
			ack(t, b, r, d.Ref)
		}
		if _, err := b.RemoveSchedule(ctxT(t), s.Name); err != nil {
			t.Fatal(err)
		}
	}
}

// testScheduleTaken shows that a tick decided against a replaced schedule
// (another version) does nothing.
func testScheduleTaken(t *testing.T, b broker.Broker) {
	now := brokerNowMS(t, b)
	r := name("recv")
	s := putSchedule(t, b, broker.ScheduleRecord{Name: name("sched"), Receiver: r, Def: []byte("v1"), Next: now})
	replaced := putSchedule(t, b, broker.ScheduleRecord{Name: s.Name, Receiver: r, Def: []byte("v2"), Next: now})
	res := tick(t, b, tickParams(s, now.Add(time.Hour), now.Add(time.Hour)))
	if res.Outcome != broker.TickTaken || res.Version != replaced.Version {
		t.Fatalf("tick of the replaced version: got %v version %d, want taken, %d", res.Outcome, res.Version, replaced.Version)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r})
	if _, err := b.RemoveSchedule(ctxT(t), s.Name); err != nil {
		t.Fatal(err)
	}
}

// testScheduleInvalid shows that both brokers reject invalid schedule
// params with the error of Validate, and a tick's message over the size
// limit.
func testScheduleInvalid(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	now := brokerNowMS(t, b)
	r := name("recv")
	put := func(p *broker.ScheduleRecord) error { _, err := b.PutSchedule(ctx, p); return err }
	tk := func(p *broker.TickParams) error { _, err := b.TickSchedule(ctx, p); return err }
	good := broker.ScheduleRecord{Name: name("sched"), Receiver: r, Def: []byte("d"), Next: now}
	env := &broker.Envelope{ID: "m", Receiver: r}
	goodTick := broker.TickParams{Name: good.Name, Receiver: r, Version: 1, Due: now, Following: now.Add(time.Second), Resume: now.Add(time.Second), Env: env}
	with := func(f func(*broker.TickParams)) *broker.TickParams { p := goodTick; f(&p); return &p }
	rec := func(f func(*broker.ScheduleRecord)) *broker.ScheduleRecord { p := good; f(&p); return &p }
	cases := []paramCase{
		invalidCall("PutSchedule", rec(func(p *broker.ScheduleRecord) { p.Name = "" }), put),
		invalidCall("PutSchedule", rec(func(p *broker.ScheduleRecord) { p.Receiver = "" }), put),
		invalidCall("PutSchedule", rec(func(p *broker.ScheduleRecord) { p.Def = nil }), put),
		invalidCall("PutSchedule", rec(func(p *broker.ScheduleRecord) { p.Next = time.Time{} }), put),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Name = "" }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Receiver = "" }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Due = time.Time{} }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Following = now }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Resume = now }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.MissedAfter = -1 }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Env = nil }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.Env = &broker.Envelope{ID: "m", Receiver: "other"} }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) { p.MissedEnv = &broker.Envelope{Receiver: r} }), tk),
		invalidCall("TickSchedule", with(func(p *broker.TickParams) {
			p.Env = &broker.Envelope{ID: "m", Sender: "s", Receiver: r, Timeout: time.Second}
		}), tk),
	}
	for _, tc := range cases {
		want := tc.valid()
		if want == nil {
			t.Fatalf("%s: the case's params are valid; the suite is wrong", tc.name)
		}
		if got := tc.call(); got == nil || got.Error() != want.Error() {
			t.Errorf("%s with invalid params: got %v, want Validate's error %q", tc.name, got, want)
		}
	}
	if _, ok := listed(t, b, good.Name); ok {
		t.Fatal("an invalid PutSchedule stored a schedule")
	}
	s := putSchedule(t, b, good)
	big := tickParams(s, now.Add(time.Hour), now.Add(time.Hour))
	big.Env.Content = make([]byte, MaxMessageSize+1)
	if _, err := b.TickSchedule(ctx, &big); err == nil {
		t.Fatal("TickSchedule with content over the limit: no error")
	}
	if got, _ := listed(t, b, s.Name); !got.Next.Equal(s.Next) {
		t.Fatalf("a refused tick moved the schedule: %+v", got)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r})
	if _, err := b.RemoveSchedule(ctx, s.Name); err != nil {
		t.Fatal(err)
	}
}
