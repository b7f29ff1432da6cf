package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The fire-and-forget workload: ffProducers goroutines send n no-op messages
// between them to one queue served by ffHandlers concurrent handlers. The
// timed region starts when the producers start and ends when the last message
// has been handled; clients, servers and handlers are set up before it and
// shut down after it.

const (
	ffProducers = 8
	ffHandlers  = 32
	nameDisker  = "disker"
	// ffBatch is how many messages a producer sends per call in the
	// batched rows (Disker's SendBatch, one LPUSH of many elements).
	ffBatch = 100
)

// payload is the content of every message: 16 bytes.
var payload = []byte("0123456789abcdef")

// stopWord tells a bare consumer to exit. It is pushed once per consumer
// after every message has been handled.
const stopWord = "stop"

// countdown closes done when n events have been counted.
type countdown struct {
	n    int64
	c    atomic.Int64
	done chan struct{}
}

func newCountdown(n int) *countdown { return &countdown{n: int64(n), done: make(chan struct{})} }

func (c *countdown) add() {
	if c.c.Add(1) == c.n {
		close(c.done)
	}
}

// wait waits until every event was counted, the context ends, or errc
// reports an error.
func (c *countdown) wait(ctx context.Context, errc <-chan error) error {
	select {
	case <-c.done:
		return nil
	case err := <-errc:
		return err
	case <-ctx.Done():
		return fmt.Errorf("bench: %d of %d handled: %w", c.c.Load(), c.n, ctx.Err())
	}
}

// produce runs ffProducers goroutines that call send n times between them.
// It returns at once; errors go to errc.
func produce(ctx context.Context, n int, errc chan<- error, send func(context.Context) error) *sync.WaitGroup {
	return produceBy(ctx, ffProducers, n, errc, send)
}

// produceBy is produce with the given number of producers.
func produceBy(ctx context.Context, producers, n int, errc chan<- error, send func(context.Context) error) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(producers)
	for p := range producers {
		k := n / producers
		if p < n%producers {
			k++
		}
		go func() {
			defer wg.Done()
			for range k {
				if err := send(ctx); err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
			}
		}()
	}
	return &wg
}

// redisImpl is one contender in a Redis workload: run performs one complete
// run against the server at addr.
type redisImpl struct {
	name string
	run  func(ctx context.Context, s *redisServer) (sample, error)
	// server, when set, returns the row's own server (a peer's:
	// nats-server, PostgreSQL), which the run measures instead of the
	// workload's redis-server; an error wrapping errNotRun says why the
	// row cannot run here.
	server func() (serverProbe, error)
	// peers is set for a peer's row: a run of it that fails is the row's
	// failure, not the suite's (runRedisWorkload leaves the row out, its
	// table says why, and the workload goes on with the other rows).
	peers *peers
}

func ffImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameDisker, run: func(ctx context.Context, s *redisServer) (sample, error) { return ffDisker(ctx, s, n) }},
		{name: "asynq", run: func(ctx context.Context, s *redisServer) (sample, error) { return ffAsynq(ctx, s, n) }},
		{name: "bare list, go-redis", run: func(ctx context.Context, s *redisServer) (sample, error) { return ffGoRedis(ctx, s, n) }},
		{name: "bare list, rueidis", run: func(ctx context.Context, s *redisServer) (sample, error) { return ffRueidis(ctx, s, n) }},
		{name: nameDiskerBatch, run: func(ctx context.Context, s *redisServer) (sample, error) { return ffDiskerBatch(ctx, s, n) }},
		{name: nameBareBatch, run: func(ctx context.Context, s *redisServer) (sample, error) { return ffRueidisBatch(ctx, s, n) }},
		{name: namePingCeiling, run: func(ctx context.Context, s *redisServer) (sample, error) { return ffPingCeiling(ctx, s, n) }},
	}
}

// Names of the batched fire-and-forget rows: not the targets' workload (the
// producers send 100 messages per call), shown for what batching gives.
const (
	nameDiskerBatch = "disker, SendBatch of 100, prefetch 32"
	nameBareBatch   = "bare list, rueidis, LPUSH of 100"
	namePingCeiling = "ceiling: PING per message, rueidis, no queue"
)

// ffPingCeiling measures the most that ffProducers callers can do when each
// waits for one Redis reply per message: they send PING, the cheapest
// command, through rueidis's pipeline, and nothing consumes anything. No
// producer that waits for Redis to accept each message before it sends the
// next can beat it on the same machine.
func ffPingCeiling(ctx context.Context, s *redisServer, n int) (sample, error) {
	return ffPingCeilingBy(ctx, s, n, ffProducers)
}

// ffPingCeilingBy is ffPingCeiling with the given number of producers.
func ffPingCeilingBy(ctx context.Context, s *redisServer, n, producers int) (sample, error) {
	c, err := newBareRueidis(s)
	if err != nil {
		return sample{}, err
	}
	defer c.Close()
	cd := newCountdown(n)
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produceBy(ctx, producers, n, errc, func(ctx context.Context) error {
			if err := c.Do(ctx, c.B().Ping().Build()).Error(); err != nil {
				return err
			}
			cd.add()
			return nil
		})
	})
}

