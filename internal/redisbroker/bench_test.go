package redisbroker

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// BenchmarkFireAndForget moves b.N messages through one receiver: 32
// senders, 4 consumers that fetch up to 64 at a time and ack each batch in
// one call.
func BenchmarkFireAndForget(b *testing.B) {
	br := newBroker(b)
	ctx := context.Background()
	content := make([]byte, 100)
	var received atomic.Int64
	done := make(chan struct{})
	var consumers sync.WaitGroup
	for c := range 4 {
		consumers.Add(1)
		go func() {
			defer consumers.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				ds, err := br.Fetch(ctx, &broker.FetchParams{Receiver: "bench", Consumer: fmt.Sprint("c", c), Max: 64, Block: 50 * time.Millisecond, Lease: time.Minute, MaxAttempts: 0})
				if err != nil {
					b.Error(err)
					return
				}
				if len(ds) == 0 {
					continue
				}
				refs := make([]string, len(ds))
				for i, d := range ds {
					refs[i] = d.Ref
				}
				if err := br.Ack(ctx, "bench", refs...); err != nil {
					b.Error(err)
					return
				}
				if received.Add(int64(len(ds))) >= int64(b.N) {
					select {
					case <-done:
					default:
						close(done)
					}
				}
			}
		}()
	}
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var senders sync.WaitGroup
	for range 32 {
		senders.Add(1)
		go func() {
			defer senders.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				if _, err := sendEnv(ctx, br, &broker.Envelope{ID: fmt.Sprint(i), Receiver: "bench", Content: content, Route: broker.RouteNone}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	senders.Wait()
	<-done
	consumers.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkRequestReply runs b.N timed requests from 32 requesters; 4
// workers fetch, reply (timed) and ack; one reader routes replies back.
func BenchmarkRequestReply(b *testing.B) {
	br := newBroker(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waiting sync.Map // request id -> chan struct{}
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				ds, err := br.Fetch(ctx, &broker.FetchParams{Receiver: "svc", Consumer: fmt.Sprint("w", c), Max: 64, Block: 50 * time.Millisecond, Lease: time.Minute, MaxAttempts: 0})
				if err != nil {
					return
				}
				refs := make([]string, len(ds))
				var rw sync.WaitGroup
				for i, d := range ds {
					refs[i] = d.Ref
					rw.Add(1)
					go func() {
						defer rw.Done()
						rep := &broker.Envelope{ID: "r" + d.Env.ID, Receiver: d.Env.Sender, InReplyTo: d.Env.ID, Content: d.Env.Content}
						if err := br.Reply(ctx, rep, broker.ReplyTimed); err != nil && ctx.Err() == nil {
							b.Error(err)
						}
					}()
				}
				rw.Wait()
				if len(refs) > 0 {
					_ = br.Ack(ctx, "svc", refs...)
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			rs, err := br.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "client", Consumer: "reader", Max: 256, Block: 50 * time.Millisecond, Lease: time.Minute})
			if err != nil {
				return
			}
			refs := make([]string, len(rs))
			for i, r := range rs {
				refs[i] = r.Ref
				if ch, ok := waiting.LoadAndDelete(r.RequestID); ok {
					close(ch.(chan struct{}))
				}
			}
			if len(refs) > 0 {
				_ = br.AckReplies(ctx, "client", refs...)
			}
		}
	}()
	content := make([]byte, 100)
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var requesters sync.WaitGroup
	for range 32 {
		requesters.Add(1)
		go func() {
			defer requesters.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				id := fmt.Sprint("q", i)
				ch := make(chan struct{})
				waiting.Store(id, ch)
				if _, err := sendEnv(ctx, br, &broker.Envelope{ID: id, Sender: "client", Receiver: "svc", Content: content, Timeout: time.Minute, Route: broker.RouteSender}); err != nil {
					b.Error(err)
					return
				}
				<-ch
			}
		}()
	}
	requesters.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "reqs/s")
	b.StopTimer()
	cancel()
	wg.Wait()
}

// BenchmarkFetchOne measures one consumer that fetches one message at a
// time and acks it, from a backlog of b.N messages at the normal level:
// "plain" with no other level in use (a fetch is one XREADGROUP), "levels"
// with one message parked at the low level the whole time (every fetch
// runs the fetch script, which serves the levels in order).
func BenchmarkFetchOne(b *testing.B) {
	for _, mode := range []string{"plain", "levels"} {
		b.Run(mode, func(b *testing.B) {
			br := newBroker(b)
			ctx := context.Background()
			r := "bench-one-" + mode
			if mode == "levels" {
				env := &broker.Envelope{ID: "parked", Receiver: r, Content: []byte("x"), Priority: broker.PriorityLow}
				if _, err := sendEnv(ctx, br, env); err != nil {
					b.Fatal(err)
				}
			}
			envs := make([]*broker.Envelope, b.N)
			for i := range envs {
				envs[i] = &broker.Envelope{ID: fmt.Sprint("m", i), Receiver: r, Content: make([]byte, 100)}
			}
			for i := 0; i < len(envs); i += 1000 {
				if _, err := sendEnvs(ctx, br, envs[i:min(i+1000, len(envs))]); err != nil {
					b.Fatal(err)
				}
			}
			p := broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Block: 50 * time.Millisecond, Lease: time.Minute}
			b.ResetTimer()
			for got := 0; got < b.N; {
				ds, err := br.Fetch(ctx, &p)
				if err != nil {
					b.Fatal(err)
				}
				for _, d := range ds {
					if d.Env.Priority != broker.PriorityNormal {
						b.Fatalf("fetched the parked low message before %d normal ones", b.N-got)
					}
					if err := br.Ack(ctx, r, d.Ref); err != nil {
						b.Fatal(err)
					}
					got++
				}
			}
		})
	}
}
