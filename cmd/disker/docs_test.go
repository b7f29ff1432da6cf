package main_test

import (
	"bufio"
	"context"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// The docs' examples run as tests, so that a page cannot say what the
// command or the library no longer does. TestDocExamples reads the fenced
// blocks of README.md and docs/*.md:
//
//   - ```sh blocks are run, line by line, in one bash shell per page, with
//     this test's disker first on PATH and DISKER_REDIS_URL naming a
//     redis-server of the page's own. A line must succeed. A long-running command
//     (worker, gateway, dashboard, stats --watch) runs beside the shell
//     until it says it started, and is stopped (SIGTERM, or Ctrl-C's SIGINT
//     for stats) when the page is done, or when another of its kind takes
//     its place: it must then exit 0. A synopsis (NAME, [--flag], A | B)
//     is not run: each of its flags must be one of its command's.
//   - Blocks without a language whose lines start with "$ " are
//     transcripts: each command runs in the page's shell, and what it
//     prints (stdout and stderr) must be what follows it, once the values
//     that differ from run to run are put aside (see normalize).
//   - ```go blocks are type-checked against the code of today, inside a
//     function "func(ctx context.Context) error".
//   - Other blocks (JSON, YAML, sample output) are not examples.
//
// A comment on the line before a block says more:
//
//	<!-- not run: WHY -->      an example that cannot run in a test
//	<!-- run by TestName -->    an example another test runs, as written
//	<!-- file: NAME -->         the block is a file that later examples use
//	<!-- go: DECLARATIONS -->   what a Go block uses without declaring it
//	<!-- any order -->          a transcript whose lines may come in any order
//
// The ports of the docs (6379, 8000, 8080, 8090, 9090) become free ports:
// 6379 the private Redis, 8000 a service (docs/tour/app.py). A command
// that listens on a default port is given a free one by its variable.

// maxNotRun bounds the examples marked "not run": they are to stay few.
const maxNotRun = 5

// docBlock is one fenced block of a page.
type docBlock struct {
	page   string
	line   int    // of the opening fence
	lang   string // after the fence
	marker string // the HTML comment on the line before it, without <!-- -->
	lines  []string
}

func (b docBlock) String() string { return fmt.Sprintf("%s:%d", b.page, b.line) }

// readBlocks returns the fenced blocks of the page at path.
func readBlocks(t *testing.T, root, page string) []docBlock {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, page))
	if err != nil {
		t.Fatal(err)
	}
	var (
		blocks []docBlock
		cur    *docBlock
		prev   string
	)
	for i, line := range strings.Split(string(data), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(line, "```"):
			cur = &docBlock{page: page, line: i + 1, lang: strings.TrimPrefix(line, "```")}
			if m := regexp.MustCompile(`^<!-- (.*) -->$`).FindStringSubmatch(strings.TrimSpace(prev)); m != nil {
				cur.marker = m[1]
			}
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, line)
		}
		if strings.TrimSpace(line) != "" {
			prev = line
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a block is not closed", page, cur.line)
	}
	return blocks
}

func (b docBlock) isTranscript() bool {
	return (b.lang == "" || b.lang == "console") && len(b.lines) > 0 && strings.HasPrefix(b.lines[0], "$ ")
}

