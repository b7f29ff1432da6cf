package disker

import (
	"context"
	"errors"
	"os"
	"sort"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// runHeartbeat renews the instance's registry entry, which re-measures the
// broker's clock offset, every HeartbeatInterval until ctx ends, and makes
// a heartbeat when a receiver is added (d.beatNow): at once, unless one
// was so made less than HeartbeatInterval/beatNowPerInterval ago, then
// when that has passed; the receivers added meanwhile share it.
func (d *Disker) runHeartbeat(ctx context.Context) {
	t := time.NewTicker(d.cfg.HeartbeatInterval)
	defer t.Stop()
	gap := d.cfg.HeartbeatInterval / beatNowPerInterval
	var last time.Time // when the last heartbeat asked by beatNow began
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.beatNow:
			if wait := time.Until(last.Add(gap)); wait > 0 {
				w := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					w.Stop()
					return
				case <-w.C:
				}
			}
			last = time.Now()
			d.heartbeat(ctx)
		case <-t.C:
			d.heartbeat(ctx) // measures the broker's clock again too
		}
	}
}

// beatNowPerInterval bounds the heartbeats asked by beatNow (receivers
// added) to so many per HeartbeatInterval: each writes an entry per
// receiver, and an instance adding thousands of receivers one by one
// would otherwise make a heartbeat for each.
const beatNowPerInterval = 10

// minHeartbeatTTL is the least time a heartbeat vouches for the instance:
// with very short intervals, a process that the machine stalls briefly
// would otherwise lose its deliveries to its peers.
const minHeartbeatTTL = time.Second

// heartbeat records the instance as live for 3 heartbeat intervals (at
// least minHeartbeatTTL): until then the broker keeps its deliveries with
// it, whatever their lease. It also renews the expiry of its inbox.
func (d *Disker) heartbeat(ctx context.Context) {
	d.rq.heartbeat(ctx)
	if err := d.b.Heartbeat(ctx, d.workerInfo(), d.heartbeatTTL()); err != nil {
		if ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
			d.health.fail("heartbeat", err)
		}
		return
	}
	d.health.ok()
}

// heartbeatTTL is how long a heartbeat vouches for the instance.
func (d *Disker) heartbeatTTL() time.Duration {
	return max(3*d.cfg.HeartbeatInterval, minHeartbeatTTL)
}

// workerInfo describes this instance for the registry.
func (d *Disker) workerInfo() broker.WorkerInfo {
	info := broker.WorkerInfo{
		ID:          d.id,
		Host:        d.host,
		PID:         os.Getpid(),
		Receivers:   []string{},
		Concurrency: map[string]int{},
		StartedAt:   d.started,
	}
	d.mu.Lock()
	for name, c := range d.consumers {
		info.Receivers = append(info.Receivers, name)
		info.Concurrency[name] = c.o.concurrency
		if c.o.globalConcurrency > 0 {
			if info.GlobalConcurrency == nil {
				info.GlobalConcurrency = map[string]int{}
			}
			info.GlobalConcurrency[name] = c.o.globalConcurrency
		}
		if c.o.rate > 0 {
			if info.RateLimit == nil {
				info.RateLimit, info.RateBurst = map[string]float64{}, map[string]int{}
			}
			info.RateLimit[name], info.RateBurst[name] = c.o.rate, c.o.burst
		}
		info.InFlight += c.n.Load()
		info.Processed += c.processed.Load()
		info.Failed += c.failed.Load()
	}
	d.mu.Unlock()
	sort.Strings(info.Receivers)
	return info
}
