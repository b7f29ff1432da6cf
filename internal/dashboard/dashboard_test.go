package dashboard

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

var redisURL string

func TestMain(m *testing.M) {
	srv, stop := redistest.MustStart()
	redisURL = srv.URL()
	code := m.Run()
	stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

var quiet = slog.New(slog.DiscardHandler)

// instance opens a Disker instance on the test's own key prefix.
func instance(t *testing.T, prefix string) *disker.Disker {
	t.Helper()
	d, err := disker.New(context.Background(), disker.Config{RedisURL: redisURL, KeyPrefix: prefix, Logger: quiet, HeartbeatInterval: 200 * time.Millisecond})
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

// fixture is a worker serving "jobs" one message at a time (content
// "fail..." is dead-lettered at once), a dashboard on its own Disker instance, and an HTTP client with a
// cookie jar, all on one key prefix.
type fixture struct {
	worker, dash *disker.Disker
	prefix       string // of the keys
	srv          *httptest.Server
	client       *http.Client
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	prefix := redistest.Prefix(t)
	f := &fixture{worker: instance(t, prefix), dash: instance(t, prefix), prefix: prefix}
	err := f.worker.Handle("jobs", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		if strings.HasPrefix(string(m.Content), "fail") || strings.HasPrefix(string(m.Content), "<script>") {
			return nil, disker.NoRetry(errors.New("refused: " + string(m.Content)))
		}
		return m.Content, nil
	}), disker.WithConcurrency(1)) // one at a time: dead letters in the order sent (TestDeadLettersPaging)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Disker, cfg.Interval = f.dash, 100*time.Millisecond
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	dash, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(dash.Close)
	f.srv = httptest.NewServer(dash)
	t.Cleanup(f.srv.Close)
	jar, _ := cookiejar.New(nil)
	f.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return f
}

func (f *fixture) do(t *testing.T, req *http.Request) (int, http.Header, string) {
	t.Helper()
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func (f *fixture) get(t *testing.T, path string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	return f.do(t, req)
}

func (f *fixture) post(t *testing.T, path string, form url.Values, header http.Header) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for k, v := range header {
		req.Header[k] = v
	}
	return f.do(t, req)
}

// deadLetter sends contents that the worker dead-letters, and waits until
// they are all in the dead-letter stream.
func (f *fixture) deadLetter(t *testing.T, contents ...string) {
	t.Helper()
	ctx := context.Background()
	before, err := f.dash.Stats(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range contents {
		if _, err := f.dash.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte(c), Headers: map[string]string{"kind": "test"}}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "dead letters", func() bool {
		st, err := f.dash.Stats(ctx, "jobs")
		return err == nil && st.DeadLetters == before.DeadLetters+int64(len(contents))
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var nextLink = regexp.MustCompile(`<a href="(\?[^"]*)">older →</a>`)

var csrfField = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

func TestSnapshotMatchesStatsAndWorkers(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	for range 5 {
		if _, err := f.dash.Request(ctx, disker.Message{Receiver: "jobs", Content: []byte("ok")}); err != nil {
			t.Fatal(err)
		}
	}
	f.deadLetter(t, "fail 1", "fail 2")
	var snap apiSnapshot
	waitFor(t, "the snapshot to show the dead letters and the worker's count", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatal(err)
		}
		return len(snap.Receivers) == 1 && snap.Receivers[0].Cells[3] == "2" &&
			len(snap.Workers) == 1 && snap.Workers[0].Cells[4] == "5"
	})
	st, err := f.dash.Stats(ctx, "jobs")
	if err != nil {
		t.Fatal(err)
	}
	ws, err := f.dash.Workers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := snap.Receivers[0]
	want := []string{fmt.Sprint(st.Queued), fmt.Sprint(st.Pending), "0", fmt.Sprint(st.DeadLetters)}
	if r.Name != "jobs" || strings.Join(r.Cells[:4], " ") != strings.Join(want, " ") || r.Cells[5] != "1" {
		t.Errorf("receiver row %+v, want jobs %v with 1 worker", r, want)
	}
	var w disker.WorkerInfo
	for _, x := range ws {
		if x.ID == f.worker.ID() {
			w = x
		}
	}
	if got := snap.Workers[0]; got.Name != w.ID || got.Cells[0] != w.Host || got.Cells[1] != fmt.Sprint(w.PID) ||
		got.Cells[2] != "jobs (1)" || got.Cells[5] != fmt.Sprint(w.Failed) {
		t.Errorf("worker row %+v, want %+v", got, w)
	}
	if len(snap.History) == 0 || snap.History[len(snap.History)-1].DeadLetters != 2 {
		t.Errorf("history %+v: want a last point with 2 dead letters", snap.History)
	}
	for _, path := range []string{"/", "/workers"} {
		code, h, body := f.get(t, path)
		if code != http.StatusOK || !strings.Contains(body, "jobs") {
			t.Errorf("GET %s: %d, want 200 with the receiver", path, code)
		}
		if csp := h.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: CSP %q", path, csp)
		}
	}

	// A message sent for later, and the receiver paused.
	if r.Cells[7] != "0" || r.Cells[8] != "no" {
		t.Errorf("receiver row %+v: want 0 scheduled, not paused", r)
	}
	if _, err := f.dash.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte("later")}, disker.WithDelay(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := f.dash.Pause(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the snapshot to show the scheduled message and the pause", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatal(err)
		}
		return len(snap.Receivers) == 1 && snap.Receivers[0].Cells[7] == "1" && snap.Receivers[0].Cells[8] == "yes"
	})
	if err := f.dash.Resume(ctx, "jobs"); err != nil {
		t.Fatal(err)
	}
}

