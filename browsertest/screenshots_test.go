package browsertest

import (
	"bytes"
	"context"
	"image/png"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestScreenshots takes the screenshots of docs/dashboard.md: the receivers
// page under a varying load, with keyed messages waiting behind their keys,
// a receiver's page (its busiest keys, its batches, its completed
// messages), the batches page, and a dead-letter page. They go to the
// directory DISKER_SCREENSHOTS names after a minute of load; without it, to
// a temporary directory after a few seconds, and the test checks that they
// are images of the window's size.
func TestScreenshots(t *testing.T) {
	dir, load := os.Getenv("DISKER_SCREENSHOTS"), 70*time.Second
	if dir == "" {
		dir, load = t.TempDir(), 4*time.Second
	}
	prefix := redistest.Prefix(t)
	start(t, prefix, workerStarted, "worker", "--receiver", "thumbnails", "--concurrency", "4", "--exec", "sh -c 'sleep 0.2; cat'")
	start(t, prefix, workerStarted, "worker", "--receiver", "thumbnails", "--concurrency", "4", "--exec", "sh -c 'sleep 0.2; cat'")
	start(t, prefix, workerStarted, "worker", "--receiver", "emails", "--concurrency", "2", "--exec", "sh -c 'sleep 0.1; cat'")
	start(t, prefix, workerStarted, "worker", "--receiver", "invoices", "--concurrency", "2", "--exec", "cat")
	start(t, prefix, workerStarted, "worker", "--receiver", "webhooks", "--concurrency", "2", "--exec", "false", "--max-attempts", "1")
	lib := library(t, prefix)
	ctx := context.Background()
	send := func(receiver, content string, headers map[string]string) {
		if _, err := lib.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(content), Headers: headers}); err != nil {
			t.Fatal(err)
		}
	}
	send("webhooks", `{"event":"order.paid","order":4211,"amount":"129.00","currency":"EUR"}`,
		map[string]string{"content-type": "application/json", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	send("webhooks", "<script>alert(1)</script>", map[string]string{"content-type": "text/html"})
	send("webhooks", "\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x01\x00", map[string]string{"content-type": "image/png"})
	waitFor(t, "3 dead letters", func() bool { return deadLetters(t, lib, "webhooks") == 3 })

	// Batches whose completion, a contact sheet, goes to thumbnails: two
	// of 40 images sealed, one of invoices with failed webhooks among its
	// children, one cancelled, one still open; one more is sent at the end
	// so that it is in progress on the screenshot.
	batch := func(name string, children map[string]int, seal bool) *disker.Batch {
		b, err := lib.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "thumbnails", Content: []byte("contact sheet of " + name)}})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range slices.Sorted(maps.Keys(children)) {
			for i := range children[r] {
				if _, err := b.Send(ctx, disker.Message{Receiver: r, Content: []byte(name + " #" + strconv.Itoa(i))}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if seal {
			if _, err := b.Seal(ctx); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	batch("album 7", map[string]int{"thumbnails": 40}, true)
	batch("album 8", map[string]int{"thumbnails": 40}, true)
	batch("invoices of the day", map[string]int{"invoices": 24, "webhooks": 2}, true)
	cancelled := batch("album 9", map[string]int{"archive": 12}, true)
	if _, err := lib.CancelBatch(ctx, cancelled.ID()); err != nil {
		t.Fatal(err)
	}
	batch("welcome emails", map[string]int{"emails": 6}, false)

	dash := dashboard(t, prefix, "--allow-actions", "--interval", "1s", "--window", "1m")
	b := newBrowser(t)
	b.do(t, chromedp.Navigate(dash+"/"))
	// A load that rises and falls, so that the chart has a shape.
	begin := time.Now()
	for i := 0; time.Since(begin) < load; i++ {
		phase := time.Since(begin).Seconds() / load.Seconds()
		n := 2 + int(6*math.Sin(phase*math.Pi*1.5)*math.Sin(phase*math.Pi*1.5))
		for j := range n {
			send("thumbnails", "img-"+strconv.Itoa(i*10+j)+".jpg", nil)
		}
		if i%2 == 0 {
			send("emails", "welcome #"+strconv.Itoa(i), nil)
		}
		send("invoices", "invoice "+strconv.Itoa(i), nil)
		time.Sleep(250 * time.Millisecond) // the pace of the load, not a wait for a result
	}
	// Keyed thumbnails, run one at a time per key: most wait behind their
	// key on the screenshots.
	for i := range 36 {
		if _, err := lib.Send(ctx, disker.Message{Receiver: "thumbnails", Content: []byte("keyed-" + strconv.Itoa(i) + ".jpg")},
			disker.WithGroup("album-"+strconv.Itoa(10+i%3))); err != nil {
			t.Fatal(err)
		}
	}
	batch("album 12", map[string]int{"thumbnails": 60}, true)
	b.waitJS(t, "rows and a chart", `['thumbnails', 'emails', 'invoices', 'webhooks'].every(n => document.querySelector('#receivers tr[data-name="' + n + '"]')) && +document.getElementById('chart-rate').dataset.points >= 3 && document.querySelector('#receivers tr[data-name="thumbnails"] td:last-child').textContent.includes('keys')`)
	shot(t, b, filepath.Join(dir, "dashboard-receivers.png"))
	b.do(t, chromedp.Navigate(dash+"/batches"))
	b.waitJS(t, "the batches", `document.querySelectorAll('#batches tbody tr').length == 6`)
	shot(t, b, filepath.Join(dir, "dashboard-batches.png"))
	b.do(t, chromedp.Navigate(dash+"/receivers/thumbnails"))
	b.waitJS(t, "the receiver's keys and batches", `document.querySelector('#groups') && document.querySelector('#batches')`)
	shot(t, b, filepath.Join(dir, "dashboard-receiver.png"))
	b.do(t, chromedp.Navigate(dash+"/receivers/webhooks/dead-letters"))
	shot(t, b, filepath.Join(dir, "dashboard-dead-letters.png"))
	b.noErrors(t, "screenshots")
}

// shot writes a screenshot of the window and checks it is a PNG of its size.
func shot(t *testing.T, b *browser, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	img, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width != 1280 || cfg.Height != 800 {
		t.Fatalf("screenshot %s: %dx%d, %v; want a 1280x800 PNG", path, cfg.Width, cfg.Height, err)
	}
	if err := os.WriteFile(path, img, 0o644); err != nil {
		t.Fatal(err)
	}
}
