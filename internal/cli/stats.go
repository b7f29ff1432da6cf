package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/dashboard"
)

type statsOptions struct {
	conn      connFlags
	receivers []string
	watch     bool
	interval  time.Duration
	json      bool
}

func (a *app) statsCommand() *cobra.Command {
	o := &statsOptions{}
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show queues, dead letters, rates and live workers",
		Long: long(`Show, for every receiver (or those named with --receiver):

  LENGTH     messages in the receiver's stream (queued + pending)
  QUEUED     messages waiting for a worker
  PENDING    messages delivered and not yet acknowledged: in flight, or
             waiting for a retry or for redelivery after a crash
  IN-FLIGHT  messages the live workers are handling (at their last heartbeat)
  DEAD       messages in the dead-letter stream (see "disker dlq")
  DEFERRED   messages sent for later (send --delay, --at), not due yet
  GROUPS     keyed messages (send --group) waiting behind their key, and
             in how many keys: "120 (7 keys)"; - when none
  EXPIRED    messages dropped because their deadline or expiry had passed
  RATE/S     messages handled per second by the receiver's workers: with
             --watch, between their last two heartbeats seen (a refresh
             faster than the heartbeat shows the latest known rate), else
             on average since they started
  WORKERS    live workers serving it
  LIMITS     the limits its workers serve it with (worker --rate, ...)
  PAUSED     yes while it is paused (see "disker pause")

and the live workers: id, host, pid, receivers, concurrency, in flight,
processed, failed, and how long they have been up. A worker is live while its
heartbeats arrive (every 1s by default).

With --receiver, the busiest group keys of each receiver named (up to 10,
most waiting first) follow the receivers.

--json prints the same as one JSON object (one per refresh with --watch).`),
		Example: `  disker stats
  disker stats --receiver web --watch
  disker stats --receiver orders   # and its busiest group keys
  disker stats --json | jq '.receivers[] | select(.dead_letters > 0)'`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runStats(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&o.receivers, "receiver", nil, "show only this receiver (repeatable)")
	fs.BoolVarP(&o.watch, "watch", "w", false, "refresh every --interval until interrupted")
	fs.DurationVar(&o.interval, "interval", 2*time.Second, "refresh period of --watch")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	o.conn.register(fs)
	needs(cmd, "interval", "watch")
	return cmd
}

// receiverRow is one receiver's line of stats.
type receiverRow struct {
	disker.ReceiverStats
	InFlight int64   `json:"in_flight"`
	Rate     float64 `json:"rate"`
	Workers  int     `json:"workers"`
	// The limits its workers serve it with (the first worker's that has
	// them; every worker of a receiver should use the same).
	GlobalConcurrency int     `json:"global_concurrency,omitempty"`
	RateLimit         float64 `json:"rate_limit,omitempty"`
	RateBurst         int     `json:"rate_burst,omitempty"`
	// BusiestGroups are its group keys with the most messages waiting,
	// when the command names the receiver (--receiver).
	BusiestGroups []groupLoad `json:"busiest_groups,omitempty"`
}

// groupLoad is a group key and the messages waiting behind it.
type groupLoad struct {
	Key     string `json:"key"`
	Waiting int64  `json:"waiting"`
}

// busiestGroups is how many keys stats lists for a receiver named.
const busiestGroups = 10

// groups returns the GROUPS column of r: "-" when no keyed message waits,
// as the dashboard's Groups column.
func (r *receiverRow) groups() string { return dashboard.GroupsText(r.ReceiverStats) }

