package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// The batch workload: a backlog of n no-op fire-and-forget messages,
// queued before the worker starts, handled one message per handler call
// (Handle) or batchSize messages per call (HandleBatch). The CPU of
// queueing the backlog is not counted: each row's CPU is that of handling
// it, from the worker's start until the last message was handled.

// batchSize is the batch size of the HandleBatch rows.
const batchSize = 100

// Names of the batch workload's rows.
const (
	nameBatchPerMessage = "Handle, 32 handlers, WithPrefetch(32)"
	nameBatch1          = "HandleBatch(100), 1 batch at a time"
	nameBatch4          = "HandleBatch(100), 4 batches at a time"
)

func batchImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameBatchPerMessage, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return batchRun(ctx, s, n, 0, disker.WithConcurrency(ffHandlers), disker.WithPrefetch(ffHandlers))
		}},
		{name: nameBatch1, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return batchRun(ctx, s, n, batchSize)
		}},
		{name: nameBatch4, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return batchRun(ctx, s, n, batchSize, disker.WithConcurrency(4))
		}},
	}
}

// batchRun queues n messages, then serves them with a counting no-op
// handler, a Handler when size is 0 and a BatchHandler of size otherwise,
// and times it until every message was handled. The sample's setup CPU is
// the queueing's.
func batchRun(ctx context.Context, s *redisServer, n, size int, opts ...disker.HandleOption) (sample, error) {
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		return batchServe(ctx, s, dispatcher, worker, n, size, opts)
	})
}

// batchServe is batchRun's, on dispatcher and worker.
func batchServe(ctx context.Context, s *redisServer, dispatcher, worker *disker.Disker, n, size int, opts []disker.HandleOption) (smp sample, err error) {
	server0, client0, err := cpuNow(s)
	if err != nil {
		return sample{}, err
	}
	msgs := make([]disker.Message, min(n, 10_000))
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: "bench-batch", Content: payload}
	}
	for sent := 0; sent < n; sent += len(msgs) {
		if _, err := dispatcher.SendBatch(ctx, msgs[:min(len(msgs), n-sent)]); err != nil {
			return sample{}, err
		}
	}
	server1, client1, err := cpuNow(s)
	if err != nil {
		return sample{}, err
	}
	smp.setupServerCPU, smp.setupClientCPU = server1-server0, client1-client0
	cd, h := countingHandler(n)
	t0 := time.Now()
	if size == 0 {
		err = worker.Handle("bench-batch", h, opts...)
	} else {
		err = worker.HandleBatch("bench-batch", disker.BatchHandlerFunc(func(ctx context.Context, msgs []*disker.Message) ([]disker.Outcome, error) {
			for range msgs {
				cd.add()
			}
			return make([]disker.Outcome, len(msgs)), nil
		}), append(opts, disker.WithBatchSize(size))...)
	}
	if err != nil {
		return sample{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	err = cd.wait(rctx, nil)
	smp.elapsed, smp.ops = time.Since(t0), n
	return smp, err
}

// cpuNow returns the CPU time s and this process have used so far.
func cpuNow(s *redisServer) (server, client time.Duration, err error) {
	server, err = s.cpu()
	return server, processCPU(), err
}

// batchTable renders the batch workload.
func batchTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: %s queued no-op messages, handled one at a time or in batches of %d", thousands(int64(n)), batchSize),
		Notes: []string{"Timed from the worker's start until the last message was handled; the CPU columns count the " +
			"same span (queueing the backlog, with SendBatch, is left out of them). \"× per message\" is the row's " +
			"throughput over the first row's."},
		Header: []string{"handler", "msgs/s, median (min–max)", "× per message", "redis CPU µs/msg", "Go CPU µs/msg"},
	}
	ref := series(res[nameBatchPerMessage], opsPerSec).med
	for _, im := range batchImpls(n) {
		t.Rows = append(t.Rows, rateRow(im.name, res[im.name], fmt.Sprintf("%.2f", series(res[im.name], opsPerSec).med/ref)))
	}
	return t
}
