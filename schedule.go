package disker

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/diskerhq/disker/internal/broker"
)

// Schedule is a periodic schedule: a message sent to a receiver at each
// tick, every interval (Every) or on a cron expression (Cron, in
// Location). Register it with Disker.Schedule; it is stored in the broker
// and ticks, once per tick across all instances, for as long as at least
// one instance that serves a receiver or registered a schedule runs (see
// Disker.Schedule).
type Schedule struct {
	// Name identifies the schedule in the broker: registering a schedule
	// of the same name again replaces it (or, when nothing changed, leaves
	// it as it is). It follows the rule of ValidateName.
	Name string
	// Receiver is the receiver each tick's message goes to.
	Receiver string
	// Content is the content of each tick's message, up to
	// Config.MaxMessageSize bytes.
	Content []byte
	// Headers are added to each tick's message, beside HeaderSchedule and
	// HeaderTick (which Disker sets, over any of the same name).
	Headers map[string]string

	// Every ticks at this interval, from the registration: at least 10ms.
	// Set Every or Cron, not both.
	Every time.Duration
	// Cron ticks on a cron expression: five fields (minute, hour, day of
	// month, month, day of week), or six with a leading seconds field, or
	// a descriptor such as @hourly or @daily; see
	// https://pkg.go.dev/github.com/robfig/cron/v3 for the syntax. An
	// expression that does not parse is a *ValidationError that names it
	// and the field at fault.
	Cron string
	// Location is the time zone of Cron; nil means UTC. (A "CRON_TZ=Zone "
	// prefix of Cron takes precedence.)
	Location *time.Location

	// Missed says what happens to ticks missed while no instance ran
	// (see Missed); the zero value is MissedSkip.
	Missed Missed
}

// Missed says what a schedule does with ticks that were missed: ticks
// still unsent when their following tick is due too, at least a second
// after their time (no instance ran the schedule then). A tick that is
// merely late (its following tick not due yet) is always sent.
type Missed int

// The ways of Schedule.Missed.
const (
	// MissedSkip sends nothing for missed ticks: the schedule goes on
	// with its first tick in the future.
	MissedSkip Missed = iota
	// MissedOne sends one message in place of all the missed ticks, at
	// once, with HeaderTick the first of them and HeaderMissed how many
	// there were; the schedule then goes on with its first tick in the
	// future.
	MissedOne
)

// String returns "skip" or "one".
func (m Missed) String() string {
	switch m {
	case MissedSkip:
		return "skip"
	case MissedOne:
		return "one"
	}
	return "Missed(" + strconv.Itoa(int(m)) + ")"
}

// ParseMissed parses "skip" or "one" (as Missed.String returns them).
func ParseMissed(s string) (Missed, error) {
	switch s {
	case "skip":
		return MissedSkip, nil
	case "one":
		return MissedOne, nil
	}
	return 0, invalid("Schedule.Missed", "%q is neither \"skip\" nor \"one\"", s)
}

// The headers Disker sets on the messages of a schedule.
const (
	// HeaderSchedule is the name of the schedule that sent the message.
	HeaderSchedule = "Disker-Schedule"
	// HeaderTick is the time of the tick the message is for, in the
	// broker's clock, as RFC 3339 with milliseconds, in UTC.
	HeaderTick = "Disker-Tick"
	// HeaderMissed is set on the message that MissedOne sends in place of
	// missed ticks: how many ticks it stands for (decimal).
	HeaderMissed = "Disker-Missed"
)

// TickTimeFormat is the layout of HeaderTick (time.Parse reads it).
const TickTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// ScheduleInfo is a stored schedule, as Disker.Schedules lists it. Its
// times are the broker's clock (Redis time).
type ScheduleInfo struct {
	Schedule
	// Next is the time of the next tick.
	Next time.Time
	// LastTick is the time of the last tick that sent a message, and
	// LastSent when it was sent; zero when none did yet.
	LastTick, LastSent time.Time
	// Invalid says why this instance cannot run the schedule (a time zone
	// it does not know, or a definition stored by a newer version); empty
	// when it can.
	Invalid string
}

