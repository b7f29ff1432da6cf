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

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
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
  RATE/S     messages handled per second by the receiver's workers: with
             --watch, between their last two heartbeats seen (a refresh
             faster than the heartbeat shows the latest known rate), else
             on average since they started
  WORKERS    live workers serving it

and the live workers: id, host, pid, receivers, concurrency, in flight,
processed, failed, and how long they have been up. A worker is live while its
heartbeats arrive (every 1s by default).

--json prints the same as one JSON object (one per refresh with --watch).`),
		Example: `  disker stats
  disker stats --receiver web --watch
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
}

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
		fmt.Fprintf(tw, "RECEIVER\tLENGTH\tQUEUED\tPENDING\tIN-FLIGHT\tDEAD\tDEFERRED\tEXPIRED\t%s\tWORKERS\tLIMITS\tPAUSED\n", rateHead)
		for _, r := range s.Receivers {
			paused := "no"
			if r.Paused {
				paused = "yes"
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%d\t%d\t%.1f\t%d\t%s\t%s\n", r.Receiver, r.Length, r.queued(), r.Pending, r.InFlight, r.DeadLetters, r.Deferred, r.Expired, r.Rate, r.Workers, r.limits(), paused)
		}
	}
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
