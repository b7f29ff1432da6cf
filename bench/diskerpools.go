package bench

import (
	"context"
	"sync/atomic"

	"github.com/diskerhq/disker/pool"
)

// Disker's in-process pools, as the executor and checkout workloads use them.

// runDiskerExecutor runs the tasks on a pool.Executor with MaxWorkers c and
// no queue (the default): Submit waits for a free worker; Close drains.
func runDiskerExecutor(n, c int, task func()) error {
	return runDiskerExecutorQueue(n, c, 0, task)
}

// diskerQueueSize is the bounded queue of the second Disker row: pond and
// gammazero/workerpool queue without bound by default, so the submitter
// never waits for a worker; a bounded queue is Disker's way to the same.
const diskerQueueSize = 1024

// runDiskerExecutorQueued runs the tasks on a pool.Executor with MaxWorkers
// c and a queue of diskerQueueSize: Submit waits only when the queue is full.
func runDiskerExecutorQueued(n, c int, task func()) error {
	return runDiskerExecutorQueue(n, c, diskerQueueSize, task)
}

func runDiskerExecutorQueue(n, c, queue int, task func()) error {
	ctx := context.Background()
	e, err := pool.NewExecutor(pool.ExecutorConfig{MaxWorkers: c, QueueSize: queue})
	if err != nil {
		return err
	}
	for range n {
		if err := e.Submit(ctx, task); err != nil {
			return err
		}
	}
	return e.Close(ctx)
}

// buildDiskerPool builds a pool.Pool of size permanent workers, made before
// it returns (Eager).
func buildDiskerPool(size int) (func(context.Context) error, func(), error) {
	var next atomic.Int64
	p, err := pool.New(pool.Config[*worker]{
		Size:  size,
		Eager: true,
		New: func(context.Context) (*worker, error) {
			return &worker{id: int(next.Add(1))}, nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	op := func(ctx context.Context) error {
		l, err := p.Checkout(ctx)
		if err != nil {
			return err
		}
		return l.Release()
	}
	return op, func() { _ = p.Close(context.Background()) }, nil
}
