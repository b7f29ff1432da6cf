package disker_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
	"github.com/diskerhq/disker/internal/wire"
)

// tickLog records the schedule messages a receiver got, by tick time.
type tickLog struct {
	mu     sync.Mutex
	ticks  map[time.Time]int // tick time -> messages
	missed map[time.Time]int // tick time -> HeaderMissed of a catch-up message
	bad    []string
	late   []time.Duration // from each tick's time to its handling (local clock)
}

func newTickLog() *tickLog {
	return &tickLog{ticks: map[time.Time]int{}, missed: map[time.Time]int{}}
}

// handler records each message's tick.
func (l *tickLog) handler(schedule string) disker.Handler {
	return disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		tick, err := time.Parse(disker.TickTimeFormat, m.Headers[disker.HeaderTick])
		if err != nil || m.Headers[disker.HeaderSchedule] != schedule || m.ExpectsReply() {
			l.bad = append(l.bad, fmt.Sprintf("%v (%v)", m.Headers, err))
			return nil, nil
		}
		l.ticks[tick]++
		l.late = append(l.late, time.Since(tick))
		if s := m.Headers[disker.HeaderMissed]; s != "" {
			n, _ := strconv.Atoi(s)
			l.missed[tick] = n
		}
		return nil, nil
	})
}

// sorted returns the tick times received, in order.
func (l *tickLog) sorted() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]time.Time, 0, len(l.ticks))
	for t := range l.ticks {
		out = append(out, t)
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

func (l *tickLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ticks)
}

// checkOncePerTick fails unless every tick from the first received to the
// last came exactly once, every period.
func (l *tickLog) checkOncePerTick(t *testing.T, every time.Duration) []time.Time {
	t.Helper()
	l.mu.Lock()
	for tick, n := range l.ticks {
		if n != 1 {
			t.Errorf("tick %v: %d messages, want 1", tick, n)
		}
	}
	if len(l.bad) > 0 {
		t.Errorf("messages that are not the schedule's: %v", l.bad)
	}
	l.mu.Unlock()
	ticks := l.sorted()
	for i := 1; i < len(ticks); i++ {
		if gap := ticks[i].Sub(ticks[i-1]); gap != every {
			t.Errorf("ticks %v and %v are %v apart, want %v (a tick missing?)", ticks[i-1], ticks[i], gap, every)
		}
	}
	return ticks
}

// TestScheduleOncePerTick registers one schedule from five instances,
// ticking every 100ms, and shows that each tick is sent exactly once.
func TestScheduleOncePerTick(t *testing.T) {
	run := 10 * time.Second
	if testing.Short() {
		run = 3 * time.Second
	}
	eachBackend(t, func(t *testing.T, e *env) {
		const every = 100 * time.Millisecond
		s := disker.Schedule{Name: "every-100ms", Receiver: "ticks", Content: []byte("tick"), Headers: map[string]string{"k": "v"}, Every: every}
		log := newTickLog()
		worker := e.open()
		if err := worker.Handle(s.Receiver, log.handler(s.Name)); err != nil {
			t.Fatal(err)
		}
		for range 5 {
			if err := e.open().Schedule(ctxTimeout(t, 10*time.Second), s); err != nil {
				t.Fatal(err)
			}
		}
		start := time.Now()
		waitFor(t, run+30*time.Second, "the ticks of "+run.String(), func() bool {
			return time.Since(start) >= run && log.count() > 0
		})
		stopAndDrain(t, worker, s.Name, log)
		ticks := log.checkOncePerTick(t, every)
		log.mu.Lock()
		slices.Sort(log.late)
		p50, p99 := log.late[len(log.late)/2], log.late[len(log.late)*99/100]
		log.mu.Unlock()
		t.Logf("%d ticks in %v, each sent once; from tick time to handler: p50 %v, p99 %v", len(ticks), run, p50.Round(100*time.Microsecond), p99.Round(100*time.Microsecond))
		if len(ticks) < int(run/every)/2 {
			t.Errorf("%d ticks in %v, want about %d", len(ticks), run, run/every)
		}
	})
}

