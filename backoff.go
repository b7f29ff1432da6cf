package disker

import (
	"time"

	"github.com/diskerhq/disker/internal/backoff"
)

// Backoff bounds for broker failures in loops.
const (
	minRetryDelay = 50 * time.Millisecond
	// maxRetryDelay is low enough that a loop notices that the broker is
	// back within a second (Requests wait on the inbox's reader), and high
	// enough not to spin while it is down.
	maxRetryDelay = 500 * time.Millisecond
)

// pacer spaces the attempts of a loop whose broker calls fail: a capped
// exponential delay with jitter (internal/backoff) that grows with each
// failure in a row.
type pacer struct{ attempts int }

func (b *pacer) reset() { b.attempts = 0 }

// wait sleeps for the next delay, or until done is closed (then it returns
// false).
func (b *pacer) wait(done <-chan struct{}) bool {
	return b.waitUntil(done, time.Time{})
}

// waitUntil is wait that also returns false, at once, when the delay would
// end after stop (zero: no limit).
func (b *pacer) waitUntil(done <-chan struct{}, stop time.Time) bool {
	delay := backoff.Delay(minRetryDelay, maxRetryDelay, b.attempts)
	b.attempts = min(b.attempts+1, 64) // bounded: the delay is capped long before
	return sleepUntil(delay, done, stop)
}

// sleepUntil sleeps for delay and returns true, or returns false at once
// when it would end after stop (zero: no limit), or when done is closed.
func sleepUntil(delay time.Duration, done <-chan struct{}, stop time.Time) bool {
	if !stop.IsZero() && time.Now().Add(delay).After(stop) {
		return false
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}
