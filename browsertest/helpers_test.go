package browsertest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

var (
	redisURL  string
	diskerBin string // the disker command, built once
	chromium  string
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			chromium = p
			break
		}
	}
	if chromium == "" {
		fmt.Fprintln(os.Stderr, "browsertest: no chromium on PATH: install it (make deps, or apt-get install chromium)")
		return 1
	}
	dir, err := os.MkdirTemp("", "disker-browsertest")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	diskerBin = filepath.Join(dir, "disker")
	build := exec.Command("go", "build", "-o", diskerBin, ".")
	build.Dir = "../cmd/disker" // a module of its own
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "browsertest: go build ./cmd/disker: %v\n%s", err, out)
		return 1
	}
	srv, stop := redistest.MustStart()
	defer stop()
	redisURL = srv.URL()
	return m.Run()
}

// proc is a disker command running for a test; it gets SIGTERM when the
// test ends.
type proc struct {
	cmd *exec.Cmd
	mu  sync.Mutex
	log strings.Builder
}

// start runs the disker command with args on the test's key prefix and
// the test's Redis; ready, if not nil, is a pattern of its log to wait for,
// whose first group start returns.
func start(t *testing.T, prefix string, ready *regexp.Regexp, args ...string) (*proc, string) {
	t.Helper()
	args = append(args, "--redis-url", redisURL, "--key-prefix", prefix)
	p := &proc{cmd: exec.Command(diskerBin, args...)}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	pat := ready
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
			p.mu.Unlock()
			if pat != nil {
				if m := pat.FindStringSubmatch(line); m != nil {
					found <- m[len(m)-1]
					pat = nil
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-done
		}
	})
	if ready == nil {
		return p, ""
	}
	select {
	case v := <-found:
		return p, v
	case <-time.After(30 * time.Second):
		p.mu.Lock()
		defer p.mu.Unlock()
		t.Fatalf("disker %s did not log %v in time; its log:\n%s", strings.Join(args, " "), ready, p.log.String())
		return nil, ""
	}
}

var startedURL = regexp.MustCompile(`msg="dashboard started" url=(http://\S+)/ `)

// dashboard starts "disker dashboard" with args on a free port and returns
// its URL (without the trailing slash).
func dashboard(t *testing.T, prefix string, args ...string) string {
	t.Helper()
	_, url := start(t, prefix, startedURL, append([]string{"dashboard", "--listen", "127.0.0.1:0", "--interval", "300ms"}, args...)...)
	return url
}

// library opens a Disker instance on prefix for the test to send and check
// with.
func library(t *testing.T, prefix string) *disker.Disker {
	t.Helper()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: redisURL, KeyPrefix: prefix, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = d.Close(ctx)
	})
	return d
}

// waitFor polls cond until it holds, failing the test after a deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// browser is a headless Chromium with a fresh profile, recording the
// console errors and dialogs of its page.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T) *browser {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.NoSandbox,
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("hide-scrollbars", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(profile(t)),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx, chromedp.EmulateViewport(1280, 800)); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	b := &browser{ctx: ctx}
	go func() {
		for m, err := range chromedp.Console(ctx) {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.record(m.String() + " (" + m.URL + ")")
			}
		}
	}()
	go func() {
		for ev, err := range chromedp.Events(ctx, page.JavascriptDialogOpening) {
			if err != nil {
				return
			}
			b.record("a dialog opened: " + ev.Message)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return b
}

// profile makes a fresh user-data-dir for a browser. Chromium's helper
// processes can still write there a moment after it stops, so its removal
// is tried again for a while (t.TempDir would fail the test).
func profile(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "disker-chromium")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		deadline := time.Now().Add(10 * time.Second)
		for os.RemoveAll(dir) != nil && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

func (b *browser) record(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs = append(b.errs, s)
}

// takeErrors returns the console errors and dialogs since the last call.
func (b *browser) takeErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errs
	b.errs = nil
	return e
}

// do runs actions with a time limit.
func (b *browser) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// eval evaluates a JavaScript expression into T.
func eval[T any](t *testing.T, b *browser, js string, opts ...chromedp.EvaluateOption) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, opts...))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// waitJS waits until a JavaScript expression is truthy in the page; it
// keeps asking across navigations (an expression evaluated while the page
// changes fails, and is asked again).
func (b *browser) waitJS(t *testing.T, what, js string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("!!("+js+")"))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s (%s): last error %v", what, js, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// consume waits until n console errors containing text have arrived (the
// browser reports them a little later), and removes them.
func (b *browser) consume(t *testing.T, text string, n int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d console errors with %q", n, text), func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		found := 0
		for _, e := range b.errs {
			if strings.Contains(e, text) {
				found++
			}
		}
		if found < n {
			return false
		}
		b.errs = slices.DeleteFunc(b.errs, func(e string) bool { return strings.Contains(e, text) })
		return true
	})
}

// noErrors fails the test if the page logged errors or opened dialogs.
func (b *browser) noErrors(t *testing.T, where string) {
	t.Helper()
	if errs := b.takeErrors(); len(errs) > 0 {
		t.Errorf("%s: console errors or dialogs:\n%s", where, strings.Join(errs, "\n"))
	}
}
