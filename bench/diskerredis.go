package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// Disker over Redis: one instance sends (the dispatcher), another serves the
// receiver (the worker), as two processes would; both live in this process.

// closeGrace bounds how long closing a Disker instance may take.
const closeGrace = 30 * time.Second

func newDiskerPair(s *redisServer) (dispatcher, worker *disker.Disker, err error) {
	return newDiskerPairAt(s.url())
}

// newDiskerPairAt is newDiskerPair for the Redis (server or Cluster) at url.
func newDiskerPairAt(url string) (dispatcher, worker *disker.Disker, err error) {
	dispatcher, err = disker.New(context.Background(), disker.Config{RedisURL: url})
	if err != nil {
		return nil, nil, err
	}
	worker, err = disker.New(context.Background(), disker.Config{RedisURL: url})
	if err != nil {
		_ = closeDiskers(dispatcher)
		return nil, nil, err
	}
	return dispatcher, worker, nil
}

// withDiskerPair runs f with a new dispatcher and worker on s
// (newDiskerPair) and closes them after it; a failure to close is its
// error when f had none.
func withDiskerPair(s *redisServer, f func(dispatcher, worker *disker.Disker) (sample, error)) (smp sample, err error) {
	dispatcher, worker, err := newDiskerPair(s)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(worker, dispatcher); err == nil {
			err = cerr
		}
	}()
	return f(dispatcher, worker)
}

// closeDiskers closes the instances, giving each at most closeGrace to
// drain, so that a stuck Close fails the run instead of hanging it.
func closeDiskers(ds ...*disker.Disker) error {
	var first error
	for _, d := range ds {
		ctx, cancel := context.WithTimeout(context.Background(), closeGrace)
		err := d.Close(ctx)
		cancel()
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

func ffDisker(ctx context.Context, s *redisServer, n int) (sample, error) {
	return ffDiskerWith(ctx, s, n, 1, ffProducers)
}

// ffDiskerBatch is ffDisker with producers that send ffBatch messages per
// SendBatch call, and a worker that prefetches up to ffHandlers messages
// beyond its free handler slots (WithPrefetch), as a bulk load would.
func ffDiskerBatch(ctx context.Context, s *redisServer, n int) (sample, error) {
	return ffDiskerWith(ctx, s, n, ffBatch, ffProducers)
}

// ffDiskerWith runs the fire-and-forget workload with the given number of
// producers that send batch messages per call (Send for 1, SendBatch
// above). n must be a multiple of batch.
func ffDiskerWith(ctx context.Context, s *redisServer, n, batch, producers int) (sample, error) {
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		cd, h := countingHandler(n)
		opts := []disker.HandleOption{disker.WithConcurrency(ffHandlers)}
		if batch > 1 {
			opts = append(opts, disker.WithPrefetch(ffHandlers))
		}
		if err := worker.Handle("bench-ff", h, opts...); err != nil {
			return sample{}, err
		}
		errc := make(chan error, 1)
		return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
			if batch > 1 {
				msgs := make([]disker.Message, batch)
				for i := range msgs {
					msgs[i] = disker.Message{Receiver: "bench-ff", Content: payload}
				}
				return produceBy(ctx, producers, n/batch, errc, func(ctx context.Context) error {
					_, err := dispatcher.SendBatch(ctx, msgs)
					return err
				})
			}
			return produceBy(ctx, producers, n, errc, func(ctx context.Context) error {
				_, err := dispatcher.Send(ctx, disker.Message{Receiver: "bench-ff", Content: payload})
				return err
			})
		})
	})
}

func rrDisker(ctx context.Context, s *redisServer, n, r int) (sample, error) {
	return withDiskerPair(s, func(requester, worker *disker.Disker) (sample, error) {
		echo := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			return m.Content, nil
		})
		if err := worker.Handle("bench-rr", echo, disker.WithConcurrency(rrWorkers)); err != nil {
			return sample{}, err
		}
		return runRequests(ctx, n, r, func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, rrTimeout)
			defer cancel()
			reply, err := requester.Request(ctx, disker.Message{Receiver: "bench-rr", Content: payload})
			if err != nil {
				return err
			}
			if string(reply.Content) != string(payload) {
				return fmt.Errorf("bench: wrong reply %q", reply.Content)
			}
			return nil
		})
	})
}

// countingHandler returns a countdown of n and a no-op Disker handler that
// counts each message it handles on it.
func countingHandler(n int) (*countdown, disker.Handler) {
	cd := newCountdown(n)
	return cd, disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		cd.add()
		return nil, nil
	})
}
