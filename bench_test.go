package disker_test

import (
	"context"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// benchBackends are the brokers the benchmarks run against: the embedded
// broker, the private redis-server and the private Redis Cluster of the
// package. Intervals are the defaults.
func benchBackends(b *testing.B, f func(b *testing.B, cfg disker.Config)) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			name := "bench" + strconv.FormatInt(benchRuns.Add(1), 10)
			cfg := disker.Config{RedisURL: "mem://" + name, Logger: testLogger()}
			if be.redis {
				cfg.RedisURL, cfg.KeyPrefix = be.redisURL(b), name
			}
			f(b, cfg)
		})
	}
}

var benchRuns atomic.Int64

func openBench(b *testing.B, cfg disker.Config) *disker.Disker {
	d, err := disker.New(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = d.Close(context.Background()) })
	return d
}

// BenchmarkSendHandle: fire-and-forget messages end to end, 8 producers and
// 32 no-op handlers; msgs/s counts handled messages.
func BenchmarkSendHandle(b *testing.B) {
	benchBackends(b, func(b *testing.B, cfg disker.Config) {
		worker, producer := openBench(b, cfg), openBench(b, cfg)
		var handled atomic.Int64
		done := make(chan struct{})
		target := int64(b.N)
		if err := worker.Handle("bench", disker.HandlerFunc(func(context.Context, *disker.Message) ([]byte, error) {
			if handled.Add(1) == target {
				close(done)
			}
			return nil, nil
		}), disker.WithConcurrency(32)); err != nil {
			b.Fatal(err)
		}
		content := make([]byte, 64)
		ctx := context.Background()
		b.SetParallelism(4) // 8 producers on 2 cores
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := producer.Send(ctx, disker.Message{Receiver: "bench", Content: content}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		<-done
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
	})
}

// BenchmarkRequest: request/reply round trips with 32 concurrent requesters
// and 32 no-op handlers; reqs/s counts replies.
func BenchmarkRequest(b *testing.B) {
	benchBackends(b, func(b *testing.B, cfg disker.Config) {
		worker, client := openBench(b, cfg), openBench(b, cfg)
		if err := worker.Handle("bench", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			return m.Content, nil
		}), disker.WithConcurrency(32)); err != nil {
			b.Fatal(err)
		}
		content := make([]byte, 64)
		b.SetParallelism(16) // 32 requesters on 2 cores
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := client.Request(ctx, disker.Message{Receiver: "bench", Content: content})
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reqs/s")
	})
}

// BenchmarkRequestLatency: one requester at a time; ns/op is the round
// trip's mean and p50-ms its median.
func BenchmarkRequestLatency(b *testing.B) {
	benchBackends(b, func(b *testing.B, cfg disker.Config) {
		worker, client := openBench(b, cfg), openBench(b, cfg)
		if err := worker.Handle("bench", disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
			return m.Content, nil
		})); err != nil {
			b.Fatal(err)
		}
		content := make([]byte, 64)
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			t0 := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := client.Request(ctx, disker.Message{Receiver: "bench", Content: content})
			cancel()
			if err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(t0))
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	})
}
