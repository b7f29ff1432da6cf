package broker

import (
	"sync/atomic"
	"time"
)

// Offset is the one estimate of the broker's clock from the local one:
// broker time minus local time, as the last reading of the broker's clock
// measured it. Both brokers keep one, set by Now; the client converts the
// broker's deadlines with Clock.Local, and a broker that needs broker-now
// without a round trip (an inbox's request) uses Estimate. The zero value
// has measured nothing. It is safe for concurrent use.
type Offset struct {
	ns  atomic.Int64
	set atomic.Bool
}

// Measure records a reading of the broker's clock, now, made by a call
// sent at local time sent and answered at got: the broker read its clock
// about half way through the round trip.
func (o *Offset) Measure(sent, now, got time.Time) {
	o.ns.Store(int64(now.Sub(sent.Add(got.Sub(sent) / 2))))
	o.set.Store(true)
}

// Estimate returns broker-now as the last measurement gives it, and false
// when nothing was measured yet.
func (o *Offset) Estimate() (time.Time, bool) {
	if !o.set.Load() {
		return time.Time{}, false
	}
	return time.Now().Add(time.Duration(o.ns.Load())), true
}

// Local turns broker time t into local time; the zero time stays zero.
func (o *Offset) Local(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.Add(-time.Duration(o.ns.Load())).Local()
}