func TestDeadLettersPageShowsContentAsText(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.deadLetter(t, "<script>alert(1)</script>", "fail \x00\x01\x02 binary")
	code, _, body := f.get(t, "/receivers/jobs/dead-letters")
	if code != http.StatusOK {
		t.Fatalf("GET: %d %s", code, body)
	}
	if strings.Contains(body, "<script>alert") {
		t.Error("the content is in the page as HTML")
	}
	if !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Error("the content is not in the page as text")
	}
	if !strings.Contains(body, "66 61 69 6c 20 00 01 02") {
		t.Error("binary content is not shown as hex")
	}
	if !strings.Contains(body, "kind") || !strings.Contains(body, "refused: fail") {
		t.Error("headers or reason missing")
	}
	if strings.Contains(body, "Retry all") {
		t.Error("a read-only dashboard offers actions")
	}
}

func TestDeadLettersPaging(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	var contents []string
	for i := range 25 {
		contents = append(contents, fmt.Sprintf("fail %02d", i))
	}
	f.deadLetter(t, contents...)
	// Each page links to the next by the last dead letter it shows.
	pages := []string{}
	for path := "/receivers/jobs/dead-letters?size=10"; path != ""; {
		_, _, body := f.get(t, path)
		pages = append(pages, body)
		path = ""
		if m := nextLink.FindStringSubmatch(body); m != nil {
			path = "/receivers/jobs/dead-letters" + html.UnescapeString(m[1])
		}
		if len(pages) > 5 {
			t.Fatal("more than 5 pages of 10 for 25 dead letters")
		}
	}
	if len(pages) != 3 {
		t.Fatalf("%d pages of 10 for 25 dead letters, want 3", len(pages))
	}
	first, last := pages[0], pages[2]
	if !strings.Contains(first, "fail 00") || strings.Contains(first, "fail 10") || strings.Contains(first, "first page") {
		t.Error("page 1 does not hold the 10 oldest")
	}
	if !strings.Contains(pages[1], "fail 10") || !strings.Contains(pages[1], "fail 19") || strings.Contains(pages[1], "fail 09") ||
		!strings.Contains(pages[1], "showing 11–20") || !strings.Contains(pages[1], "first page") {
		t.Error("page 2 does not hold dead letters 11 to 20 with a link to the first page")
	}
	if !strings.Contains(last, "fail 24") || strings.Contains(last, "fail 19") || strings.Contains(last, "older →") {
		t.Error("page 3 does not hold the last 5 without a next link")
	}
	if code, _, _ := f.get(t, "/receivers/jobs/dead-letters?from=0"); code != http.StatusBadRequest {
		t.Errorf("from 0: %d, want 400", code)
	}
	if code, _, _ := f.get(t, "/receivers/jobs/dead-letters?after=nonsense"); code != http.StatusBadRequest {
		t.Errorf("after=nonsense: %d, want 400", code)
	}
	if code, _, _ := f.get(t, "/receivers/_bad/dead-letters"); code != http.StatusBadRequest {
		t.Errorf("a bad name: %d, want 400", code)
	}
}

