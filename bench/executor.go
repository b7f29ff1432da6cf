package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Jeffail/tunny"
	"github.com/alitto/pond/v2"
	"github.com/gammazero/workerpool"
	"github.com/panjf2000/ants/v2"
	concpool "github.com/sourcegraph/conc/pool"
	"golang.org/x/sync/errgroup"
)

// The executor workloads: N tasks of one kind at a concurrency limit.
//
// Every implementation is built, fed every task, and waited on (until the
// last task has finished) inside the timed region, each in its own idiomatic
// way: Disker's Executor drains on Close, errgroup and conc wait, pond and
// workerpool stop and wait, ants and tunny are waited on with a
// sync.WaitGroup (ants has no wait of its own; tunny's Process is synchronous,
// so it is driven by as many caller goroutines as the concurrency limit, its
// documented use).

// data holds the integers the CPU task sums. A package variable, so that the
// compiler cannot fold the sum.
var data = func() []int {
	d := make([]int, 100)
	for i := range d {
		d[i] = i
	}
	return d
}()

var sink atomic.Int64

// sumTask sums 100 integers.
func sumTask() {
	s := 0
	for _, v := range data {
		s += v
	}
	if s == -1 { // never; keeps the sum alive
		sink.Store(int64(s))
	}
}

// sleepTask sleeps for 10µs.
func sleepTask() { time.Sleep(10 * time.Microsecond) }

// executor is a way to run n calls of task with at most c at a time, and
// wait for them all.
type executor struct {
	name string
	run  func(n, c int, task func()) error
	// unbounded marks an implementation that ignores c.
	unbounded bool
}

func executors() []executor {
	return []executor{
		{name: "disker pool.Executor", run: runDiskerExecutor},
		{name: "disker pool.Executor, queue 1024", run: runDiskerExecutorQueued},
		{name: "goroutine per task", run: runGoroutines, unbounded: true},
		{name: "errgroup SetLimit", run: runErrgroup},
		{name: "ants v2", run: runAnts},
		{name: "pond v2", run: runPond},
		{name: "tunny", run: runTunny},
		{name: "gammazero/workerpool", run: runWorkerpool},
		{name: "conc/pool", run: runConc},
	}
}

// runGoroutines starts one goroutine per task, with no limit: the classic
// baseline, which c does not affect.
func runGoroutines(n, _ int, task func()) error {
	var wg sync.WaitGroup
	wg.Add(n)
	for range n {
		go func() {
			task()
			wg.Done()
		}()
	}
	wg.Wait()
	return nil
}

func runErrgroup(n, c int, task func()) error {
	var g errgroup.Group
	g.SetLimit(c)
	for range n {
		g.Go(func() error {
			task()
			return nil
		})
	}
	return g.Wait()
}

func runAnts(n, c int, task func()) error {
	p, err := ants.NewPool(c)
	if err != nil {
		return err
	}
	defer p.Release()
	var wg sync.WaitGroup
	wg.Add(n)
	f := func() {
		task()
		wg.Done()
	}
	for range n {
		if err := p.Submit(f); err != nil {
			return err
		}
	}
	wg.Wait()
	return nil
}

func runPond(n, c int, task func()) error {
	p := pond.NewPool(c)
	for range n {
		if err := p.Go(task); err != nil {
			return err
		}
	}
	p.StopAndWait()
	return nil
}

// runTunny drives tunny's synchronous Process from c caller goroutines.
func runTunny(n, c int, task func()) error {
	p := tunny.NewFunc(c, func(any) any {
		task()
		return nil
	})
	defer p.Close()
	var next atomic.Int64
	var wg sync.WaitGroup
	wg.Add(c)
	for range c {
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				p.Process(nil)
			}
		}()
	}
	wg.Wait()
	return nil
}

func runWorkerpool(n, c int, task func()) error {
	wp := workerpool.New(c)
	for range n {
		wp.Submit(task)
	}
	wp.StopWait()
	return nil
}

func runConc(n, c int, task func()) error {
	p := concpool.New().WithMaxGoroutines(c)
	for range n {
		p.Go(task)
	}
	p.Wait()
	return nil
}

// executorWorkload is one row group of the executor tables.
type executorWorkload struct {
	title string
	kind  string
	n     int
	task  func()
}

// ExecutorSuite runs the executor workloads: 1,000,000 tasks that each sum
// 100 integers and 100,000 tasks that each sleep 10µs, at concurrency 4 and
// 1000 (fewer tasks with Quick or Tiny).
func ExecutorSuite(ctx context.Context, o Options) ([]Table, error) {
	nSum, nSleep := 1_000_000, 100_000
	switch {
	case o.Tiny:
		nSum, nSleep = 2_000, 200
	case o.Quick:
		nSum, nSleep = 100_000, 5_000
	}
	workloads := []executorWorkload{
		{title: fmt.Sprintf("%s tasks that each sum 100 integers", thousands(int64(nSum))), kind: "sum", n: nSum, task: sumTask},
		{title: fmt.Sprintf("%s tasks that each sleep 10 µs", thousands(int64(nSleep))), kind: "sleep", n: nSleep, task: sleepTask},
	}
	var tables []Table
	for _, w := range workloads {
		for _, c := range []int{4, 1000} {
			name := fmt.Sprintf("executor %s n=%d c=%d", w.kind, w.n, c)
			var impls []impl
			for _, e := range executors() {
				impls = append(impls, impl{name: e.name, run: func(context.Context) (sample, error) {
					return measure(w.n, func() error { return e.run(w.n, c, w.task) })
				}})
			}
			res, err := runAlternating(ctx, o, name, impls)
			if err != nil {
				return nil, err
			}
			tables = append(tables, executorTable(fmt.Sprintf("Executor: %s, concurrency %d", w.title, c), res))
		}
	}
	return tables, nil
}

func executorTable(title string, res map[string][]sample) Table {
	t := Table{
		Title: title,
		Header: []string{"implementation", "wall ms, median (min–max)", "ns/task", "× Disker time",
			"allocs/task", "bytes/task", "peak goroutines"},
	}
	ref := series(res["disker pool.Executor"], wallMS).med
	for _, e := range executors() {
		ss := res[e.name]
		name := e.name
		if e.unbounded {
			name += " (unbounded)"
		}
		wall := series(ss, wallMS)
		t.Rows = append(t.Rows, []string{
			name,
			fmtStat(wall),
			fmtNum(series(ss, nsPerOp).med),
			fmtRatio(wall.med, ref),
			fmtNum(series(ss, allocsPerOp).med),
			fmtNum(series(ss, bytesPerOp).med),
			thousands(int64(series(ss, peakG).med)),
		})
	}
	return t
}