// stopAndDrain removes schedule and waits until log has the message of
// its last tick.
func stopAndDrain(t *testing.T, d *disker.Disker, schedule string, log *tickLog) {
	t.Helper()
	ctx := ctxTimeout(t, 30*time.Second)
	infos, err := d.Schedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := d.RemoveSchedule(ctx, schedule); err != nil || !ok {
		t.Fatalf("RemoveSchedule: %v, %v", ok, err)
	}
	var last time.Time
	for _, in := range infos {
		if in.Name == schedule {
			last = in.LastTick
		}
	}
	// A tick decided between the listing and the removal is later.
	after, err := d.Schedules(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range after {
		if in.Name == schedule {
			t.Fatalf("Schedules lists %s after RemoveSchedule", schedule)
		}
	}
	waitFor(t, 30*time.Second, "the last tick's message", func() bool {
		ticks := log.sorted()
		return last.IsZero() || len(ticks) > 0 && !ticks[len(ticks)-1].Before(last)
	})
}

// TestScheduleKilledInstances runs a schedule ticking every 100ms in five
// processes, and nowhere else (nobody serves its receiver: the test reads
// the queue in Redis), kills two of them with SIGKILL midway, and shows
// that each tick is still sent exactly once.
func TestScheduleKilledInstances(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	e := newEnv(t, true, redisURL(t))
	const every = 100 * time.Millisecond
	rc := rawRedis(t, e)
	queue := e.base.KeyPrefix + ":{proc-ticks}:q"
	queued := func() int64 {
		n, _ := rc.Do(context.Background(), rc.B().Xlen().Key(queue).Build()).AsInt64()
		return n
	}
	var children []*child
	for i := range 5 {
		c := startChild(t, e, "scheduler", "proc-ticks", "i"+strconv.Itoa(i))
		if line := recv(t, c.lines, 30*time.Second, "the child to start"); line != "ready" {
			t.Fatalf("child: %q", line)
		}
		children = append(children, c)
	}
	waitFor(t, 60*time.Second, "5s of ticks", func() bool { return queued() >= 50 })
	children[0].kill(t)
	children[3].kill(t)
	before := queued()
	waitFor(t, 60*time.Second, "5s more of ticks", func() bool { return queued() >= before+50 })
	if ok, err := e.open().RemoveSchedule(ctxTimeout(t, 10*time.Second), "proc-every-100ms"); err != nil || !ok {
		t.Fatalf("RemoveSchedule: %v, %v", ok, err)
	}

	entries, err := rc.Do(context.Background(), rc.B().Xrange().Key(queue).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatal(err)
	}
	log := newTickLog()
	for _, en := range entries {
		env, err := wire.Decode([]byte(en.FieldValues["m"]))
		if err != nil {
			t.Fatal(err)
		}
		tick, err := time.Parse(disker.TickTimeFormat, env.Headers[disker.HeaderTick])
		if err != nil || env.Headers[disker.HeaderSchedule] != "proc-every-100ms" || env.Receiver != "proc-ticks" {
			t.Fatalf("a tick's message: %+v (%v)", env, err)
		}
		log.ticks[tick]++
	}
	ticks := log.checkOncePerTick(t, every)
	t.Logf("%d ticks, each sent once; two of five processes killed after %d", len(ticks), before)
}

// TestScheduleMissed stops every instance for two seconds, and shows what
// each Missed option does with the ticks missed meanwhile; and that the
// schedule, stored in the broker, ticks again when an instance that only
// serves its receiver starts.
func TestScheduleMissed(t *testing.T) {
	for _, missed := range []disker.Missed{disker.MissedSkip, disker.MissedOne} {
		t.Run(missed.String(), func(t *testing.T) {
			t.Parallel()
			for _, b := range backends[:2] {
				t.Run(b.name, func(t *testing.T) {
					t.Parallel()
					testScheduleMissed(t, newEnv(t, b.redis, b.redisURL(t)), missed)
				})
			}
		})
	}
}

func testScheduleMissed(t *testing.T, e *env, missed disker.Missed) {
	const every = 100 * time.Millisecond
	s := disker.Schedule{Name: "missed", Receiver: "missed-ticks", Every: every, Missed: missed}
	log := newTickLog()
	ctx := ctxTimeout(t, time.Minute)
	first, err := disker.New(ctx, e.config())
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Handle(s.Receiver, log.handler(s.Name)); err != nil {
		t.Fatal(err)
	}
	if err := first.Schedule(ctx, s); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "5 ticks", func() bool { return log.count() >= 5 })
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// No instance runs the schedule now: one that neither serves a
	// receiver nor registered a schedule only looks.
	looker := e.open()
	infos, err := looker.Schedules(ctx)
	if err != nil || len(infos) != 1 {
		t.Fatalf("Schedules: %v, %v", infos, err)
	}
	stoppedAfter := infos[0].LastTick
	if got := log.sorted(); !got[len(got)-1].Equal(stoppedAfter) {
		t.Fatalf("last tick received %v, last tick sent %v", got[len(got)-1], stoppedAfter)
	}
	down := time.Now()
	waitFor(t, 10*time.Second, "two seconds down", func() bool { return time.Since(down) >= 2*time.Second })

	// An instance that only serves the receiver runs the stored schedule.
	second := e.open()
	if err := second.Handle(s.Receiver, log.handler(s.Name)); err != nil {
		t.Fatal(err)
	}
	before := log.count()
	waitFor(t, 30*time.Second, "5 ticks after the restart", func() bool { return log.count() >= before+5 })
	stopAndDrain(t, second, s.Name, log)

	ticks := log.sorted()
	var after []time.Time // ticks received after the stop
	for _, tk := range ticks {
		if tk.After(stoppedAfter) {
			after = append(after, tk)
		}
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	for tk, n := range log.ticks {
		if n != 1 {
			t.Errorf("tick %v: %d messages", tk, n)
		}
	}
	switch missed {
	case disker.MissedSkip:
		if len(log.missed) != 0 {
			t.Errorf("MissedSkip sent catch-up messages: %v", log.missed)
		}
		// The first tick after the stop comes at least 1s after the last
		// before it: the ticks in between were skipped.
		if gap := after[0].Sub(stoppedAfter); gap < 2*time.Second-every {
			t.Errorf("MissedSkip: first tick after the stop %v after the last before it, want the ticks of the 2s down skipped", gap)
		}
	case disker.MissedOne:
		// One message for the missed ticks: the first one after the stop,
		// standing for the ~20 missed ticks.
		n, ok := log.missed[after[0]]
		if len(log.missed) != 1 || !ok || !after[0].Equal(stoppedAfter.Add(every)) || n < 15 {
			t.Errorf("MissedOne: catch-up messages %v, first tick after the stop %v (last before it %v); want one, for the tick after the last and ~20 ticks", log.missed, after[0], stoppedAfter)
		}
		if gap := after[1].Sub(after[0]); gap < 2*time.Second-every {
			t.Errorf("MissedOne: the tick after the catch-up came %v after it, want the missed ticks skipped", gap)
		}
	}
	// After the missed ones, every tick once.
	for i := 2; i < len(after); i++ {
		if gap := after[i].Sub(after[i-1]); gap != every {
			t.Errorf("ticks %v and %v are %v apart after the restart, want %v", after[i-1], after[i], gap, every)
		}
	}
}

// TestScheduleReplaceAndRemove shows that registering a schedule again
// unchanged keeps its next tick, that a changed one replaces it, and that
// no tick is sent once RemoveSchedule returned.
func TestScheduleReplaceAndRemove(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, time.Minute)
		d := e.open()
		s := disker.Schedule{Name: "hourly", Receiver: "replaced", Cron: "0 * * * *", Content: []byte("a")}
		if err := d.Schedule(ctx, s); err != nil {
			t.Fatal(err)
		}
		info := onlySchedule(t, d)
		if info.Next.Minute() != 0 || info.Next.Second() != 0 || !info.Next.After(time.Now().Add(-time.Minute)) || info.Spec() != "0 * * * *" || string(info.Content) != "a" {
			t.Fatalf("Schedules: %+v", info)
		}
		if err := e.open().Schedule(ctx, s); err != nil {
			t.Fatal(err)
		}
		if again := onlySchedule(t, d); !again.Next.Equal(info.Next) {
			t.Fatalf("registered again: next %v, was %v", again.Next, info.Next)
		}
		// Replaced by one ticking every 50ms to another receiver.
		log := newTickLog()
		if err := d.Handle("fast", log.handler(s.Name)); err != nil {
			t.Fatal(err)
		}
		s.Receiver, s.Cron, s.Every = "fast", "", 50*time.Millisecond
		if err := d.Schedule(ctx, s); err != nil {
			t.Fatal(err)
		}
		if info := onlySchedule(t, d); info.Receiver != "fast" || info.Spec() != "every 50ms" {
			t.Fatalf("replaced: %+v", info)
		}
		waitFor(t, 30*time.Second, "3 ticks", func() bool { return log.count() >= 3 })
		stopAndDrain(t, d, s.Name, log)
		n := log.count()
		quiet := time.Now()
		waitFor(t, 5*time.Second, "10 periods", func() bool { return time.Since(quiet) >= 500*time.Millisecond })
		if got := log.count(); got != n {
			t.Fatalf("%d ticks after RemoveSchedule returned", got-n)
		}
		if ok, err := d.RemoveSchedule(ctx, s.Name); err != nil || ok {
			t.Fatalf("RemoveSchedule of a removed schedule: %v, %v; want false, nil", ok, err)
		}
	})
}

