package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type scheduleOptions struct {
	conn     connFlags
	receiver string
	every    time.Duration
	cron     string
	tz       string
	missed   string
	headers  []string
	json     bool
}

// scheduleFlags maps the fields of a disker.Schedule to the flags that set
// them, for the messages of validation errors.
var scheduleFlags = map[string]string{
	"Schedule.Name":     "NAME",
	"Schedule.Receiver": "--receiver",
	"Schedule.Every":    "--every",
	"Schedule.Cron":     "--cron",
	"Schedule.Missed":   "--missed",
	"Schedule.Content":  "DATA",
}

const scheduleLong = `A schedule sends a message to a receiver at each of its ticks: every
interval (--every) or on a cron expression (--cron, in the time zone --tz).
Schedules are stored in Redis and run by every running "disker worker" (and
every program that serves a receiver or registers a schedule): each tick is
sent exactly once, whichever of them are running, and a schedule outlives
restarts of all of them. Ticks missed while none ran are skipped
(--missed skip, the default) or sent as one message (--missed one).

Each message carries the headers Disker-Schedule (the schedule's name) and
Disker-Tick (the tick's time, Redis time, RFC 3339 in UTC); the message sent
for missed ticks also Disker-Missed (how many).`

func (a *app) scheduleCommand() *cobra.Command {
	o := &scheduleOptions{}
	cmd := &cobra.Command{
		Use:   "schedule (add | list | remove)",
		Short: "Add, list or remove periodic schedules",
		Long:  long(scheduleLong),
		Example: `  disker schedule add report --receiver reports --cron '0 9 * * 1-5' --tz Europe/Paris '{"kind":"daily"}'
  disker schedule add ping --receiver health --every 30s
  disker schedule list
  disker schedule remove ping`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	o.conn.register(cmd.PersistentFlags())

	add := &cobra.Command{
		Use:   "add NAME --receiver R (--every D | --cron EXPR [--tz ZONE]) [flags] [DATA | @FILE | -]",
		Short: "Add a schedule, or replace the one of that name",
		Long: long(scheduleLong + `

add stores the schedule NAME; its message's content is DATA as given, the
contents of FILE with @FILE, standard input with -, or empty. Adding the
same schedule again changes nothing; a changed one replaces the old, and its
ticks start afresh. --cron takes five fields (minute hour day-of-month month
day-of-week), six with a leading seconds field, or @hourly, @daily, @weekly,
@monthly, @yearly.`),
		Example: `  disker schedule add report --receiver reports --cron '0 9 * * 1-5' --tz Europe/Paris '{"kind":"daily"}'
  disker schedule add ping --receiver health --every 30s --missed one`,
		Args: upTo(1, "NAME", "DATA"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runScheduleAdd(cmd.Context(), o, args)
		}),
	}
	add.Flags().StringVar(&o.receiver, "receiver", "", "the receiver the messages go to (required)")
	add.Flags().DurationVar(&o.every, "every", 0, "tick at this interval (at least 10ms), from now")
	add.Flags().StringVar(&o.cron, "cron", "", "tick on this cron expression")
	add.Flags().StringVar(&o.tz, "tz", "UTC", "the time zone of --cron (an IANA name such as Europe/Paris)")
	add.Flags().StringVar(&o.missed, "missed", "skip", "ticks missed while no instance ran: skip, or one (send one message for them)")
	add.Flags().StringArrayVar(&o.headers, "header", nil, "message header KEY=VALUE (repeatable)")
	needs(add, "tz", "cron")

	list := a.scheduleListCommand(o, "list", "List the schedules")

	remove := &cobra.Command{
		Use:   "remove NAME...",
		Short: "Remove schedules",
		Long: long(`Remove the named schedules: once removed, no instance sends a tick of
theirs. A name that is not a schedule is named on stderr, the others are
removed, and the exit status is 1.`),
		Example: `  disker schedule remove ping report`,
		Args:    atLeastOne("NAME"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runScheduleRemove(cmd.Context(), o, args)
		}),
	}
	cmd.AddCommand(add, list, remove)
	return cmd
}

// schedulesCommand is "disker schedules", the same as "disker schedule list".
func (a *app) schedulesCommand() *cobra.Command {
	o := &scheduleOptions{}
	cmd := a.scheduleListCommand(o, "schedules", "List the periodic schedules (the same as schedule list)")
	o.conn.register(cmd.Flags())
	return cmd
}

