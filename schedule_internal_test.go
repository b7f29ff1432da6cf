package disker

import (
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func mustTiming(t *testing.T, s Schedule) *timing {
	t.Helper()
	tm, err := s.check(1 << 20)
	if err != nil {
		t.Fatal(err)
	}
	return tm
}

// TestTimingCronZone: a cron schedule ticks in its time zone, across a
// change of daylight saving time.
func TestTimingCronZone(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone database:", err)
	}
	tm := mustTiming(t, Schedule{Name: "s", Receiver: "r", Cron: "0 9 * * *", Location: paris})
	// 2026-03-29 is the day Paris moves from UTC+1 to UTC+2.
	at := time.Date(2026, 3, 28, 12, 0, 0, 0, time.UTC)
	want := []time.Time{
		time.Date(2026, 3, 29, 7, 0, 0, 0, time.UTC), // 09:00 CEST
		time.Date(2026, 3, 30, 7, 0, 0, 0, time.UTC),
	}
	first := tm.first(at)
	if !first.Equal(want[0]) {
		t.Fatalf("first after %v: %v, want %v", at, first, want[0])
	}
	if next := tm.following(first); !next.Equal(want[1]) {
		t.Fatalf("following %v: %v, want %v", first, next, want[1])
	}
	utc := mustTiming(t, Schedule{Name: "s", Receiver: "r", Cron: "0 9 * * *"})
	if got := utc.first(at); !got.Equal(time.Date(2026, 3, 29, 9, 0, 0, 0, time.UTC)) {
		t.Fatalf("UTC: first after %v: %v", at, got)
	}
}

// TestTimingResume: after missed ticks, a schedule resumes at its first
// tick after now, and counts the ticks passed over.
func TestTimingResume(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	every := mustTiming(t, Schedule{Name: "s", Receiver: "r", Every: 100 * time.Millisecond})
	for _, c := range []struct {
		now   time.Duration
		next  time.Duration
		count int
	}{
		{0, 100 * time.Millisecond, 1},
		{50 * time.Millisecond, 100 * time.Millisecond, 1},
		{100 * time.Millisecond, 200 * time.Millisecond, 2},
		{2050 * time.Millisecond, 2100 * time.Millisecond, 21},
	} {
		next, n := every.resume(t0, t0.Add(c.now))
		if !next.Equal(t0.Add(c.next)) || n != c.count {
			t.Errorf("every 100ms from %v, now +%v: resume %v, %d ticks; want +%v, %d", t0, c.now, next.Sub(t0), n, c.next, c.count)
		}
	}
	hourly := mustTiming(t, Schedule{Name: "s", Receiver: "r", Cron: "@hourly"})
	next, n := hourly.resume(t0, t0.Add(5*time.Hour+time.Minute))
	if !next.Equal(t0.Add(6*time.Hour)) || n != 6 {
		t.Errorf("hourly, 5h1m late: resume %v, %d ticks; want +6h, 6", next.Sub(t0), n)
	}
}

// FuzzDecodeSchedule: a schedule's definition read from the broker never
// panics the decoder, and what decodes is a valid schedule.
func FuzzDecodeSchedule(f *testing.F) {
	for _, s := range []Schedule{
		{Name: "s", Receiver: "r", Every: time.Second, Content: []byte("x"), Headers: map[string]string{"k": "v"}},
		{Name: "s", Receiver: "r", Cron: "0 9 * * 1-5", Location: time.FixedZone("X", 3600), Missed: MissedOne},
		{Name: "s", Receiver: "r", Cron: "*/5 * * * * *"},
	} {
		f.Add(encodeDef(&s))
	}
	f.Add([]byte(`{"every":1,"missed":"skip"}`))
	f.Add([]byte(`{"cron":"99 * * * *","missed":"one","tz":"Nowhere/Else"}`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, def []byte) {
		rec := broker.ScheduleRecord{Name: "s", Receiver: "r", Def: def, Next: time.Unix(1, 0)}
		s, tm, err := decodeSchedule(&rec)
		if err != nil {
			return
		}
		if tm == nil {
			t.Fatal("decoded without a timing")
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded an invalid schedule: %v", err)
		}
		next := tm.following(rec.Next)
		if !next.After(rec.Next) {
			t.Fatalf("following %v is %v", rec.Next, next)
		}
	})
}