// newBareRueidis returns the rueidis client of the bare floors: defaults,
// no client-side cache.
func newBareRueidis(s *redisServer) (rueidis.Client, error) {
	return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.addr}, DisableCache: true})
}

// timedRun times from start until cd has counted everything.
func timedRun(ctx context.Context, n int, cd *countdown, errc chan error, start func(context.Context) *sync.WaitGroup) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	t0 := time.Now()
	wg := start(ctx)
	err := cd.wait(ctx, errc)
	elapsed := time.Since(t0)
	cancel()
	wg.Wait()
	return sample{elapsed: elapsed, ops: n}, err
}

// runLimit bounds one run of a Redis workload, so that a stuck run fails
// instead of hanging the whole benchmark.
const runLimit = 3 * time.Minute

func ffAsynq(ctx context.Context, s *redisServer, n int) (sample, error) {
	return runAsynq(ctx, s, n, nil)
}

// runAsynq runs the fire-and-forget workload on asynq; with delay, each
// task is enqueued with asynq.ProcessIn(delay()), and asynq moves due
// scheduled tasks to the queue every 100 ms (DelayedTaskCheckInterval,
// default 5 s).
func runAsynq(ctx context.Context, s *redisServer, n int, delay func() time.Duration) (sample, error) {
	opt := asynq.RedisClientOpt{Addr: s.addr}
	cd := newCountdown(n)
	cfg := asynq.Config{
		Concurrency: ffHandlers,
		LogLevel:    asynq.WarnLevel,
		// asynq polls an empty queue every TaskCheckInterval (default 1 s).
		// A short interval keeps its idle wait at the start out of the
		// measurement, to its advantage.
		TaskCheckInterval: 10 * time.Millisecond,
	}
	if delay != nil {
		cfg.DelayedTaskCheckInterval = 100 * time.Millisecond
	}
	srv := asynq.NewServer(opt, cfg)
	mux := asynq.NewServeMux()
	mux.HandleFunc("noop", func(context.Context, *asynq.Task) error {
		cd.add()
		return nil
	})
	if err := srv.Start(mux); err != nil {
		return sample{}, err
	}
	defer srv.Shutdown()
	client := asynq.NewClient(opt)
	defer client.Close()
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			var opts []asynq.Option
			if delay != nil {
				opts = append(opts, asynq.ProcessIn(delay()))
			}
			_, err := client.EnqueueContext(ctx, asynq.NewTask("noop", payload), opts...)
			return err
		})
	})
}

func ffGoRedis(ctx context.Context, s *redisServer, n int) (sample, error) {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2 * (ffProducers + ffHandlers)})
	defer rdb.Close()
	cd := newCountdown(n)
	errc := make(chan error, 1)
	var consumers sync.WaitGroup
	consumers.Add(ffHandlers)
	for range ffHandlers {
		go func() {
			defer consumers.Done()
			for {
				r, err := rdb.BRPop(ctx, 0, "q").Result()
				if err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
				if r[1] == stopWord {
					return
				}
				cd.add()
			}
		}()
	}
	smp, err := timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			return rdb.LPush(ctx, "q", payload).Err()
		})
	})
	for range ffHandlers {
		if err := rdb.LPush(ctx, "q", stopWord).Err(); err != nil {
			return smp, err
		}
	}
	consumers.Wait()
	return smp, err
}

func ffRueidis(ctx context.Context, s *redisServer, n int) (sample, error) {
	return ffRueidisWith(ctx, s, n, 1, ffProducers)
}

// ffRueidisBatch is ffRueidis with producers that push ffBatch elements per
// LPUSH; the consumers still pop one at a time.
func ffRueidisBatch(ctx context.Context, s *redisServer, n int) (sample, error) {
	return ffRueidisWith(ctx, s, n, ffBatch, ffProducers)
}

// ffRueidisWith runs the bare list queue with the given number of
// producers that push batch elements per LPUSH. n must be a multiple of
// batch.
func ffRueidisWith(ctx context.Context, s *redisServer, n, batch, producers int) (sample, error) {
	c, err := newBareRueidis(s)
	if err != nil {
		return sample{}, err
	}
	defer c.Close()
	cd := newCountdown(n)
	errc := make(chan error, 1)
	var consumers sync.WaitGroup
	consumers.Add(ffHandlers)
	for range ffHandlers {
		go func() {
			defer consumers.Done()
			for {
				r, err := c.Do(ctx, c.B().Brpop().Key("q").Timeout(0).Build()).AsStrSlice()
				if err != nil {
					select {
					case errc <- err:
					default:
					}
					return
				}
				if len(r) != 2 {
					select {
					case errc <- errors.New("bench: BRPOP: unexpected reply"):
					default:
					}
					return
				}
				if r[1] == stopWord {
					return
				}
				cd.add()
			}
		}()
	}
	smp, err := timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		elems := make([]string, batch)
		for i := range elems {
			elems[i] = string(payload)
		}
		return produceBy(ctx, producers, n/batch, errc, func(ctx context.Context) error {
			return c.Do(ctx, c.B().Lpush().Key("q").Element(elems...).Build()).Error()
		})
	})
	for range ffHandlers {
		if err := c.Do(ctx, c.B().Lpush().Key("q").Element(stopWord).Build()).Error(); err != nil {
			return smp, err
		}
	}
	consumers.Wait()
	return smp, err
}
