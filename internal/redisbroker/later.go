package redisbroker

import (
	"math"
	"sync/atomic"
	"time"
)

// scheduleDue reports whether the first scheduled message of stream's
// receiver, as this broker last saw it, is due by the local clock
// corrected to Redis time (see setNextDue).
func (b *Broker) scheduleDue(stream string) bool {
	v, ok := b.nextDue.Load(stream)
	return ok && time.Now().UnixNano() >= v.(*atomic.Int64).Load()
}

// setNextDue records the due time (unix ms, Redis time; -1 for none) of
// the first message scheduled for stream's receiver, as the fetch script
// answered it, in local unix ns.
func (b *Broker) setNextDue(stream string, ms int64) {
	at := int64(math.MaxInt64)
	if ms >= 0 {
		at = b.offset.Local(time.UnixMilli(ms)).UnixNano()
	}
	v, _ := b.nextDue.LoadOrStore(stream, new(atomic.Int64))
	v.(*atomic.Int64).Store(at)
}

// forceSchedule makes the next fetch of stream run the fetch script, which
// queues the due scheduled messages and reads the next due time: a wake
// entry said that a message was scheduled before the one known.
func (b *Broker) forceSchedule(stream string) {
	v, _ := b.nextDue.LoadOrStore(stream, new(atomic.Int64))
	v.(*atomic.Int64).Store(0)
}

// blockUntilDue bounds block, the time a fetch of stream blocks in Redis,
// by the due time of the first scheduled message, so that the fetch after
// it queues that message. Redis ends a blocking read's timeout only at its
// next cron tick (every 100ms at the default hz 10), so the read is made
// to end redisTimerSlack before the due time; when the due time is closer
// than that, it returns no block but how long to wait here instead.
func (b *Broker) blockUntilDue(stream string, block time.Duration) (time.Duration, time.Duration) {
	v, ok := b.nextDue.Load(stream)
	if !ok {
		return block, 0
	}
	at := v.(*atomic.Int64).Load()
	if at == math.MaxInt64 {
		return block, 0
	}
	wait := time.Duration(at - time.Now().UnixNano())
	if wait <= redisTimerSlack+minDueBlock {
		return block, min(max(wait, minDueBlock), block)
	}
	return min(block, wait-redisTimerSlack), 0
}

// minDueBlock is the least wait of a fetch whose scheduled message is due
// (by the local clock, which may be ahead of Redis's by a little).
const minDueBlock = 2 * time.Millisecond

// redisTimerSlack is how late Redis may end a blocking read past its
// timeout: one period of its cron at the default hz (10).
const redisTimerSlack = 100 * time.Millisecond
