package dashboard

import (
	"net/http"
	"strconv"
	"time"

	"github.com/diskerhq/disker"
)

// busiestShown is how many group keys a receiver's page lists.
const busiestShown = 10

// completedShown is how many retained results a receiver's page lists.
const completedShown = 20

// receiverData is a receiver's page: its line of the receivers page, and
// its busiest group keys.
type receiverData struct {
	Receiver    string
	Table       liveTable
	DeadLetters int64
	Groups      []groupLine
	Shown       int // the most keys listed
	// Completed are its latest final retained results (WithRetention).
	Completed []resultLine
	// Batches are its latest batches (those whose completion it
	// receives).
	Batches []batchLine
	// Unreadable are the batch records left out of Batches.
	Unreadable []string
}

// resultLine is a retained result as a receiver's page lists it.
type resultLine struct {
	ID, State, Finished, Worker string
	Attempts                    int
}

// groupLine is a group key as the page shows it, and the messages waiting
// behind it.
type groupLine struct {
	Key     string
	Waiting int64
}

// receiverPage shows a receiver (/receivers/NAME): its numbers, as the
// receivers page has them (the last poll's, or read now for a receiver the
// poll does not list), its busiest group keys (BusiestGroups, read now),
// and a link to its dead letters.
func (d *Dashboard) receiverPage(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	snap, _ := d.poll.current(r.Context())
	row, ok := Receiver{}, false
	for _, rc := range snap.Receivers {
		if rc.Receiver == name {
			row, ok = rc, true
		}
	}
	if !ok {
		st, err := d.cfg.Disker.Stats(r.Context(), name)
		if err != nil {
			d.fail(w, err)
			return
		}
		row = Receiver{ReceiverStats: st}
	}
	data := receiverData{Receiver: name, DeadLetters: row.DeadLetters, Shown: busiestShown,
		Table: table(receiverColumns, []Receiver{row}, func(r Receiver) string { return r.Receiver }, snap.At)}
	loads, err := d.cfg.Disker.BusiestGroups(r.Context(), name, busiestShown)
	if err != nil {
		d.fail(w, err)
		return
	}
	for _, l := range loads {
		data.Groups = append(data.Groups, groupLine{Key: keyText(l), Waiting: l.Waiting})
	}
	done, err := d.cfg.Disker.ListResults(r.Context(), name, completedShown)
	if err != nil {
		d.fail(w, err)
		return
	}
	for _, res := range done {
		data.Completed = append(data.Completed, resultLine{ID: res.ID, State: res.State.String(), Attempts: res.Attempts,
			Worker: res.Worker, Finished: timeText(res.FinishedAt)})
	}
	bs, skipped, err := d.receiverBatchLines(r, name)
	if err != nil {
		d.fail(w, err)
		return
	}
	data.Batches, data.Unreadable = bs, skipped
	d.render(w, http.StatusOK, "receiver", d.page("Receiver "+name, "receivers", data))
}

// keyText shows a group key (any bytes) as it is when it is printable text,
// else quoted.
func keyText(l disker.GroupLoad) string {
	if printable([]byte(l.Key)) {
		return l.Key
	}
	return strconv.Quote(l.Key)
}

// timeText shows t in UTC to the second, "" for the zero time.
func timeText(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05 UTC")
}
