package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A Mutant is a bug planted in a scratch copy of the repository, to test
// the checker: a fault run of the copy must break the invariant that
// Caught looks for.
type Mutant struct {
	// Name names the mutant (chaosmutants -only NAME).
	Name string
	// Bug says what the planted bug does.
	Bug string
	// Edits plant it.
	Edits []Edit
	// Needs, when set, is a text that the harness's code (a .go file of
	// internal/chaos, not a test nor a mutant's) must hold for the fault
	// run to exercise the bug; a copy without it is not run
	// (MutantResult.Skipped).
	Needs string
	// Caught reports whether a run's report shows the bug.
	Caught func(*Report) bool
	// Expect says what Caught looks for.
	Expect string
}

// An Edit replaces Old, which must occur exactly once in File (relative to
// the repository's root), with New.
type Edit struct {
	File, Old, New string
}

// Mutants are the planted bugs of `make chaos-mutants`.
var Mutants = []Mutant{skipAcks, ackFirst, dropReplies, stealLeases, groupOverlap, resultNoReply, earlyCompletion}

var skipAcks = Mutant{
	Name: "skip_acks",
	Bug:  "a consumer never acknowledges 1 handled message in 50",
	Edits: []Edit{{File: "consumer.go",
		Old: "\tif t.dl.Env.DedupKey == \"\" {\n\t\tc.acks.addDelivery(&t.dl, msg)\n",
		New: "\tif c.processed.Load()%50 == 0 {\n\t\treturn\n\t}\n\tif t.dl.Env.DedupKey == \"\" {\n\t\tc.acks.addDelivery(&t.dl, msg)\n",
	}},
	Caught: func(r *Report) bool { return r.Unexplained["never_acked"] > 0 },
	Expect: "redeliveries after a handler that ended well and was never acknowledged (unexplained, never_acked)",
}

var ackFirst = Mutant{
	Name: "ack_first",
	Bug:  "a consumer acknowledges each delivery before its handler runs",
	Edits: []Edit{{File: "consumer.go",
		Old: "\tbegan := time.Now()\n\tresp, err := c.call(&t.hc, msg)\n",
		New: "\tc.acks.addDelivery(&t.dl, msg)\n\tbegan := time.Now()\n\tresp, err := c.call(&t.hc, msg)\n",
	}},
	Caught: func(r *Report) bool { return r.Lost > 0 },
	Expect: "lost messages (a failed first attempt is not retried: its entry is gone)",
}

var dropReplies = Mutant{
	Name: "drop_replies",
	Bug:  "1 reply in 10 is not sent, and Reply says it was accepted",
	Edits: []Edit{{File: "reply.go",
		Old: "\tvar err error\n\tif msg.idemKey != \"\" {\n\t\terr = d.replyIdempotent(ctx, msg, &env)\n",
		New: "\tvar err error\n\tif d.replied.Load()%10 == 9 {\n\t\td.replied.Add(1)\n\t\treturn nil\n\t}\n\tif msg.idemKey != \"\" {\n\t\terr = d.replyIdempotent(ctx, msg, &env)\n",
	}},
	Caught: func(r *Report) bool { return r.Disagreements > 0 },
	Expect: "disagreements (a reply accepted, the sender saw a timeout)",
}

var stealLeases = Mutant{
	Name: "steal_leases",
	Bug:  "a fetch reclaims every pending entry, however briefly idle: it steals from live holders at every fetch",
	Edits: []Edit{{File: "internal/redisbroker/fetchscript.go",
		Old: "local scan = redis.pcall('XPENDING', stream, 'g', 'IDLE', string.format('%.0f', minLease), '-', '+', room + 100)",
		New: "local scan = redis.pcall('XPENDING', stream, 'g', '-', '+', room + 100)",
	}, {File: "internal/redisbroker/fetchscript.go",
		Old: "if not lapsed[p[2]] and p[3] >= ownerLease(p[2]) then take(p) end",
		New: "if not lapsed[p[2]] then take(p) end",
	}},
	Caught: func(r *Report) bool { return r.Duplicates["unexplained"] > 0 },
	Expect: "unexplained redeliveries",
}

// MutantOptions configure RunMutant.
type MutantOptions struct {
	// Repo is the repository's root, whose files git tracks are copied.
	Repo string
	// Duration and Seed are the fault run's (chaos -duration, -seed).
	Duration time.Duration
	Seed     uint64
	// Settle is the fault run's -settle: a bug that loses messages keeps
	// the run from settling, so short.
	Settle time.Duration
	// Keep keeps the scratch copy and the run's directory.
	Keep bool
	// Log receives the build's and the run's output.
	Log io.Writer
}