// limits returns the LIMITS column of r: "-" when none.
func (r *receiverRow) limits() string {
	var parts []string
	if r.GlobalConcurrency > 0 {
		parts = append(parts, fmt.Sprintf("%d at once", r.GlobalConcurrency))
	}
	if r.RateLimit > 0 {
		parts = append(parts, fmt.Sprintf("%s/s burst %d", strconv.FormatFloat(r.RateLimit, 'g', -1, 64), r.RateBurst))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// queued returns the QUEUED column of r: with the counts of the high and
// low priority levels when there are any.
func (r *receiverRow) queued() string {
	if r.QueuedHigh == 0 && r.QueuedLow == 0 {
		return strconv.FormatInt(r.Queued, 10)
	}
	return fmt.Sprintf("%d (high %d, low %d)", r.Queued, r.QueuedHigh, r.QueuedLow)
}

// statsSnapshot is what stats prints.
type statsSnapshot struct {
	At        time.Time           `json:"at"`
	Receivers []receiverRow       `json:"receivers"`
	Workers   []disker.WorkerInfo `json:"workers"`
}

func (a *app) runStats(ctx context.Context, o *statsOptions) error {
	for _, r := range o.receivers {
		if err := checkName("receiver", r); err != nil {
			return err
		}
	}
	if o.interval < 100*time.Millisecond {
		return usagef("invalid --interval %v: must be >= 100ms", o.interval)
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	for _, r := range o.receivers {
		if err := knownReceiver(ctx, d, r, o.conn.keyPrefix); err != nil {
			return err
		}
	}
	clear := o.watch && !o.json && isTerminal(a.stdout)
	rates := &rateTracker{seen: map[string]disker.WorkerInfo{}, rate: map[string]float64{}}
	first := true
	tick := time.NewTicker(o.interval)
	defer tick.Stop()
	for {
		snap, err := takeSnapshot(ctx, d, o.receivers, rates)
		if err != nil {
			if o.watch && ctx.Err() != nil {
				return nil
			}
			return err
		}
		if clear {
			fmt.Fprint(a.stdout, "\x1b[H\x1b[2J")
		}
		if o.json {
			if err := json.NewEncoder(a.stdout).Encode(snap); err != nil {
				return err
			}
		} else {
			printStats(a.stdout, snap, !first)
			if o.watch && !clear {
				fmt.Fprintln(a.stdout)
			}
		}
		if !o.watch {
			return nil
		}
		first = false
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// rateTracker keeps, per worker, the last heartbeat seen and the rate
// between it and the one before. A worker's counters change only at its
// heartbeats, so a rate over the time between two refreshes shorter than
// the heartbeat would read 0 and then a burst.
type rateTracker struct {
	seen map[string]disker.WorkerInfo
	rate map[string]float64
}

// observe records w's heartbeat and returns its rate, and whether one is
// known: false until two of its heartbeats were seen.
func (t *rateTracker) observe(w disker.WorkerInfo) (float64, bool) {
	p, ok := t.seen[w.ID]
	if !ok {
		t.seen[w.ID] = w
		return 0, false
	}
	if dt := w.LastSeen.Sub(p.LastSeen).Seconds(); dt > 0 {
		t.rate[w.ID] = float64(max(0, w.Processed-p.Processed)) / dt
		t.seen[w.ID] = w
	}
	r, ok := t.rate[w.ID]
	return r, ok
}

func takeSnapshot(ctx context.Context, d *disker.Disker, only []string, rates *rateTracker) (*statsSnapshot, error) {
	names := only
	if len(names) == 0 {
		var err error
		if names, err = d.Receivers(ctx); err != nil {
			return nil, err
		}
	}
	all, err := d.Workers(ctx)
	if err != nil {
		return nil, err
	}
	// This command's own instance is not a worker; with --receiver, only
	// the workers of those receivers count.
	workers := slices.DeleteFunc(all, func(w disker.WorkerInfo) bool {
		if w.ID == d.ID() {
			return true
		}
		return len(only) > 0 && !slices.ContainsFunc(only, func(r string) bool { return slices.Contains(w.Receivers, r) })
	})
	snap := &statsSnapshot{At: time.Now(), Workers: workers, Receivers: []receiverRow{}}
	rateOf := map[string]float64{}
	for _, w := range workers {
		r, ok := rates.observe(w)
		if !ok {
			// The average since it started, until two heartbeats are seen.
			if up := w.LastSeen.Sub(w.StartedAt).Seconds(); up > 0 {
				r = float64(w.Processed) / up
			}
		}
		rateOf[w.ID] = r
	}
	for _, name := range names {
		st, err := d.Stats(ctx, name)
		if err != nil {
			return nil, err
		}
		row := receiverRow{ReceiverStats: st}
		for _, w := range workers {
			if !slices.Contains(w.Receivers, name) {
				continue
			}
			row.Workers++
			row.InFlight += w.InFlight
			row.Rate += rateOf[w.ID]
			if n := w.GlobalConcurrency[name]; n > 0 && row.GlobalConcurrency == 0 {
				row.GlobalConcurrency = n
			}
			if r := w.RateLimit[name]; r > 0 && row.RateLimit == 0 {
				row.RateLimit, row.RateBurst = r, w.RateBurst[name]
			}
		}
		if len(only) > 0 && st.GroupKeys > 0 {
			loads, err := d.BusiestGroups(ctx, name, busiestGroups)
			if err != nil {
				return nil, err
			}
			for _, l := range loads {
				row.BusiestGroups = append(row.BusiestGroups, groupLoad{Key: l.Key, Waiting: l.Waiting})
			}
		}
		snap.Receivers = append(snap.Receivers, row)
	}
	return snap, nil
}

func printStats(w io.Writer, s *statsSnapshot, recent bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if len(s.Receivers) == 0 {
		fmt.Fprintln(tw, "No receivers.")
	} else {
		rateHead := "RATE/S(AVG)"
		if recent {
			rateHead = "RATE/S"
		}
		fmt.Fprintf(tw, "RECEIVER\tLENGTH\tQUEUED\tPENDING\tIN-FLIGHT\tDEAD\tDEFERRED\tGROUPS\tEXPIRED\t%s\tWORKERS\tLIMITS\tPAUSED\n", rateHead)
		for _, r := range s.Receivers {
			paused := "no"
			if r.Paused {
				paused = "yes"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%.1f\t%d\t%s\t%s\n", r.Receiver, r.Length, r.queued(), r.Pending, r.InFlight, r.DeadLetters, r.Deferred, r.groups(), r.Expired, r.Rate, r.Workers, r.limits(), paused)
		}
	}
	printBusiest(tw, s.Receivers)
	fmt.Fprintln(tw)
	if len(s.Workers) == 0 {
		fmt.Fprintln(tw, "No live workers.")
	} else {
		fmt.Fprintln(tw, "WORKER\tHOST\tPID\tRECEIVERS\tCONCURRENCY\tIN-FLIGHT\tPROCESSED\tFAILED\tUP")
		for _, wi := range s.Workers {
			var conc []string
			for _, r := range wi.Receivers {
				conc = append(conc, strconv.Itoa(wi.Concurrency[r]))
			}
			recv, cs := strings.Join(wi.Receivers, ","), strings.Join(conc, ",")
			if recv == "" {
				recv, cs = "-", "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%s\n", wi.ID, wi.Host, wi.PID, recv, cs, wi.InFlight, wi.Processed, wi.Failed,
				wi.LastSeen.Sub(wi.StartedAt).Round(time.Second))
		}
	}
	tw.Flush()
}

// printBusiest prints the busiest group keys of the receivers that have
// them listed, one key a line: nothing when none has.
func printBusiest(w io.Writer, rows []receiverRow) {
	head := false
	for _, r := range rows {
		for _, g := range r.BusiestGroups {
			if !head {
				fmt.Fprintln(w)
				fmt.Fprintln(w, "RECEIVER\tGROUP KEY\tWAITING")
				head = true
			}
			fmt.Fprintf(w, "%s\t%s\t%d\n", r.Receiver, printable(g.Key), g.Waiting)
		}
	}
}

// printable returns key as it is when it prints as one word of a table,
// else quoted (a key is any bytes).
func printable(key string) string {
	if utf8.ValidString(key) && !strings.ContainsFunc(key, func(r rune) bool { return !unicode.IsPrint(r) || unicode.IsSpace(r) || r == '"' }) {
		return key
	}
	return strconv.Quote(key)
}
