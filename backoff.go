package disker

import (
	"time"

	"github.com/diskerhq/disker/internal/backoff"
)

// Backoff bounds for broker failures in loops.
const (
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = 5 * time.Second
)

// pacer spaces the attempts of a loop whose broker calls fail: a capped
// exponential delay with jitter (internal/backoff) that grows with each
// failure in a row.
type pacer struct{ attempts int }

func (b *pacer) reset() { b.attempts = 0 }

// wait sleeps for the next delay, or until done is closed (then it returns
// false).
func (b *pacer) wait(done <-chan struct{}) bool {
	delay := backoff.Delay(minRetryDelay, maxRetryDelay, b.attempts)
	b.attempts = min(b.attempts+1, 64) // bounded: the delay is capped long before
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