func onlySchedule(t *testing.T, d *disker.Disker) disker.ScheduleInfo {
	t.Helper()
	infos, err := d.Schedules(ctxTimeout(t, 10*time.Second))
	if err != nil || len(infos) != 1 {
		t.Fatalf("Schedules: %+v, %v; want one", infos, err)
	}
	if infos[0].Invalid != "" {
		t.Fatalf("Schedules: invalid: %s", infos[0].Invalid)
	}
	return infos[0]
}

// TestScheduleCronSeconds runs a cron schedule of every second in a time
// zone: its ticks fall on whole seconds, once each.
func TestScheduleCronSeconds(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		paris, err := time.LoadLocation("Europe/Paris")
		if err != nil {
			t.Skip("no time zone database:", err)
		}
		s := disker.Schedule{Name: "each-second", Receiver: "seconds", Cron: "* * * * * *", Location: paris}
		log := newTickLog()
		d := e.open()
		if err := d.Handle(s.Receiver, log.handler(s.Name)); err != nil {
			t.Fatal(err)
		}
		if err := d.Schedule(ctxTimeout(t, 10*time.Second), s); err != nil {
			t.Fatal(err)
		}
		if info := onlySchedule(t, d); info.Location.String() != "Europe/Paris" || info.Spec() != "* * * * * * (Europe/Paris)" {
			t.Fatalf("Schedules: %+v", info)
		}
		waitFor(t, 30*time.Second, "3 ticks", func() bool { return log.count() >= 3 })
		stopAndDrain(t, d, s.Name, log)
		for _, tk := range log.checkOncePerTick(t, time.Second) {
			if tk.Nanosecond() != 0 {
				t.Errorf("tick %v is not on a whole second", tk)
			}
		}
	})
}

