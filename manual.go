package disker

// An instance driven by hand: the test kit's (package diskertest, through
// internal/testhook). It runs on the kit's broker, and the loops that
// wait for time to pass do not run in goroutines of their own: a
// receiver's fetch loop and lease keeper, a sender's reply reader, the
// ticker of schedules and the timeout monitor. The kit takes their steps
// on its own goroutine instead, with the same code that settles each
// outcome in production (consumer.run, dispatchReply, ticker.tickDue,
// ExpireTimeouts). The heartbeat, the pause watch and Request's inbox
// reader run as usual.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/testhook"
)

func init() { testhook.Open = openByHand }

// openByHand is testhook.Open.
func openByHand(ctx context.Context, cfg any, b broker.Broker) (any, testhook.Instance, error) {
	c, ok := cfg.(Config)
	if !ok {
		return nil, nil, fmt.Errorf("disker: testhook.Open: the config is a %T, not a Config", cfg)
	}
	if b == nil {
		return nil, nil, errors.New("disker: testhook.Open: no broker")
	}
	d, err := open(ctx, c, b)
	if err != nil {
		return nil, nil, err
	}
	return d, byHand{d}, nil
}

// byHand is the testhook.Instance of an instance opened by openByHand.
type byHand struct{ d *Disker }

// startByHand readies c to be run by Drain: it has no fetch loop and no
// lease keeper, and it acknowledges each delivery as it is settled, so
// that Drain returns with every outcome in the broker. It sets the
// receiver's groups, as a fetch loop does first.
func (c *consumer) startByHand() {
	c.keeper.Lock()
	c.keeperOff = true // a kit extends no lease: its clock decides
	c.keeper.Unlock()
	batched := c.acks
	c.acks = &acker{d: batched.d, kind: batched.kind, name: batched.name, ack: batched.ack,
		refs: make(chan ackRef), abort: make(chan struct{}), direct: true}
	// The group settings a fetch loop would set first; the in-memory
	// broker of a kit does not fail.
	_ = c.configureGroups(context.Background())
}

// ackNow acknowledges r on the caller's goroutine (a direct acker's
// add); a failure leaves the entry to be delivered again.
func (a *acker) ackNow(r ackRef) {
	err := a.ack(a.d.opCtx, r.ref)
	acked(a.name, []ackRef{r}, err)
	if err != nil {
		a.d.health.fail("ack", err)
		a.d.log.Warn("disker: cannot acknowledge; the entry will be delivered again", a.kind, a.name, "error", err)
		return
	}
	a.d.health.ok()
}

// Drain runs receiver's due messages one at a time on the caller's
// goroutine (see testhook.Instance).
func (h byHand) Drain(ctx context.Context, receiver string, max int) (int, error) {
	d := h.d
	d.mu.Lock()
	c := d.consumers[receiver]
	d.mu.Unlock()
	if c == nil {
		return 0, fmt.Errorf("disker: receiver %q: %w", receiver, ErrNotHandled)
	}
	// The broker's flag, as the pause watch would read it by now.
	ps, err := d.b.Paused(ctx, []string{receiver})
	if err != nil {
		return 0, err
	}
	c.setPaused(ps[0])
	if c.lim != nil {
		defer c.lim.releaseAll(ctx) // the slots of the deliveries run
	}
	fp := broker.FetchParams{Receiver: receiver, Consumer: d.id, Max: 1, Lease: c.o.lease, MaxAttempts: c.o.maxAttempts}
	if c.batches != nil {
		return c.drainBatches(ctx, &fp, max)
	}
	n := 0
	for ; n < max; n++ {
		dl, ok, err := c.fetchOne(ctx, &fp)
		if err != nil || !ok {
			return n, err
		}
		if err := c.runByHand(ctx, dl); err != nil {
			return n + 1, err
		}
	}
	return n, nil
}

// fetchOne fetches one due delivery, when the receiver is still served
// (not Unhandled meanwhile) and not paused, and its flow limits allow one
// now (broker time), without blocking.
func (c *consumer) fetchOne(ctx context.Context, fp *broker.FetchParams) (broker.Delivery, bool, error) {
	if c.fetchCtx.Err() != nil || c.paused.Load() {
		return broker.Delivery{}, false, nil
	}
	if c.lim != nil {
		free, _, _, _, err := c.lim.gate(ctx, 1)
		if err != nil || free == 0 {
			return broker.Delivery{}, false, err
		}
	}
	ds, err := c.d.b.Fetch(ctx, fp)
	if c.lim != nil {
		c.lim.ungate(ctx, 1, len(ds))
	}
	if err != nil || len(ds) == 0 {
		return broker.Delivery{}, false, err
	}
	return ds[0], true, nil
}