func TestDocExamples(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pages := []string{"README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range more {
		pages = append(pages, filepath.Join("docs", filepath.Base(p)))
	}
	// The service at the docs' port 8000.
	svcPort := freePort(t)
	svc := exec.Command("python3", filepath.Join(root, "docs", "tour", "app.py"), svcPort)
	if err := svc.Start(); err != nil {
		t.Fatalf("the docs' service (python3 docs/tour/app.py): %v", err)
	}
	t.Cleanup(func() { _ = svc.Process.Kill(); _ = svc.Wait() })

	var (
		mu     sync.Mutex
		notRun []string
	)
	for _, page := range pages {
		blocks := readBlocks(t, root, page)
		t.Run(strings.ReplaceAll(page, "/", "_"), func(t *testing.T) {
			t.Parallel()
			var s *docSession
			session := func() *docSession {
				if s == nil {
					s = newDocSession(t, svcPort)
				}
				return s
			}
			for _, b := range blocks {
				switch {
				case strings.HasPrefix(b.marker, "not run:"):
					if strings.TrimSpace(strings.TrimPrefix(b.marker, "not run:")) == "" {
						t.Errorf("%v: \"not run\" says not why", b)
					}
					mu.Lock()
					notRun = append(notRun, fmt.Sprintf("%v (%s)", b, b.marker))
					mu.Unlock()
				case strings.HasPrefix(b.marker, "run by "):
					checkRunBy(t, b, strings.TrimPrefix(b.marker, "run by "))
				case strings.HasPrefix(b.marker, "file: "):
					session().writeFile(b, strings.TrimPrefix(b.marker, "file: "))
				case b.lang == "go":
					checkGoBlock(t, root, b)
				case b.lang == "sh":
					session().runShell(b)
				case b.isTranscript():
					session().runTranscript(b)
				}
			}
			if s != nil {
				s.stop()
			}
		})
	}
	t.Cleanup(func() {
		if len(notRun) > maxNotRun {
			t.Errorf("%d examples are not run, more than %d: %s", len(notRun), maxNotRun, strings.Join(notRun, "; "))
		}
		t.Logf("examples not run: %s", strings.Join(notRun, "; "))
	})
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// checkRunBy checks that test, which a block says runs it, exists.
func checkRunBy(t *testing.T, b docBlock, test string) {
	t.Helper()
	files, _ := filepath.Glob("*_test.go")
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err == nil && strings.Contains(string(data), "func "+test+"(t *testing.T)") {
			return
		}
	}
	t.Errorf("%v: run by %s, which is not a test of cmd/disker", b, test)
}

// docSession is the shell, the processes and the state of one page.
type docSession struct {
	t       *testing.T
	dir     string
	env     []string
	sh      *tourShell
	ports   map[string]string // a port of the docs -> a free one
	procs   []*docProc
	volatil map[string]string // a value of the page (an id) -> the one of this run
}

// docProc is a long-running command of a page.
type docProc struct {
	*proc
	line string
	kind string // worker, gateway, dashboard, stats
}

func newDocSession(t *testing.T, svcPort string) *docSession {
	// A Redis of its own: the page's commands use the default key prefix,
	// as its reader's do.
	srv := redistest.Start(t)
	s := &docSession{t: t, dir: t.TempDir(), volatil: map[string]string{}}
	_, redisPort, _ := net.SplitHostPort(srv.Addr())
	s.ports = map[string]string{"6379": redisPort, "8000": svcPort}
	for _, p := range []string{"8080", "8090", "9090"} {
		s.ports[p] = freePort(t)
	}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DISKER_") && !strings.HasPrefix(kv, "PATH=") {
			s.env = append(s.env, kv)
		}
	}
	s.env = append(s.env, "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"DISKER_REDIS_URL="+srv.URL())
	s.sh = startTourShell(t, s.dir, s.env)
	s.sh.quiet = true // each failure shows what it printed
	return s
}

var docPort = regexp.MustCompile(`(\b(?:localhost|127\.0\.0\.1|redis)\b)?:(6379|8000|8080|8090|9090)\b`)

// local puts the session's ports in text written with the docs' ports.
func (s *docSession) local(text string) string {
	return docPort.ReplaceAllStringFunc(text, func(m string) string {
		sub := docPort.FindStringSubmatch(m)
		host := sub[1]
		if host == "redis" {
			host = "127.0.0.1"
		}
		return host + ":" + s.ports[sub[2]]
	})
}

func (s *docSession) writeFile(b docBlock, name string) {
	if err := os.WriteFile(filepath.Join(s.dir, name), []byte(strings.Join(b.lines, "\n")+"\n"), 0o600); err != nil {
		s.t.Fatal(err)
	}
}

// logicalLines joins the lines of a block that end with a backslash to the
// next, and leaves out comments.
func logicalLines(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		if cur == "" && strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\")
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	return out
}

