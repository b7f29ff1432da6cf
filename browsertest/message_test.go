package browsertest

import (
	"context"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestMessagePage finds a message by id through the dashboard's form in
// the browser: queued while nobody serves its receiver, gone once a worker
// has handled it.
func TestMessagePage(t *testing.T) {
	prefix := redistest.Prefix(t)
	lib := library(t, prefix)
	id, err := lib.Send(context.Background(), disker.Message{Receiver: "later", Content: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	dash := dashboard(t, prefix)
	b := newBrowser(t)
	find := func() {
		t.Helper()
		b.do(t, chromedp.Navigate(dash+"/message"),
			chromedp.SendKeys(chromedp.CSS(`input[name=receiver]`), "later"),
			chromedp.SendKeys(chromedp.CSS(`input[name=id]`), id),
			chromedp.Click(chromedp.CSS(`form.find button`)))
	}
	find()
	b.waitJS(t, "the fate: queued", `document.querySelector('#fate') && document.querySelector('#fate').dataset.state === 'queued'`)
	start(t, prefix, workerStarted, "worker", "--receiver", "later", "--exec", "cat")
	waitFor(t, "the message handled", func() bool {
		f, err := lib.Fate(context.Background(), "later", id)
		return err == nil && f.State == disker.MessageGone
	})
	find()
	b.waitJS(t, "the fate: gone", `document.querySelector('#fate') && document.querySelector('#fate').dataset.state === 'gone'`)
	b.noErrors(t, "message page")
}