func TestRetryAndPurge(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{AllowActions: true})
	ctx := context.Background()
	f.deadLetter(t, "fail a", "fail b", "fail c")
	dls, err := f.dash.DeadLetters(ctx, "jobs", 10)
	if err != nil {
		t.Fatal(err)
	}
	path := "/receivers/jobs/dead-letters/purge"
	code, _, page := f.get(t, path+"?id="+dls[0].ID)
	m := csrfField.FindStringSubmatch(page)
	if code != http.StatusOK || m == nil {
		t.Fatalf("confirm page: %d, token %v", code, m)
	}
	token := m[1]
	// Without the token, with a wrong one, or from another site: refused.
	for _, c := range []struct {
		name   string
		form   url.Values
		header http.Header
	}{
		{"no token", url.Values{"id": {dls[0].ID}}, nil},
		{"wrong token", url.Values{"id": {dls[0].ID}, "csrf": {strings.Repeat("0", 64)}}, nil},
		{"cross-site", url.Values{"id": {dls[0].ID}, "csrf": {token}}, http.Header{"Sec-Fetch-Site": {"cross-site"}, "Origin": {"https://evil.example"}}},
	} {
		if code, _, _ := f.post(t, path, c.form, c.header); code != http.StatusForbidden {
			t.Errorf("%s: %d, want 403", c.name, code)
		}
	}
	code, h, _ := f.post(t, path, url.Values{"id": {dls[0].ID}, "csrf": {token}}, nil)
	if code != http.StatusSeeOther || !strings.Contains(h.Get("Location"), "done=purge&n=1") {
		t.Fatalf("purge one: %d to %q", code, h.Get("Location"))
	}
	code, h, _ = f.post(t, "/receivers/jobs/dead-letters/retry", url.Values{"all": {"1"}, "csrf": {token}}, nil)
	if code != http.StatusSeeOther || !strings.Contains(h.Get("Location"), "done=retry&n=2") {
		t.Fatalf("retry all: %d to %q", code, h.Get("Location"))
	}
	// The worker dead-letters them again.
	waitFor(t, "the retried messages to fail again", func() bool {
		st, err := f.dash.Stats(ctx, "jobs")
		return err == nil && st.DeadLetters == 2 && st.Length == 0
	})
	if code, _, _ := f.post(t, path, url.Values{"csrf": {token}}, nil); code != http.StatusBadRequest {
		t.Errorf("no ids and no all: %d, want 400", code)
	}
	_, _, page = f.get(t, "/receivers/jobs/dead-letters/purge?all=1")
	if !strings.Contains(page, "All 2 dead letter(s)") {
		t.Error("the purge-all confirmation does not say how many")
	}
	code, _, _ = f.post(t, path, url.Values{"all": {"1"}, "csrf": {token}}, nil)
	st, err := f.dash.Stats(ctx, "jobs")
	if code != http.StatusSeeOther || err != nil || st.DeadLetters != 0 {
		t.Errorf("purge all: %d, %d dead letters left (%v)", code, st.DeadLetters, err)
	}
}

func TestReadOnlyRefusesActions(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	f.deadLetter(t, "fail")
	if code, _, _ := f.get(t, "/receivers/jobs/dead-letters/retry?all=1"); code != http.StatusForbidden {
		t.Errorf("confirm page: %d, want 403", code)
	}
	if code, _, _ := f.post(t, "/receivers/jobs/dead-letters/purge", url.Values{"all": {"1"}}, nil); code != http.StatusForbidden {
		t.Errorf("purge: %d, want 403", code)
	}
	if st, err := f.dash.Stats(context.Background(), "jobs"); err != nil || st.DeadLetters != 1 {
		t.Errorf("dead letters %d (%v), want 1", st.DeadLetters, err)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{Auth: Auth{User: "ops", Password: "pw", Token: "tok"}})
	for _, c := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, http.StatusUnauthorized},
		{"wrong password", func(r *http.Request) { r.SetBasicAuth("ops", "nope") }, http.StatusUnauthorized},
		{"wrong user", func(r *http.Request) { r.SetBasicAuth("root", "pw") }, http.StatusUnauthorized},
		{"basic", func(r *http.Request) { r.SetBasicAuth("ops", "pw") }, http.StatusOK},
		{"token as password", func(r *http.Request) { r.SetBasicAuth("anyone", "tok") }, http.StatusOK},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer tok") }, http.StatusOK},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer pw") }, http.StatusUnauthorized},
	} {
		for _, path := range []string{"/", "/api/snapshot", "/assets/app.js"} {
			req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
			c.set(req)
			code, h, _ := f.do(t, req)
			if code != c.want {
				t.Errorf("%s %s: %d, want %d", c.name, path, code, c.want)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Basic ") {
				t.Errorf("%s: 401 without a Basic challenge", c.name)
			}
		}
	}
}