// TestScheduleValidation shows that bad schedules are refused with a
// *ValidationError naming the field, and store nothing.
func TestScheduleValidation(t *testing.T) {
	d := newEnv(t, false, "").open(func(c *disker.Config) { c.MaxMessageSize = 10 })
	ctx := ctxTimeout(t, 10*time.Second)
	ok := disker.Schedule{Name: "s", Receiver: "r", Every: time.Second}
	with := func(f func(*disker.Schedule)) disker.Schedule { s := ok; f(&s); return s }
	for _, tc := range []struct {
		s     disker.Schedule
		field string
		has   []string
	}{
		{with(func(s *disker.Schedule) { s.Name = "" }), "Schedule.Name", nil},
		{with(func(s *disker.Schedule) { s.Name = "a b" }), "Schedule.Name", []string{`"a b"`}},
		{with(func(s *disker.Schedule) { s.Name = "_reserved" }), "Schedule.Name", nil},
		{with(func(s *disker.Schedule) { s.Receiver = "" }), "Schedule.Receiver", nil},
		{with(func(s *disker.Schedule) { s.Every = 0 }), "Schedule.Every", nil},
		{with(func(s *disker.Schedule) { s.Every = time.Millisecond }), "Schedule.Every", nil},
		{with(func(s *disker.Schedule) { s.Every = -time.Second }), "Schedule.Every", nil},
		{with(func(s *disker.Schedule) { s.Every = 100 * 366 * 24 * time.Hour }), "Schedule.Every", nil},
		{with(func(s *disker.Schedule) { s.Cron = "* * * * *" }), "Schedule.Cron", []string{"not both"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "0 25 * * *" }), "Schedule.Cron", []string{`"0 25 * * *"`, "field 2 (hour)", `"25"`, "column 3"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "0 9 * * mon-fry" }), "Schedule.Cron", []string{"field 5 (day of week)", "column 9"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "61 * * * * *" }), "Schedule.Cron", []string{"field 1 (second)", "column 1"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "* * *" }), "Schedule.Cron", []string{`"* * *"`, "found 3"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "@sometimes" }), "Schedule.Cron", []string{"@sometimes"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "@every 1m" }), "Schedule.Cron", []string{"Schedule.Every"}},
		{with(func(s *disker.Schedule) { s.Every, s.Cron = 0, "0 0 30 2 *" }), "Schedule.Cron", []string{"never ticks"}},
		{with(func(s *disker.Schedule) { s.Missed = 7 }), "Schedule.Missed", nil},
		{with(func(s *disker.Schedule) { s.Content = []byte("more than ten bytes") }), "Schedule.Content", nil},
	} {
		err := d.Schedule(ctx, tc.s)
		var ve *disker.ValidationError
		if !errors.As(err, &ve) || ve.Field != tc.field {
			t.Errorf("Schedule(%+v): got %v, want a *ValidationError of %s", tc.s, err, tc.field)
			continue
		}
		for _, h := range tc.has {
			if !strings.Contains(err.Error(), h) {
				t.Errorf("Schedule(%+v): %q does not say %q", tc.s, err, h)
			}
		}
	}
	if _, err := d.RemoveSchedule(ctx, "no good"); err == nil {
		t.Error("RemoveSchedule of a bad name: no error")
	}
	if _, err := disker.ParseMissed("sometimes"); err == nil {
		t.Error("ParseMissed(sometimes): no error")
	}
	if infos, err := d.Schedules(ctx); err != nil || len(infos) != 0 {
		t.Fatalf("bad schedules were stored: %+v, %v", infos, err)
	}
}

