package dashboard

import (
	"context"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/diskerhq/disker"
)

// TestBatchesPages: the batches page lists the batches of the receivers
// the poll lists, the latest first, with their state and progress, and
// only those not completed when asked; a batch's page shows its counts and
// links its completion; a child's message page links its batch; the
// receiver's page lists its batches. Index entries that do not read as a
// batch are left out, said in the page once each and logged once.
func TestBatchesPages(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	f := newFixture(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	ctx := context.Background()
	done, err := f.dash.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "jobs", Content: []byte("all done")}})
	if err != nil {
		t.Fatal(err)
	}
	var firstChild string
	for i, c := range []string{"a", "fail b", "c"} {
		id, err := done.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte(c)})
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			firstChild = id
		}
	}
	if _, err := done.Seal(ctx); err != nil {
		t.Fatal(err)
	}
	open, err := f.dash.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "jobs"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := open.Send(ctx, disker.Message{Receiver: "nobody", Content: []byte("waits")}); err != nil {
		t.Fatal(err)
	}
	var info *disker.BatchInfo
	waitFor(t, "the first batch completed", func() bool {
		info, err = f.dash.Batch(ctx, done.ID())
		return err == nil && info.State == disker.BatchCompleted
	})
	// "fail b" fails with NoRetry: fire-and-forget, it is dead-lettered.
	if info.Succeeded != 2 || info.DeadLettered != 1 || info.Cancelled || !info.CompletionSent || info.CompletionID == "" {
		t.Fatalf("the first batch: %+v", info)
	}

	row := func(id, state, progress string) string {
		return `<tr data-id="` + id + `" data-state="` + state + `"><td class="id"><a href="/batch?id=` + tmplEscape(id) + `">` + id + `</a></td><td class="state">` + state + `</td><td>` +
			`<span class="progress" title="` + progress
	}
	waitFor(t, "the batches page lists jobs' batches", func() bool {
		_, _, page := f.get(t, "/batches")
		return strings.Contains(page, open.ID())
	})
	code, _, page := f.get(t, "/batches")
	i, j := strings.Index(page, row(open.ID(), "open", "0 of 1 children settled")), strings.Index(page, row(done.ID(), "completed", "3 of 3 children settled"))
	if code != http.StatusOK || i < 0 || j < i {
		t.Fatalf("GET /batches: %d; want the open batch, then the completed one, with their progress:\n%s", code, page)
	}
	if strings.Contains(page, `id="skipped-batches"`) {
		t.Errorf("GET /batches says it left something out:\n%s", page)
	}
	_, _, page = f.get(t, "/batches?open=1")
	if !strings.Contains(page, row(open.ID(), "open", "0 of 1")) || strings.Contains(page, `data-id="`+done.ID()) {
		t.Errorf("GET /batches?open=1: want only the open batch:\n%s", page)
	}
	if _, _, page = f.get(t, "/batches?receiver=nobody"); !strings.Contains(page, `id="batches-empty"`) {
		t.Errorf("GET /batches?receiver=nobody lists batches:\n%s", page)
	}

	code, _, page = f.get(t, "/batch?id="+url.QueryEscape(done.ID()))
	msg := `href="/message?receiver=jobs&amp;id=` + info.CompletionID + `"`
	counts := `<tbody><tr><td class="num">3</td><td class="num">3</td><td class="num">0</td><td class="num">2</td><td class="num">0</td><td class="num">1</td>`
	if code != http.StatusOK || !strings.Contains(page, `<span id="batch-state">completed</span>`) || !strings.Contains(page, msg) || !strings.Contains(page, counts) {
		t.Errorf("GET /batch?id=%s: %d; want completed, its counts and a link to its completion (%s):\n%s", done.ID(), code, msg, page)
	}
	if code, _, page = f.get(t, "/batch?id=jobs/none"); code != http.StatusNotFound || !strings.Contains(page, `id="batch-missing"`) {
		t.Errorf("GET /batch?id=jobs/none: %d, want 404 and a page that says so:\n%s", code, page)
	}
	if code, _, _ = f.get(t, "/batch?id=nobatch"); code != http.StatusBadRequest {
		t.Errorf("GET /batch?id=nobatch: %d, want 400", code)
	}
	_, _, page = f.get(t, "/message?receiver=jobs&id="+firstChild)
	if !strings.Contains(page, `<a id="result-batch" href="/batch?id=`+tmplEscape(done.ID())+`">`+done.ID()+`</a>`) {
		t.Errorf("the message page of a child does not link its batch:\n%s", page)
	}
	_, _, page = f.get(t, "/receivers/jobs")
	if !strings.Contains(page, row(open.ID(), "open", "0 of 1")) || !strings.Contains(page, row(done.ID(), "completed", "3 of 3")) {
		t.Errorf("the receiver's page does not list its batches:\n%s", page)
	}

	// Records that do not read as a batch: an index entry that is not a
	// batch id, and a batch key that is not a hash.
	redisDo(t, "ZADD", f.prefix+":{jobs}:bts", "9999999999999999", "not a batch id")
	redisDo(t, "ZADD", f.prefix+":{jobs}:bts", "9999999999999998", "jobs/broken")
	redisDo(t, "SET", f.prefix+":{jobs}:bt:broken", "not a hash")
	lines := []string{`the batch index of receiver jobs holds "not a batch id", not a batch id of its`, "batch jobs/broken is not a hash"}
	for _, path := range []string{"/batches", "/batches", "/receivers/jobs"} {
		_, _, page = f.get(t, path)
		for _, l := range lines {
			if n := strings.Count(page, strings.ReplaceAll(l, `"`, "&#34;")); n != 1 {
				t.Errorf("GET %s says %q %d times, want once:\n%s", path, l, n, page)
			}
		}
		if !strings.Contains(page, `data-id="`+done.ID()) || !strings.Contains(page, `data-id="`+open.ID()) {
			t.Errorf("GET %s no longer lists the batches that read:\n%s", path, page)
		}
	}
	for _, l := range lines {
		if n := logs.count(strings.ReplaceAll(l, `"`, `\"`)); n != 1 {
			t.Errorf("the log has %q %d times, want once:\n%s", l, n, logs.String())
		}
	}
}

// tmplEscape is id as html/template writes it in a URL's query.
func tmplEscape(id string) string { return strings.ReplaceAll(url.QueryEscape(id), "%2F", "%2f") }
