package pool

import (
	"time"

	"github.com/diskerhq/disker/internal/backoff"
)

// This file is the pool's supervision: background construction with
// backoff, the restart intensity and the degraded state, and the reaper of
// idle overflow workers. Every goroutine it starts is counted in p.wg.

// refillLocked replaces a worker that has just gone (retired, failed to be
// made) when the pool is now below Size, and makes workers for waiting
// callers when there is room. With restart, the replacement counts in
// Restarts.
func (p *Pool[W]) refillLocked(restart bool) {
	if p.closed {
		return
	}
	if p.live < p.size {
		p.startBuilderLocked()
		if restart {
			p.restarts++
		}
	}
	p.growForWaitersLocked()
}

// growForWaitersLocked starts background constructions for the callers
// waiting in Checkout that no construction in progress will serve, as far
// as the cap allows.
func (p *Pool[W]) growForWaitersLocked() {
	for p.queue.len() > p.builders && p.live < p.size+p.maxOverflow {
		p.startBuilderLocked()
	}
}

// startBuilderLocked reserves a slot and starts a goroutine that fills it.
func (p *Pool[W]) startBuilderLocked() {
	p.live++
	p.builders++
	p.wg.Add(1)
	go p.builder()
}

// builder makes one worker in the background and hands it to the first
// waiter or the idle set. After a failure it tries again after a backoff;
// while constructions fail, only one builder (the prober) tries and the
// others wait for its outcome. It gives its slot up when the pool closes or
// no longer needs the worker.
func (p *Pool[W]) builder() {
	defer p.wg.Done()
	p.mu.Lock()
	for {
		if p.closed || p.surplusLocked() {
			p.builders--
			p.live--
			p.drainCheckLocked()
			p.unlock()
			return
		}
		prober := false
		if p.streak > 0 {
			if p.probing {
				done := p.probeDone
				p.unlock()
				select {
				case <-done:
				case <-p.ctx.Done():
				}
				p.mu.Lock()
				continue
			}
			prober = true
			p.probing = true
			delay := p.backoffLocked()
			p.unlock()
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-p.ctx.Done():
				t.Stop()
			}
		} else {
			p.unlock()
		}
		var (
			w    W
			err  error
			made bool
		)
		if p.ctx.Err() == nil {
			w, err = p.construct(p.ctx)
			made = true
		}
		p.mu.Lock()
		if prober {
			p.probing = false
			close(p.probeDone)
			p.probeDone = make(chan struct{})
		}
		if !made || (err != nil && p.closed) {
			continue // closed meanwhile: the loop gives the slot up
		}
		if err != nil {
			degraded := p.failedLocked(err)
			p.restarts++
			failures := p.streak
			p.unlock()
			p.log.Warn("pool: background construction failed", "err", err, "failures", failures)
			if degraded {
				p.logDegraded(err)
			}
			p.mu.Lock()
			continue
		}
		recovered := p.succeededLocked()
		p.created++
		p.builders--
		if p.closed || p.surplusLocked() {
			p.closing++
			p.unlock()
			if err := p.finishClose(w, false); err != nil {
				p.log.Warn("pool: closing a surplus worker failed", "err", err)
			}
		} else {
			p.deliverLocked(p.newEntry(w, false))
		}
		if recovered {
			p.logRecovered()
		}
		return
	}
}

// backoffLocked is the delay before the next try after p.streak failures:
// RestartBackoff doubled per further failure, capped at MaxRestartBackoff,
// and jittered down by up to half so that pools do not retry in step.
func (p *Pool[W]) backoffLocked() time.Duration {
	return backoff.Delay(p.backoff, p.maxBack, max(p.streak-1, 0))
}

// failedLocked records a failed construction and degrades the pool when
// the constructor has failed more than MaxRestarts times within Period. It
// reports whether the pool has just become degraded (to be logged once p.mu
// is released, with logDegraded).
func (p *Pool[W]) failedLocked(err error) (degraded bool) {
	p.failures++
	p.streak++
	p.lastErr = err
	now := p.now()
	p.failTimes[p.failNext] = now
	p.failNext = (p.failNext + 1) % len(p.failTimes)
	p.failCount = min(p.failCount+1, len(p.failTimes))
	oldest := p.failTimes[p.failNext] // the ring is full when this counts
	if p.failCount < len(p.failTimes) || now-oldest > int64(p.period) {
		if p.degraded != nil {
			p.degraded = &degradedError{prefix: p.prefix, failures: p.failCount, period: p.period, last: err}
		}
		return false
	}
	wasDegraded := p.degraded != nil
	p.degraded = &degradedError{prefix: p.prefix, failures: p.failCount, period: p.period, last: err}
	if wasDegraded {
		return false
	}
	// Callers waiting for a worker would wait for one that cannot be made.
	for w := p.queue.pop(); w != nil; w = p.queue.pop() {
		w.err = p.degraded
		w.ch <- nil
	}
	// Make sure a background builder keeps trying, so the pool recovers by
	// itself.
	if !p.closed && p.builders == 0 && p.live < p.size+p.maxOverflow {
		p.startBuilderLocked()
	}
	return true
}

// logDegraded logs that the pool has become degraded by err. Call it
// without p.mu: the Logger's handler is the user's code.
func (p *Pool[W]) logDegraded(err error) {
	p.log.Error("pool: degraded: the constructor keeps failing; checkouts fail fast until it succeeds",
		"err", err, "period", p.period)
}

// succeededLocked records a successful construction, which ends the
// degraded state. It reports whether the pool has just recovered (to be
// logged once p.mu is released, with logRecovered).
func (p *Pool[W]) succeededLocked() (recovered bool) {
	p.streak = 0
	p.lastErr = nil
	recovered = p.degraded != nil
	p.degraded = nil
	return recovered
}

// logRecovered logs that the pool is no longer degraded. Call it without
// p.mu.
func (p *Pool[W]) logRecovered() {
	p.log.Info("pool: recovered: the constructor succeeded again")
}

// armReaperLocked schedules the reaper for when the idle worker that has
// waited longest reaches IdleTTL, unless it is scheduled already.
func (p *Pool[W]) armReaperLocked() {
	if p.reaper != nil || p.closed {
		return
	}
	d := p.ttl
	if e := p.idle.front(); e != nil && e.since != 0 {
		d = time.Duration(e.since + int64(p.ttl) - p.now())
	}
	p.wg.Add(1)
	p.reaper = time.AfterFunc(max(d, 0), p.reap)
}

// reap closes the overflow workers that have been idle for IdleTTL, oldest
// first, and schedules itself again while overflow workers remain idle.
func (p *Pool[W]) reap() {
	defer p.wg.Done()
	var victims []W
	p.mu.Lock()
	p.reaper = nil
	now := p.now()
	for !p.closed && p.live-len(victims) > p.size && p.idle.n > 0 {
		e := p.idle.front()
		if e.since == 0 {
			e.since = now // went idle before overflow existed: give it a full TTL
		}
		if now-e.since < int64(p.ttl) {
			break
		}
		victims = append(victims, p.idle.popFront().w)
	}
	p.closing += len(victims)
	if !p.closed && p.live-len(victims) > p.size && p.idle.n > 0 {
		p.armReaperLocked()
	}
	p.drainCheckLocked()
	p.unlock()
	for _, w := range victims {
		if err := p.finishClose(w, false); err != nil {
			p.log.Warn("pool: closing an idle overflow worker failed", "err", err)
		}
	}
}
