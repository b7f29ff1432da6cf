package browsertest

import (
	"context"
	"strconv"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestBatchesPage follows batches through the dashboard in the browser:
// the Batches page lists a batch in progress (sealed, its children
// waiting for a worker) and one completed, with their progress bars;
// once a worker handles the children, the page shows the first completed
// too; its link opens its page, whose link opens its completion's message
// page; a child's message page links back to the batch.
func TestBatchesPage(t *testing.T) {
	prefix := redistest.Prefix(t)
	lib := library(t, prefix)
	ctx := context.Background()
	start(t, prefix, workerStarted, "worker", "--receiver", "albums", "--exec", "cat")
	start(t, prefix, workerStarted, "worker", "--receiver", "invoices", "--exec", "cat")
	newBatch := func(children string, n int) (*disker.Batch, string) {
		t.Helper()
		b, err := lib.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "albums", Content: []byte("done")}})
		if err != nil {
			t.Fatal(err)
		}
		var child string
		for i := range n {
			if child, err = b.Send(ctx, disker.Message{Receiver: children, Content: []byte(strconv.Itoa(i))}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		return b, child
	}
	waiting, child := newBatch("thumbnails", 4) // nobody serves thumbnails yet
	done, _ := newBatch("invoices", 3)
	waitFor(t, "the second batch completed", func() bool {
		info, err := lib.Batch(ctx, done.ID())
		return err == nil && info.State == disker.BatchCompleted
	})

	dash := dashboard(t, prefix)
	b := newBrowser(t)
	b.do(t, chromedp.Navigate(dash+"/batches"))
	row := func(id string) string { return `document.querySelector('#batches tr[data-id="` + id + `"]')` }
	b.waitJS(t, "both batches listed", row(waiting.ID())+` && `+row(done.ID()))
	if got := eval[string](t, b, row(waiting.ID())+`.dataset.state`); got != "sealed" {
		t.Errorf("the batch in progress reads %q, want sealed", got)
	}
	if got := eval[string](t, b, row(waiting.ID())+`.querySelector('.pct').textContent`); got != "0/4" {
		t.Errorf("the batch in progress shows %q settled, want 0/4", got)
	}
	if got := eval[string](t, b, row(done.ID())+`.querySelector('svg.bar rect.ok').getAttribute('width')`); got != "100.00" {
		t.Errorf("the completed batch's bar is %q%% green, want 100.00", got)
	}
	// Not completed only: the completed batch is left out.
	b.do(t, chromedp.Click(chromedp.CSS(`#show-open`)))
	b.waitJS(t, "only the batch in progress", row(waiting.ID())+` && !`+row(done.ID()))

	start(t, prefix, workerStarted, "worker", "--receiver", "thumbnails", "--exec", "cat")
	waitFor(t, "the first batch completed", func() bool {
		info, err := lib.Batch(ctx, waiting.ID())
		return err == nil && info.State == disker.BatchCompleted
	})
	b.do(t, chromedp.Navigate(dash+"/batches"))
	b.waitJS(t, "the first batch completed on the page", row(waiting.ID())+` && `+row(waiting.ID())+`.dataset.state === 'completed'`)
	b.do(t, chromedp.Click(chromedp.CSS(`#batches tr[data-id="`+waiting.ID()+`"] a`)))
	b.waitJS(t, "the batch's page", `document.querySelector('#batch-state') && document.querySelector('#batch-state').textContent === 'completed' && document.querySelector('#batch-percent').textContent === '100%'`)
	b.do(t, chromedp.Click(chromedp.CSS(`#batch-message`)))
	b.waitJS(t, "its completion's message page", `document.querySelector('#fate') && location.search.includes('receiver=albums')`)

	b.do(t, chromedp.Navigate(dash+"/message?receiver=thumbnails&id="+child))
	b.waitJS(t, "a child's link to its batch", `document.querySelector('#result-batch') && document.querySelector('#result-batch').textContent === '`+waiting.ID()+`'`)
	b.do(t, chromedp.Click(chromedp.CSS(`#result-batch`)))
	b.waitJS(t, "the batch's page again", `document.querySelector('#batch') && document.querySelector('h1 .name').textContent === '`+waiting.ID()+`'`)
	b.noErrors(t, "batches pages")
}