// words splits a command line the way the shell would, roughly: quotes
// and a comment are understood, nothing is expanded.
func words(line string) []string {
	var (
		out   []string
		cur   strings.Builder
		quote rune
		in    bool
	)
	for _, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '#' && !in:
			return out
		case r == ' ' || r == '\t':
			if in {
				out = append(out, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		out = append(out, cur.String())
	}
	return out
}

// disker returns the words of a command line from "disker" on, past the
// variables set before it, or nil if it does not run disker.
func diskerWords(line string) []string {
	w := words(line)
	for len(w) > 0 && regexp.MustCompile(`^[A-Z_]+=`).MatchString(w[0]) {
		w = w[1:]
	}
	if len(w) == 0 || w[0] != "disker" {
		return nil
	}
	return w
}

var placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9_]*(=[A-Z]+)?$`)

// isSynopsis tells a line that shows a command's form (NAME, [--flag], A |
// B) from one to run.
func isSynopsis(w []string) bool {
	return slices.ContainsFunc(w, func(s string) bool {
		bare := strings.TrimSuffix(strings.Trim(s, "[]()"), "...")
		return s == "|" || strings.HasPrefix(s, "[") || placeholder.MatchString(strings.Trim(bare, "[]()"))
	})
}

// longRunningKind returns which long-running command w is, or "".
func longRunningKind(w []string) string {
	if len(w) < 2 {
		return ""
	}
	switch w[1] {
	case "worker", "gateway", "dashboard":
		return w[1]
	case "stats":
		if slices.Contains(w, "--watch") || slices.Contains(w, "-w") {
			return "stats"
		}
	}
	return ""
}

func (s *docSession) runShell(b docBlock) {
	s.t.Helper()
	for _, line := range logicalLines(b.lines) {
		w := diskerWords(line)
		switch {
		case w != nil && isSynopsis(w):
			s.checkSynopsis(b, w)
		case longRunningKind(w) != "":
			s.start(b, line, longRunningKind(w))
		default:
			out, code := s.sh.run("{ "+s.local(line)+"\n} 2>&1", 2*time.Minute)
			if code != 0 {
				s.t.Errorf("%v: %s: exit %d:\n%s", b, line, code, out)
			}
		}
	}
}

// checkSynopsis checks that the flags of a synopsis are those of its
// command.
func (s *docSession) checkSynopsis(b docBlock, w []string) {
	s.t.Helper()
	var path []string
	for _, x := range w[1:] {
		if !regexp.MustCompile(`^[a-z]+$`).MatchString(x) {
			break
		}
		path = append(path, x)
	}
	out, code := s.sh.run("disker "+strings.Join(path, " ")+" --help", 30*time.Second)
	if code != 0 {
		s.t.Errorf("%v: disker %s is not a command: %s", b, strings.Join(path, " "), out)
		return
	}
	for _, f := range regexp.MustCompile(`--[a-z][a-z0-9-]*`).FindAllString(strings.Join(w, " "), -1) {
		if !regexp.MustCompile(`(?m)^\s+(-[a-z], )?` + f + `( |$)`).MatchString(out) {
			s.t.Errorf("%v: disker %s has no flag %s", b, strings.Join(path, " "), f)
		}
	}
}

// start runs a long-running command of a page beside its shell until it
// says it started.
func (s *docSession) start(b docBlock, line, kind string) {
	s.t.Helper()
	line = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(stripComment(line)), "&"))
	for _, p := range slices.Clone(s.procs) { // stopProc deletes from s.procs
		if p.kind == kind && kind != "worker" {
			// Another way to run the same server: it takes the place
			// of the one before.
			s.stopProc(b, p)
		}
	}
	// "exec" before disker, after the variables set for it: the signals
	// go to disker.
	local := s.local(line)
	at := regexp.MustCompile(`(^|\s)disker\s`).FindStringIndex(local)
	if at == nil {
		s.t.Fatalf("%v: %s does not run disker", b, line)
	}
	cmd := exec.Command("bash", "-c", local[:at[0]]+" exec "+strings.TrimLeft(local[at[0]:], " "))
	cmd.Dir = s.dir
	cmd.Env = append(slices.Clone(s.env), "DISKER_LOG_FORMAT=json")
	if !strings.Contains(line, "--listen") {
		switch kind {
		case "dashboard":
			cmd.Env = append(cmd.Env, "DISKER_LISTEN=127.0.0.1:"+s.ports["8090"])
		case "gateway":
			cmd.Env = append(cmd.Env, "DISKER_LISTEN=127.0.0.1:"+s.ports["8080"])
		}
	}
	p := &docProc{proc: startProc(s.t, cmd, fmt.Sprintf("%v: %s", b, line), false), line: line, kind: kind}
	s.procs = append(s.procs, p)
	started := func() bool {
		if kind == "stats" {
			out := p.stdout.String()
			return strings.Contains(out, "RECEIVER") || strings.Contains(out, "No receivers")
		}
		return strings.Contains(p.stderr.String(), `"msg":"`+kind+` started"`)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !started() {
		select {
		case <-p.done:
			s.t.Fatalf("%v: %s exited before it started: %v\n%s", b, line, p.cmd.ProcessState, p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("%v: %s did not start within 30s:\n%s", b, line, p.stderr.String())
		}
	}
}

// stopProc stops a long-running command as its user would: SIGTERM, or
// Ctrl-C for stats --watch. It must exit 0.
func (s *docSession) stopProc(b docBlock, p *docProc) {
	s.t.Helper()
	s.procs = slices.DeleteFunc(s.procs, func(q *docProc) bool { return q == p })
	sig := syscall.SIGTERM
	if p.kind == "stats" {
		sig = syscall.SIGINT
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		s.t.Errorf("%v: %s did not stop within 60s of %v", b, p.line, sig)
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		s.t.Errorf("%v: %s ended with exit %d on %v:\n%s", b, p.line, code, sig, p.stderr.String())
	}
}

func (s *docSession) stop() {
	for len(s.procs) > 0 {
		s.stopProc(docBlock{page: "end of page"}, s.procs[len(s.procs)-1])
	}
}

// stripComment returns line without its comment: a # after a blank,
// outside quotes.
func stripComment(line string) string {
	var quote rune
	for i, r := range line {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
		case r == '\'' || r == '"':
			quote = r
		case r == '#' && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return strings.TrimRight(line[:i], " \t")
		}
	}
	return line
}

// runTranscript runs each "$ command" of a transcript and compares what it
// prints with the lines that follow it.
func (s *docSession) runTranscript(b docBlock) {
	s.t.Helper()
	type step struct {
		cmd  string
		want []string
	}
	var steps []step
	for _, l := range b.lines {
		if c, ok := strings.CutPrefix(l, "$ "); ok {
			steps = append(steps, step{cmd: c})
		} else {
			steps[len(steps)-1].want = append(steps[len(steps)-1].want, l)
		}
	}
	for _, st := range steps {
		if w := diskerWords(st.cmd); longRunningKind(w) != "" && strings.HasSuffix(strings.TrimSpace(stripComment(st.cmd)), "&") {
			if len(st.want) > 0 {
				s.t.Errorf("%v: %s runs in the background but shows output", b, st.cmd)
			}
			s.start(b, st.cmd, longRunningKind(w))
			continue
		}
		cmd := s.local(st.cmd)
		for page, run := range s.volatil {
			cmd = strings.ReplaceAll(cmd, page, run)
		}
		out, _ := s.sh.run("{ "+cmd+"\n} 2>&1", 2*time.Minute)
		want := s.local(strings.Join(st.want, "\n"))
		if !s.matches(want, out, b.marker == "any order") {
			s.t.Errorf("%v: $ %s\nprinted:\n%s\nthe page shows:\n%s", b, st.cmd, out, strings.Join(st.want, "\n"))
		}
	}
}

var (
	goVersion  = regexp.MustCompile(`\bgo1\.\d+(\.\d+)?\b`)
	platform   = regexp.MustCompile(`\b(linux|darwin|windows|freebsd)/(amd64|arm64|386|arm)\b`)
	pseudo     = regexp.MustCompile(`\bv0\.0\.0-\d{14}-[0-9a-f]{12}(\+dirty)?`)
	timeStamp  = regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:?\d{2})?`)
	streamID   = regexp.MustCompile(`\b\d{10,}-\d+\b`)
	messageID  = regexp.MustCompile(`\b[0-7][0-9abcdefghjkmnpqrstvwxyz]{25}\b`)
	duration   = regexp.MustCompile(`\b(\d+(\.\d+)?(h|m|s|ms|µs|ns))+\b`)
	number     = regexp.MustCompile(`\b\d+(\.\d+)?\b`)
	whitespace = regexp.MustCompile(`\s+`)
)

