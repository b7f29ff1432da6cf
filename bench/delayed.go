package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// The delayed fire-and-forget workload: ffProducers goroutines send n
// no-op messages between them, each for delivery at a random moment within
// delayedSpan of its send (Disker's WithDelay, asynq's ProcessIn), to one
// queue served by ffHandlers concurrent handlers. The timed region starts
// when the producers start and ends when the last message has been handled,
// so it lasts at least as long as the sends plus about delayedSpan.

// delayedSpan bounds the delay of each message of the delayed workload.
const delayedSpan = time.Second

func delayedImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameDisker, run: func(ctx context.Context, s *redisServer) (sample, error) { return delayedDisker(ctx, s, n) }},
		{name: "asynq", run: func(ctx context.Context, s *redisServer) (sample, error) { return runAsynq(ctx, s, n, randomDelay) }},
	}
}

// randomDelay is a delay in [1ms, delayedSpan).
func randomDelay() time.Duration {
	return time.Millisecond + time.Duration(rand.Int64N(int64(delayedSpan-time.Millisecond)))
}

func delayedDisker(ctx context.Context, s *redisServer, n int) (sample, error) {
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		cd, h := countingHandler(n)
		if err := worker.Handle("bench-delayed", h, disker.WithConcurrency(ffHandlers)); err != nil {
			return sample{}, err
		}
		errc := make(chan error, 1)
		return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
			return produce(ctx, n, errc, func(ctx context.Context) error {
				_, err := dispatcher.Send(ctx, disker.Message{Receiver: "bench-delayed", Content: payload}, disker.WithDelay(randomDelay()))
				return err
			})
		})
	})
}

// delayedTable renders the delayed fire-and-forget workload.
func delayedTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: delayed fire-and-forget, %d producers, %d handlers, %s no-op messages each due within %v of its send",
			ffProducers, ffHandlers, thousands(int64(n)), delayedSpan),
		Notes: []string{"Timed from the first send until the last message was handled, so a run lasts at least the sends " +
			"plus about the longest delay. Disker: Send with WithDelay; asynq: Enqueue with ProcessIn, with " +
			"TaskCheckInterval 10 ms and DelayedTaskCheckInterval 100 ms (defaults 1 s and 5 s)."},
		Header: []string{"implementation", "msgs/s, median (min–max)", "wall s", "× Disker time", "redis CPU µs/msg", "Go CPU µs/msg"},
	}
	ref := series(res[nameDisker], opsPerSec).med
	for _, im := range delayedImpls(n) {
		tp := series(res[im.name], opsPerSec)
		t.Rows = append(t.Rows, []string{im.name, fmtStat(tp),
			fmt.Sprintf("%.2f", series(res[im.name], wallMS).med/1e3), fmtRatio(ref, tp.med),
			fmtNum(series(res[im.name], serverCPUPerOp).med), fmtNum(series(res[im.name], clientCPUPerOp).med)})
	}
	return t
}