// Limits of Schedule.Every.
const (
	minEvery = 10 * time.Millisecond
	maxEvery = 10 * 366 * 24 * time.Hour
)

// missedAfter is how old a tick must be, beside its following tick being
// due, to count as missed (see Missed).
const missedAfter = time.Second

// cronParser parses Schedule.Cron: five fields, an optional leading
// seconds field, or a descriptor.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// timing is a schedule's ticks.
type timing struct {
	every time.Duration
	cron  cron.Schedule
	loc   *time.Location
}

// following returns the tick after tick t.
func (tm *timing) following(t time.Time) time.Time {
	if tm.every > 0 {
		return t.Add(tm.every)
	}
	return tm.cron.Next(t.In(tm.loc)).Truncate(time.Millisecond)
}

// resume returns the first tick of the chain through tick due that is
// after now (at least due's following), and how many ticks of the chain
// lie before it from due (counting due; at most maxCount).
func (tm *timing) resume(due, now time.Time) (time.Time, int) {
	const maxCount = 1_000_000
	if tm.every > 0 {
		k := int64(1)
		if now.After(due) {
			k = int64(now.Sub(due)/tm.every) + 1
		}
		return due.Add(time.Duration(k) * tm.every), int(min(k, maxCount))
	}
	next := tm.following(due)
	if !now.Before(next) {
		next = tm.cron.Next(now.In(tm.loc)).Truncate(time.Millisecond)
	}
	n := 0
	for t := due; t.Before(next) && n < maxCount; t = tm.following(t) {
		n++
	}
	return next, n
}

// first returns the first tick of a schedule registered at now.
func (tm *timing) first(now time.Time) time.Time {
	now = now.Truncate(time.Millisecond)
	if tm.every > 0 {
		return now.Add(tm.every)
	}
	return tm.following(now)
}

// Validate returns the *ValidationError that Disker.Schedule would return
// for s, or nil; it does not check Content against Config.MaxMessageSize,
// which only an instance knows.
func (s *Schedule) Validate() error {
	_, err := s.check(1<<62 - 1)
	return err
}

// check validates s and returns its timing.
func (s *Schedule) check(maxSize int) (*timing, error) {
	if err := checkName("Schedule.Name", s.Name); err != nil {
		return nil, err
	}
	if err := checkName("Schedule.Receiver", s.Receiver); err != nil {
		return nil, err
	}
	if len(s.Content) > maxSize {
		return nil, invalid("Schedule.Content", "%d bytes is over the limit of %d (Config.MaxMessageSize)", len(s.Content), maxSize)
	}
	if s.Missed != MissedSkip && s.Missed != MissedOne {
		return nil, invalid("Schedule.Missed", "%d is neither MissedSkip nor MissedOne", int(s.Missed))
	}
	tm := &timing{loc: s.Location}
	if tm.loc == nil {
		tm.loc = time.UTC
	}
	switch {
	case s.Every == 0 && s.Cron == "":
		return nil, invalid("Schedule.Every", "set Every or Cron")
	case s.Every != 0 && s.Cron != "":
		return nil, invalid("Schedule.Cron", "set Every or Cron, not both")
	case s.Every != 0 && (s.Every < minEvery || s.Every > maxEvery):
		return nil, invalid("Schedule.Every", "must be between %v and %v, got %v", minEvery, maxEvery, s.Every)
	case s.Every != 0:
		tm.every = s.Every.Truncate(time.Millisecond)
		return tm, nil
	}
	c, err := parseCron(s.Cron)
	if err != nil {
		return nil, err
	}
	if c.Next(time.Now().In(tm.loc)).IsZero() {
		return nil, invalid("Schedule.Cron", "%q never ticks", s.Cron)
	}
	tm.cron = c
	return tm, nil
}

