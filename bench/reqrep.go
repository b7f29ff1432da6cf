package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The request/reply workload: R requesters share n round trips, each a
// request with a 5 s timeout that waits for its reply, served by rrWorkers
// concurrent handlers that echo the content. Every round trip's latency is
// recorded; the timed region runs from the first request to the last reply.

const (
	rrWorkers = 32
	rrTimeout = 5 * time.Second
)

// errRequestTimeout is a bare request that got no reply within rrTimeout.
var errRequestTimeout = errors.New("bench: request timed out")

// requestFunc performs one round trip.
type requestFunc func(ctx context.Context) error

// runRequests runs n round trips from r requesters and measures them.
func runRequests(ctx context.Context, n, r int, req requestFunc) (sample, error) {
	ctx, cancel := context.WithTimeout(ctx, runLimit)
	defer cancel()
	lat := make([][]time.Duration, r)
	errs := make(chan error, r)
	var wg sync.WaitGroup
	wg.Add(r)
	t0 := time.Now()
	for i := range r {
		k := n / r
		if i < n%r {
			k++
		}
		go func() {
			defer wg.Done()
			ds := make([]time.Duration, 0, k)
			for range k {
				t := time.Now()
				if err := req(ctx); err != nil {
					errs <- err
					cancel()
					return
				}
				ds = append(ds, time.Since(t))
			}
			lat[i] = ds
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return sample{}, err
	}
	var all []time.Duration
	for _, ds := range lat {
		all = append(all, ds...)
	}
	s := sample{elapsed: elapsed, ops: len(all)}
	s.p50, s.p99 = percentiles(all)
	return s, nil
}

func rrImpls(n, r int) []redisImpl {
	return []redisImpl{
		{name: nameDisker, run: func(ctx context.Context, s *redisServer) (sample, error) { return rrDisker(ctx, s, n, r) }},
		{name: "bare lists, go-redis", run: func(ctx context.Context, s *redisServer) (sample, error) { return rrGoRedis(ctx, s, n, r) }},
		{name: "bare lists, rueidis", run: func(ctx context.Context, s *redisServer) (sample, error) { return rrRueidis(ctx, s, n, r) }},
	}
}

// The bare request/reply: a requester LPUSHes "replyKey|content" to the
// request list and BRPOPs its unique reply key with the timeout; a worker
// BRPOPs the request list and LPUSHes the content to the reply key.

var replySeq atomic.Int64

func newReplyKey() string { return "reply:" + strconv.FormatInt(replySeq.Add(1), 10) }

func splitRequest(v string) (key, content string, err error) {
	key, content, ok := strings.Cut(v, "|")
	if !ok {
		return "", "", fmt.Errorf("bench: malformed request %q", v)
	}
	return key, content, nil
}

func rrGoRedis(ctx context.Context, s *redisServer, n, r int) (sample, error) {
	rdb := redis.NewClient(&redis.Options{Addr: s.addr, PoolSize: 2 * (rrWorkers + r)})
	defer rdb.Close()
	var workers sync.WaitGroup
	workers.Add(rrWorkers)
	for range rrWorkers {
		go func() {
			defer workers.Done()
			for {
				v, err := rdb.BRPop(ctx, 0, "rq").Result()
				if err != nil || v[1] == stopWord {
					return
				}
				key, content, err := splitRequest(v[1])
				if err != nil {
					return
				}
				if rdb.LPush(ctx, key, content).Err() != nil {
					return
				}
			}
		}()
	}
	smp, err := runRequests(ctx, n, r, func(ctx context.Context) error {
		key := newReplyKey()
		if err := rdb.LPush(ctx, "rq", key+"|"+string(payload)).Err(); err != nil {
			return err
		}
		v, err := rdb.BRPop(ctx, rrTimeout, key).Result()
		if errors.Is(err, redis.Nil) {
			return errRequestTimeout
		}
		if err != nil {
			return err
		}
		if v[1] != string(payload) {
			return fmt.Errorf("bench: wrong reply %q", v[1])
		}
		return nil
	})
	for range rrWorkers {
		if err := rdb.LPush(ctx, "rq", stopWord).Err(); err != nil {
			return smp, err
		}
	}
	workers.Wait()
	return smp, err
}

func rrRueidis(ctx context.Context, s *redisServer, n, r int) (sample, error) {
	c, err := newBareRueidis(s)
	if err != nil {
		return sample{}, err
	}
	defer c.Close()
	var workers sync.WaitGroup
	workers.Add(rrWorkers)
	for range rrWorkers {
		go func() {
			defer workers.Done()
			for {
				v, err := c.Do(ctx, c.B().Brpop().Key("rq").Timeout(0).Build()).AsStrSlice()
				if err != nil || len(v) != 2 || v[1] == stopWord {
					return
				}
				key, content, err := splitRequest(v[1])
				if err != nil {
					return
				}
				if c.Do(ctx, c.B().Lpush().Key(key).Element(content).Build()).Error() != nil {
					return
				}
			}
		}()
	}
	smp, err := runRequests(ctx, n, r, func(ctx context.Context) error {
		key := newReplyKey()
		if err := c.Do(ctx, c.B().Lpush().Key("rq").Element(key+"|"+string(payload)).Build()).Error(); err != nil {
			return err
		}
		v, err := c.Do(ctx, c.B().Brpop().Key(key).Timeout(rrTimeout.Seconds()).Build()).AsStrSlice()
		if rueidis.IsRedisNil(err) {
			return errRequestTimeout
		}
		if err != nil {
			return err
		}
		if len(v) != 2 || v[1] != string(payload) {
			return fmt.Errorf("bench: wrong reply %q", v)
		}
		return nil
	})
	for range rrWorkers {
		if err := c.Do(ctx, c.B().Lpush().Key("rq").Element(stopWord).Build()).Error(); err != nil {
			return smp, err
		}
	}
	workers.Wait()
	return smp, err
}
