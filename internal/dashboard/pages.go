package dashboard

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/diskerhq/disker"
)

// column is a column of a live table: a receiver's or a worker's number.
// Adding a column to a page is adding a line to its list below; the page,
// its refresh and /api/snapshot follow.
type column[T any] struct {
	Title, Help string
	Cell        func(T, time.Time) string
}

// receiverColumns are the receivers page's columns after the name.
var receiverColumns = []column[Receiver]{
	{"Queued", "messages waiting for a worker", func(r Receiver, _ time.Time) string { return count(r.Queued) }},
	{"Pending", "delivered, not yet acknowledged: in flight, or waiting for a retry or a redelivery", func(r Receiver, _ time.Time) string { return count(r.Pending) }},
	{"In flight", "being handled by the live workers, at their last heartbeat", func(r Receiver, _ time.Time) string { return count(r.InFlight) }},
	{"Dead letters", "messages in the dead-letter stream", func(r Receiver, _ time.Time) string { return count(r.DeadLetters) }},
	{"Handled/s", "handled per second by its live workers, between their last two heartbeats", func(r Receiver, _ time.Time) string { return strconv.FormatFloat(r.Rate, 'f', 1, 64) }},
	{"Workers", "live workers serving it", func(r Receiver, _ time.Time) string { return strconv.Itoa(r.Workers) }},
	{"Oldest waiting", "time since the oldest message not yet delivered was queued", oldestCell},
	{"Deferred", "messages sent for later (WithDelay, WithDeliverAt), not due yet", func(r Receiver, _ time.Time) string { return count(r.Deferred) }},
	{"Paused", "yes while the receiver is paused (Pause, disker pause): its messages queue and no worker starts them", pausedCell},
	{"Groups", "keyed messages (WithGroup) waiting behind their key, and in how many keys; - when none", func(r Receiver, _ time.Time) string { return GroupsText(r.ReceiverStats) }},
}

// GroupsText sums up s's keyed messages (WithGroup) waiting behind their
// key: "120 (7 keys)", "3 (1 key)", or "-" when none waits. The receivers
// page and "disker stats" show it.
func GroupsText(s disker.ReceiverStats) string {
	switch {
	case s.GroupWaiting == 0:
		return "-"
	case s.GroupKeys == 1:
		return fmt.Sprintf("%d (1 key)", s.GroupWaiting)
	}
	return fmt.Sprintf("%d (%d keys)", s.GroupWaiting, s.GroupKeys)
}

func pausedCell(r Receiver, _ time.Time) string {
	if r.Paused {
		return "yes"
	}
	return "no"
}

func oldestCell(r Receiver, now time.Time) string {
	if r.OldestQueued.IsZero() {
		return "-"
	}
	return ago(now.Sub(r.OldestQueued))
}

// workerColumns are the workers page's columns after the id.
var workerColumns = []column[disker.WorkerInfo]{
	{"Host", "", func(w disker.WorkerInfo, _ time.Time) string { return w.Host }},
	{"PID", "", func(w disker.WorkerInfo, _ time.Time) string { return strconv.Itoa(w.PID) }},
	{"Receivers", "receiver (concurrency)", receiversCell},
	{"In flight", "messages being handled at its last heartbeat", func(w disker.WorkerInfo, _ time.Time) string { return count(w.InFlight) }},
	{"Processed", "handled successfully", func(w disker.WorkerInfo, _ time.Time) string { return count(w.Processed) }},
	{"Failed", "handler calls that failed", func(w disker.WorkerInfo, _ time.Time) string { return count(w.Failed) }},
	{"Last seen", "time since its last heartbeat", func(w disker.WorkerInfo, now time.Time) string { return ago(now.Sub(w.LastSeen)) }},
	{"Up", "time since it started", func(w disker.WorkerInfo, _ time.Time) string { return ago(w.LastSeen.Sub(w.StartedAt)) }},
}

