package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/puddle/v2"
)

// The checkout workload: G goroutines each repeat checkout-then-release on a
// pool of N workers until the run's operations are spent. The pools are built
// and filled before the timed region; ns/op is the wall time divided by all
// round trips of all goroutines.

// worker is the pooled resource: a small struct, as a connection handle would be.
type worker struct{ id int }

// checkoutImpl builds a pool of size workers and returns the round trip to
// time and a cleanup.
type checkoutImpl struct {
	name  string
	build func(size int) (op func(ctx context.Context) error, cleanup func(), err error)
}

const (
	nameDiskerPool = "disker pool.Pool"
	nameChanFloor  = "buffered channel (floor)"
)

func checkoutImpls() []checkoutImpl {
	return []checkoutImpl{
		{name: nameDiskerPool, build: buildDiskerPool},
		{name: "puddle v2", build: buildPuddle},
		{name: nameChanFloor, build: buildChan},
	}
}

// buildChan is the floor: a channel of capacity size holding the workers;
// receive is checkout, send is release.
func buildChan(size int) (func(context.Context) error, func(), error) {
	ch := make(chan *worker, size)
	for i := range size {
		ch <- &worker{id: i}
	}
	return func(context.Context) error {
		w := <-ch
		ch <- w
		return nil
	}, func() {}, nil
}

func buildPuddle(size int) (func(context.Context) error, func(), error) {
	var next atomic.Int64
	p, err := puddle.NewPool(&puddle.Config[*worker]{
		Constructor: func(context.Context) (*worker, error) { return &worker{id: int(next.Add(1))}, nil },
		Destructor:  func(*worker) {},
		MaxSize:     int32(size),
	})
	if err != nil {
		return nil, nil, err
	}
	for range size {
		if err := p.CreateResource(context.Background()); err != nil {
			p.Close()
			return nil, nil, err
		}
	}
	return func(ctx context.Context) error {
		r, err := p.Acquire(ctx)
		if err != nil {
			return err
		}
		r.Release()
		return nil
	}, p.Close, nil
}

// CheckoutSuite runs checkout+release round trips at 1, 8 and 64 goroutines
// over pools of 4 and 64 workers.
func CheckoutSuite(ctx context.Context, o Options) ([]Table, error) {
	ops := 1_000_000
	switch {
	case o.Tiny:
		ops = 2_000
	case o.Quick:
		ops = 100_000
	}
	t := Table{
		Title: fmt.Sprintf("Checkout pool: checkout+release round trip (%s round trips per run)", thousands(int64(ops))),
		Notes: []string{"ns/op is wall time over all round trips of all goroutines (lower is better). " +
			"\"× floor\" is ns/op over the buffered channel's; \"× Disker\" is ns/op over Disker's " +
			"(above 1 means Disker is faster)."},
		Header: []string{"goroutines", "workers", "implementation", "ns/op, median (min–max)", "× floor", "× Disker", "allocs/op"},
	}
	for _, size := range []int{4, 64} {
		for _, g := range []int{1, 8, 64} {
			name := fmt.Sprintf("checkout g=%d size=%d", g, size)
			var impls []impl
			for _, ci := range checkoutImpls() {
				impls = append(impls, impl{name: ci.name, run: func(ctx context.Context) (sample, error) {
					return runCheckout(ctx, ci, size, g, ops)
				}})
			}
			res, err := runAlternating(ctx, o, name, impls)
			if err != nil {
				return nil, err
			}
			floor := series(res[nameChanFloor], nsPerOp).med
			ref := series(res[nameDiskerPool], nsPerOp).med
			for _, ci := range checkoutImpls() {
				ns := series(res[ci.name], nsPerOp)
				t.Rows = append(t.Rows, []string{
					fmt.Sprint(g), fmt.Sprint(size), ci.name, fmtStat(ns),
					fmtRatio(ns.med, floor), fmtRatio(ns.med, ref),
					fmtNum(series(res[ci.name], allocsPerOp).med),
				})
			}
		}
	}
	return []Table{t}, nil
}

func runCheckout(ctx context.Context, ci checkoutImpl, size, g, ops int) (sample, error) {
	op, cleanup, err := ci.build(size)
	if err != nil {
		return sample{}, err
	}
	defer cleanup()
	n := ops / g * g
	return measure(n, func() error { return roundTrips(ctx, op, g, n) })
}

// roundTrips makes n calls of op in all, shared among g goroutines, and
// returns the first error.
func roundTrips(ctx context.Context, op func(context.Context) error, g, n int) error {
	var wg sync.WaitGroup
	errs := make(chan error, g)
	wg.Add(g)
	for i := range g {
		per := n / g
		if i < n%g {
			per++
		}
		go func() {
			defer wg.Done()
			for range per {
				if err := op(ctx); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}
