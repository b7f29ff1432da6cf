package bench

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// The retention workload: what WithRetention costs a fire-and-forget send
// against a plain one, and the Redis memory each retained result takes.
// ffProducers producers send n messages between them to ffHandlers
// handlers, timed from the first send until the last message was handled.
const (
	nameRetainPlain = "Send (no retention)"
	nameRetainHour  = "Send WithRetention(1h)"
)

func retentionImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameRetainPlain, run: func(ctx context.Context, s *redisServer) (sample, error) { return retentionSends(ctx, s, n, 0) }},
		{name: nameRetainHour, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return retentionSends(ctx, s, n, time.Hour)
		}},
	}
}

// retentionSends sends n fire-and-forget messages, with retention ret
// (0: none), to a worker that handles them. With a retention, once every
// result is recorded, it sets the sample's redisBytes to Redis's
// used_memory growth per message.
func retentionSends(ctx context.Context, s *redisServer, n int, ret time.Duration) (sample, error) {
	mem0, err := s.infoInt("memory", "used_memory")
	if err != nil {
		return sample{}, err
	}
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		cd, h := countingHandler(n)
		if err := worker.Handle("bench-ret", h, disker.WithConcurrency(ffHandlers)); err != nil {
			return sample{}, err
		}
		var opts []disker.SendOption
		if ret > 0 {
			opts = append(opts, disker.WithRetention(ret))
		}
		errc := make(chan error, 1)
		smp, err := timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
			return produce(ctx, n, errc, func(ctx context.Context) error {
				_, err := dispatcher.Send(ctx, disker.Message{Receiver: "bench-ret", Content: payload}, opts...)
				return err
			})
		})
		if err != nil || ret == 0 {
			return smp, err
		}
		// The results are recorded as the deliveries are acknowledged,
		// just after their handlers return.
		deadline := time.Now().Add(time.Minute)
		for {
			got, err := s.do("ZCARD disker:{bench-ret}:res", ":")
			if err != nil {
				return smp, err
			}
			if c, _ := strconv.Atoi(strings.TrimPrefix(got, ":")); c >= n {
				break
			}
			if time.Now().After(deadline) {
				return smp, fmt.Errorf("bench: %s of %d results recorded after a minute", got, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
		mem1, err := s.infoInt("memory", "used_memory")
		if err != nil {
			return smp, err
		}
		smp.redisBytes = float64(mem1-mem0) / float64(n)
		return smp, nil
	})
}

// retentionTable renders the retention workload.
func retentionTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: fire-and-forget with a retention, %d producers, %d handlers, %s no-op messages",
			ffProducers, ffHandlers, thousands(int64(n))),
		Notes: []string{"Timed from the first send until the last message was handled. \"× plain\" is the plain Send's " +
			"throughput over the row's (above 1 means the row is slower). A send with a retention runs the enqueue script " +
			"(XADD and the record's HSET, PEXPIRE) instead of a plain XADD, its worker one result_start script at each " +
			"start, and one result_finish script (XACK, ZREM, XDEL and the final record, its index and size) instead of a " +
			"share of a batched acknowledgement. \"Redis bytes/msg\" is used_memory's growth per message once every " +
			"result is recorded (the queue's entries are deleted: what stays is the results)."},
		Header: []string{"sends", "msgs/s, median (min–max)", "× plain", "redis CPU µs/msg", "Go CPU µs/msg", "Redis bytes/msg"},
	}
	ref := series(res[nameRetainPlain], opsPerSec).med
	for _, im := range retentionImpls(n) {
		row := rateRow(im.name, res[im.name], fmt.Sprintf("%.2f", ref/series(res[im.name], opsPerSec).med))
		mem := "–"
		if im.name == nameRetainHour {
			mem = fmt.Sprintf("%.0f", series(res[im.name], func(s sample) float64 { return s.redisBytes }).med)
		}
		t.Rows = append(t.Rows, append(row, mem))
	}
	return t
}
