package disker

import (
	"context"
	"errors"
	"slices"
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
// those it sent timed messages as, until their last deadline has passed and
// been settled, at every pass; and those it registered handlers for
// (pinned), for timed messages sent by instances that are gone, spread over
// passes when there are many (see due).
type monitor struct {
	mu      sync.Mutex
	senders map[string]*watched
}

type watched struct {
	pins   int       // handlers (or the inbox) that keep the sender watched
	until  time.Time // local time after which an unpinned sender is dropped
	looked time.Time // when a pass last looked at it
}

// pinnedPerPass is how many senders that are only pinned a pass looks at,
// at least: up to it, every pass looks at all of them (see due).
const pinnedPerPass = 100

// pinnedSpread is the most passes between two looks at a sender that is
// only pinned: a timed message whose sending instance is gone gets its
// notice within this many TimeoutMonitorFrequency of its deadline.
const pinnedSpread = 10

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

// due lists the senders to look at in a pass at now, and forgets unpinned
// senders whose last deadline passed more than margin ago (a pass after it
// settled them). A sender this instance sent timed messages as, whose last
// deadline is not past margin, is looked at in every pass. Of the senders
// that are only pinned, a pass looks at the ones looked at longest ago,
// n/k of the n of them (rounded up), where k is n over pinnedPerPass
// (rounded up), at most pinnedSpread: each is looked at every k passes.
// The instances that sent their timed messages watch them themselves, so
// this one only settles those whose sender is gone, and thousands of idle
// reply senders cost the broker a bounded number of calls per pass.
func (m *monitor) due(now time.Time, margin time.Duration) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.senders))
	var idle []string
	for s, w := range m.senders {
		active := !now.After(w.until.Add(margin))
		switch {
		case w.pins <= 0 && !active:
			delete(m.senders, s)
		case active:
			w.looked = now
			out = append(out, s)
		default:
			idle = append(idle, s)
		}
	}
	k := min(max((len(idle)+pinnedPerPass-1)/pinnedPerPass, 1), pinnedSpread)
	if k > 1 {
		slices.SortFunc(idle, func(a, b string) int { return m.senders[a].looked.Compare(m.senders[b].looked) })
		idle = idle[:(len(idle)+k-1)/k]
	}
	for _, s := range idle {
		m.senders[s].looked = now
	}
	return append(out, idle...)
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