// TestScheduleRedisRestart restarts Redis (kill -9, with the append-only
// file) under a schedule ticking every 100ms: the schedule is still there
// and ticks on, and no tick is sent twice.
func TestScheduleRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	const every = 100 * time.Millisecond
	s := disker.Schedule{Name: "through-restart", Receiver: "restart-ticks", Every: every}
	log := newTickLog()
	worker := e.open()
	if err := worker.Handle(s.Receiver, log.handler(s.Name)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := e.open().Schedule(ctxTimeout(t, 10*time.Second), s); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 30*time.Second, "10 ticks", func() bool { return log.count() >= 10 })
	info := onlySchedule(t, worker)
	srv.Restart()
	before := log.count()
	waitFor(t, 60*time.Second, "10 ticks after the restart", func() bool { return log.count() >= before+10 })
	if after := onlySchedule(t, worker); after.Spec() != info.Spec() || after.Receiver != info.Receiver || !after.LastTick.After(info.LastTick) {
		t.Fatalf("after the restart: %+v, before %+v", after, info)
	}
	stopAndDrain(t, worker, s.Name, log)
	log.mu.Lock()
	defer log.mu.Unlock()
	for tick, n := range log.ticks {
		if n != 1 {
			t.Errorf("tick %v: %d messages, want 1", tick, n)
		}
	}
	t.Logf("%d ticks, none twice, Redis restarted after %d", len(log.ticks), before)
}