// normalize puts aside what differs from run to run: the Go version and
// the platform, a build's version from git, times, durations and numbers
// (counts, rates, pids), the host's name, and the amount of blank space in
// tables. Ids (message and dead-letter ids) are returned apart, in order,
// so that a page's ids can be matched with the run's.
func normalize(text string, host string) (lines []string, ids []string) {
	for _, l := range strings.Split(text, "\n") {
		l = goVersion.ReplaceAllString(l, "GO")
		l = platform.ReplaceAllString(l, "OS/ARCH")
		l = pseudo.ReplaceAllString(l, "devel")
		l = timeStamp.ReplaceAllString(l, "TIME")
		l = replaceKeeping(streamID, l, "SID", &ids)
		l = replaceKeeping(messageID, l, "ID", &ids)
		if host != "" {
			l = regexp.MustCompile(`\b`+regexp.QuoteMeta(host)+`\b`).ReplaceAllString(l, "HOST")
		}
		l = duration.ReplaceAllString(l, "D")
		l = number.ReplaceAllString(l, "N")
		l = strings.TrimSpace(whitespace.ReplaceAllString(l, " "))
		if l != "" {
			lines = append(lines, l)
		}
	}
	return lines, ids
}

func replaceKeeping(re *regexp.Regexp, s, with string, kept *[]string) string {
	return re.ReplaceAllStringFunc(s, func(m string) string {
		*kept = append(*kept, m)
		return with
	})
}

