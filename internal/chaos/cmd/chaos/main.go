// Command chaos runs Disker's fault-injection harness (see RELIABILITY.md):
//
//	chaos -topology standalone -duration 60s -seed 1
//
// It starts copies of itself as workers ("chaos worker ...") and producers
// ("chaos producer ..."), prints the seed and the report, and exits with
// status 1 when an invariant broke.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/diskerhq/disker/internal/chaos"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "worker" || os.Args[1] == "producer") {
		if err := proc(os.Args[1], os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	os.Exit(run(os.Args[1:]))
}

func proc(role string, args []string) error {
	fs := flag.NewFlagSet(role, flag.ExitOnError)
	var cfg chaos.ProcConfig
	fs.StringVar(&cfg.Name, "name", "", "the process's name in the history")
	fs.StringVar(&cfg.RedisURL, "redis", "", "Redis URL")
	fs.StringVar(&cfg.Dir, "dir", "", "run directory")
	fs.Uint64Var(&cfg.Seed, "seed", 0, "seed of the producer's choices")
	_ = fs.Parse(args)
	if role == "worker" {
		return chaos.RunWorker(cfg)
	}
	return chaos.RunProducer(cfg)
}

func run(args []string) int {
	fs := flag.NewFlagSet("chaos", flag.ExitOnError)
	o := chaos.Options{}
	fs.StringVar(&o.Topology, "topology", chaos.TopologyStandalone, "standalone, cluster or sentinel")
	fs.DurationVar(&o.Duration, "duration", time.Minute, "how long to inject faults")
	fs.Uint64Var(&o.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the faults and the operations (default: the time)")
	fs.DurationVar(&o.FaultEvery, "fault-every", 5*time.Second, "mean time between faults")
	fs.IntVar(&o.Workers, "workers", 3, "worker processes")
	fs.IntVar(&o.Producers, "producers", 3, "producer processes")
	fs.StringVar(&o.Dir, "dir", "", "run directory (default: a new temporary directory)")
	fs.DurationVar(&o.SettleTimeout, "settle", 2*time.Minute, "how long to wait for the system to settle after the faults")
	history := fs.String("check", "", "only check the history in this run directory (of a run on -topology), and print the report")
	_ = fs.Parse(args)

	if *history != "" {
		events, err := chaos.ReadHistory(*history)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		r := chaos.Check(events, chaos.CheckOptions{FailoverLoss: o.Topology == chaos.TopologySentinel})
		fmt.Print(r)
		return exitCode(r)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		return 2
	}
	o.Exe = exe
	if o.Dir == "" {
		if o.Dir, err = os.MkdirTemp("", "chaos-"); err != nil {
			fmt.Fprintln(os.Stderr, "chaos:", err)
			return 2
		}
	}
	o.Dir, _ = filepath.Abs(o.Dir)
	fmt.Printf("chaos: topology %s, duration %v, seed %d, fault every %v on average, %d workers, %d producers\n",
		o.Topology, o.Duration, o.Seed, o.FaultEvery, o.Workers, o.Producers)
	fmt.Printf("chaos: history in %s\n", o.Dir)
	fmt.Printf("chaos: reproduce with: go run ./internal/chaos/cmd/chaos -topology %s -duration %v -seed %d -fault-every %v -workers %d -producers %d\n",
		o.Topology, o.Duration, o.Seed, o.FaultEvery, o.Workers, o.Producers)
	host, _ := os.Hostname()
	fmt.Printf("chaos: host %s, %s\n", host, chaos.CPUModel())
	r, err := chaos.Run(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Print(r)
	return exitCode(r)
}

func exitCode(r *chaos.Report) int {
	if r.OK() {
		return 0
	}
	return 1
}
