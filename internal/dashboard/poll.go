package dashboard

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker"
)

// listEvery is how many polls reuse the list of receivers before it is read
// again (the list comes from a scan of the keyspace). Receivers that a live
// worker serves join at once.
const listEvery = 10

// Receiver is one receiver's line on the receivers page.
type Receiver struct {
	disker.ReceiverStats
	// InFlight sums the in-flight messages of the live workers serving it.
	InFlight int64 `json:"in_flight"`
	// Rate is messages handled per second by those workers between their
	// last two heartbeats (on the first poll, since they started). A worker
	// serving several receivers counts for each.
	Rate float64 `json:"rate"`
	// Workers counts the live workers serving it.
	Workers int `json:"workers"`
}

// Point is one poll in the chart's history: totals over every receiver.
type Point struct {
	// At is when the poll ended (this machine's clock), in Unix ms.
	At int64 `json:"t"`
	// Rate is messages handled per second by all live workers.
	Rate float64 `json:"rate"`
	// Queued and InFlight sum those of the receivers.
	Queued   int64 `json:"queued"`
	InFlight int64 `json:"in_flight"`
	// DeadLetters sums the dead letters of the receivers.
	DeadLetters int64 `json:"dead_letters"`
}

// Snapshot is the result of one poll.
type Snapshot struct {
	At        time.Time           `json:"at"`
	Receivers []Receiver          `json:"receivers"`
	Workers   []disker.WorkerInfo `json:"workers"`
	// Err is the error of the last poll, if it failed; the rest is then
	// the last good poll's.
	Err string `json:"error,omitempty"`
}

// beat is what a worker's last heartbeat said: its count of messages
// handled, and the rate since its heartbeat before. Workers report their
// counts at each heartbeat, so a rate taken between polls would jump between
// 0 and twice the truth when polls are more frequent than heartbeats.
type beat struct {
	seen      time.Time
	processed int64
	rate      float64
}

// nextBeat returns what w says now, given what it said at the previous poll
// (known tells whether there was one): the rate between its last two
// heartbeats, or since it started when it is new.
func nextBeat(prev beat, known bool, w disker.WorkerInfo) beat {
	switch {
	case !known:
		b := beat{seen: w.LastSeen, processed: w.Processed}
		if up := w.LastSeen.Sub(w.StartedAt).Seconds(); up > 0 {
			b.rate = float64(w.Processed) / up
		}
		return b
	case w.LastSeen.After(prev.seen):
		return beat{seen: w.LastSeen, processed: w.Processed,
			rate: float64(max(0, w.Processed-prev.processed)) / w.LastSeen.Sub(prev.seen).Seconds()}
	default:
		return prev // no heartbeat since: the same rate
	}
}

// poller reads the broker every interval while someone looks, and keeps the
// last snapshot and the history of totals for every page.
type poller struct {
	d        *disker.Disker
	interval time.Duration
	points   int
	log      *slog.Logger

	pollMu   sync.Mutex // one poll at a time; guards names, polls, beats
	names    []string
	polls    int
	beats    map[string]beat // by worker id
	lastSeen atomic.Int64    // Unix ns of the last page request

	mu      sync.RWMutex
	snap    *Snapshot
	history []Point

	stop chan struct{}
	done chan struct{}
	once sync.Once
}

func newPoller(d *disker.Disker, interval, window time.Duration, log *slog.Logger) *poller {
	p := &poller{
		d: d, interval: interval, points: int(window/interval) + 1, log: log,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go p.run()
	return p
}

// idle is how long after the last page request the loop keeps polling.
func (p *poller) idle() time.Duration { return max(30*time.Second, 5*p.interval) }

func (p *poller) run() {
	defer close(p.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-p.stop
		cancel()
	}()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		if time.Since(time.Unix(0, p.lastSeen.Load())) < p.idle() {
			p.pollOnce(ctx)
		}
	}
}

func (p *poller) close() {
	p.once.Do(func() { close(p.stop) })
	<-p.done
}

// current returns the last snapshot and the history, polling first when
// the loop has been idle (the first page after a quiet spell).
func (p *poller) current(ctx context.Context) (*Snapshot, []Point) {
	p.lastSeen.Store(time.Now().UnixNano())
	p.mu.RLock()
	stale := p.snap == nil || time.Since(p.snap.At) > 2*p.interval
	p.mu.RUnlock()
	if stale {
		// Not cancelled with the request: the poll serves every page.
		p.pollOnce(context.WithoutCancel(ctx))
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	return p.snap, slices.Clone(p.history)
}

func (p *poller) pollOnce(ctx context.Context) {
	p.pollMu.Lock()
	defer p.pollMu.Unlock()
	p.mu.RLock()
	fresh := p.snap != nil && p.snap.Err == "" && time.Since(p.snap.At) < p.interval/2
	p.mu.RUnlock()
	if fresh {
		return // another page's request polled meanwhile
	}
	ctx, cancel := context.WithTimeout(ctx, max(p.interval, 5*time.Second))
	defer cancel()
	snap, pt, err := p.read(ctx)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.log.Warn("dashboard: poll failed", "err", err)
		failed := &Snapshot{At: time.Now(), Err: err.Error(), Receivers: []Receiver{}, Workers: []disker.WorkerInfo{}}
		if p.snap != nil {
			failed.Receivers, failed.Workers = p.snap.Receivers, p.snap.Workers
		}
		p.snap = failed
		return
	}
	p.snap = snap
	p.history = append(p.history, pt)
	if n := len(p.history) - p.points; n > 0 {
		p.history = slices.Delete(p.history, 0, n)
	}
}

// read does one poll: the workers, the list of receivers now and then, and
// the stats of every receiver (StatsOf: one round trip).
func (p *poller) read(ctx context.Context) (*Snapshot, Point, error) {
	all, err := p.d.Workers(ctx)
	if err != nil {
		return nil, Point{}, err
	}
	workers := slices.DeleteFunc(all, func(w disker.WorkerInfo) bool { return w.ID == p.d.ID() && len(w.Receivers) == 0 })
	if p.polls%listEvery == 0 {
		if p.names, err = p.d.Receivers(ctx); err != nil {
			return nil, Point{}, err
		}
	}
	p.polls++
	for _, w := range workers {
		for _, r := range w.Receivers {
			if i, found := slices.BinarySearch(p.names, r); !found {
				p.names = slices.Insert(p.names, i, r)
			}
		}
	}
	stats, err := p.d.StatsOf(ctx, p.names...)
	if err != nil {
		return nil, Point{}, err
	}
	now := time.Now()
	snap := &Snapshot{At: now, Workers: workers, Receivers: make([]Receiver, len(stats))}
	beats := make(map[string]beat, len(workers))
	for _, w := range workers {
		prev, ok := p.beats[w.ID]
		beats[w.ID] = nextBeat(prev, ok, w)
	}
	p.beats = beats
	pt := Point{At: now.UnixMilli()}
	byName := make(map[string]*Receiver, len(stats))
	for i, st := range stats {
		snap.Receivers[i] = Receiver{ReceiverStats: st}
		byName[st.Receiver] = &snap.Receivers[i]
		pt.Queued += st.Queued
		pt.DeadLetters += st.DeadLetters
	}
	for _, w := range workers {
		rate := beats[w.ID].rate
		pt.Rate += rate
		pt.InFlight += w.InFlight
		for _, name := range w.Receivers {
			if r := byName[name]; r != nil {
				r.Workers++
				r.InFlight += w.InFlight
				r.Rate += rate
			}
		}
	}
	return snap, pt, nil
}
