package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/diskerhq/disker"
)

// The flow limits workload: a backlog of messages, queued before the
// worker starts, handled by a handler that takes about 1 ms (jittered).
// One row is a receiver with WithRateLimit (does it reach its limit?), the
// others compare WithGlobalConcurrency(5) with WithConcurrency(5).

const (
	limitsRate      = 500 // the rate limit's messages per second
	limitsBurst     = 25  // its burst
	limitsSlots     = 5   // the concurrency compared
	limitsInstances = 3   // instances of the global concurrency row with several
)

// Names of the flow limits rows.
const (
	nameRate         = "WithRateLimit(500, 25), 1 instance × 32"
	nameConcurrency5 = "WithConcurrency(5), 1 instance"
	nameGlobal5      = "WithGlobalConcurrency(5), 1 instance × 16"
	nameGlobal5x3    = "WithGlobalConcurrency(5), 3 instances × 16"
)

func limitsImpls(n int) []redisImpl {
	rate := []disker.HandleOption{disker.WithConcurrency(32), disker.WithRateLimit(limitsRate, limitsBurst)}
	return []redisImpl{
		{name: nameRate, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return limitsRun(ctx, s, n, 1, rate)
		}},
		{name: nameConcurrency5, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return limitsRun(ctx, s, n, 1, []disker.HandleOption{disker.WithConcurrency(limitsSlots)})
		}},
		{name: nameGlobal5, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return limitsRun(ctx, s, n, 1, []disker.HandleOption{disker.WithConcurrency(16), disker.WithGlobalConcurrency(limitsSlots)})
		}},
		{name: nameGlobal5x3, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return limitsRun(ctx, s, n, limitsInstances, []disker.HandleOption{disker.WithConcurrency(16), disker.WithGlobalConcurrency(limitsSlots)})
		}},
	}
}

// limitsRun queues n messages, then starts instances workers serving them
// with opts, and times them until every message was handled.
func limitsRun(ctx context.Context, s *redisServer, n, instances int, opts []disker.HandleOption) (smp sample, err error) {
	dispatcher, err := disker.New(ctx, disker.Config{RedisURL: s.url()})
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(dispatcher); err == nil {
			err = cerr
		}
	}()
	msgs := make([]disker.Message, n)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "bench-limits", Content: payload}
	}
	if _, err := dispatcher.SendBatch(ctx, msgs); err != nil {
		return sample{}, err
	}
	cd := newCountdown(n)
	h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		time.Sleep(time.Duration(500+rand.IntN(1000)) * time.Microsecond)
		cd.add()
		return nil, nil
	})
	var workers []*disker.Disker
	defer func() {
		if cerr := closeDiskers(workers...); err == nil {
			err = cerr
		}
	}()
	t0 := time.Now()
	for range instances {
		w, err := disker.New(ctx, disker.Config{RedisURL: s.url()})
		if err != nil {
			return sample{}, err
		}
		workers = append(workers, w)
		if err := w.Handle("bench-limits", h, opts...); err != nil {
			return sample{}, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	err = cd.wait(rctx, nil)
	return sample{elapsed: time.Since(t0), ops: n}, err
}

// limitsTable renders the flow limits workload.
func limitsTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: flow limits, %s queued messages, a handler of 0.5–1.5 ms", thousands(int64(n))),
		Notes: []string{"Timed from the workers' start until the last message was handled. The rate-limited receiver " +
			fmt.Sprintf("is limited to %d/s with bursts of %d; \"of the limit\" is its rate over that. ", limitsRate, limitsBurst) +
			"The global concurrency rows hold their 5 slots in Redis (taken before each fetch); \"× WithConcurrency(5)\" " +
			"is their throughput over that of 5 local slots on one instance."},
		Header: []string{"receiver", "msgs/s, median (min–max)", "of the limit", "× WithConcurrency(5)", "redis CPU µs/msg", "Go CPU µs/msg"},
	}
	local := series(res[nameConcurrency5], opsPerSec).med
	for _, im := range limitsImpls(n) {
		tp := series(res[im.name], opsPerSec)
		of, vs := "–", "–" // not applicable to the row
		if im.name == nameRate {
			of = fmt.Sprintf("%.0f%%", 100*tp.med/limitsRate)
		} else if local > 0 {
			vs = fmt.Sprintf("%.2f", tp.med/local)
		}
		t.Rows = append(t.Rows, []string{im.name, fmtStat(tp), of, vs,
			fmtNum(series(res[im.name], serverCPUPerOp).med), fmtNum(series(res[im.name], clientCPUPerOp).med)})
	}
	return t
}