func TestNewChecksConfig(t *testing.T) {
	t.Parallel()
	d := instance(t, redistest.Prefix(t))
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "Config.Disker"},
		{Config{Disker: d, Interval: time.Millisecond}, "Config.Interval"},
		{Config{Disker: d, Window: time.Second, Interval: 2 * time.Second}, "Config.Window"},
		{Config{Disker: d, Base: "dash/"}, "Config.Base"},
		{Config{Disker: d, AllowActions: true, Addr: ":8090"}, "needs Config.Auth"},
		{Config{Disker: d, AllowActions: true, Addr: "10.0.0.1:8090"}, "needs Config.Auth"},
	} {
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want an error about %s", c.cfg, err, c.want)
		}
	}
	for _, cfg := range []Config{
		{Disker: d, AllowActions: true, Addr: "127.0.0.1:8090"},
		{Disker: d, AllowActions: true, Addr: ":8090", Auth: Auth{Token: "t"}},
	} {
		dash, err := New(cfg)
		if err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
			continue
		}
		dash.Close()
		dash.Close()
	}
}

func TestLoopback(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"": true, "127.0.0.1:8090": true, "localhost:1": true, "[::1]:8090": true, "127.1.2.3:80": true,
		":8090": false, "0.0.0.0:8090": false, "[::]:8090": false, "10.0.0.1:80": false, "example.com:80": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}

func TestShowContent(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("é", contentShown) // 2 bytes each
	for _, c := range []struct {
		in            string
		text, hex     bool
		shown, hidden int
	}{
		{"hello\n\tworld", true, false, 12, 0},
		{long, true, false, contentShown, len(long) - contentShown},
		{"\xff\xfe", false, true, 2, 0},
		{"bell\a", false, true, 5, 0},
		{strings.Repeat("\x00", hexShown+10), false, true, hexShown, 10},
	} {
		got := showContent([]byte(c.in))
		if (got.Text != "") != c.text || (got.Hex != "") != c.hex || got.Hidden != c.hidden || got.Size != len(c.in) {
			t.Errorf("showContent(%.20q) = text %d bytes, hex %v, hidden %d", c.in, len(got.Text), got.Hex != "", got.Hidden)
		}
		if c.text && len(got.Text) != c.shown {
			t.Errorf("showContent(%.20q) shows %d bytes, want %d", c.in, len(got.Text), c.shown)
		}
	}
}

func TestParseBasic(t *testing.T) {
	t.Parallel()
	if a, err := ParseBasic("ops:p:w\n"); err != nil || a.User != "ops" || a.Password != "p:w" {
		t.Errorf("ParseBasic: %+v, %v", a, err)
	}
	for _, bad := range []string{"", "ops", ":pw", "ops:"} {
		if _, err := ParseBasic(bad); err == nil {
			t.Errorf("ParseBasic(%q): no error", bad)
		}
	}
}

func TestNextBeat(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	w := disker.WorkerInfo{StartedAt: t0, LastSeen: t0.Add(10 * time.Second), Processed: 50}
	b := nextBeat(beat{}, false, w)
	if b.rate != 5 {
		t.Errorf("a new worker: rate %v, want 5 (50 in 10s)", b.rate)
	}
	// Polls between heartbeats keep the rate.
	if again := nextBeat(b, true, w); again.rate != 5 {
		t.Errorf("no heartbeat since: rate %v, want 5", again.rate)
	}
	w.LastSeen, w.Processed = w.LastSeen.Add(2*time.Second), 70
	if b = nextBeat(b, true, w); b.rate != 10 {
		t.Errorf("20 in 2s: rate %v, want 10", b.rate)
	}
	w.LastSeen, w.Processed = w.LastSeen.Add(2*time.Second), 70
	if b = nextBeat(b, true, w); b.rate != 0 {
		t.Errorf("none in 2s: rate %v, want 0", b.rate)
	}
}
