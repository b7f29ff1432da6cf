package pool_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/diskerhq/disker/pool"
)

// conn stands for a stateful worker: a database or network connection.
type conn struct{ id int }

func (c *conn) query(q string) (string, error) {
	return fmt.Sprintf("conn %d: %s ok", c.id, q), nil
}

// dialer makes numbered conns.
type dialer struct{ n atomic.Int32 }

func (d *dialer) dial(context.Context) (*conn, error) {
	return &conn{id: int(d.n.Add(1))}, nil
}

// Do runs a function with a worker and always gives the worker back, or
// retires it when the function says it is broken.
func ExamplePool_Do() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{
		Name:  "db",
		Size:  1,
		New:   d.dial,
		Close: func(c *conn) error { fmt.Printf("closed conn %d\n", c.id); return nil },
	})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	err = p.Do(ctx, func(ctx context.Context, c *conn) error {
		reply, err := c.query("SELECT 1")
		fmt.Println(reply)
		return err
	})
	fmt.Println("err:", err)

	// A broken connection is retired and replaced.
	err = p.Do(ctx, func(ctx context.Context, c *conn) error {
		return pool.Broken(errors.New("connection reset"))
	})
	fmt.Println("err:", err, "broken:", pool.IsBroken(err))

	// The next transaction gets the replacement.
	p.Do(ctx, func(ctx context.Context, c *conn) error {
		reply, err := c.query("SELECT 2")
		fmt.Println(reply)
		return err
	})

	fmt.Println("close:", p.Close(ctx))
	fmt.Println("after close:", p.Do(ctx, func(context.Context, *conn) error { return nil }))
	// Output:
	// conn 1: SELECT 1 ok
	// err: <nil>
	// closed conn 1
	// err: connection reset broken: true
	// conn 2: SELECT 2 ok
	// closed conn 2
	// close: <nil>
	// after close: pool "db": closed
}

// Checkout leases a worker until Release; TryCheckout never waits.
func ExamplePool_Checkout() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)

	lease, err := p.Checkout(ctx)
	if err != nil {
		panic(err)
	}
	reply, _ := lease.Worker().query("GET k")
	fmt.Println(reply)

	_, err = p.TryCheckout(ctx)
	fmt.Println("while leased:", err)

	fmt.Println("release:", lease.Release())
	fmt.Println("release again:", lease.Release())

	lease, err = p.TryCheckout(ctx)
	fmt.Println("after release: conn", lease.Worker().id, err)
	lease.Release()
	// Output:
	// conn 1: GET k ok
	// while leased: pool: no worker available
	// release: <nil>
	// release again: pool: lease already released
	// after release: conn 1 <nil>
}

// Under load the pool makes overflow workers beyond Size, up to MaxOverflow;
// they stay idle for IdleTTL before they are closed.
func ExamplePool_overflow() {
	d := &dialer{}
	p, err := pool.New(pool.Config[*conn]{Size: 1, MaxOverflow: 2, New: d.dial})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	defer p.Close(ctx)

	var leases []pool.Lease[*conn]
	for range 3 {
		l, err := p.Checkout(ctx)
		if err != nil {
			panic(err)
		}
		leases = append(leases, l)
	}
	s := p.Stats()
	fmt.Printf("busy %d, overflow %d\n", s.Busy, s.Overflow)

	_, err = p.TryCheckout(ctx)
	fmt.Println("at the cap:", errors.Is(err, pool.ErrNoWorker))

	for _, l := range leases {
		l.Release()
	}
	s = p.Stats()
	fmt.Printf("idle %d, overflow %d, made %d\n", s.Idle, s.Overflow, s.Created)
	// Output:
	// busy 3, overflow 2
	// at the cap: true
	// idle 3, overflow 2, made 3
}
