// Command chaosmutants tests the fault-injection checker with planted bugs
// (see RELIABILITY.md, "Planted bugs"):
//
//	chaosmutants -duration 30s -seed 1
//
// For each mutant of internal/chaos (chaos.Mutants) it copies the files
// git tracks to a scratch directory, plants the bug there, builds the
// harness, runs it, and requires the checker to catch the bug. It exits
// with status 1 when a bug went uncaught, could not be planted (its text is
// no longer in the code) or its run failed.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/diskerhq/disker/internal/chaos"
)

func main() {
	o := chaos.MutantOptions{}
	flag.DurationVar(&o.Duration, "duration", 30*time.Second, "how long each fault run injects faults")
	flag.Uint64Var(&o.Seed, "seed", 1, "seed of the fault runs")
	flag.DurationVar(&o.Settle, "settle", 30*time.Second, "how long each run waits to settle")
	flag.BoolVar(&o.Keep, "keep", false, "keep every scratch copy (one whose bug went uncaught is always kept)")
	flag.StringVar(&o.Repo, "repo", "", "the repository's root (default: git's, from the working directory)")
	only := flag.String("only", "", "run only these mutants (comma-separated names)")
	verbose := flag.Bool("v", false, "print the builds' and the runs' output")
	flag.Parse()
	if o.Repo == "" {
		out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
		if err != nil {
			fmt.Fprintln(os.Stderr, "chaosmutants: not in a git checkout; give -repo:", err)
			os.Exit(2)
		}
		o.Repo = strings.TrimSpace(string(out))
	}
	o.Log = io.Discard
	if *verbose {
		o.Log = os.Stderr
	}
	os.Exit(run(o, *only))
}

func run(o chaos.MutantOptions, only string) int {
	names := strings.Split(only, ",")
	code, begin := 0, time.Now()
	for _, m := range chaos.Mutants {
		if only != "" && !slices.Contains(names, m.Name) {
			continue
		}
		fmt.Printf("%-14s %s\n", m.Name, m.Bug)
		res, err := chaos.RunMutant(m, o)
		switch {
		case err != nil:
			fmt.Printf("%-14s ERROR: %v\n", "", err)
			code = max(code, 1)
		case res.Skipped != "":
			fmt.Printf("%-14s not run: %s\n", "", res.Skipped)
		case res.Caught:
			fmt.Printf("%-14s caught in %v: %s\n", "", res.Took.Round(time.Second), summary(res.Report))
		default:
			fmt.Printf("%-14s NOT CAUGHT in %v: expected %s; got %s; the copy and its run: %s\n", "", res.Took.Round(time.Second), m.Expect, summary(res.Report), res.Dir)
			code = 1
		}
	}
	fmt.Printf("chaosmutants: %v, %s\n", time.Since(begin).Round(time.Second), map[bool]string{true: "every bug was caught", false: "FAILED"}[code == 0])
	return code
}

// summary gives the report's broken invariants, the features' among
// them.
func summary(r *chaos.Report) string {
	var features []string
	if r.Features != nil {
		for k, n := range r.Features.Broken {
			if n > 0 {
				features = append(features, fmt.Sprintf("%s %d", k, n))
			}
		}
	}
	slices.Sort(features)
	return fmt.Sprintf("lost %d, no outcome %d, two outcomes %d, disagreements %d, late starts %d, unexplained duplicates %d %v, pending %d, settled %v, features broken [%s], ok %v",
		r.Lost, r.NoOutcome, r.MultiOutcome, r.Disagreements, r.LateStarts, r.Duplicates["unexplained"], r.Unexplained, r.PendingAtEnd, r.Settled,
		strings.Join(features, ", "), r.OK())
}
