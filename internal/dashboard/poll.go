package dashboard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
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
	// Skipped says what the poll left out because it cannot read it (a
	// worker's record naming a receiver by a name that breaks the name
	// rule, written by an older or a foreign client; a receiver whose
	// stats do not read), one line each; it shows everything else.
	Skipped []string `json:"skipped,omitempty"`
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

	pollMu   sync.Mutex // one poll at a time; guards names, polls, beats, unreadable, noted
	names    []string
	polls    int
	beats    map[string]beat // by worker id
	lastSeen atomic.Int64    // Unix ns of the last page request
	// unreadable is the receivers whose stats the last poll could not
	// read: they are read apart, so that they fail no other's.
	unreadable map[string]bool
	// noted is the Skipped lines of the last poll: a line is logged when
	// it first comes, not at every poll.
	noted map[string]bool

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
			failed.Receivers, failed.Workers, failed.Skipped = p.snap.Receivers, p.snap.Workers, p.snap.Skipped
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
// the stats of every receiver (StatsOf: one round trip), leaving out what
// it cannot read (Snapshot.Skipped, logged once).
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
	var skipped []string
	for _, w := range workers {
		for _, r := range w.Receivers {
			if err := disker.ValidateName(r); err != nil {
				skipped = append(skipped, fmt.Sprintf("worker %s lists a receiver %q, which is not a valid receiver name: %s", w.ID, r, strings.TrimPrefix(err.Error(), "disker: ")))
				continue
			}
			if i, found := slices.BinarySearch(p.names, r); !found {
				p.names = slices.Insert(p.names, i, r)
			}
		}
	}
	stats, left, err := p.statsOf(ctx)
	if err != nil {
		return nil, Point{}, err
	}
	now := time.Now()
	snap := &Snapshot{At: now, Workers: workers, Receivers: make([]Receiver, len(stats)), Skipped: append(skipped, left...)}
	p.note(snap.Skipped)
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

// statsOf reads the stats of p.names, in one round trip (StatsOf) but for
// those whose stats could not be read at the last poll: those are read
// one by one, so that they fail no other's. When the round trip fails but
// the broker answers (a receiver's keys that do not read), every receiver
// is read so. It returns the stats read, sorted by receiver, and a line
// for each receiver left out; an error when the broker cannot be reached.
func (p *poller) statsOf(ctx context.Context) ([]disker.ReceiverStats, []string, error) {
	readable := slices.DeleteFunc(slices.Clone(p.names), func(r string) bool { return p.unreadable[r] })
	apart := slices.DeleteFunc(slices.Clone(p.names), func(r string) bool { return !p.unreadable[r] })
	stats, err := p.d.StatsOf(ctx, readable...)
	switch {
	case err == nil:
	case unreachable(ctx, err):
		return nil, nil, err
	default:
		stats, apart = nil, p.names
	}
	var left []string
	unreadable := map[string]bool{}
	for _, r := range apart {
		st, err := p.d.Stats(ctx, r)
		if err != nil {
			if unreachable(ctx, err) {
				return nil, nil, err
			}
			unreadable[r] = true
			left = append(left, fmt.Sprintf("receiver %s: its stats do not read: %s", r, strings.TrimPrefix(err.Error(), "disker: ")))
			continue
		}
		stats = append(stats, st)
	}
	p.unreadable = unreadable
	slices.SortFunc(stats, func(a, b disker.ReceiverStats) int { return strings.Compare(a.Receiver, b.Receiver) })
	return stats, left, nil
}

// unreachable reports whether err, of a call made with ctx, says that the
// broker could not be reached (or ctx ended), not that it refused what it
// was asked.
func unreachable(ctx context.Context, err error) bool {
	return ctx.Err() != nil || errors.Is(err, disker.ErrUnavailable) || errors.Is(err, disker.ErrClosed)
}

// note logs each line of skipped that the poll before did not have: a
// record that cannot be read is logged once, not at every poll. Call with
// pollMu held.
func (p *poller) note(skipped []string) {
	noted := make(map[string]bool, len(skipped))
	for _, line := range skipped {
		if !p.noted[line] {
			p.log.Warn("dashboard: left out what it cannot read; it shows everything else", "what", line)
		}
		noted[line] = true
	}
	p.noted = noted
}
