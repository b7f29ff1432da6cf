package pool

import (
	"context"
	"fmt"
	"sync"
	"testing"
)

// BenchmarkCheckout measures a checkout+release round trip of a Pool against
// the floor of a buffered channel holding the same number of workers
// (receive a worker, send it back), at 1, 8 and 64 goroutines over 4 and 64
// workers. ns/op is per round trip. "pool-ctx" and "chan-ctx" use a context
// that can be cancelled, as most callers have, so that a caller that must
// wait selects on it. waits/op is the share of checkouts that had to queue.
func BenchmarkCheckout(b *testing.B) {
	for _, workers := range []int{4, 64} {
		for _, goroutines := range []int{1, 8, 64} {
			name := fmt.Sprintf("workers=%d/goroutines=%d", workers, goroutines)
			b.Run(name+"/chan", func(b *testing.B) {
				ch := make(chan int, workers)
				for i := range workers {
					ch <- i
				}
				b.ReportAllocs()
				runSplit(b, goroutines, func() {
					w := <-ch
					ch <- w
				})
			})
			b.Run(name+"/chan-ctx", func(b *testing.B) {
				ch := make(chan int, workers)
				for i := range workers {
					ch <- i
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				b.ReportAllocs()
				runSplit(b, goroutines, func() {
					select {
					case w := <-ch:
						ch <- w
					case <-ctx.Done():
					}
				})
			})
			for _, impl := range []string{"pool", "pool-ctx"} {
				b.Run(name+"/"+impl, func(b *testing.B) {
					p, err := New(Config[int]{
						Size:  workers,
						Eager: true,
						New:   func(context.Context) (int, error) { return 0, nil },
					})
					if err != nil {
						b.Fatal(err)
					}
					defer p.Close(context.Background())
					ctx := context.Background()
					if impl == "pool-ctx" {
						var cancel context.CancelFunc
						ctx, cancel = context.WithCancel(ctx)
						defer cancel()
					}
					b.ReportAllocs()
					runSplit(b, goroutines, func() {
						l, err := p.Checkout(ctx)
						if err != nil {
							b.Error(err)
							return
						}
						l.Release()
					})
					s := p.Stats()
					b.ReportMetric(float64(s.Waits)/float64(s.Checkouts), "waits/op")
				})
			}
		}
	}
}

// runSplit runs op b.N times in all, shared among g goroutines, and
// reports the work counts of measureWork.
func runSplit(b *testing.B, g int, op func()) {
	measureWork(b, func() { split(b.N, g, op) })
}

// split runs op n times in all, shared among g goroutines.
func split(n, g int, op func()) {
	var wg sync.WaitGroup
	for i := range g {
		per := n / g
		if i < n%g {
			per++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range per {
				op()
			}
		}()
	}
	wg.Wait()
}
