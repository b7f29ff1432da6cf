package broker

import (
	"sync"
	"sync/atomic"
	"time"
)

// Offset is the one estimate of the broker's clock from the local one:
// broker time minus local time. Both brokers keep one, fed by Now; the
// client converts the broker's deadlines with Clock.Local, and a broker
// that needs broker-now without a round trip (an inbox's request) uses
// Estimate. The zero value has measured nothing. It is safe for concurrent
// use.
//
// A reading is only as good as its round trip is short: the broker read
// its clock somewhere within it, so half the round trip bounds the error.
// Offset keeps the tightest reading, and lets a looser one replace it only
// once the kept one has aged by more than the difference (at AgingRate):
// a reading taken across a stalled connection, whose round trip took
// seconds, does not throw the estimate off, while a broker whose clock
// moved (a failover to another host) is followed at the next ordinary
// reading.
type Offset struct {
	ns  atomic.Int64
	set atomic.Bool

	mu   sync.Mutex
	half time.Duration // the kept reading's bound: half its round trip
	at   time.Time     // when the kept reading was made (local time)
}

// AgingRate is how fast the kept reading of an Offset loses its
// precision: per second of age, its bound grows by a second divided by
// AgingRate (a millisecond), far more than any clock drifts.
const AgingRate = 1000

// Measure records a reading of the broker's clock, now, made by a call
// sent at local time sent and answered at got: the broker read its clock
// about half way through the round trip. It keeps the reading if it is
// tighter than the kept one's bound grown by its age (see Offset).
func (o *Offset) Measure(sent, now, got time.Time) {
	half := got.Sub(sent) / 2
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.set.Load() && half > o.half+got.Sub(o.at)/AgingRate {
		return
	}
	o.ns.Store(int64(now.Sub(sent.Add(half))))
	o.half, o.at = half, got
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