func (a *app) scheduleListCommand(o *scheduleOptions, use, short string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long: long(`List the schedules stored in Redis, by name: the receiver, the timing, what
happens to missed ticks, the next tick, and the last tick that sent a
message (times in Redis's clock, shown in the local time zone). --json
prints every field, with the content ("content", or "content_base64" when
it is not UTF-8) and times in RFC 3339.`),
		Example: `  disker schedules
  disker schedule list --json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runScheduleList(cmd.Context(), o)
		}),
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	return cmd
}

// scheduleOf returns the schedule that add's flags and args describe, or
// a usage error naming the flag at fault.
func (a *app) scheduleOf(o *scheduleOptions, args []string) (disker.Schedule, error) {
	s := disker.Schedule{Name: args[0], Receiver: o.receiver, Every: o.every, Cron: o.cron}
	if o.receiver == "" {
		return s, usagef("--receiver is required")
	}
	if err := checkName("receiver", o.receiver); err != nil {
		return s, err
	}
	if o.every == 0 && o.cron == "" {
		return s, usagef("give --every or --cron")
	}
	if o.every != 0 && o.cron != "" {
		return s, usagef("give --every or --cron, not both")
	}
	if o.tz != "UTC" {
		loc, err := time.LoadLocation(o.tz)
		if err != nil {
			return s, usagef("invalid --tz %q: %v", o.tz, err)
		}
		s.Location = loc
	}
	m, err := disker.ParseMissed(o.missed)
	if err != nil {
		return s, usagef("invalid --missed %q: want skip or one", o.missed)
	}
	s.Missed = m
	for _, h := range o.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return s, usagef("invalid --header %q: want KEY=VALUE", h)
		}
		if s.Headers == nil {
			s.Headers = map[string]string{}
		}
		s.Headers[k] = v
	}
	if len(args) > 1 {
		if s.Content, err = a.readData(args[1]); err != nil {
			return s, err
		}
	}
	if err := s.Validate(); err != nil {
		return s, scheduleUsage(err)
	}
	return s, nil
}

// scheduleUsage turns a *disker.ValidationError of a schedule into a
// usage error that names the flag.
func scheduleUsage(err error) error {
	var ve *disker.ValidationError
	if !errors.As(err, &ve) {
		return err
	}
	flag := scheduleFlags[ve.Field]
	if flag == "" {
		return usageError{flagError(err)}
	}
	return usagef("invalid %s: %s", flag, ve.Reason)
}

func (a *app) runScheduleAdd(ctx context.Context, o *scheduleOptions, args []string) error {
	s, err := a.scheduleOf(o, args)
	if err != nil {
		return err
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	if err := d.Schedule(ctx, s); err != nil {
		return scheduleUsage(err)
	}
	infos, err := d.Schedules(ctx)
	if err != nil {
		return err
	}
	for _, in := range infos {
		if in.Name == s.Name {
			fmt.Fprintf(a.stdout, "schedule %s: %s to %s, next at %s\n", s.Name, in.Spec(), s.Receiver, in.Next.Local().Format(time.DateTime))
		}
	}
	return nil
}

func (a *app) runScheduleRemove(ctx context.Context, o *scheduleOptions, names []string) error {
	for _, n := range names {
		if err := disker.ValidateName(n); err != nil {
			return usagef("invalid NAME %q: %s", n, strings.TrimPrefix(err.(*disker.ValidationError).Reason, fmt.Sprintf("%q ", n)))
		}
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	var unknown []string
	for _, n := range names {
		ok, err := d.RemoveSchedule(ctx, n)
		if err != nil {
			return err
		}
		if !ok {
			unknown = append(unknown, n)
			continue
		}
		fmt.Fprintf(a.stdout, "removed schedule %s\n", n)
	}
	if len(unknown) > 0 {
		return fmt.Errorf("no schedule named %s", strings.Join(unknown, ", "))
	}
	return nil
}

// scheduleJSON is a schedule as schedule list --json prints it.
type scheduleJSON struct {
	Name          string            `json:"name"`
	Receiver      string            `json:"receiver"`
	Every         string            `json:"every,omitempty"`
	Cron          string            `json:"cron,omitempty"`
	TZ            string            `json:"tz,omitempty"`
	Missed        string            `json:"missed"`
	Next          time.Time         `json:"next"`
	LastTick      *time.Time        `json:"last_tick,omitempty"`
	LastSent      *time.Time        `json:"last_sent,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	Content       *string           `json:"content,omitempty"`
	ContentBase64 string            `json:"content_base64,omitempty"`
	Invalid       string            `json:"invalid,omitempty"`
}

func (a *app) runScheduleList(ctx context.Context, o *scheduleOptions) error {
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	infos, err := d.Schedules(ctx)
	if err != nil {
		return err
	}
	if o.json {
		out := make([]scheduleJSON, 0, len(infos))
		for _, in := range infos {
			j := scheduleJSON{Name: in.Name, Receiver: in.Receiver, Cron: in.Cron, Missed: in.Missed.String(),
				Next: in.Next.UTC(), Headers: in.Headers, Invalid: in.Invalid}
			if in.Every > 0 {
				j.Every = in.Every.String()
			}
			if in.Location != nil {
				j.TZ = in.Location.String()
			}
			if !in.LastTick.IsZero() {
				lt, ls := in.LastTick.UTC(), in.LastSent.UTC()
				j.LastTick, j.LastSent = &lt, &ls
			}
			if utf8.Valid(in.Content) {
				s := string(in.Content)
				j.Content = &s
			} else {
				j.ContentBase64 = base64.StdEncoding.EncodeToString(in.Content)
			}
			out = append(out, j)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(infos) == 0 {
		fmt.Fprintln(a.stdout, "No schedules.")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tRECEIVER\tSPEC\tMISSED\tNEXT\tLAST\tCONTENT")
	for _, in := range infos {
		last := "-"
		if !in.LastTick.IsZero() {
			last = in.LastTick.Local().Format(time.DateTime)
		}
		next := in.Next.Local().Format(time.DateTime)
		if in.Invalid != "" {
			next = "(cannot run here: " + clip(in.Invalid, 40) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", in.Name, in.Receiver, in.Spec(), in.Missed, next, last, preview(in.Content, 30))
	}
	return tw.Flush()
}
