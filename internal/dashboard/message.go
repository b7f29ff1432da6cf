package dashboard

import (
	"errors"
	"net/http"

	"github.com/diskerhq/disker"
)

// messageData is the message page's: the form, and the fate found.
type messageData struct {
	Receiver, ID string
	Asked        bool
	Fate         disker.MessageFate
	State        string // the state in words
	At           string
	Receivers    []string // for the form's list
	Scan         int
	// Result is its retained result (WithRetention), nil if none; Started
	// and Finished its times as the page shows them.
	Result            *disker.Result
	Started, Finished string
}

// stateWords are the message page's words for a state.
var stateWords = map[disker.MessageState]string{
	disker.MessageQueued:       "Queued: waiting for a worker.",
	disker.MessageInFlight:     "In flight: delivered and not yet acknowledged (being handled, or waiting for a retry or a redelivery).",
	disker.MessageDeadLettered: "Dead-lettered.",
	disker.MessageGone:         "Gone: not in the queue nor in the dead letters. It was handled and acknowledged, purged, or never sent to this receiver.",
	disker.MessageUnknown:      "Unknown: not found among the entries read, which stop at a bound.",
}

// messagePage finds a message by receiver and id (/message?receiver=R&id=X).
func (d *Dashboard) messagePage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	data := messageData{Receiver: q.Get("receiver"), ID: q.Get("id"), Scan: disker.FateScan}
	snap, _ := d.poll.current(r.Context())
	for _, rc := range snap.Receivers {
		data.Receivers = append(data.Receivers, rc.Receiver)
	}
	if q.Has("receiver") || q.Has("id") {
		f, err := d.cfg.Disker.Fate(r.Context(), data.Receiver, data.ID)
		if err != nil {
			d.fail(w, err)
			return
		}
		data.Asked, data.Fate, data.State = true, f, stateWords[f.State]
		if !f.At.IsZero() {
			data.At = f.At.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		res, err := d.cfg.Disker.Result(r.Context(), data.Receiver, data.ID)
		switch {
		case err == nil:
			data.Result, data.Started, data.Finished = res, timeText(res.StartedAt), timeText(res.FinishedAt)
		case !errors.Is(err, disker.ErrResultNotFound):
			d.fail(w, err)
			return
		}
	}
	d.render(w, http.StatusOK, "message", d.page("Message", "message", data))
}
