package dashboard

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/diskerhq/disker"
)

// Listing of batches.
const (
	// batchesShown is how many batches the batches page lists.
	batchesShown = 50
	// openScan is how many of the latest batches the batches page reads
	// to find batchesShown that are not completed (?open=1).
	openScan = 500
	// receiverBatches is how many batches a receiver's page lists.
	receiverBatches = 10
)

// batchLine is a batch as the pages show it.
type batchLine struct {
	*disker.BatchInfo
	Receiver string // of the completion
	State    string // open, sealed, completed, with "cancelled"
	Waiting  int    // children not settled
	Percent  int    // settled, of the children: 0..100
	Bar      []barPart
	Outcomes string // the non-zero counts of the settled, in words
	Created  string
	Done     string // when it completed, "" until then
}

// barPart is a segment of a batch's progress bar: its class, its start
// and its width in percent of the bar, and what it counts.
type barPart struct {
	Class    string
	X, W     float64
	Count    int
	Outcomes string
}

// viewBatch is b as the pages show it.
func viewBatch(b *disker.BatchInfo) batchLine {
	recv, _, _ := strings.Cut(b.ID, "/") // the receiver of its completion
	l := batchLine{BatchInfo: b, Receiver: recv, State: b.State.String(), Waiting: b.Children - b.Settled,
		Created: timeText(b.Created), Done: timeText(b.Completed)}
	if b.Cancelled {
		l.State += ", cancelled"
	}
	switch {
	case b.Children > 0:
		l.Percent = b.Settled * 100 / b.Children
	case b.State == disker.BatchCompleted:
		l.Percent = 100
	}
	var outs []string
	for _, o := range []struct {
		n    int
		word string
	}{{b.Succeeded, "succeeded"}, {b.Failed, "failed"}, {b.DeadLettered, "dead-lettered"}, {b.TimedOut, "timed out"},
		{b.Cancels, "cancelled"}, {b.Expired, "expired"}} {
		if o.n > 0 {
			outs = append(outs, strconv.Itoa(o.n)+" "+o.word)
		}
	}
	l.Outcomes = strings.Join(outs, ", ")
	if l.Outcomes == "" {
		l.Outcomes = "-"
	}
	x := 0.0
	for _, p := range []barPart{
		{Class: "ok", Count: b.Succeeded, Outcomes: "succeeded"},
		{Class: "bad", Count: b.Failed + b.DeadLettered + b.TimedOut, Outcomes: "failed, dead-lettered or timed out"},
		{Class: "gone", Count: b.Cancels + b.Expired, Outcomes: "cancelled or expired"},
	} {
		if p.Count == 0 || b.Children == 0 {
			continue
		}
		p.X, p.W = x, float64(p.Count)*100/float64(b.Children)
		x += p.W
		l.Bar = append(l.Bar, p)
	}
	return l
}

// batchesData is the batches page's.
type batchesData struct {
	Receiver  string   // the receiver asked for, "" for all
	Receivers []string // those read
	Open      bool     // only the batches not completed
	Batches   []batchLine
	Shown     int
	// Unreadable are the batch records left out of Batches.
	Unreadable []string
}

// batchesPage lists the latest batches (/batches): of every receiver the
// poll lists, or of ?receiver=R; with ?open=1 only those not completed.
func (d *Dashboard) batchesPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	snap, _ := d.poll.current(r.Context())
	data := batchesData{Receiver: q.Get("receiver"), Open: q.Get("open") == "1", Shown: batchesShown}
	if data.Receiver != "" {
		data.Receivers = []string{data.Receiver}
	} else {
		for _, rc := range snap.Receivers {
			data.Receivers = append(data.Receivers, rc.Receiver)
		}
	}
	p := d.page("Batches", "batches", &data)
	p.Error = snap.Err
	if len(data.Receivers) > 0 {
		n := batchesShown
		if data.Open {
			n = openScan
		}
		l, err := d.cfg.Disker.ListBatches(r.Context(), data.Receivers, n)
		if err != nil {
			d.fail(w, err)
			return
		}
		for _, b := range l.Batches {
			if len(data.Batches) < batchesShown && (!data.Open || b.State != disker.BatchCompleted) {
				data.Batches = append(data.Batches, viewBatch(b))
			}
		}
		data.Unreadable = d.batchNotes.note(d, l.Unreadable)
	}
	d.render(w, http.StatusOK, "batches", p)
}

// batchData is a batch's page.
type batchData struct {
	ID    string
	Found bool
	Batch batchLine
}

// batchPage shows batch ?id=ID: its state, counts and progress, and links
// to its completion (or failure) message once it was queued.
func (d *Dashboard) batchPage(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("id")
	data := batchData{ID: id}
	status := http.StatusOK
	b, err := d.cfg.Disker.Batch(r.Context(), id)
	switch {
	case errors.Is(err, disker.ErrBatchNotFound):
		status = http.StatusNotFound
	case err != nil:
		d.fail(w, err)
		return
	default:
		data.Found, data.Batch = true, viewBatch(b)
	}
	d.render(w, status, "batch", d.page("Batch "+id, "batches", data))
}

// receiverBatchLines are receiver's latest batches, for its page, and
// what was left out of them as unreadable.
func (d *Dashboard) receiverBatchLines(r *http.Request, receiver string) ([]batchLine, []string, error) {
	l, err := d.cfg.Disker.ListBatches(r.Context(), []string{receiver}, receiverBatches)
	if err != nil {
		return nil, nil, err
	}
	out := make([]batchLine, len(l.Batches))
	for i, b := range l.Batches {
		out[i] = viewBatch(b)
	}
	return out, d.batchNotes.note(d, l.Unreadable), nil
}

// notes logs each line it is given once.
type notes struct {
	mu   sync.Mutex
	seen map[string]bool
}

// maxNotes bounds the lines a notes remembers: past it, it starts again.
const maxNotes = 1000

// note logs the lines of skipped it has not logged yet, and returns
// skipped, for the page's box.
func (n *notes) note(d *Dashboard, skipped []string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.seen == nil || len(n.seen) > maxNotes {
		n.seen = make(map[string]bool)
	}
	for _, s := range skipped {
		if !n.seen[s] {
			d.cfg.Logger.Warn("dashboard: left out, as it cannot be read", "record", s)
			n.seen[s] = true
		}
	}
	return skipped
}
