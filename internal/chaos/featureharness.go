package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// The harness's part of the features: it pauses and resumes recvPaused
// while the faults run, and starts again the workers that crashed by
// themselves (FaultCrashWorker).

// Lengths of the pauses of recvPaused, and of the spells between them.
const (
	pauseRunMin, pauseRunMax   = time.Second, 4 * time.Second
	pauseHoldMin, pauseHoldMax = time.Second, 3 * time.Second
)

// pauseCallTimeout bounds each Pause and Resume of the harness;
// resumeGiveUp bounds the tries of a Resume.
const (
	pauseCallTimeout = 5 * time.Second
	resumeGiveUp     = 2 * time.Minute
)

// startPauser starts pausing and resuming recvPaused, at random (seeded
// apart from the faults), through a connection of its own straight to
// Redis; the function it returns stops it and returns once the receiver
// is resumed.
func (h *harness) startPauser() func() {
	return background(h.pauseLoop)
}

// background runs f in a goroutine of its own; the function it returns
// cancels f's context and returns once f returned (at once when called
// again).
func background(f func(ctx context.Context)) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	return sync.OnceFunc(func() {
		cancel()
		<-done
	})
}

func (h *harness) pauseLoop(ctx context.Context) {
	d, err := newDisker(ProcConfig{Name: "pauser", RedisURL: h.be.adminURL}, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos: the pauser cannot connect: %v\n", err)
		return
	}
	defer d.Close(context.Background())
	rng := rand.New(rand.NewPCG(h.opts.Seed, 0x7061757365))
	for {
		sleepCtx(ctx, between(rng, pauseRunMin, pauseRunMax))
		if ctx.Err() != nil {
			return
		}
		// A Pause that failed may have paused the receiver all the same:
		// it is resumed in any case.
		h.pauseCall(d, KindPause)
		sleepCtx(ctx, between(rng, pauseHoldMin, pauseHoldMax))
		h.resumeUntilDone(d)
	}
}

// between returns a random duration in [lo, hi).
func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// pauseCall pauses (KindPause) or resumes (KindResume) recvPaused once,
// records the call, and reports whether it succeeded.
func (h *harness) pauseCall(d *disker.Disker, kind string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), pauseCallTimeout)
	defer cancel()
	call := d.Pause
	if kind == KindResume {
		call = d.Resume
	}
	begin := time.Now().UnixNano()
	err := call(ctx, recvPaused)
	e := Event{T: begin, Kind: kind, Receiver: recvPaused, Result: ResultOK, End: time.Now().UnixNano()}
	if err != nil {
		e.Result, e.Err = ResultError, err.Error()
	}
	h.rec.Record(e)
	return err == nil
}

// resumeUntilDone resumes recvPaused, trying again while Redis fails, for
// up to resumeGiveUp.
func (h *harness) resumeUntilDone(d *disker.Disker) {
	deadline := time.Now().Add(resumeGiveUp)
	for !h.pauseCall(d, KindResume) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // a retry pace, not a wait for an event
	}
}

// superviseWorkers starts the next generation of a worker that exited by
// itself (not under a fault of the harness), until the function it
// returns is called.
func (h *harness) superviseWorkers() func() {
	return background(func(ctx context.Context) {
		every(ctx, 100*time.Millisecond, func() {
			for _, s := range h.slots {
				if s.role == "worker" && h.takeExited(s) {
					if err := h.spawn(s); err != nil {
						fmt.Fprintf(os.Stderr, "chaos: restart %s: %v\n", s.name, err)
					}
					h.release(s)
				}
			}
		})
	})
}

// every calls f every period until ctx ends.
func every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}

// takeExited marks s busy, as a fault does, when its process exited and
// no fault holds it.
func (h *harness) takeExited(s *slot) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s.busy {
		return false
	}
	select {
	case <-s.done:
		s.busy = true
		return true
	default:
		return false
	}
}

// release ends what takeExited began.
func (h *harness) release(s *slot) {
	h.mu.Lock()
	s.busy = false
	h.mu.Unlock()
}