// cronFieldNames names the fields of a cron expression of 5 or 6 fields.
var cronFieldNames = map[int][]string{
	5: {"minute", "hour", "day of month", "month", "day of week"},
	6: {"second", "minute", "hour", "day of month", "month", "day of week"},
}

// parseCron parses expr, or returns a *ValidationError for Schedule.Cron
// that quotes expr and, when one field is at fault, names it and its
// column.
func parseCron(expr string) (cron.Schedule, error) {
	fail := func(format string, args ...any) error {
		return invalid("Schedule.Cron", "%q does not parse: %s", expr, fmt.Sprintf(format, args...))
	}
	body, offset := expr, 0
	if strings.HasPrefix(body, "TZ=") || strings.HasPrefix(body, "CRON_TZ=") {
		i := strings.IndexByte(body, ' ')
		if i < 0 {
			return nil, fail("a time zone prefix without fields")
		}
		body, offset = body[i:], i
	}
	if strings.HasPrefix(strings.TrimSpace(body), "@every") {
		return nil, invalid("Schedule.Cron", "%q: use Schedule.Every for an interval", expr)
	}
	c, err := cronParser.Parse(expr)
	if err == nil {
		if _, ok := c.(*cron.SpecSchedule); !ok {
			return nil, fail("not a calendar schedule")
		}
		return c, nil
	}
	// Find the field at fault: parse each field alone, the others '*'.
	fields := strings.Fields(body)
	names := cronFieldNames[len(fields)]
	if names == nil || strings.HasPrefix(strings.TrimSpace(body), "@") {
		return nil, fail("%v", err)
	}
	pos := offset
	for i, f := range fields {
		pos += strings.Index(expr[pos:], f)
		probe := make([]string, len(fields))
		for j := range probe {
			probe[j] = "*"
		}
		probe[i] = f
		if _, perr := cronParser.Parse(strings.Join(probe, " ")); perr != nil {
			return nil, fail("field %d (%s) %q at column %d: %v", i+1, names[i], f, pos+1, perr)
		}
		pos += len(f)
	}
	return nil, fail("%v", err)
}

// scheduleDef is a schedule's definition as stored in the broker
// (broker.ScheduleRecord.Def), in JSON. A field added later must be
// optional (omitempty), so that older definitions still decode.
type scheduleDef struct {
	Every    time.Duration     `json:"every,omitempty"`
	Cron     string            `json:"cron,omitempty"`
	Location string            `json:"tz,omitempty"`
	Missed   string            `json:"missed"`
	Content  []byte            `json:"content,omitempty"`
	Headers  map[string]string `json:"headers,omitempty"`
}

// encodeDef returns the stored definition of s.
func encodeDef(s *Schedule) []byte {
	def := scheduleDef{Every: s.Every, Cron: s.Cron, Missed: s.Missed.String(), Content: s.Content, Headers: s.Headers}
	if s.Location != nil && s.Location != time.UTC {
		def.Location = s.Location.String()
	}
	b, err := json.Marshal(def)
	if err != nil {
		panic("disker: encoding a schedule: " + err.Error()) // strings, bytes and numbers only
	}
	return b
}

// decodeSchedule returns the schedule stored as rec, and its timing; the
// timing is nil, and the error says why, when this instance cannot run it.
func decodeSchedule(rec *broker.ScheduleRecord) (Schedule, *timing, error) {
	s := Schedule{Name: rec.Name, Receiver: rec.Receiver}
	var def scheduleDef
	if err := json.Unmarshal(rec.Def, &def); err != nil {
		return s, nil, fmt.Errorf("its definition does not decode: %w", err)
	}
	s.Every, s.Cron, s.Content, s.Headers = def.Every, def.Cron, def.Content, def.Headers
	m, err := ParseMissed(def.Missed)
	if err != nil {
		return s, nil, err
	}
	s.Missed = m
	if def.Location != "" {
		loc, err := time.LoadLocation(def.Location)
		if err != nil {
			return s, nil, fmt.Errorf("time zone %q: %w", def.Location, err)
		}
		s.Location = loc
	}
	tm, err := s.check(1<<62 - 1) // the content was checked when it was registered
	if err != nil {
		return s, nil, err
	}
	return s, tm, nil
}

