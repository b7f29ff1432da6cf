// Command benchcompare measures two commits of Disker the same way, in one
// sitting: it builds the harness (bench/cmd/bench) of each commit from a git
// worktree in a temporary directory, runs the two in turns, the first of
// each turn alternating, and prints every figure of their tables with its
// ratio, new over old.
//
//	cd bench && go run ./cmd/benchcompare -old d04cb82 [-new HEAD] [-turns 3] [-- -suite disker -runs 1]
//
// `make bench-compare OLD=<commit>` runs it. The arguments after -- go to
// both harnesses (they must know them: -suite, -runs, -quick and
// -workloads are in every version); -q is added. Each figure's old and new
// are the medians over the turns; "turns" gives the lowest and highest
// ratio of one turn's pair.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker/bench"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "benchcompare:", err)
		os.Exit(1)
	}
}

func run() error {
	oldRef := flag.String("old", "", "the commit to compare against (required)")
	newRef := flag.String("new", "HEAD", "the commit to measure")
	turns := flag.Int("turns", 3, "how many times each harness runs, in turns")
	out := flag.String("out", "", "also write the markdown to this file")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: benchcompare -old COMMIT [-new COMMIT] [-turns N] [-out FILE] [-- HARNESS ARGS]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *oldRef == "" {
		flag.Usage()
		return errors.New("-old is required")
	}
	if *turns < 1 {
		return fmt.Errorf("-turns must be >= 1, got %d", *turns)
	}
	args := flag.Args()
	if len(args) == 0 {
		args = []string{"-suite", "disker", "-runs", "1"}
	}
	args = append(slices.Clone(args), "-q")

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	root, err := gitOut(ctx, ".", "rev-parse", "--show-toplevel")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "bench-compare-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	sides := []*side{{label: "old", ref: *oldRef}, {label: "new", ref: *newRef}}
	for _, s := range sides {
		if err := s.build(ctx, root, tmp); err != nil {
			return err
		}
		defer s.remove(root)
	}

	start := time.Now()
	for t := range *turns {
		order := sides
		if t%2 == 1 {
			order = []*side{sides[1], sides[0]}
		}
		for _, s := range order {
			fmt.Fprintf(os.Stderr, "turn %d/%d: %s (%s) %s\n", t+1, *turns, s.label, s.commit[:12], strings.Join(args, " "))
			t0 := time.Now()
			md, err := s.runHarness(ctx, args)
			if err != nil {
				return err
			}
			s.turns = append(s.turns, figures(parseTables(md)))
			fmt.Fprintf(os.Stderr, "turn %d/%d: %s took %s\n", t+1, *turns, s.label, time.Since(t0).Round(time.Second))
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "## Comparison: %s (new) against %s (old)\n\n", describe(sides[1]), describe(sides[0]))
	fmt.Fprintf(&b, "Harness arguments: `%s`; %d turns, each running both harnesses, the first alternating; %s in all; "+
		"load average at the end: %s.\n\n", strings.Join(args, " "), *turns, time.Since(start).Round(time.Second), bench.LoadAverage())
	b.WriteString(render(sides[0].turns, sides[1].turns))
	fmt.Print(b.String())
	if *out != "" {
		return os.WriteFile(*out, []byte(b.String()), 0o644)
	}
	return nil
}

// side is one commit's harness.
type side struct {
	label, ref, commit string
	dir, bin           string   // its worktree and its built harness
	turns              []figSet // what each of its runs printed
	subject            string   // the commit's subject line
}

// build checks out s's commit in a worktree under tmp and builds its
// harness there.
func (s *side) build(ctx context.Context, root, tmp string) error {
	var err error
	if s.commit, err = gitOut(ctx, root, "rev-parse", "--verify", s.ref+"^{commit}"); err != nil {
		return fmt.Errorf("%s commit %q: %w", s.label, s.ref, err)
	}
	s.subject, _ = gitOut(ctx, root, "log", "-1", "--format=%s", s.commit)
	s.dir = filepath.Join(tmp, s.label)
	if _, err := gitOut(ctx, root, "worktree", "add", "--detach", s.dir, s.commit); err != nil {
		return err
	}
	s.bin = filepath.Join(tmp, s.label+"-bench")
	fmt.Fprintf(os.Stderr, "building the harness of %s (%s)\n", s.label, s.commit[:12])
	build := exec.CommandContext(ctx, "go", "build", "-o", s.bin, "./cmd/bench")
	build.Dir = filepath.Join(s.dir, "bench")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build the harness of %s (%s): %w\n%s", s.label, s.commit[:12], err, out)
	}
	return nil
}