func receiversCell(w disker.WorkerInfo, _ time.Time) string {
	parts := make([]string, len(w.Receivers))
	for i, r := range w.Receivers {
		parts[i] = fmt.Sprintf("%s (%d)", r, w.Concurrency[r])
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func count(n int64) string { return strconv.FormatInt(n, 10) }

// ago shows a duration rounded to the second, never negative (clocks of
// machines differ a little).
func ago(d time.Duration) string {
	return max(d, 0).Round(time.Second).String()
}

// row is a table row as the pages and /api/snapshot give it.
type row struct {
	Name  string   `json:"name"`
	Cells []string `json:"cells"`
}

func rows[T any](items []T, name func(T) string, cols []column[T], now time.Time) []row {
	out := make([]row, len(items))
	for i, it := range items {
		cells := make([]string, len(cols))
		for j, c := range cols {
			cells[j] = c.Cell(it, now)
		}
		out[i] = row{Name: name(it), Cells: cells}
	}
	return out
}

// apiSnapshot is the answer of /api/snapshot.
type apiSnapshot struct {
	At        int64    `json:"t"`
	Error     string   `json:"error,omitempty"`
	Skipped   []string `json:"skipped,omitempty"`
	Receivers []row    `json:"receivers"`
	Workers   []row    `json:"workers"`
	History   []Point  `json:"history"`
}

func (d *Dashboard) snapshotAPI(w http.ResponseWriter, r *http.Request) {
	snap, hist := d.poll.current(r.Context())
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(apiSnapshot{
		At:        snap.At.UnixMilli(),
		Error:     snap.Err,
		Skipped:   snap.Skipped,
		Receivers: rows(snap.Receivers, func(r Receiver) string { return r.Receiver }, receiverColumns, snap.At),
		Workers:   rows(snap.Workers, func(w disker.WorkerInfo) string { return w.ID }, workerColumns, snap.At),
		History:   hist,
	})
}

// page is what every template gets.
type page struct {
	Base     string
	Title    string
	Nav      string
	Interval int64 // ms
	Window   int64 // ms
	Actions  bool
	Auth     bool
	Error    string
	Skipped  []string // what the poll left out (Snapshot.Skipped)
	Data     any
}

func (d *Dashboard) page(title, nav string, data any) page {
	return page{Base: d.cfg.Base, Title: title, Nav: nav, Interval: d.cfg.Interval.Milliseconds(),
		Window:  d.cfg.Window.Milliseconds(),
		Actions: d.cfg.AllowActions, Auth: d.cfg.Auth.Enabled(), Data: data}
}

func (d *Dashboard) render(w http.ResponseWriter, status int, name string, p page) {
	var b strings.Builder
	if err := d.tmpl[name].ExecuteTemplate(&b, "layout", p); err != nil {
		d.cfg.Logger.Error("dashboard: render", "page", name, "err", err)
		http.Error(w, "dashboard: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

type liveTable struct {
	Heads []string
	Helps []string
	Rows  []row
}

func table[T any](cols []column[T], items []T, name func(T) string, now time.Time) liveTable {
	t := liveTable{Rows: rows(items, name, cols, now)}
	for _, c := range cols {
		t.Heads = append(t.Heads, c.Title)
		t.Helps = append(t.Helps, c.Help)
	}
	return t
}

func (d *Dashboard) receiversPage(w http.ResponseWriter, r *http.Request) {
	snap, _ := d.poll.current(r.Context())
	p := d.page("Receivers", "receivers", table(receiverColumns, snap.Receivers, func(r Receiver) string { return r.Receiver }, snap.At))
	p.Error, p.Skipped = snap.Err, snap.Skipped
	d.render(w, http.StatusOK, "receivers", p)
}

func (d *Dashboard) workersPage(w http.ResponseWriter, r *http.Request) {
	snap, _ := d.poll.current(r.Context())
	p := d.page("Workers", "workers", table(workerColumns, snap.Workers, func(w disker.WorkerInfo) string { return w.ID }, snap.At))
	p.Error, p.Skipped = snap.Err, snap.Skipped
	d.render(w, http.StatusOK, "workers", p)
}

// Paging of the dead-letter page.
const (
	defaultPageSize = 20
	maxPageSize     = 200
	// contentShown is how much of a text content a dead letter shows;
	// binary content shows hexShown bytes as a hex dump.
	contentShown = 4096
	hexShown     = 512
)

// deadLetter is a dead letter as the page shows it.
type deadLetter struct {
	ID, MessageID, Sender string
	Headers               [][2]string
	Attempts              int
	At                    string
	Reason                string
	Undecodable           bool
	Content               content
}

// content is a message's content made safe to show: text or a hex dump, cut
// to a size; the template escapes it like any text.
type content struct {
	Size   int
	Text   string
	Hex    string
	Hidden int // bytes not shown
}

func showContent(b []byte) content {
	c := content{Size: len(b)}
	if printable(b) {
		n := min(len(b), contentShown)
		for n > 0 && n < len(b) && !utf8.RuneStart(b[n]) {
			n--
		}
		c.Text, c.Hidden = string(b[:n]), len(b)-n
		return c
	}
	n := min(len(b), hexShown)
	c.Hex, c.Hidden = hex.Dump(b[:n]), len(b)-n
	return c
}

// printable reports whether b is UTF-8 text without control characters
// other than tab and line breaks.
func printable(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t' {
			return false
		}
	}
	return true
}

type deadLettersData struct {
	Receiver    string
	Total       int64
	Letters     []deadLetter
	Page, Size  int
	From, To    int
	First, Next string
	Done        string
	CSRF        string
}

func (d *Dashboard) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	// A page starts after the last dead letter of the one before (after),
	// so no page reads those before it; from only numbers what it shows.
	after, from, size := q.Get("after"), atoiOr(q.Get("from"), 1), atoiOr(q.Get("size"), defaultPageSize)
	if from < 1 || size < 1 || size > maxPageSize {
		http.Error(w, fmt.Sprintf("dashboard: from must be >= 1 and size 1..%d", maxPageSize), http.StatusBadRequest)
		return
	}
	data := deadLettersData{Receiver: name, Page: (from-1)/size + 1, Size: size}
	st, err := d.cfg.Disker.Stats(r.Context(), name)
	if err != nil {
		d.fail(w, err)
		return
	}
	data.Total = st.DeadLetters
	dls, err := d.cfg.Disker.DeadLettersAfter(r.Context(), name, after, size+1)
	if err != nil {
		d.fail(w, err)
		return
	}
	more := len(dls) > size
	dls = dls[:min(size, len(dls))]
	for _, dl := range dls {
		data.Letters = append(data.Letters, viewDeadLetter(dl))
	}
	data.From, data.To = from, from+len(dls)-1
	if more {
		data.Next = pageURL(dls[len(dls)-1].ID, data.To+1, size)
	}
	if after != "" {
		data.First = pageURL("", 1, size)
	}
	if n := q.Get("n"); n != "" {
		switch q.Get("done") {
		case "retry":
			data.Done = "Retried " + strconv.Itoa(atoiOr(n, 0)) + " dead letter(s): they are back in the queue."
		case "purge":
			data.Done = "Purged " + strconv.Itoa(atoiOr(n, 0)) + " dead letter(s)."
		}
	}
	data.CSRF = d.csrfToken(w, r)
	d.render(w, http.StatusOK, "deadletters", d.page("Dead letters of "+name, "receivers", data))
}

func viewDeadLetter(dl disker.DeadLetter) deadLetter {
	v := deadLetter{
		ID: dl.ID, MessageID: dl.Message.ID, Sender: dl.Message.Sender, Attempts: dl.Attempts,
		At: dl.At.UTC().Format("2006-01-02 15:04:05 UTC"), Reason: dl.Reason,
	}
	for _, k := range slices.Sorted(maps.Keys(dl.Message.Headers)) {
		v.Headers = append(v.Headers, [2]string{k, dl.Message.Headers[k]})
	}
	body := dl.Message.Content
	if dl.Message.ID == "" {
		v.Undecodable, body = true, dl.Raw
	}
	v.Content = showContent(body)
	return v
}

// pageURL is the query of the dead-letter page that starts after the dead
// letter after, numbered from from.
func pageURL(after string, from, size int) string {
	v := url.Values{}
	if after != "" {
		v.Set("after", after)
		v.Set("from", strconv.Itoa(from))
	}
	if size != defaultPageSize {
		v.Set("size", strconv.Itoa(size))
	}
	return "?" + v.Encode()
}

func atoiOr(s string, def int) int {
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// fail answers an error of the broker or of the request.
func (d *Dashboard) fail(w http.ResponseWriter, err error) {
	var ve *disker.ValidationError
	if errors.As(err, &ve) {
		http.Error(w, "dashboard: "+strings.TrimPrefix(err.Error(), "disker: "), http.StatusBadRequest)
		return
	}
	d.cfg.Logger.Warn("dashboard: broker error", "err", err)
	http.Error(w, "dashboard: "+strings.TrimPrefix(err.Error(), "disker: "), http.StatusBadGateway)
}

// action is a mutating action on dead letters.
type action struct {
	Verb  string // "retry" or "purge"
	Title string
	Desc  string
}

var actions = map[string]action{
	"retry": {"retry", "Retry", "back to the queue, with their attempts reset"},
	"purge": {"purge", "Purge", "deleted for good"},
}

type confirmData struct {
	Receiver string
	Action   action
	IDs      []string
	All      bool
	Count    int64
	CSRF     string
}

// target reads what an action applies to: ids, or all.
func target(v url.Values) (ids []string, all bool, err error) {
	ids, all = v["id"], v.Get("all") == "1"
	if all == (len(ids) > 0) {
		return nil, false, errors.New("dashboard: give dead-letter ids (id=...) or all=1, not both and not neither")
	}
	return ids, all, nil
}

// action returns the request's action, or answers 404 for an unknown one
// and 403 when actions are not allowed.
func (d *Dashboard) action(w http.ResponseWriter, r *http.Request) (action, bool) {
	a, ok := actions[r.PathValue("action")]
	if !ok {
		http.NotFound(w, r)
		return a, false
	}
	if !d.cfg.AllowActions {
		http.Error(w, "dashboard: read-only: start the dashboard with --allow-actions to retry or purge", http.StatusForbidden)
		return a, false
	}
	return a, true
}

func (d *Dashboard) confirmPage(w http.ResponseWriter, r *http.Request) {
	a, ok := d.action(w, r)
	if !ok {
		return
	}
	ids, all, err := target(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := r.PathValue("name")
	data := confirmData{Receiver: name, Action: a, IDs: ids, All: all, Count: int64(len(ids))}
	if all {
		st, err := d.cfg.Disker.Stats(r.Context(), name)
		if err != nil {
			d.fail(w, err)
			return
		}
		data.Count = st.DeadLetters
	}
	data.CSRF = d.csrfToken(w, r)
	d.render(w, http.StatusOK, "confirm", d.page(a.Title+" dead letters of "+name, "receivers", data))
}

func (d *Dashboard) act(w http.ResponseWriter, r *http.Request) {
	a, ok := d.action(w, r)
	if !ok {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "dashboard: bad form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if !d.csrfValid(r) {
		http.Error(w, "dashboard: missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	ids, _, err := target(r.PostForm)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	name := r.PathValue("name")
	change := d.cfg.Disker.RetryDeadLetters
	if a.Verb == "purge" {
		change = d.cfg.Disker.PurgeDeadLetters
	}
	n, err := change(r.Context(), name, ids...)
	if err != nil {
		d.fail(w, err)
		return
	}
	d.cfg.Logger.Info("dashboard: dead letters changed", "action", a.Verb, "receiver", name, "count", n, "remote", r.RemoteAddr)
	dest := d.cfg.Base + "/receivers/" + url.PathEscape(name) + "/dead-letters?" + url.Values{"done": {a.Verb}, "n": {strconv.Itoa(n)}}.Encode()
	http.Redirect(w, r, dest, http.StatusSeeOther)
}

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"path": url.PathEscape,
		"batchTable": func(base string, bs []batchLine) any {
			return struct {
				Base    string
				Batches []batchLine
			}{base, bs}
		},
		"openScanned": func() int { return openScan },
		"indexCap":    func() int { return disker.BatchIndexCap },
	}
	out := map[string]*template.Template{}
	for _, name := range []string{"receivers", "receiver", "workers", "deadletters", "confirm", "message", "batches", "batch"} {
		t, err := template.New(name).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("dashboard: templates: %w", err)
		}
		out[name] = t
	}
	return out, nil
}
