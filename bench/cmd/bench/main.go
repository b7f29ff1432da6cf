// Command bench runs Disker and its peers side by side on the same workloads
// and prints markdown tables.
//
//	cd bench && go run ./cmd/bench -suite all -runs 5 -out ../BENCHMARKS.tables.md
//
// The disker suite starts its own redis-server (it must be on PATH), and
// for its peers a nats-server (built into this program), node processes
// for BullMQ and a private PostgreSQL; `go run ./cmd/bench -install-peers`
// installs BullMQ's node modules. A peer that cannot run here leaves its
// rows out, saying why.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/diskerhq/disker/bench"
)

func main() {
	if bench.ServePeerIfAsked() {
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// knownWorkloads are the names -workloads takes.
var knownWorkloads = []string{"ff", "ff256", "rr1", "rr32", "dedup", "limits", "delayed", "groups", "batch", "retention", "batches", "stream"}

func run() error {
	suite := flag.String("suite", "all", "which suite to run: executor, checkout, disker, cluster, footprint or all")
	runs := flag.Int("runs", 5, "runs of each implementation per workload; the tables show the median")
	quick := flag.Bool("quick", false, "small sizes, for a smoke test")
	out := flag.String("out", "", "also write the markdown to this file")
	quiet := flag.Bool("q", false, "no progress lines on stderr")
	cmdStats := flag.Bool("cmdstats", false, "show the Redis commands per operation of each Redis run in the progress lines, and the read and write system calls per operation of this process and of redis-server (where /proc/PID/io is readable)")
	workloads := flag.String("workloads", "", "comma-separated Disker workloads to run ("+strings.Join(knownWorkloads, ", ")+"); empty runs all of them")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (this process: Disker, the peers and the bench; not redis-server) to this file")
	installPeers := flag.Bool("install-peers", false, "install what the peers need that the harness can install itself (BullMQ's node modules, with npm ci, into the user's cache directory), say what else is missing, and exit")
	flag.Parse()
	if *installPeers {
		return bench.InstallPeers(os.Stdout)
	}
	if *runs < 1 {
		return fmt.Errorf("-runs must be >= 1, got %d", *runs)
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("-cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	suites := map[string]func(context.Context, bench.Options) ([]bench.Table, error){
		"executor":  bench.ExecutorSuite,
		"checkout":  bench.CheckoutSuite,
		"disker":    bench.DiskerSuite,
		"cluster":   bench.ClusterSuite,
		"footprint": bench.FootprintSuite,
	}
	var names []string
	switch *suite {
	case "all":
		names = []string{"executor", "checkout", "disker", "cluster", "footprint"}
	case "executor", "checkout", "disker", "cluster", "footprint":
		names = []string{*suite}
	default:
		return fmt.Errorf("unknown -suite %q (want executor, checkout, disker, cluster, footprint or all)", *suite)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	o := bench.Options{Runs: *runs, Quick: *quick, CommandStats: *cmdStats}
	if *workloads != "" {
		for _, w := range strings.Split(*workloads, ",") {
			if !slices.Contains(knownWorkloads, w) {
				return fmt.Errorf("unknown workload %q in -workloads (want one of %s)", w, strings.Join(knownWorkloads, ", "))
			}
			o.Workloads = append(o.Workloads, w)
		}
	}
	if !*quiet {
		o.Progress = os.Stderr
	}

	var b strings.Builder
	start := time.Now()
	fmt.Fprintf(&b, "## Results\n\n")
	fmt.Fprintf(&b, "Command: `cd bench && go run ./cmd/bench %s`  \n", strings.Join(os.Args[1:], " "))
	fmt.Fprintf(&b, "Machine: %s  \n", machine())
	fmt.Fprintf(&b, "Date: %s; load average at start: %s  \n", start.UTC().Format("2006-01-02 15:04 MST"), bench.LoadAverage())
	fmt.Fprintf(&b, "Runs: %d per implementation per workload, round robin; medians with (min–max).\n\n", *runs)
	fmt.Print(b.String())
	for _, name := range names {
		fmt.Fprintf(os.Stderr, "suite %s\n", name)
		t0 := time.Now()
		tables, err := suites[name](ctx, o)
		fmt.Fprintf(os.Stderr, "suite %s took %s\n", name, time.Since(t0).Round(time.Second))
		if err != nil {
			return fmt.Errorf("suite %s: %w", name, err)
		}
		for _, t := range tables {
			md := t.Markdown()
			fmt.Print(md)
			b.WriteString(md)
		}
	}
	tail := fmt.Sprintf("Total time: %s; load average at the end: %s.\n", time.Since(start).Round(time.Second), bench.LoadAverage())
	fmt.Print(tail)
	b.WriteString(tail)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// machine describes the host: CPUs, Go version, redis-server version.
func machine() string {
	redis := "redis-server not found"
	if v, err := exec.Command("redis-server", "--version").Output(); err == nil {
		redis = strings.TrimSpace(string(v))
		if i := strings.Index(redis, " sha="); i > 0 {
			redis = redis[:i]
		}
	}
	cpu := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		data, _ := io.ReadAll(f)
		f.Close()
		for _, l := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(l, "model name") {
				if _, v, ok := strings.Cut(l, ":"); ok {
					cpu = strings.TrimSpace(v) + ", "
				}
				break
			}
		}
	}
	return fmt.Sprintf("%s%d CPUs (GOMAXPROCS %d), %s %s/%s, %s", cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.Version(), runtime.GOOS, runtime.GOARCH, redis)
}