// remove deletes s's worktree.
func (s *side) remove(root string) {
	if s.dir != "" {
		_, _ = gitOut(context.Background(), root, "worktree", "remove", "--force", s.dir)
	}
}

// runHarness runs s's harness once and returns its markdown; what it
// prints on standard error goes to ours.
func (s *side) runHarness(ctx context.Context, args []string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Dir = filepath.Join(s.dir, "bench")
	cmd.Stderr = prefixWriter{w: os.Stderr, prefix: "  " + s.label + ": "}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("the harness of %s (%s): %w", s.label, s.commit[:12], err)
	}
	return string(out), nil
}

func describe(s *side) string {
	return fmt.Sprintf("`%s` %s", s.commit[:12], s.subject)
}

// prefixWriter writes each write to w after prefix.
type prefixWriter struct {
	w      io.Writer
	prefix string
}

func (p prefixWriter) Write(b []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l != "" {
			if _, err := io.WriteString(p.w, p.prefix+l); err != nil {
				return 0, err
			}
		}
	}
	return len(b), nil
}

func gitOut(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return "", fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(ee.Stderr)))
		}
		return "", fmt.Errorf("git %s: %w", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out)), nil
}

// table is one markdown table of the harness's output.
type table struct {
	title  string
	header []string
	rows   [][]string
}

// parseTables reads the tables of the harness's markdown: a "### " title,
// then lines that start with "|": the header, the separator, the rows.
func parseTables(md string) []table {
	var out []table
	var cur *table
	for _, l := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(l, "### "):
			out = append(out, table{title: strings.TrimPrefix(l, "### ")})
			cur = &out[len(out)-1]
		case cur != nil && strings.HasPrefix(l, "|"):
			cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			switch {
			case cur.header == nil:
				cur.header = cells
			case strings.HasPrefix(cells[0], "---"):
			default:
				cur.rows = append(cur.rows, cells)
			}
		}
	}
	return out
}

// figKey names one figure: its table, its row, its column.
type figKey struct{ table, row, column string }

// figSet is the figures of one run of a harness, and their order.
type figSet struct {
	vals  map[figKey]float64
	order []figKey
}

// leadingNumber matches the figure a cell starts with: "39,784 (35,555–
// 40,365)", "1.55×", "0.80 (-20.3%)", "202 µs".
var leadingNumber = regexp.MustCompile(`^-?[0-9][0-9,]*(\.[0-9]+)?`)

// figures takes every cell of tables that starts with a figure, keyed by
// table, row and column. A row is named by its first cells, as many as make
// the rows of its table distinct (the request/reply table's requesters and
// implementation, the checkout table's goroutines and workers); the other
// cells are figures.
func figures(tables []table) figSet {
	fs := figSet{vals: map[figKey]float64{}}
	for _, t := range tables {
		k := keyCells(t.rows)
		for _, r := range t.rows {
			row := strings.Join(r[:min(k, len(r))], " / ")
			for j := k; j < len(r) && j < len(t.header); j++ {
				m := leadingNumber.FindString(r[j])
				if m == "" {
					continue
				}
				v, err := strconv.ParseFloat(strings.ReplaceAll(m, ",", ""), 64)
				if err != nil {
					continue
				}
				key := figKey{t.title, row, column(t.header[j])}
				if _, dup := fs.vals[key]; !dup {
					fs.order = append(fs.order, key)
				}
				fs.vals[key] = v
			}
		}
	}
	return fs
}

// renamedColumns maps the names a column had in older harnesses to its
// name now, so that their figures are compared: the Redis workloads' CPU
// columns, named for the server and the clients since peers with servers
// and clients of their own joined them.
var renamedColumns = map[string]string{
	"redis CPU µs/msg": "server CPU µs/msg",
	"Go CPU µs/msg":    "client CPU µs/msg",
	"redis CPU µs/rt":  "server CPU µs/rt",
	"Go CPU µs/rt":     "client CPU µs/rt",
}

// column returns the name of a column now.
func column(header string) string {
	if now, ok := renamedColumns[header]; ok {
		return now
	}
	return header
}

// keyCells returns how many leading cells name a row: as many as make the
// rows distinct (at least 1), and the columns right after them that hold
// no figure in any row (a name beside a distinct number).
func keyCells(rows [][]string) int {
	if len(rows) == 0 {
		return 1
	}
	k := distinctCells(rows)
	for ; ; k++ {
		for _, r := range rows {
			if k >= len(r) || leadingNumber.MatchString(r[k]) {
				return k
			}
		}
	}
}