// MutantResult is what a mutant's fault run showed.
type MutantResult struct {
	// Skipped says why the mutant was not run (Mutant.Needs), or "".
	Skipped string
	// Report is the run's; Caught reports whether it shows the bug.
	Report *Report
	Caught bool
	// Dir is the scratch copy, with the run's directory (run); removed
	// when the bug was caught or not run, unless MutantOptions.Keep.
	Dir string
	// Took is the time from the copy to the report.
	Took time.Duration
}

// RunMutant plants m in a scratch copy of the repository, builds the
// harness there and runs it, and tells whether the checker caught the
// bug. The error is for a mutant that cannot be planted (its text is no
// longer in the code: update the mutant), a build that fails, or a run
// that could not finish.
func RunMutant(m Mutant, o MutantOptions) (*MutantResult, error) {
	begin := time.Now()
	dir, err := os.MkdirTemp("", "chaos-mutant-"+m.Name+"-")
	if err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: %w", m.Name, err)
	}
	res := &MutantResult{Dir: dir}
	defer func() {
		if !o.Keep && (res.Caught || res.Skipped != "") {
			os.RemoveAll(dir) // else kept, to look into
		}
	}()
	src := filepath.Join(dir, "src")
	if err := copyTracked(o.Repo, src); err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: %w", m.Name, err)
	}
	if err := Plant(src, m.Edits); err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: %w", m.Name, err)
	}
	if missing := needs(src, m.Needs); missing != "" {
		res.Skipped = missing
		return res, nil
	}
	exe := filepath.Join(dir, "chaos")
	if err := runIn(src, o.Log, "go", "build", "-trimpath", "-o", exe, "./internal/chaos/cmd/chaos"); err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: build: %w", m.Name, err)
	}
	run := filepath.Join(dir, "run")
	err = runIn(src, o.Log, exe, "-topology", TopologyStandalone, "-duration", o.Duration.String(),
		"-seed", strconv.FormatUint(o.Seed, 10), "-settle", o.Settle.String(), "-dir", run)
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && exit.ExitCode() == 1) {
		return nil, fmt.Errorf("chaos: mutant %s: the fault run failed: %w", m.Name, err)
	}
	b, err := os.ReadFile(filepath.Join(run, "report.json"))
	if err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: %w", m.Name, err)
	}
	res.Report = &Report{}
	if err := json.Unmarshal(b, res.Report); err != nil {
		return nil, fmt.Errorf("chaos: mutant %s: report: %w", m.Name, err)
	}
	res.Caught = m.Caught(res.Report)
	res.Took = time.Since(begin)
	return res, nil
}

// Plant applies edits to the tree at root; it fails, changing nothing
// more, at the first whose text does not occur exactly once.
func Plant(root string, edits []Edit) error {
	for _, e := range edits {
		name := filepath.Join(root, filepath.FromSlash(e.File))
		b, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		if n := strings.Count(string(b), e.Old); n != 1 {
			return fmt.Errorf("%s holds the text to replace %d times, not once: the code changed, update the mutant:\n%s", e.File, n, e.Old)
		}
		if err := os.WriteFile(name, []byte(strings.Replace(string(b), e.Old, e.New, 1)), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// needs returns why the harness's code in the tree at root lacks what a
// mutant needs (see Mutant.Needs), or "".
func needs(root, need string) string {
	if need == "" {
		return ""
	}
	files, _ := filepath.Glob(filepath.Join(root, "internal", "chaos", "*.go"))
	for _, f := range files {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "mutants") || strings.HasSuffix(base, "_test.go") {
			continue
		}
		if b, err := os.ReadFile(f); err == nil && strings.Contains(string(b), need) {
			return ""
		}
	}
	return fmt.Sprintf("no file of internal/chaos holds %q: the fault run does not exercise the bug", need)
}

// copyTracked copies the files that git tracks in repo, as they are in
// its working tree, to dst.
func copyTracked(repo, dst string) error {
	out, err := exec.Command("git", "-C", repo, "ls-files", "-z").Output()
	if err != nil {
		return fmt.Errorf("git ls-files in %s: %w", repo, err)
	}
	for name := range strings.SplitSeq(strings.TrimRight(string(out), "\x00"), "\x00") {
		b, err := os.ReadFile(filepath.Join(repo, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the working tree
		}
		if err != nil {
			return err
		}
		to := filepath.Join(dst, name)
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// runIn runs a command in dir, its output to log.
func runIn(dir string, log io.Writer, name string, args ...string) error {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	return cmd.Run()
}
