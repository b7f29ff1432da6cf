package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress is a one-line progress bar on a terminal; on anything else it
// draws nothing.
type progress struct {
	w        io.Writer
	on       bool
	total    int
	start    time.Time
	mu       sync.Mutex
	n        int
	drawn    time.Time
	finished bool
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, on: isTerminal(w), total: total, start: time.Now()}
}

// add counts n more items done and redraws at most ten times a second.
func (p *progress) add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.n += n
	if p.on && time.Since(p.drawn) >= 100*time.Millisecond {
		p.draw()
	}
}

// done returns how many items are done.
func (p *progress) done() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// finish draws the final state and ends the line. Later calls do nothing.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.finished {
		return
	}
	p.finished = true
	if p.on {
		p.draw()
		fmt.Fprintln(p.w)
	}
}

func (p *progress) draw() {
	p.drawn = time.Now()
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = p.n * width / p.total
	}
	rate := float64(p.n) / max(time.Since(p.start).Seconds(), 1e-3)
	fmt.Fprintf(p.w, "\r\x1b[2K[%s%s] %d/%d %3d%% %.0f/s",
		strings.Repeat("#", filled), strings.Repeat(".", width-filled),
		p.n, p.total, p.n*100/max(p.total, 1), rate)
}