// distinctCells returns how many leading cells make the rows distinct (at
// least 1).
func distinctCells(rows [][]string) int {
	for k := 1; ; k++ {
		seen := map[string]bool{}
		distinct, short := true, true
		for _, r := range rows {
			if len(r) > k {
				short = false
			}
			key := strings.Join(r[:min(k, len(r))], "\x00")
			if seen[key] {
				distinct = false
			}
			seen[key] = true
		}
		if distinct || short {
			return k
		}
	}
}

// render prints, table by table in the new harness's order, every figure
// both harnesses printed: the medians over the turns and their ratio, new
// over old, with the range of the turns' own ratios; then what only one
// side printed.
func render(oldTurns, newTurns []figSet) string {
	var b strings.Builder
	b.WriteString("Each figure's median over the turns, old and new, and its ratio new/old (below 1: the new figure " +
		"is lower, which is better for times, CPU and counts, worse for rates); \"turns\" is the lowest and " +
		"highest ratio of one turn's two runs.\n\n")
	var keys []figKey
	seen := map[figKey]bool{}
	for _, fs := range append(slices.Clone(newTurns), oldTurns...) {
		for _, k := range fs.order {
			if !seen[k] {
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	onlyOld, onlyNew := &unmatched{}, &unmatched{}
	title := ""
	for _, k := range keys {
		olds, news := valuesOf(oldTurns, k), valuesOf(newTurns, k)
		switch {
		case len(olds) == 0:
			onlyNew.add(k)
			continue
		case len(news) == 0:
			onlyOld.add(k)
			continue
		}
		if k.table != title {
			title = k.table
			fmt.Fprintf(&b, "\n### %s\n\n| row | figure | old | new | new/old | turns |\n| --- | --- | ---: | ---: | ---: | ---: |\n", title)
		}
		onlyOld.matched(k.table)
		onlyNew.matched(k.table)
		o, n := median(olds), median(news)
		lo, hi := turnRatios(oldTurns, newTurns, k)
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s–%s |\n", k.row, k.column, fmtFig(o), fmtFig(n), fmtRatio(n, o), fmtRatio(lo, 1), fmtRatio(hi, 1))
	}
	if s := onlyNew.String(); s != "" {
		fmt.Fprintf(&b, "\nOnly in the new harness's tables: %s.\n", s)
	}
	if s := onlyOld.String(); s != "" {
		fmt.Fprintf(&b, "\nOnly in the old harness's tables: %s.\n", s)
	}
	return b.String()
}

// unmatched collects the rows with figures that one side alone printed,
// by table.
type unmatched struct {
	tables []string
	rows   map[string][]string
	seen   map[string]bool // tables with a figure both sides printed
}

func (u *unmatched) add(k figKey) {
	if u.rows == nil {
		u.rows = map[string][]string{}
	}
	if _, ok := u.rows[k.table]; !ok {
		u.tables = append(u.tables, k.table)
	}
	u.rows[k.table] = appendOnce(u.rows[k.table], k.row)
}

func (u *unmatched) matched(table string) {
	if u.seen == nil {
		u.seen = map[string]bool{}
	}
	u.seen[table] = true
}

// String names each table that only one side printed, and the rows of the
// others that only one side printed.
func (u *unmatched) String() string {
	var parts []string
	for _, t := range u.tables {
		if !u.seen[t] {
			parts = append(parts, "the table \""+t+"\"")
			continue
		}
		parts = append(parts, "\""+t+"\": "+strings.Join(u.rows[t], ", "))
	}
	return strings.Join(parts, "; ")
}

func appendOnce(xs []string, x string) []string {
	if slices.Contains(xs, x) {
		return xs
	}
	return append(xs, x)
}

func valuesOf(turns []figSet, k figKey) []float64 {
	var xs []float64
	for _, fs := range turns {
		if v, ok := fs.vals[k]; ok {
			xs = append(xs, v)
		}
	}
	return xs
}

// turnRatios returns the lowest and highest new/old of the turns in which
// both sides printed k.
func turnRatios(oldTurns, newTurns []figSet, k figKey) (lo, hi float64) {
	lo, hi = math.NaN(), math.NaN()
	for i := range min(len(oldTurns), len(newTurns)) {
		o, ok1 := oldTurns[i].vals[k]
		n, ok2 := newTurns[i].vals[k]
		if !ok1 || !ok2 || o == 0 {
			continue
		}
		r := n / o
		if math.IsNaN(lo) || r < lo {
			lo = r
		}
		if math.IsNaN(hi) || r > hi {
			hi = r
		}
	}
	return lo, hi
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fmtFig(x float64) string {
	switch {
	case math.Abs(x) >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case math.Abs(x) >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	default:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
}

func fmtRatio(a, b float64) string {
	if b == 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", a/b)
}
