package disker

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// expireBatch is how many timeouts one ExpireTimeouts call settles at most.
const expireBatch = 512

// expireParallelism is how many ExpireTimeouts calls a monitor pass makes at
// a time.
const expireParallelism = 16

// monitor settles the expired timeouts of the senders this instance watches:
// those it registered handlers for (pinned) and those it sent timed messages
// as, until their last deadline has passed and been settled.
type monitor struct {
	mu      sync.Mutex
	senders map[string]*watched
}

type watched struct {
	pins  int       // handlers (or the inbox) that keep the sender watched
	until time.Time // local time after which an unpinned sender is dropped
}

func newMonitor() *monitor { return &monitor{senders: make(map[string]*watched)} }

func (m *monitor) entry(sender string) *watched {
	w := m.senders[sender]
	if w == nil {
		w = &watched{}
		m.senders[sender] = w
	}
	return w
}

// watch makes sure sender is watched until after deadline (local time).
func (m *monitor) watch(sender string, deadline time.Time) {
	m.mu.Lock()
	if w := m.entry(sender); deadline.After(w.until) {
		w.until = deadline
	}
	m.mu.Unlock()
}

func (m *monitor) pin(sender string) {
	m.mu.Lock()
	m.entry(sender).pins++
	m.mu.Unlock()
}

func (m *monitor) unpin(sender string) {
	m.mu.Lock()
	if w := m.senders[sender]; w != nil {
		w.pins--
	}
	m.mu.Unlock()
}

// due lists the senders to look at now, and forgets unpinned senders whose
// last deadline passed more than margin ago (a pass after it settled them).
func (m *monitor) due(now time.Time, margin time.Duration) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.senders))
	for s, w := range m.senders {
		if w.pins <= 0 && now.After(w.until.Add(margin)) {
			delete(m.senders, s)
			continue
		}
		out = append(out, s)
	}
	return out
}

// runMonitor settles expired timeouts every TimeoutMonitorFrequency until
// ctx ends.
func (d *Disker) runMonitor(ctx context.Context) {
	t := time.NewTicker(d.cfg.TimeoutMonitorFrequency)
	defer t.Stop()
	// An unpinned sender stays watched for two periods (and the clock
	// offset's slack) after its last deadline: at least one pass runs after
	// the broker's deadline.
	margin := 2*d.cfg.TimeoutMonitorFrequency + time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			senders := d.monitor.due(now, margin)
			if len(senders) == 1 {
				d.expire(ctx, senders[0])
				continue
			}
			// Many senders: a few calls at a time, which the broker client
			// pipelines. The next tick waits for this pass.
			var wg sync.WaitGroup
			next := make(chan string)
			for range min(len(senders), expireParallelism) {
				wg.Go(func() {
					for s := range next {
						d.expire(ctx, s)
					}
				})
			}
			for _, s := range senders {
				next <- s
			}
			close(next)
			wg.Wait()
		}
	}
}

// expire settles sender's expired timeouts. When the broker fails, the rest
// waits for the next pass.
func (d *Disker) expire(ctx context.Context, sender string) {
	for {
		n, err := d.b.ExpireTimeouts(ctx, sender, expireBatch)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
				d.health.fail("expire timeouts", err)
			}
			return
		}
		d.health.ok()
		if n < expireBatch {
			return
		}
	}
}
