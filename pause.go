package disker

import (
	"context"
	"errors"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// PausePollInterval is how often an instance that serves receivers reads
// whether they are paused: one round trip to the broker for all of them,
// which reads the namespace's pause epoch (on Redis one GET), a value that
// every Pause and Resume changes after it set its flag. Only when the
// epoch changed (and for receivers added since the last poll) does it
// read the flags of its receivers too (on Redis one pipeline of EXISTS,
// one per receiver): an idle instance reads one value per poll, whatever
// its receivers. A Pause or Resume therefore reaches every instance within
// this interval and a round trip.
const PausePollInterval = 250 * time.Millisecond

// Pause pauses receiver on every instance: from within PausePollInterval
// (and a round trip) of Pause returning, no instance starts a message of
// receiver, and none fetches more; handlers already running finish.
// Messages sent to it still queue, and wait. Messages an instance had
// fetched but not started stay with it, leased, and start after Resume.
// The pause lasts until Resume, whatever instances come and go; pausing a
// paused receiver does nothing. ReceiverStats.Paused reports it.
//
// A Pause that returns an error may have set the receiver's flag without
// changing the pause epoch that tells the instances to read it: they see
// the pause at the next Pause or Resume of any receiver. Call it again.
//
// receiver need not be served by this instance. A bad name is a
// *ValidationError naming "receiver".
func (d *Disker) Pause(ctx context.Context, receiver string) error {
	return d.setPaused(ctx, receiver, true)
}

// Resume undoes Pause: every instance that serves receiver starts its
// messages again, within PausePollInterval (and a round trip) of Resume
// returning, from where they stopped. Resuming a receiver that is not
// paused does nothing. A Resume that returns an error may, like a Pause,
// take effect only at the next Pause or Resume: call it again.
func (d *Disker) Resume(ctx context.Context, receiver string) error {
	return d.setPaused(ctx, receiver, false)
}

func (d *Disker) setPaused(ctx context.Context, receiver string, paused bool) error {
	if err := checkName("receiver", receiver); err != nil {
		return err
	}
	op, set := "resume", d.b.Resume
	if paused {
		op, set = "pause", d.b.Pause
	}
	if _, err := call(d, op, func() (struct{}, error) { return struct{}{}, set(ctx, receiver) }); err != nil {
		return err
	}
	d.mu.Lock()
	c := d.consumers[receiver]
	d.mu.Unlock()
	if c != nil {
		c.setPaused(paused) // at once here; the others at their next poll
	}
	return nil
}

// runPauseWatch reads, every PausePollInterval, the pause epoch, and when
// it changed (see PausePollInterval), or after a poll that failed, whether
// the receivers this instance serves are paused, and pauses or resumes
// their consumers, until ctx ends. With no receivers it reads nothing.
func (d *Disker) runPauseWatch(ctx context.Context) {
	t := time.NewTicker(PausePollInterval)
	defer t.Stop()
	w := pauseWatch{d: d, known: make(map[string]bool)}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.poll(ctx); err != nil {
			// The broker may have lost writes meanwhile (a failover), an
			// epoch's among them: the next poll reads every flag.
			w.read = false
			if ctx.Err() == nil && !errors.Is(err, broker.ErrClosed) {
				d.health.fail("paused", err)
			}
		}
	}
}

// pauseWatch is the state of runPauseWatch between two polls.
type pauseWatch struct {
	d     *Disker
	epoch string          // the epoch at the last read of all the flags
	read  bool            // the flags were read at least once
	known map[string]bool // the receivers whose flag was read
	names []string
	cs    []*consumer
}

// poll reads the pause epoch, then the flags of every receiver if the
// epoch changed, else only those of the receivers added since the last
// poll.
func (w *pauseWatch) poll(ctx context.Context) error {
	w.names, w.cs = w.names[:0], w.cs[:0]
	w.d.mu.Lock()
	for name, c := range w.d.consumers {
		w.names = append(w.names, name)
		w.cs = append(w.cs, c)
	}
	w.d.mu.Unlock()
	if len(w.names) == 0 {
		return nil
	}
	epoch, err := w.d.b.PauseEpoch(ctx)
	if err != nil {
		return err
	}
	full := !w.read || epoch != w.epoch
	if full {
		clear(w.known)
	} else {
		// Only the receivers added since: the others' flags did not change.
		n := 0
		for i, name := range w.names {
			if !w.known[name] {
				w.names[n], w.cs[n] = name, w.cs[i]
				n++
			}
		}
		w.names, w.cs = w.names[:n], w.cs[:n]
		if n == 0 {
			return nil
		}
	}
	ps, err := w.d.b.Paused(ctx, w.names)
	if err != nil {
		return err
	}
	for i, c := range w.cs {
		c.setPaused(ps[i])
		w.known[w.names[i]] = true
	}
	if full {
		w.epoch, w.read = epoch, true
	}
	return nil
}

// setPaused pauses or resumes the consumer: while paused, its fetch loop
// fetches nothing and its tasks wait before starting their handler.
func (c *consumer) setPaused(paused bool) {
	if c.paused.Load() == paused {
		return
	}
	c.pauseMu.Lock()
	defer c.pauseMu.Unlock()
	if c.paused.Load() == paused {
		return
	}
	if paused {
		c.resumed = make(chan struct{})
		c.paused.Store(true)
		c.d.log.Info("disker: receiver paused", "receiver", c.name)
		if c.wakeLoop != nil {
			c.wakeLoop() // its fetch may wait in the broker: it stops fetching
		}
		return
	}
	c.paused.Store(false)
	close(c.resumed)
	if c.wakeLoop != nil {
		c.wakeLoop() // a paused loop parks
	}
	c.d.log.Info("disker: receiver resumed", "receiver", c.name)
}

// waitResumed waits while the consumer is paused, until it is resumed
// (true) or stop or halt ends first (false; either may be nil).
func (c *consumer) waitResumed(stop, halt <-chan struct{}) bool {
	for c.paused.Load() {
		c.pauseMu.Lock()
		ch := c.resumed
		c.pauseMu.Unlock()
		if ch == nil {
			return true
		}
		select {
		case <-ch:
		case <-stop:
			return false
		case <-halt:
			return false
		}
	}
	return true
}

// readPaused pauses the consumer, before it starts, if its receiver is
// paused, so that a new consumer of a paused receiver does not fetch until
// the next poll. An error leaves it to the poll. Its context is not
// fetchCtx's child, which would make fetchCtx keep a map of children for
// the consumer's life: a stop waits for it.
func (c *consumer) readPaused() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if ps, err := c.d.b.Paused(ctx, []string{c.name}); err == nil && len(ps) == 1 && ps[0] {
		c.setPaused(true)
	}
}
