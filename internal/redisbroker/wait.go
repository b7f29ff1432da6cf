package redisbroker

import (
	"context"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// The waits of fetches with broker.FetchParams.Wake: a fetch that found
// nothing leaves its blocking read in the consumer's hub, which calls the
// waiter's wake when it answers it (entries, the deadline, an error, the
// broker closing), and the next fetch with the same params takes the
// answer up (takeUp). No goroutine waits meanwhile: an idle receiver
// costs its waiter in the hub.

// parkedRead is a blocking read left waiting in a hub (broker.Wait).
type parkedRead struct {
	b        *Broker
	h        *hub
	consumer string
	r        blocking
}

// parkRead joins r's waiter to p.Consumer's hub, to wake p.Wake when it
// is answered, and leaves it as p.Wait; a waiter answered as it joins
// (entries parked for it) is answered at once.
func (b *Broker) parkRead(ctx context.Context, st *streamState, p *broker.FetchParams, r blocking) ([]entry, error) {
	w := r.w
	w.early = max(time.Millisecond, time.Until(w.deadline)/earlyDiv)
	w.wake, w.st, w.block = p.Wake, st, p.Block
	b.hubsMu.Lock()
	if b.hubsClosed {
		b.hubsMu.Unlock()
		return nil, broker.ErrClosed
	}
	h := b.hubOf(p.Consumer, w.streams[0])
	interrupt, round := h.join(w)
	if interrupt {
		// Not on the fetch's goroutine, which would wait for the read to
		// end: receivers added at once would each wait for a read of all.
		b.hubsWG.Add(1)
		go func() {
			defer b.hubsWG.Done()
			h.interrupt(round)
		}()
	}
	b.hubsMu.Unlock()
	pr := &parkedRead{b: b, h: h, consumer: p.Consumer, r: r}
	if b.closing.Err() != nil {
		// The hub may have stopped before w joined (it answers the
		// waiters it has when it stops).
		pr.Cancel()
		return nil, broker.ErrClosed
	}
	if a := w.ans.Load(); a != nil {
		return b.readResult(ctx, st, p, r, nil, *a)
	}
	p.Wait = pr
	return nil, nil
}

// end ends the wait: it returns the hub's answer, or false when it had
// none (the wake was spurious).
func (pr *parkedRead) end() (hubAnswer, bool) {
	return pr.h.end(pr.r.w)
}

// Cancel ends the wait, giving back what it read (broker.Wait).
func (pr *parkedRead) Cancel() {
	a, ok := pr.end()
	if !ok || len(a.read) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), pr.b.ioTimeout)
	defer cancel()
	pr.b.giveBackRead(ctx, pr.consumer, pr.r.w.lease, pr.r.w.home, a.read)
}

// takeUp takes up p.Wait, left by the last fetch with p: the entries its
// read got, with done; done is false when it got none, and the fetch is to
// look as usual. When ctx ended, what it read is given back.
func (b *Broker) takeUp(ctx context.Context, st *streamState, p *broker.FetchParams) (entries []entry, err error, done bool) {
	wait := p.Wait
	p.Wait = nil
	pr, ok := wait.(*parkedRead)
	if !ok {
		wait.Cancel() // a sleepWait, or another broker's
		return nil, nil, false
	}
	if err := ctx.Err(); err != nil {
		pr.Cancel()
		return nil, b.fail(ctx, st.keys.op, err), true
	}
	a, answered := pr.end()
	if !answered {
		return nil, nil, false
	}
	entries, err = b.readResult(ctx, st, p, pr.r, nil, a)
	return entries, err, err != nil || len(entries) > 0
}

// sleepWait is the wait of a fetch with Wake whose stream's first deferred
// message is due before a blocking read could end precisely then (see
// planWait): a timer that wakes the next fetch, which runs the script.
type sleepWait struct{ t *time.Timer }

// Cancel stops the timer (broker.Wait).
func (s sleepWait) Cancel() { s.t.Stop() }

// extend moves on the deadline of w, a parked read at its deadline (now),
// by its block time when a fetch of its stream would do what waking it
// would lead to, and reports whether it did: nothing but wait again (no
// reclaim due, no read without BLOCK, no priority levels, no deferred
// message due within the block time). An idle receiver then costs no
// fetch, nor a goroutine, each block time. Under the hub's lock.
func (b *Broker) extend(w *waiter, now time.Time) bool {
	if w.st == nil {
		return false
	}
	snap := w.st.snapshot()
	plan := planFetch(snap, b.inputs(w.st, now, w.block, w.lease))
	if plan.script || plan.read || plan.levels != 0 || !plan.wait {
		return false
	}
	wait := planWait(snap.nextDue, now, w.block)
	if wait.sleep > 0 {
		return false
	}
	w.deadline = now.Add(wait.block)
	w.early = max(time.Millisecond, wait.block/earlyDiv)
	return true
}
