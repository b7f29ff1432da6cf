package browsertest

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

var workerStarted = regexp.MustCompile(`msg="worker started"`)

// rowsJS reads a live table into {name: [cells after the first]}.
const rowsJS = `Object.fromEntries([...document.querySelectorAll('#%s tbody tr')].map(tr => [tr.dataset.name, [...tr.cells].slice(1).map(td => td.textContent)]))`

func rows(t *testing.T, b *browser, table string) map[string][]string {
	t.Helper()
	return eval[map[string][]string](t, b, fmt.Sprintf(rowsJS, table))
}

// contents are the dead letters the tests make: the worker of "webhooks"
// fails every message, and dead-letters it at once.
var contents = []string{`{"event":"order.paid","order":42}`, "<script>alert(1)</script>", "\x00\x01\xfe\xff binary"}

func deadLetters(t *testing.T, lib *disker.Disker, receiver string) int64 {
	t.Helper()
	st, err := lib.Stats(context.Background(), receiver)
	if err != nil {
		t.Fatal(err)
	}
	return st.DeadLetters
}

func TestDashboard(t *testing.T) {
	prefix := redistest.Prefix(t)
	start(t, prefix, workerStarted, "worker", "--receiver", "upper", "--concurrency", "4", "--exec", "tr a-z A-Z")
	start(t, prefix, workerStarted, "worker", "--receiver", "webhooks", "--concurrency", "2", "--exec", "false", "--max-attempts", "1")
	lib := library(t, prefix)
	ctx := context.Background()
	for range 5 {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := lib.Request(rctx, disker.Message{Receiver: "upper", Content: []byte("hello")})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range contents {
		if _, err := lib.Send(ctx, disker.Message{Receiver: "webhooks", Content: []byte(c),
			Headers: map[string]string{"content-type": "application/json"}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "3 dead letters", func() bool { return deadLetters(t, lib, "webhooks") == 3 })
	dash := dashboard(t, prefix, "--allow-actions")
	readOnly := dashboard(t, prefix)
	b := newBrowser(t)

	t.Run("receivers match Stats", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/"))
		b.waitJS(t, "both receivers", `document.querySelectorAll('#receivers tbody tr').length == 2`)
		var got, want map[string][]string
		waitFor(t, "the page to show what Stats says", func() bool {
			got, want = rows(t, b, "receivers"), map[string][]string{}
			for _, name := range []string{"upper", "webhooks"} {
				st, err := lib.Stats(ctx, name)
				if err != nil {
					t.Fatal(err)
				}
				want[name] = []string{fmt.Sprint(st.Queued), fmt.Sprint(st.Pending), "0", fmt.Sprint(st.DeadLetters)}
			}
			for name, w := range want {
				g := got[name]
				// Then the oldest waiting message's age (none waits), none
				// scheduled, not paused, no keyed message waiting.
				if len(g) != 10 || strings.Join(g[:4], " ") != strings.Join(w, " ") || g[5] != "1" || g[6] != "-" || g[7] != "0" || g[8] != "no" || g[9] != "-" {
					return false
				}
			}
			return true
		})
		if got["webhooks"][3] != "3" {
			t.Errorf("webhooks row %v: want 3 dead letters", got["webhooks"])
		}
		b.noErrors(t, "receivers page")
	})

	t.Run("workers match Workers", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/workers"))
		b.waitJS(t, "worker rows", `document.querySelectorAll('#workers tbody tr').length >= 2`)
		waitFor(t, "the page to show what Workers says", func() bool {
			got := rows(t, b, "workers")
			ws, err := lib.Workers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			served := 0
			for _, w := range ws {
				if len(w.Receivers) == 0 {
					continue
				}
				served++
				g := got[w.ID]
				want := []string{w.Host, fmt.Sprint(w.PID), fmt.Sprintf("%s (%d)", w.Receivers[0], w.Concurrency[w.Receivers[0]]),
					fmt.Sprint(w.InFlight), fmt.Sprint(w.Processed), fmt.Sprint(w.Failed)}
				if len(g) < 6 || strings.Join(g[:6], "|") != strings.Join(want, "|") {
					return false
				}
			}
			return served == 2
		})
		b.noErrors(t, "workers page")
	})

	t.Run("a receiver's name opens its page", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/"))
		b.waitJS(t, "the receivers' links", `document.querySelectorAll('#receivers tbody a').length == 2`)
		b.do(t, chromedp.Click(chromedp.CSS(`#receivers tr[data-name="upper"] a`)), chromedp.WaitVisible(chromedp.CSS("#groups-empty")))
		if h := eval[string](t, b, `document.querySelector('h1').textContent`); h != "Receiver upper" {
			t.Errorf("the receiver's page is headed %q", h)
		}
		b.do(t, chromedp.Click(chromedp.CSS("#dead-letters")), chromedp.WaitVisible(chromedp.CSS("#dl-total")))
		b.noErrors(t, "receiver's page")
	})

	t.Run("a record it cannot read is left out", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/"))
		b.waitJS(t, "both receivers", `document.querySelectorAll('#receivers tbody tr').length == 2`)
		key, ids := prefix+":{workers}:w:foreign", prefix+":{workers}:ids"
		redisCLI(t, "HSET", key, "info", `{"id":"foreign","receivers":["bad name"]}`, "seen", fmt.Sprint(time.Now().UnixMilli()))
		redisCLI(t, "ZADD", ids, fmt.Sprint(time.Now().Add(time.Hour).UnixMilli()), "foreign")
		defer func() {
			redisCLI(t, "DEL", key)
			redisCLI(t, "ZREM", ids, "foreign")
		}()
		// The page, loaded before, shows it as it refreshes, and the rest.
		b.waitJS(t, "the box that says what was left out", `!document.getElementById('skipped').hidden && document.querySelectorAll('#skipped-list li').length == 1 && document.querySelector('#skipped-list li').textContent.includes('"bad name"')`)
		if n := eval[int](t, b, `document.querySelectorAll('#receivers tbody tr').length`); n != 2 || !eval[bool](t, b, `document.getElementById('error').hidden`) {
			t.Errorf("with a record it cannot read, the page shows %d receivers, or an error", n)
		}
		b.noErrors(t, "a record left out")
	})

	t.Run("the live chart updates", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/"))
		b.waitJS(t, "the chart", `document.getElementById('chart-rate').dataset.points`)
		n0 := eval[string](t, b, `document.getElementById('chart-rate').dataset.points`)
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, _ = lib.Request(rctx, disker.Message{Receiver: "upper", Content: []byte("load")})
				cancel()
			}
		}()
		b.waitJS(t, "more points and a rate above 0", fmt.Sprintf(`+document.getElementById('chart-rate').dataset.points >= %s + 3 && document.getElementById('now-rate').textContent !== '0/s' && document.querySelector('#chart-rate polyline').getAttribute('points').split(' ').length >= 3`, n0))
		close(stop)
		<-done
		b.noErrors(t, "chart")
	})

	t.Run("content is shown as text", func(t *testing.T) {
		b.do(t, chromedp.Navigate(dash+"/receivers/webhooks/dead-letters"))
		shown := eval[[]string](t, b, `[...document.querySelectorAll('pre.content')].map(p => p.textContent)`)
		slices.Sort(shown) // the worker handles them in any order
		if len(shown) != 3 || !strings.Contains(shown[0], "00 01 fe ff") || shown[1] != "<script>alert(1)</script>" || shown[2] != contents[0] {
			t.Errorf("contents shown: %q", shown)
		}
		if n := eval[int](t, b, `document.querySelectorAll('main script').length`); n != 0 {
			t.Errorf("%d script elements in the page's content", n)
		}
		b.noErrors(t, "dead-letter page")
	})

	t.Run("read-only refuses actions", func(t *testing.T) {
		b.do(t, chromedp.Navigate(readOnly+"/receivers/webhooks/dead-letters"))
		if n := eval[int](t, b, `document.querySelectorAll('main a.button, main form').length`); n != 0 {
			t.Errorf("a read-only page offers %d actions", n)
		}
		b.noErrors(t, "read-only dead-letter page")
		answer := eval[string](t, b, `fetch('/receivers/webhooks/dead-letters/purge', {method: 'POST', body: new URLSearchParams({all: '1'})}).then(r => r.status + ' ' + r.statusText)`, chromedp.EvalAwaitPromise)
		if !strings.HasPrefix(answer, "403") {
			t.Errorf("a POST to a read-only dashboard: %s, want 403", answer)
		}
		b.do(t, chromedp.Navigate(readOnly+"/receivers/webhooks/dead-letters/purge?all=1"))
		if body := eval[string](t, b, `document.body.textContent`); !strings.Contains(body, "read-only") {
			t.Errorf("the confirmation page of a read-only dashboard says %q", body)
		}
		b.consume(t, "status of 403", 2)
		if n := deadLetters(t, lib, "webhooks"); n != 3 {
			t.Errorf("%d dead letters after refused actions, want 3", n)
		}
	})

	t.Run("a cross-site POST is refused", func(t *testing.T) {
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/" {
				w.WriteHeader(http.StatusNoContent) // its favicon
				return
			}
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<form method="post" action="%s/receivers/webhooks/dead-letters/purge"><input name="all" value="1"><input name="csrf" value="guess"><button id="go">win a prize</button></form>`, dash)
		}))
		defer evil.Close()
		b.do(t, chromedp.Navigate(dash+"/receivers/webhooks/dead-letters")) // the dashboard's cookie is set
		b.do(t, chromedp.Navigate(strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)), chromedp.Click(chromedp.CSS("#go")))
		b.waitJS(t, "the refusal", `location.href.includes('/purge') && document.body.textContent.includes('cross-origin request refused')`)
		b.consume(t, "status of 403", 1)
		if n := deadLetters(t, lib, "webhooks"); n != 3 {
			t.Errorf("%d dead letters after a cross-site POST, want 3", n)
		}
	})

	t.Run("retry and purge through the page", func(t *testing.T) {
		page := dash + "/receivers/webhooks/dead-letters"
		b.do(t, chromedp.Navigate(page))
		first := eval[string](t, b, `document.querySelector('article.dl').dataset.id`)
		b.do(t, chromedp.Click(chromedp.CSS(`article.dl[data-id="`+first+`"] .acts a:not(.danger)`)), chromedp.WaitVisible(chromedp.CSS("#confirm")))
		if n := deadLetters(t, lib, "webhooks"); n != 3 {
			t.Fatalf("the confirmation page changed something: %d dead letters", n)
		}
		b.do(t, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(".done")))
		if done := eval[string](t, b, `document.querySelector('.done').textContent`); !strings.HasPrefix(done, "Retried 1 ") {
			t.Errorf("after retry: %q", done)
		}
		// The worker fails it again: back in the dead letters, as a new entry.
		waitFor(t, "the retried message to be dead-lettered again", func() bool {
			dls, err := lib.DeadLetters(ctx, "webhooks", 10)
			return err == nil && len(dls) == 3 && dls[0].ID != first
		})
		b.do(t, chromedp.Navigate(page), chromedp.Click(chromedp.CSS(`article.dl .acts a.danger`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
			chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(".done")))
		if n := deadLetters(t, lib, "webhooks"); n != 2 {
			t.Errorf("after purging one: %d dead letters, want 2", n)
		}
		b.do(t, chromedp.Click(chromedp.CSS(`.bulk a.danger`)), chromedp.WaitVisible(chromedp.CSS("#confirm")),
			chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS(".done")))
		if done := eval[string](t, b, `document.querySelector('.done').textContent`); !strings.HasPrefix(done, "Purged 2 ") {
			t.Errorf("after purge all: %q", done)
		}
		if n := deadLetters(t, lib, "webhooks"); n != 0 {
			t.Errorf("after purging all: %d dead letters, want 0", n)
		}
		b.noErrors(t, "retry and purge")
	})

	t.Run("credentials are required", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "auth")
		if err := os.WriteFile(file, []byte("ops:s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		secured := dashboard(t, prefix, "--allow-actions", "--basic-auth-file", file)
		for _, c := range []struct {
			user, pass string
			want       int
		}{{"", "", 401}, {"ops", "wrong", 401}, {"ops", "s3cret", 200}} {
			req, _ := http.NewRequest(http.MethodGet, secured+"/", nil)
			if c.user != "" {
				req.SetBasicAuth(c.user, c.pass)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("GET with %q:%q: %d, want %d", c.user, c.pass, resp.StatusCode, c.want)
			}
		}
		cred := base64.StdEncoding.EncodeToString([]byte("ops:s3cret"))
		if _, err := chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{"Authorization": "Basic " + cred}}); err != nil {
			t.Fatal(err)
		}
		defer chromedp.Call(b.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: network.Headers{}})
		b.do(t, chromedp.Navigate(secured+"/"))
		b.waitJS(t, "the live rows with credentials", `document.querySelectorAll('#receivers tbody tr').length == 2 && document.getElementById('chart-rate').dataset.points`)
		b.noErrors(t, "receivers page with credentials")
	})
}

// redisCLI runs a command on the test's Redis with redis-cli.
func redisCLI(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("redis-cli", append([]string{"-u", redisURL}, args...)...).CombinedOutput(); err != nil || strings.HasPrefix(string(out), "(error)") || strings.HasPrefix(string(out), "ERR") {
		t.Fatalf("redis-cli %v: %v %s", args, err, out)
	}
}