// matches reports whether got is what the page shows (want); the page's
// ids are then those of the run, for the commands that follow.
func (s *docSession) matches(want, got string, anyOrder bool) bool {
	host, _ := os.Hostname()
	w, wIDs := normalize(want, "vm") // the pages show the host as "vm"
	g, gIDs := normalize(got, host)
	if anyOrder {
		slices.Sort(w)
		slices.Sort(g)
	}
	if !slices.Equal(w, g) || len(wIDs) != len(gIDs) {
		return false
	}
	for i, id := range wIDs {
		if run, ok := s.volatil[id]; ok && run != gIDs[i] {
			return false // the page shows the same id twice, the run two
		}
		for page, run := range s.volatil {
			if run == gIDs[i] && page != id {
				return false // the page shows two ids, the run the same twice
			}
		}
		s.volatil[id] = gIDs[i]
	}
	return true
}

// checkGoBlock type-checks a Go block of a page against the packages of
// today: its statements as the body of func(ctx context.Context) error
// (or, for a block that declares functions, such as a test as it stands in
// a file of its own, its declarations, with testing and diskertest beside
// the usual imports), its imports beside the usual ones, and the
// declarations of its "go:" comment. What Go accepts but flags (an unused
// variable or import) is no error in an excerpt.
func checkGoBlock(t *testing.T, root string, b docBlock) {
	t.Helper()
	var imports, body []string
	inImports := false
	for _, l := range b.lines {
		trimmed := strings.TrimSpace(l)
		switch {
		case inImports && trimmed == ")":
			inImports = false
		case inImports:
			if trimmed != "" {
				imports = append(imports, trimmed)
			}
		case trimmed == "import (":
			inImports = true
		case strings.HasPrefix(trimmed, "import "):
			imports = append(imports, strings.TrimPrefix(trimmed, "import "))
		default:
			body = append(body, l)
		}
	}
	usual := []string{`"context"`, `"errors"`, `"fmt"`, `"net/http"`, `"time"`,
		`"github.com/diskerhq/disker"`, `"github.com/diskerhq/disker/pool"`}
	i := slices.IndexFunc(body, func(l string) bool { return strings.TrimSpace(l) != "" })
	topLevel := i >= 0 && strings.HasPrefix(body[i], "func ")
	if topLevel {
		usual = append(usual, `"testing"`, `"github.com/diskerhq/disker/diskertest"`)
	}
	for _, std := range usual {
		if !slices.Contains(imports, std) {
			imports = append(imports, std)
		}
	}
	decls := strings.TrimPrefix(b.marker, "go: ")
	if !strings.HasPrefix(b.marker, "go: ") {
		decls = ""
	}
	code := "\n\nfunc example(ctx context.Context) error {\n" + strings.Join(body, "\n") + "\n\treturn nil\n}\n"
	if topLevel {
		code = "\n\n" + strings.Join(body, "\n") + "\n"
	}
	src := "package example\n\nimport (\n\t" + strings.Join(imports, "\n\t") + "\n)\n\n" + decls + code
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, b.String(), src, 0)
	if err != nil {
		t.Errorf("%v: the Go example does not parse: %v\n%s", b, err, src)
		return
	}
	// The module of the imports: diskerotel and diskerprom are modules of
	// their own.
	modDir := root
	var paths []string
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		paths = append(paths, p)
		for _, mod := range []string{"diskerotel", "diskerprom"} {
			if strings.HasPrefix(p, "github.com/diskerhq/disker/"+mod) {
				modDir = filepath.Join(root, mod)
			}
		}
	}
	exports, err := exportData(modDir, paths)
	if err != nil {
		t.Errorf("%v: %v", b, err)
		return
	}
	var errs []string
	conf := types.Config{
		Importer: importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
			file, ok := exports[path]
			if !ok {
				return nil, fmt.Errorf("no export data for %s", path)
			}
			return os.Open(file)
		}),
		Error: func(err error) {
			if te, ok := err.(types.Error); !ok || !te.Soft {
				errs = append(errs, err.Error())
			}
		},
	}
	_, _ = conf.Check("example", fset, []*ast.File{f}, nil)
	if len(errs) > 0 {
		t.Errorf("%v: the Go example does not compile against the code of today:\n  %s", b, strings.Join(errs, "\n  "))
	}
}

