// Package backoff is the one capped exponential backoff with jitter that
// Disker's retry loops and pools use: package disker for broker failures
// and failed deliveries, package pool for restarts of failed workers.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Delay returns the delay before retry n (0 for the first): base doubled n
// times, capped at max, then jittered to a random delay between half of it
// and all of it, so that those who failed together do not retry in step.
// A delay of at most 1ns is returned as is.
func Delay(base, max time.Duration, n int) time.Duration {
	d := base
	for i := 0; i < n && d > 0 && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}
