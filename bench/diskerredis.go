package bench

import (
	"context"
	"fmt"
	"sync"

	"github.com/diskerhq/disker"
)

// Disker over Redis: one instance sends (the dispatcher), another serves the
// receiver (the worker), as two processes would; both live in this process.

func newDiskerPair(s *redisServer) (dispatcher, worker *disker.Disker, err error) {
	dispatcher, err = disker.New(disker.Config{RedisURL: s.url()})
	if err != nil {
		return nil, nil, err
	}
	worker, err = disker.New(disker.Config{RedisURL: s.url()})
	if err != nil {
		dispatcher.Close(context.Background())
		return nil, nil, err
	}
	return dispatcher, worker, nil
}

func closeDiskers(ds ...*disker.Disker) error {
	var first error
	for _, d := range ds {
		if err := d.Close(context.Background()); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func ffDisker(ctx context.Context, s *redisServer, n int) (smp sample, err error) {
	dispatcher, worker, err := newDiskerPair(s)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(worker, dispatcher); err == nil {
			err = cerr
		}
	}()
	cd := newCountdown(n)
	h := disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
		cd.add()
		return nil, nil
	})
	if err := worker.Handle("bench-ff", h, disker.WithConcurrency(ffHandlers)); err != nil {
		return sample{}, err
	}
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			_, err := dispatcher.Send(ctx, disker.Message{Receiver: "bench-ff", Content: payload}, disker.WithFireAndForget())
			return err
		})
	})
}

func rrDisker(ctx context.Context, s *redisServer, n, r int) (smp sample, err error) {
	requester, worker, err := newDiskerPair(s)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(worker, requester); err == nil {
			err = cerr
		}
	}()
	echo := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		return m.Content, nil
	})
	if err := worker.Handle("bench-rr", echo, disker.WithConcurrency(rrWorkers)); err != nil {
		return sample{}, err
	}
	return runRequests(ctx, n, r, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, rrTimeout)
		defer cancel()
		reply, err := requester.Request(ctx, "bench-rr", payload)
		if err != nil {
			return err
		}
		if string(reply.Content) != string(payload) {
			return fmt.Errorf("bench: wrong reply %q", reply.Content)
		}
		return nil
	})
}