var (
	exportMu    sync.Mutex
	exportCache = map[string]map[string]string{}
)

// exportData returns, by import path, the files of compiled export data of
// paths and their dependencies, as the go command builds them in modDir.
func exportData(modDir string, paths []string) (map[string]string, error) {
	slices.Sort(paths)
	key := modDir + "|" + strings.Join(paths, " ")
	exportMu.Lock()
	defer exportMu.Unlock()
	if m, ok := exportCache[key]; ok {
		return m, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(append([]string{"list", "-export", "-deps"}, buildFlags...), "-f", "{{if .Export}}{{.ImportPath}}={{.Export}}{{end}}")
	cmd := exec.CommandContext(ctx, "go", append(args, paths...)...)
	cmd.Dir = modDir
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return nil, fmt.Errorf("go list -export %v: %v %s", paths, err, stderr)
	}
	m := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if p, file, ok := strings.Cut(sc.Text(), "="); ok {
			m[p] = file
		}
	}
	exportCache[key] = m
	return m, nil
}

// tableRows returns the rows of the first Markdown table after the line
// that starts with heading in the page at path, as their cells.
func tableRows(t *testing.T, path, heading string) [][]string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	found := false
	for _, line := range strings.Split(string(data), "\n") {
		if !found {
			if found = strings.HasPrefix(line, heading); !found || !strings.HasPrefix(line, "|") {
				continue
			}
		}
		switch {
		case strings.HasPrefix(line, "|"):
			cells := strings.Split(strings.Trim(line, "|"), "|")
			for i := range cells {
				cells[i] = strings.TrimSpace(cells[i])
			}
			if !strings.HasPrefix(cells[0], "---") {
				rows = append(rows, cells)
			}
		case len(rows) > 0:
			return rows[1:] // without the header
		}
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no table after %q", path, heading)
	}
	return rows[1:]
}

