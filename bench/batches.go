package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// The batches workload: what a batch (NewBatch, Batch.Send, Seal) costs
// per child against a plain fire-and-forget send and against a send with
// the retention a child gets (the retention workload's sends, with 24 h),
// and how long a completion takes to start. ffProducers producers send n messages between them to ffHandlers
// handlers, timed from the first send until the last message was handled;
// in the batch row the batches are sent one after another, batchChildren
// children each, and sealed once every Send of theirs returned.
//
// A completion's latency is measured from the later of the last child's
// handler return and the Seal call's return to the start of the
// completion's handler: the child's acknowledgement, its retained result,
// its report to the batch and the completion's delivery.

// batchChildren is the number of children of each batch.
const batchChildren = 1000

// Names of the batches workload's rows.
const (
	nameBatchesPlain    = "Send (no retention)"
	nameBatchesRetained = "Send WithRetention(24h)"
	nameBatchesChildren = "Batch.Send, 1,000 children a batch"
)

func batchesImpls(n int) []redisImpl {
	return []redisImpl{
		{name: nameBatchesPlain, run: func(ctx context.Context, s *redisServer) (sample, error) { return retentionSends(ctx, s, n, 0) }},
		{name: nameBatchesRetained, run: func(ctx context.Context, s *redisServer) (sample, error) {
			return retentionSends(ctx, s, n, disker.DefaultBatchRetention)
		}},
		{name: nameBatchesChildren, run: func(ctx context.Context, s *redisServer) (sample, error) { return batchesRun(ctx, s, n) }},
	}
}

// batchTimes are the times of one batch that its completion's latency is
// measured from and to.
type batchTimes struct {
	lastChild, sealed, completion time.Time
}

// batchesRun sends n messages as children of batches of batchChildren
// (fewer when n is smaller), one batch after another, and measures each
// completion's latency. A child's content is its batch's number, as long
// as the plain rows' payload.
func batchesRun(ctx context.Context, s *redisServer, n int) (sample, error) {
	size := min(batchChildren, n)
	nb := n / size
	n = nb * size
	return withDiskerPair(s, func(dispatcher, worker *disker.Disker) (sample, error) {
		var mu sync.Mutex
		times := make([]batchTimes, nb)
		cd := newCountdown(n)
		child := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			i, err := strconv.Atoi(string(m.Content))
			if err != nil || i < 0 || i >= nb {
				return nil, disker.NoRetry(fmt.Errorf("bench: a child of no batch: %q", m.Content))
			}
			now := time.Now()
			mu.Lock()
			if now.After(times[i].lastChild) {
				times[i].lastChild = now
			}
			mu.Unlock()
			cd.add()
			return nil, nil
		})
		done := newCountdown(nb)
		completion := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			now := time.Now()
			i, err := strconv.Atoi(string(m.Content))
			if err != nil || i < 0 || i >= nb {
				return nil, disker.NoRetry(fmt.Errorf("bench: a completion of no batch: %q", m.Content))
			}
			mu.Lock()
			first := times[i].completion.IsZero()
			if first {
				times[i].completion = now
			}
			mu.Unlock()
			if first {
				done.add()
			}
			return nil, nil
		})
		if err := worker.Handle("bench-bt", child, disker.WithConcurrency(ffHandlers)); err != nil {
			return sample{}, err
		}
		if err := worker.Handle("bench-bt-done", completion); err != nil {
			return sample{}, err
		}
		errc := make(chan error, 1)
		// The sends run on a context of their own: the timed run ends when
		// the last child was handled, which may come before the last Seal
		// returned (a child is handled before its Send returns), and its
		// end cancels the context it gives start.
		sendCtx, sendCancel := context.WithTimeout(ctx, runLimit)
		defer sendCancel()
		smp, err := timedRun(ctx, n, cd, errc, func(context.Context) *sync.WaitGroup {
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := sendBatches(sendCtx, dispatcher, nb, size, times, &mu); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}()
			return &wg
		})
		if err != nil {
			return smp, err
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := done.wait(wctx, errc); err != nil {
			return smp, fmt.Errorf("bench: completions: %w", err)
		}
		lat := make([]time.Duration, nb)
		for i, bt := range times {
			from := bt.lastChild
			if bt.sealed.After(from) {
				from = bt.sealed
			}
			lat[i] = bt.completion.Sub(from)
		}
		smp.p50, smp.p99 = percentiles(lat)
		return smp, nil
	})
}

// sendBatches sends nb batches of size children, one after another: each
// created, its children sent by ffProducers producers, then sealed; the
// Seal call's return goes to times.
func sendBatches(ctx context.Context, d *disker.Disker, nb, size int, times []batchTimes, mu *sync.Mutex) error {
	for i := range nb {
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "bench-bt-done", Content: []byte(strconv.Itoa(i))}})
		if err != nil {
			return err
		}
		content := []byte(fmt.Sprintf("%0*d", len(payload), i))
		errc := make(chan error, 1)
		produce(ctx, size, errc, func(ctx context.Context) error {
			_, err := b.Send(ctx, disker.Message{Receiver: "bench-bt", Content: content})
			return err
		}).Wait()
		select {
		case err := <-errc:
			return err
		default:
		}
		if _, err := b.Seal(ctx); err != nil {
			return err
		}
		now := time.Now()
		mu.Lock()
		times[i].sealed = now
		mu.Unlock()
	}
	return nil
}

// batchesTable renders the batches workload.
func batchesTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: batches of %s children, %d producers, %d handlers, %s no-op messages",
			thousands(int64(min(batchChildren, n))), ffProducers, ffHandlers, thousands(int64(n))),
		Notes: []string{"Timed from the first send until the last message was handled. \"× plain\" is the plain Send's " +
			"throughput over the row's (above 1 means the row is slower). A child is sent with the batch's retention " +
			"(24 h): the second row is that retention alone. Before its send, each child is registered with its batch " +
			"(one batch_add script per Send); its settlement writes its outcome to its receiver's batch outbox, then the " +
			"settling instance hands its own entry to the batch (an HGET, a batch_report script, an HDEL); the batch row's " +
			"CPU and commands include " +
			"its batches' creation, seal and completion. \"Redis commands/msg\" is INFO commandstats' calls per message (the " +
			"commands a script runs counted apart from the script). The completion's latency runs from the later of the " +
			"last child's handler return and the Seal call's return to the start of the completion's handler."},
		Header: []string{"sends", "msgs/s, median (min–max)", "× plain", "redis CPU µs/msg", "Go CPU µs/msg", "Redis commands/msg",
			"completion p50 µs", "completion p99 µs"},
	}
	ref := series(res[nameBatchesPlain], opsPerSec).med
	for _, im := range batchesImpls(n) {
		ss := res[im.name]
		row := append(rateRow(im.name, ss, fmt.Sprintf("%.2f", ref/series(ss, opsPerSec).med)), fmtNum(series(ss, commandsPerOp).med))
		if im.name == nameBatchesChildren {
			row = append(row, fmtNum(series(ss, p50).med), fmtNum(series(ss, p99).med))
		} else {
			row = append(row, "–", "–")
		}
		t.Rows = append(t.Rows, row)
	}
	return t
}