// Schedule registers s in the broker, or replaces the schedule of the same
// name, and makes this instance run schedules (see below). Registering
// the same schedule again, from this instance or any other, changes
// nothing: its next tick stays. A changed one starts afresh from now (its
// first tick one Every from now, or the next time Cron gives).
//
// Each tick sends one message to s.Receiver (fire-and-forget, with
// HeaderSchedule and HeaderTick), exactly once across all instances: the
// tick is decided, and its message queued, in one atomic step of the
// broker, by its clock (Redis time). Every instance that serves a
// receiver (Handle) or called Schedule runs, from then until Close, the
// schedules stored in the broker, whoever registered them (another instance, or `disker schedule
// add`); they survive restarts of every instance. Ticks missed while none
// ran are skipped or sent as one message, as s.Missed says.
//
// Schedule returns a *ValidationError for bad input (a name that fails
// ValidateName, neither or both of Every and Cron, an Every under 10ms,
// a Cron expression that does not parse), an error wrapping
// ErrUnavailable when the broker cannot be reached, and ErrClosed after
// Close.
func (d *Disker) Schedule(ctx context.Context, s Schedule) error {
	tm, err := s.check(d.cfg.MaxMessageSize)
	if err != nil {
		return err
	}
	_, err = call(d, "schedule", func() (broker.ScheduleRecord, error) {
		now, err := d.b.Now(ctx)
		if err != nil {
			return broker.ScheduleRecord{}, err
		}
		rec := broker.ScheduleRecord{Name: s.Name, Receiver: s.Receiver, Def: encodeDef(&s), Next: tm.first(now)}
		return d.b.PutSchedule(ctx, &rec)
	})
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.startTicker()
	if d.tk != nil { // nil when Close came first
		d.tk.poke()
	}
	return nil
}

// RemoveSchedule removes the schedule called name from the broker: once it
// returns, no instance sends a tick of it. It reports whether there was
// one.
func (d *Disker) RemoveSchedule(ctx context.Context, name string) (bool, error) {
	if err := checkName("name", name); err != nil {
		return false, err
	}
	ok, err := call(d, "remove schedule", func() (bool, error) { return d.b.RemoveSchedule(ctx, name) })
	if err != nil {
		return false, err
	}
	d.mu.Lock()
	tk := d.tk
	d.mu.Unlock()
	if tk != nil {
		tk.poke()
	}
	return ok, nil
}

// Schedules lists the schedules stored in the broker, by name.
func (d *Disker) Schedules(ctx context.Context) ([]ScheduleInfo, error) {
	recs, err := call(d, "schedules", func() ([]broker.ScheduleRecord, error) { return d.b.ListSchedules(ctx) })
	if err != nil {
		return nil, err
	}
	out := make([]ScheduleInfo, 0, len(recs))
	for i := range recs {
		s, _, err := decodeSchedule(&recs[i])
		info := ScheduleInfo{Schedule: s, Next: recs[i].Next, LastTick: recs[i].LastTick, LastSent: recs[i].LastSent}
		if err != nil {
			info.Invalid = err.Error()
		}
		out = append(out, info)
	}
	sortSchedules(out)
	return out, nil
}

// Spec returns the schedule's timing as text: "every 1m0s", or the cron
// expression with its time zone ("0 9 * * 1-5 (Europe/Paris)").
func (s *Schedule) Spec() string {
	if s.Every > 0 {
		return "every " + s.Every.String()
	}
	if s.Location != nil && s.Location != time.UTC {
		return s.Cron + " (" + s.Location.String() + ")"
	}
	return s.Cron
}
