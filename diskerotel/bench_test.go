package diskerotel_test

import (
	"context"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/diskerotel"
	"github.com/diskerhq/disker/internal/redistest"
)

// benchTracer returns a Tracer whose spans go through the SDK's batch
// processor to an exporter that drops them: what tracing costs a process,
// without the network.
func benchTracer(b *testing.B) *diskerotel.Tracer {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return diskerotel.New(diskerotel.WithTracerProvider(tp))
}

// cpuTime returns the CPU time (user and system) the process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time of the whole process per op since start
// as cpu-ns/op: on a loaded machine it varies less than the wall time,
// which counts the waits for a CPU, and it counts the work of every
// goroutine (the span processor's, the broker client's).
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

var echo = disker.HandlerFunc(func(ctx context.Context, msg *disker.Message) ([]byte, error) { return msg.Content, nil })

// BenchmarkHandler measures what a traced handler call costs beyond the
// handler: extracting the trace context from the headers, and starting
// and ending the handle span.
func BenchmarkHandler(b *testing.B) {
	tr := benchTracer(b)
	msg := &disker.Message{ID: "m1", Receiver: "jobs", Attempt: 1, Content: []byte("x"),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	for _, c := range []struct {
		name string
		h    disker.Handler
	}{{"off", echo}, {"on", tr.Handler(echo)}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			start := cpuTime(b)
			for b.Loop() {
				if _, err := c.h.Handle(ctx, msg); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, start)
		})
	}
}

// BenchmarkRequest measures a Request's round trip through a real
// redis-server to a handler and back, with tracing off (plain Request and
// handler) and on (Tracer.Request, Tracer.Handler, Tracer.Observe).
func BenchmarkRequest(b *testing.B) {
	srv, stop := redistest.MustStart()
	defer stop()
	for _, traced := range []bool{false, true} {
		name := "off"
		if traced {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			cfg := disker.Config{RedisURL: srv.URL(), KeyPrefix: "bench-" + name, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))}
			var tr *diskerotel.Tracer
			h := disker.Handler(echo)
			if traced {
				tr = benchTracer(b)
				cfg.OnEvent = tr.Observe
				h = tr.Handler(echo)
			}
			d, err := disker.New(context.Background(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer d.Close(context.Background())
			if err := d.Handle("echo", h, disker.WithConcurrency(64)); err != nil {
				b.Fatal(err)
			}
			content := []byte("hello")
			b.ReportAllocs()
			b.SetParallelism(16)
			start := cpuTime(b)
			defer reportCPU(b, start)
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					var err error
					if traced {
						_, err = tr.Request(ctx, d, disker.Message{Receiver: "echo", Content: content})
					} else {
						_, err = d.Request(ctx, disker.Message{Receiver: "echo", Content: content})
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
