package cli

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker/pool"
)

type demoPoolOptions struct {
	job     time.Duration
	callers int
	size    int
}

func (a *app) demoPoolCommand() *cobra.Command {
	o := &demoPoolOptions{}
	cmd := &cobra.Command{
		Use:   "pool",
		Short: "See why a pool of workers helps: one worker versus a pool of three",
		Long: long(`Show the in-process pool (package pool) at work, in two acts.

First the classic bottleneck: one worker serves three callers whose job takes
500ms each. They queue for it, and the last caller waits 1.5s in all. Then the
same three callers on a pool of three workers: each gets a worker at once, and
all are done in about 0.5s. Each act prints a timeline per caller ('.' waiting
for a worker, '#' the job running).

The callers use pool.Pool.Do, which checks a worker out, runs the job with it,
and always gives it back (or retires it if the job panicked or broke it).`),
		Example: `  disker demo pool
  disker demo pool --callers 5 --size 5 --job 200ms`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runDemoPool(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	fs.DurationVar(&o.job, "job", 500*time.Millisecond, "how long each caller's job takes")
	fs.IntVar(&o.callers, "callers", 3, "how many callers arrive at once")
	fs.IntVar(&o.size, "size", 3, "workers in the pool of the second act")
	return cmd
}

// poolWorker is the demo's stateful worker: it only knows its number.
type poolWorker struct{ n int }

// callerRun is what one caller saw.
type callerRun struct {
	worker     int
	start, end time.Duration // since the callers arrived
}

func (a *app) runDemoPool(ctx context.Context, o *demoPoolOptions) error {
	switch {
	case o.job <= 0:
		return usagef("invalid --job %v: must be > 0", o.job)
	case o.callers < 1 || o.callers > 50:
		return usagef("invalid --callers %d: must be in 1..50", o.callers)
	case o.size < 1 || o.size > 50:
		return usagef("invalid --size %d: must be in 1..50", o.size)
	}
	fmt.Fprintf(a.stdout, "disker demo pool: %d callers arrive at once, each with a job that takes %v.\n\n", o.callers, o.job)

	one, err := runPoolAct(ctx, 1, o)
	if err != nil {
		return err
	}
	many, err := runPoolAct(ctx, o.size, o)
	if err != nil {
		return err
	}
	scale := max(lastEnd(one), lastEnd(many))

	fmt.Fprintf(a.stdout, "Act 1: one worker (pool.Config{Size: 1}). The callers queue for it.\n")
	printTimeline(a.stdout, one, scale)
	fmt.Fprintf(a.stdout, "  The last caller waited %.2fs in all.\n\n", lastEnd(one).Seconds())

	fmt.Fprintf(a.stdout, "Act 2: a pool of %d workers (pool.Config{Size: %d}).", o.size, o.size)
	if o.size >= o.callers {
		fmt.Fprintf(a.stdout, " Each caller gets a worker at once.\n")
	} else {
		fmt.Fprintf(a.stdout, " The callers share them.\n")
	}
	printTimeline(a.stdout, many, scale)
	fmt.Fprintf(a.stdout, "  All done in %.2fs.\n\n", lastEnd(many).Seconds())
	fmt.Fprintf(a.stdout, "Legend: '.' waiting for a worker, '#' the job running. Code: pool.New, then Pool.Do(ctx, job).\n")
	return nil
}

// runPoolAct lets o.callers callers run their job on a pool of size workers.
func runPoolAct(ctx context.Context, size int, o *demoPoolOptions) ([]callerRun, error) {
	var made atomic.Int64
	p, err := pool.New(pool.Config[*poolWorker]{
		Name:     "demo",
		Size:     size,
		Eager:    true,
		Strategy: pool.FIFO,
		New: func(context.Context) (*poolWorker, error) {
			return &poolWorker{n: int(made.Add(1))}, nil
		},
	})
	if err != nil {
		return nil, err
	}
	defer p.Close(context.Background())

	runs := make([]callerRun, o.callers)
	errs := make([]error, o.callers)
	arrived := time.Now()
	var wg sync.WaitGroup
	for i := range runs {
		wg.Go(func() {
			errs[i] = p.Do(ctx, func(ctx context.Context, w *poolWorker) error {
				runs[i].worker = w.n
				runs[i].start = time.Since(arrived)
				t := time.NewTimer(o.job)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
				runs[i].end = time.Since(arrived)
				return nil
			})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	// Name the callers in the order they got a worker.
	slices.SortFunc(runs, func(a, b callerRun) int { return cmp.Compare(a.start, b.start) })
	return runs, nil
}

func lastEnd(runs []callerRun) time.Duration {
	var end time.Duration
	for _, r := range runs {
		end = max(end, r.end)
	}
	return end
}

// printTimeline draws one line per caller on a common time scale.
func printTimeline(w interface{ Write([]byte) (int, error) }, runs []callerRun, scale time.Duration) {
	const width = 36
	cell := func(d time.Duration) int {
		return min(width, int((d*width+scale/2)/max(scale, 1)))
	}
	for i, r := range runs {
		s, e := cell(r.start), cell(r.end)
		line := strings.Repeat(".", s) + strings.Repeat("#", max(e-s, 1)) + strings.Repeat(" ", max(width-max(e, s+1), 0))
		fmt.Fprintf(w, "  caller %d  worker %d  |%s|  waited %.2fs  done at %.2fs\n",
			i+1, r.worker, line, r.start.Seconds(), r.end.Seconds())
	}
}