// runByHand handles dl on the caller's goroutine as dispatch has a task
// handle it: dropped if too late, else run and settled. Whether it is too
// late is decided on the broker's clock: tooLate compares in the local
// clock, which cannot tell a deadline from the broker's time at the same
// instant when the broker's clock stands still.
func (c *consumer) runByHand(ctx context.Context, dl broker.Delivery) error {
	now, err := c.d.b.Now(ctx)
	if err != nil {
		return err
	}
	if c.tooLateAt(&dl, now) {
		return nil
	}
	c.run(c.begin(dl, c.d.b.Local(dl.Deadline)))
	return nil
}

// tooLateAt is tooLate on the broker's clock, at now: it reports whether
// dl must not start, and then drops it.
func (c *consumer) tooLateAt(dl *broker.Delivery, now time.Time) bool {
	switch {
	case !dl.Deadline.IsZero() && !now.Before(dl.Deadline):
		c.drop(dl, false)
		return true
	case !dl.Expiry.IsZero() && !now.Before(dl.Expiry):
		c.drop(dl, true)
		return true
	}
	return false
}

// DrainReplies hands sender's reply-stream entries to its handlers on the
// caller's goroutine (see testhook.Instance).
func (h byHand) DrainReplies(ctx context.Context, sender string, max int) (int, error) {
	d := h.d
	d.mu.Lock()
	_, ok := d.senders[sender]
	d.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("disker: sender %q: %w", sender, ErrNotHandled)
	}
	rp := broker.ReadRepliesParams{Sender: sender, Consumer: d.id, Lease: replyLease}
	n := 0
	for n < max {
		rp.Max = min(max-n, replyBatch)
		rs, err := d.b.ReadReplies(ctx, &rp)
		if err != nil || len(rs) == 0 {
			return n, err
		}
		for i := range rs {
			d.dispatchReply(d.bgCtx, sender, &rs[i])
			if err := d.b.AckReplies(ctx, sender, rs[i].Ref); err != nil {
				return n, err
			}
			n++
		}
	}
	return n, nil
}

// Names lists the receivers served and the senders with handlers.
func (h byHand) Names() (receivers, senders []string) {
	d := h.d
	d.mu.Lock()
	defer d.mu.Unlock()
	for name := range d.consumers {
		receivers = append(receivers, name)
	}
	for name := range d.senders {
		senders = append(senders, name)
	}
	slices.Sort(receivers)
	slices.Sort(senders)
	return receivers, senders
}

// maxTickRounds bounds the rounds of one Tick: each sends up to
// maxTicksInARow ticks of each schedule.
const maxTickRounds = 1000

// Tick sends the due ticks of the schedules, as the ticker's loop does,
// until none is due (see testhook.Instance).
func (h byHand) Tick(ctx context.Context) (time.Time, error) {
	d := h.d
	d.mu.Lock()
	tk := d.tk
	d.mu.Unlock()
	if tk == nil {
		return time.Time{}, nil // the instance does not run the schedules
	}
	for range maxTickRounds {
		if err := tk.refresh(ctx); err != nil {
			return time.Time{}, err
		}
		wakeAt, err := tk.tickDue(ctx)
		if err != nil {
			return time.Time{}, err
		}
		if wakeAt.After(time.Now()) { // every schedule waits for its next tick
			var next time.Time
			for _, st := range tk.scheds {
				if next.IsZero() || st.rec.Next.Before(next) {
					next = st.rec.Next
				}
			}
			return next, nil
		}
	}
	return time.Time{}, fmt.Errorf("disker: schedules still due after %d rounds of ticks", maxTickRounds)
}

// Expire settles the expired timeouts of every sender the monitor watches
// (see testhook.Instance).
func (h byHand) Expire(ctx context.Context) error {
	d := h.d
	d.monitor.mu.Lock()
	senders := make([]string, 0, len(d.monitor.senders))
	for s := range d.monitor.senders {
		senders = append(senders, s)
	}
	d.monitor.mu.Unlock()
	slices.Sort(senders)
	for _, s := range senders {
		for {
			n, err := d.b.ExpireTimeouts(ctx, s, expireBatch)
			if err != nil {
				return err
			}
			if n < expireBatch {
				break
			}
		}
	}
	return nil
}

// KeepAlive renews the registry entry and the inbox for extra beyond
// their usual lifetime (see testhook.Instance).
func (h byHand) KeepAlive(ctx context.Context, extra time.Duration) error {
	d := h.d
	r := d.rq
	r.mu.Lock()
	var err error
	if r.open {
		err = d.b.KeepInbox(ctx, r.name, r.inboxTTL(time.Now())+extra)
	}
	r.mu.Unlock()
	if err != nil {
		return err
	}
	return d.b.Heartbeat(ctx, d.workerInfo(), d.heartbeatTTL()+extra)
}
