package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/diskerhq/disker"
)

// The streamed request workload: one requester at a time asks a handler
// that sends streamParts partial replies of payload and then replies,
// with RequestStream; beside it the plain Request round trip of the same
// handler's reply alone. The stream's sample counts partials (ops) and
// the latency percentiles are those of the time to the first partial; the
// plain one's are those of the round trip.

// streamParts is the number of partial replies of each streamed request.
const streamParts = 100

// streamImpls are the rows of the streamed request workload.
func streamImpls(n int) []redisImpl {
	return []redisImpl{
		{name: "Request (no stream)", run: func(ctx context.Context, s *redisServer) (sample, error) { return streamDisker(ctx, s, n, false) }},
		{name: fmt.Sprintf("RequestStream, %d partials", streamParts), run: func(ctx context.Context, s *redisServer) (sample, error) {
			return streamDisker(ctx, s, n, true)
		}},
	}
}

// streamDisker runs n requests one after another, streamed or plain.
func streamDisker(ctx context.Context, s *redisServer, n int, stream bool) (sample, error) {
	return withDiskerPair(s, func(requester, worker *disker.Disker) (sample, error) {
		h := disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			if m.Streamed() {
				for range streamParts {
					if err := m.Partial(ctx, payload); err != nil {
						return nil, err
					}
				}
			}
			return payload, nil
		})
		if err := worker.Handle("bench-stream", h, disker.WithConcurrency(rrWorkers)); err != nil {
			return sample{}, err
		}
		ctx, cancel := context.WithTimeout(ctx, runLimit)
		defer cancel()
		lat := make([]time.Duration, 0, n)
		parts := 0
		t0 := time.Now()
		for range n {
			rctx, rcancel := context.WithTimeout(ctx, rrTimeout)
			t := time.Now()
			var err error
			if stream {
				first := true
				for p, perr := range requester.RequestStream(rctx, disker.Message{Receiver: "bench-stream", Content: payload}) {
					switch {
					case perr != nil:
						err = perr
					case p.Reply == nil:
						if first {
							lat, first = append(lat, time.Since(t)), false
						}
						parts++
					}
				}
				if err == nil && first {
					err = fmt.Errorf("bench: a stream without partials")
				}
			} else {
				_, err = requester.Request(rctx, disker.Message{Receiver: "bench-stream", Content: payload})
				lat = append(lat, time.Since(t))
			}
			rcancel()
			if err != nil {
				return sample{}, err
			}
		}
		smp := sample{elapsed: time.Since(t0), ops: n}
		if stream {
			smp.ops = parts
		}
		smp.p50, smp.p99 = percentiles(lat)
		return smp, nil
	})
}

// streamTable renders the streamed request workload.
func streamTable(res map[string][]sample, n int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over Redis: streamed requests, %s one at a time, %d partials each", thousands(int64(n)), streamParts),
		Notes: []string{fmt.Sprintf("One requester, one request at a time, to a handler (concurrency %d) that sends %d partial replies "+
			"of the %d-byte payload with Message.Partial, then its reply; beside it the plain Request round trip of the same "+
			"handler (no partials). For the stream, the rate is partials per second and the latencies are the time from the "+
			"call to the first partial; for Request, round trips per second and the round trip.", rrWorkers, streamParts, len(payload))},
		Header: []string{"implementation", "ops/s, median (min–max)", "p50 µs", "p99 µs", "redis CPU µs/op", "Go CPU µs/op"},
	}
	for _, im := range streamImpls(n) {
		ss := res[im.name]
		t.Rows = append(t.Rows, []string{im.name, fmtStat(series(ss, opsPerSec)),
			fmtNum(series(ss, p50).med), fmtNum(series(ss, p99).med),
			fmtNum(series(ss, serverCPUPerOp).med), fmtNum(series(ss, clientCPUPerOp).med)})
	}
	return t
}
