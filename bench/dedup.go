package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker"
)

// The dedup workload: what a send with WithDedupKey costs against a plain
// Send. ffProducers producers send n messages between them to a receiver
// that nobody serves, timed from the first send to the last answer:
// plain sends, sends whose keys are all new (each is queued: the cost of
// the check and the key), sends whose keys are all taken (each is a
// duplicate: the cost of the check alone), and combined sends, deferred,
// urgent and with a new key each (the options composed in one step).
const (
	nameDedupPlain    = "Send (no key)"
	nameDedupNew      = "Send WithDedupKey, every key new"
	nameDedupDup      = "Send WithDedupKey, every key taken"
	nameDedupCombined = "Send WithDelay + WithPriority + WithDedupKey, every key new"
)

func dedupImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameDedupPlain, run: func(ctx context.Context, s *redisServer) (sample, error) { return dedupSends(ctx, s, n, "") }},
		{name: nameDedupNew, run: func(ctx context.Context, s *redisServer) (sample, error) { return dedupSends(ctx, s, n, "new") }},
		{name: nameDedupDup, run: func(ctx context.Context, s *redisServer) (sample, error) { return dedupSends(ctx, s, n, "taken") }},
		{name: nameDedupCombined, run: func(ctx context.Context, s *redisServer) (sample, error) { return dedupSends(ctx, s, n, "combined") }},
	}
}

// dedupSends sends n messages from ffProducers producers: without a key
// (keys ""), each with a key of its own ("new"), each with one of 100
// keys sent once before the clock starts ("taken"), or each with a key of
// its own, deferred by an hour and at the high level ("combined").
func dedupSends(ctx context.Context, s *redisServer, n int, keys string) (smp sample, err error) {
	d, err := disker.New(context.Background(), disker.Config{RedisURL: s.url()})
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(d); err == nil {
			err = cerr
		}
	}()
	const taken = 100
	msg := disker.Message{Receiver: "bench-dedup", Content: payload}
	if keys == "taken" {
		for i := range taken {
			if _, err := d.Send(ctx, msg, disker.WithDedupKey("k"+strconv.Itoa(i), time.Hour)); err != nil {
				return sample{}, err
			}
		}
	}
	var seq atomic.Int64
	cd := newCountdown(n)
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(ctx context.Context) error {
			i := seq.Add(1)
			var err error
			switch keys {
			case "":
				_, err = d.Send(ctx, msg)
			case "new":
				_, err = d.Send(ctx, msg, disker.WithDedupKey("n"+strconv.FormatInt(i, 10), time.Hour))
			case "combined":
				_, err = d.Send(ctx, msg, disker.WithDelay(time.Hour), disker.WithPriority(disker.PriorityHigh),
					disker.WithDedupKey("c"+strconv.FormatInt(i, 10), time.Hour))
			default:
				_, err = d.Send(ctx, msg, disker.WithDedupKey("k"+strconv.FormatInt(i%taken, 10), time.Hour))
				if errors.Is(err, disker.ErrDuplicate) {
					err = nil
				} else if err == nil {
					err = fmt.Errorf("bench: a send with a taken key was queued")
				}
			}
			if err == nil {
				cd.add()
			}
			return err
		})
	})
}

// dedupTable renders the dedup workload.
func dedupTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: dedup sends, %d producers, %s sends", ffProducers, thousands(int64(n))),
		Notes: []string{"Sends only (nobody serves the receiver), timed from the first send until the last returned. " +
			"\"× plain\" is the plain Send's throughput over the row's (above 1 means the row is slower). " +
			"\"every key new\" queues each message and takes its key (script enqueue: GET, SET PX, XADD); " +
			"\"every key taken\" queues nothing (the script's GET answers); " +
			"the combined send defers each message an hour at the high level with a key of its own (script enqueue: GET, SET PX, ZADD, HSET; " +
			"an INCR of the reclaim epoch after it, for the level)."},
		Header: []string{"sends", "sends/s, median (min–max)", "× plain", "redis CPU µs/send", "Go CPU µs/send"},
	}
	ref := series(res[nameDedupPlain], opsPerSec).med
	for _, im := range dedupImpls(n) {
		t.Rows = append(t.Rows, rateRow(im.name, res[im.name], fmt.Sprintf("%.2f", ref/series(res[im.name], opsPerSec).med)))
	}
	return t
}