// TestDocTables: the tables of the docs list what the command has, no more
// and no less: each page's flags (its command's --help), the columns of
// disker stats and of the dashboard's receivers page, and the metrics a
// worker and a gateway serve.
func TestDocTables(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	globals := []string{"log-format", "log-level", "verbose", "version"} // docs/README.md has them
	for _, c := range []struct {
		page, heading string
		commands      [][]string
	}{
		{"cancel.md", "## Flags", [][]string{{"cancel"}}}, {"dashboard.md", "## Flags", [][]string{{"dashboard"}}},
		{"demo.md", "## Flags", [][]string{{"demo"}}}, {"demo.md", "## `disker demo pool`", [][]string{{"demo", "pool"}}},
		{"dlq.md", "## Flags", [][]string{{"dlq", "list"}, {"dlq", "retry"}, {"dlq", "purge"}}},
		{"gateway.md", "## Flags", [][]string{{"gateway"}}}, {"pause.md", "## Flags", [][]string{{"pause"}, {"resume"}}},
		{"send.md", "## Flags", [][]string{{"send"}}}, {"stats.md", "## Flags", [][]string{{"stats"}}},
		{"results.md", "## Flags", [][]string{{"result"}}}, {"batches.md", "## Flags", [][]string{{"batch"}}},
		{"worker.md", "## Flags", [][]string{{"worker"}}},
	} {
		page, commands := c.page, c.commands
		var have []string
		for _, c := range commands {
			_, flags := readHelp(t, e, c)
			for _, f := range flags {
				if !slices.Contains(globals, f.name) && !slices.Contains(have, f.name) {
					have = append(have, f.name)
				}
			}
		}
		var documented []string
		for _, row := range tableRows(t, filepath.Join("../../docs", page), c.heading) {
			for _, f := range regexp.MustCompile(`--([a-z][a-z0-9-]*\*?)`).FindAllStringSubmatch(row[0], -1) {
				if prefix, ok := strings.CutSuffix(f[1], "*"); ok {
					for _, h := range have {
						if strings.HasPrefix(h, prefix) {
							documented = append(documented, h)
						}
					}
					continue
				}
				documented = append(documented, f[1])
			}
		}
		for _, f := range have {
			if !slices.Contains(documented, f) {
				t.Errorf("docs/%s: the flag --%s of %v is not in its table of flags", page, f, commands)
			}
		}
		for _, f := range documented {
			if !slices.Contains(have, f) {
				t.Errorf("docs/%s: its table of flags has --%s, which %v has not", page, f, commands)
			}
		}
	}

	// The columns of disker stats.
	e.startWorker("--receiver", "cols", "--exec", "cat")
	out, errOut, code := e.run("", "stats")
	if code != 0 {
		t.Fatalf("stats: exit %d %s", code, errOut)
	}
	header := strings.Fields(firstLine(out))
	var statsCols []string
	for _, row := range tableRows(t, "../../docs/stats.md", "## Receivers") {
		statsCols = append(statsCols, strings.Trim(row[0], "`"))
	}
	for i, col := range header {
		if col == "RATE/S(AVG)" {
			header[i] = "RATE/S"
		}
	}
	if want := append([]string{"RECEIVER"}, statsCols...); !slices.Equal(header, want) {
		t.Errorf("disker stats shows the columns %v; docs/stats.md lists %v", header, want)
	}

	// The columns of the dashboard's receivers page.
	_, url := e.startDashboard()
	code, page := get(t, url+"/")
	if code != 200 {
		t.Fatalf("the dashboard's receivers page: %d", code)
	}
	var pageCols []string
	for _, m := range regexp.MustCompile(`<th[^>]*>([^<]*)</th>`).FindAllStringSubmatch(page, -1) {
		pageCols = append(pageCols, m[1])
	}
	var dashCols []string
	for _, row := range tableRows(t, "../../docs/dashboard.md", "**Receivers**") {
		dashCols = append(dashCols, row[0])
	}
	if want := append([]string{"Receiver"}, dashCols...); !slices.Equal(pageCols, want) {
		t.Errorf("the dashboard's receivers page has the columns %v; docs/dashboard.md lists %v", pageCols, want)
	}

	// The metrics: every one a worker and a gateway serve is in the table
	// of docs/README.md (and, but the gateway's, of docs/metrics.md).
	w := e.start("worker", "--receiver", "metrics", "--exec", "cat", "--admin", "127.0.0.1:0")
	workerAdmin := "http://" + w.waitLog("worker started")["admin"].(string)
	gw, gwURL := e.startGateway("--receiver", "metrics", "--admin", "127.0.0.1:0", "--timeout", "2s")
	gwAdmin := "http://" + gw.waitLog("gateway started")["admin"].(string)
	get(t, gwURL+"/") // a request: the gateway's metrics then have a series
	documented := func(page string) []string {
		var names []string
		for _, row := range tableRows(t, page, "| metric |") {
			names = append(names, strings.Trim(row[0], "`"))
		}
		return names
	}
	overview, library := documented("../../docs/README.md"), documented("../../docs/metrics.md")
	served := 0
	for _, admin := range []string{workerAdmin, gwAdmin} {
		_, metrics := get(t, admin+"/metrics")
		for _, m := range regexp.MustCompile(`(?m)^# TYPE (disker_[a-z_]+) `).FindAllStringSubmatch(metrics, -1) {
			served++
			if !slices.Contains(overview, m[1]) {
				t.Errorf("%s serves %s, which docs/README.md does not list", admin, m[1])
			}
			if !strings.HasPrefix(m[1], "disker_gateway_") && !slices.Contains(library, m[1]) {
				t.Errorf("%s serves %s, which docs/metrics.md does not list", admin, m[1])
			}
		}
	}
	if served < 10 {
		t.Errorf("the worker and the gateway serve %d disker_ metrics; the test expects more", served)
	}
}
