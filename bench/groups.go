package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/diskerhq/disker"
)

// The groups workload: the fire-and-forget workload (ffProducers
// producers, ffHandlers handlers, no-op messages) with each message sent
// WithGroup, its messages spread over 1,000 keys or all of one key, each
// key run one message at a time (the default group concurrency), against
// plain messages in the same run. None of the peers in the harness has
// per-key order in its free edition (BullMQ Pro groups, River Pro
// sequences and Oban Pro are paid; asynq's groups aggregate tasks into
// batches), so the table compares Disker with itself.
const (
	nameGroupsPlain = "Send (no key)"
	nameGroups1000  = "Send WithGroup, 1,000 keys"
	nameGroups1     = "Send WithGroup, 1 key"
)

func groupsImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameGroupsPlain, run: func(ctx context.Context, s *redisServer) (sample, error) { return groupsDisker(ctx, s, n, 0) }},
		{name: nameGroups1000, run: func(ctx context.Context, s *redisServer) (sample, error) { return groupsDisker(ctx, s, n, 1000) }},
		// One key runs its messages one after the other: a tenth of them
		// measures its rate.
		{name: nameGroups1, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return groupsDisker(ctx, s, max(n/10, 1), 1)
		}},
	}
}

// groupsDisker sends n messages over keys keys (0: no key), round robin,
// to a receiver served with ffHandlers handlers, timed from the first send
// until the last message was handled.
func groupsDisker(ctx context.Context, s *redisServer, n, keys int) (sample, error) {
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		cd, h := countingHandler(n)
		if err := worker.Handle("bench-groups", h, disker.WithConcurrency(ffHandlers)); err != nil {
			return sample{}, err
		}
		names := make([]disker.SendOption, keys)
		for i := range names {
			names[i] = disker.WithGroup("k" + strconv.Itoa(i))
		}
		var seq atomic.Int64
		errc := make(chan error, 1)
		return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
			return produce(ctx, n, errc, func(ctx context.Context) error {
				msg := disker.Message{Receiver: "bench-groups", Content: payload}
				if keys == 0 {
					_, err := dispatcher.Send(ctx, msg)
					return err
				}
				_, err := dispatcher.Send(ctx, msg, names[seq.Add(1)%int64(keys)])
				return err
			})
		})
	})
}

// groupsTable renders the groups workload.
func groupsTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: keyed fire-and-forget, %d producers, %d handlers, %s no-op messages",
			ffProducers, ffHandlers, thousands(int64(n))),
		Notes: []string{"Timed from the first send until the last message was handled. Each key runs one message at a time " +
			"(WithGroupConcurrency 1): with 1,000 keys the handlers stay busy; with one key the messages run one after the other, " +
			"each settled before the next is queued, so the row measures the round trips of a strict sequence (it sends a tenth of the messages). " +
			"\"× plain\" is the plain row's throughput over the row's (above 1: slower). " +
			"No peer in the harness has per-key order in its free edition (BullMQ Pro groups, River Pro sequences are paid; " +
			"asynq's groups aggregate tasks into batches): Disker is compared with itself."},
		Header: []string{"sends", "msgs/s, median (min–max)", "× plain", "redis CPU µs/msg", "Go CPU µs/msg"},
	}
	ref := series(res[nameGroupsPlain], opsPerSec).med
	for _, im := range groupsImpls(n) {
		tp := series(res[im.name], opsPerSec)
		t.Rows = append(t.Rows, []string{im.name, fmtStat(tp), fmt.Sprintf("%.2f", ref/tp.med),
			fmtNum(series(res[im.name], serverCPUPerOp).med), fmtNum(series(res[im.name], clientCPUPerOp).med)})
	}
	return t
}
