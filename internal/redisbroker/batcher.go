package redisbroker

import (
	"context"
	"slices"
	"sync"
)

// batcher merges concurrent calls of one kind into shared round trips, as a
// database merges concurrent commits ("group commit"). A call made while
// none is in flight goes at once, alone, so a lone caller waits for nothing
// more than its own round trip. Calls made while one is in flight queue up,
// and the first of them makes the next round trip for all of them (up to
// max) as soon as the one in flight returns. Under load, n concurrent calls
// so cost Redis one script invocation or transaction, one write and one
// read instead of n of each.
//
// A call still queued when its context ends leaves the queue; once its
// round trip has started, it waits for it.
//
// flush makes one round trip for items and sets one result per item in
// out (as long as items, zeroed), in order. It runs on the goroutine of
// one of the callers, the batch's leader, one flush at a time, and must
// return (the client bounds its I/O). It gets the leader's context: a
// flush may return when that ends, with a result for each item that says
// so (the round trip's outcome then unknown), so that the leader is not
// held past its context by a round trip that hangs. Should it panic, the
// other callers of its batch get failed(the panic value) and the batcher
// carries on; the panic goes on in the caller that ran it. items and out
// are the batcher's again once flush returned: flush keeps neither. The
// batcher reuses out, but items only when made with ownItems: the client
// may still read the commands of a round trip after it answered (its
// writer, after a connection error), or after flush left it behind (its
// leader's context ended), so only a flush that hands the client commands
// of its own, never items, and waits for them whatever its context, lets
// the batcher have items back.
type batcher[T, R any] struct {
	max    int
	flush  func(ctx context.Context, items []T, out []R)
	failed func(v any) R

	mu    sync.Mutex
	busy  bool // a flush is in flight
	queue []*batchCall[T, R]
	// spare is the array of a batch whose flush ended, for the queue to
	// grow into again.
	spare []*batchCall[T, R]

	// out is the results' buffer of the next flush, owned by the flush
	// in flight (one at a time); items is the items' buffer, the same,
	// when ownItems (else each flush has items of its own).
	out      []R
	items    []T
	ownItems bool

	calls sync.Pool // of *batchCall[T, R], reused once their caller has the result
}

// batchCall is one caller's item, and its result once its flush returned.
type batchCall[T, R any] struct {
	item T
	res  R
	// done gets one value when res is set, or when the caller is to lead;
	// capacity 1, so that the call is reused with it.
	done  chan struct{}
	batch []*batchCall[T, R] // set for the caller that leads the next flush
	// alone backs the batch of a call that goes alone (none in flight),
	// which so costs no slice of its own.
	alone [1]*batchCall[T, R]
}

func newBatcher[T, R any](max int, flush func(ctx context.Context, items []T, out []R), failed func(v any) R) *batcher[T, R] {
	return &batcher[T, R]{max: max, flush: flush, failed: failed}
}

// withOwnItems makes b reuse the items it hands to flush: for a flush that
// keeps nothing of them once it returned, the client included (see
// batcher).
func (b *batcher[T, R]) withOwnItems() *batcher[T, R] {
	b.ownItems = true
	return b
}

// call returns a call of item, reused if one is free.
func (b *batcher[T, R]) call(item T) *batchCall[T, R] {
	c, _ := b.calls.Get().(*batchCall[T, R])
	if c == nil {
		c = &batchCall[T, R]{done: make(chan struct{}, 1)}
	}
	c.item = item
	return c
}

// release gives c back for reuse, once nothing refers to it any more: its
// result read, its done received (or never sent: a call that left the
// queue, or went alone).
func (b *batcher[T, R]) release(c *batchCall[T, R]) {
	*c = batchCall[T, R]{done: c.done}
	b.calls.Put(c)
}

// do sends item in the next round trip and returns its result. It returns
// ctx's error, and item is not sent, if ctx ends while item waits for a
// round trip in flight; once item's own round trip has started, do waits
// for it, which ends when flush returns (see batcher: at the latest soon
// after the context of the batch's leader, which may be this call's).
func (b *batcher[T, R]) do(ctx context.Context, item T) (R, error) {
	c := b.call(item)
	b.mu.Lock()
	if b.busy {
		if b.queue == nil {
			b.queue, b.spare = b.spare, nil
		}
		b.queue = append(b.queue, c)
		b.mu.Unlock()
		select {
		case <-c.done:
		case <-ctx.Done():
			if b.leave(c) {
				b.release(c)
				var zero R
				return zero, ctx.Err()
			}
			<-c.done
		}
		if c.batch == nil {
			res := c.res
			b.release(c)
			return res, nil
		}
	} else {
		b.busy = true
		b.mu.Unlock()
		c.alone[0] = c
		c.batch = c.alone[:]
	}
	b.run(ctx, c.batch)
	res := c.res
	b.release(c)
	return res, nil
}

// leave takes c out of the queue and reports whether it was still there.
func (b *batcher[T, R]) leave(c *batchCall[T, R]) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.queue, c)
	if i < 0 {
		return false
	}
	b.queue = slices.Delete(b.queue, i, i+1)
	return true
}

// run flushes batch, whose first call is the caller's (with ctx, the
// caller's context), hands the queue to the first caller in it, and wakes
// the others of batch.
func (b *batcher[T, R]) run(ctx context.Context, batch []*batchCall[T, R]) {
	var items []T
	if b.ownItems {
		items, b.items = b.items[:0], nil
	} else {
		items = make([]T, 0, len(batch))
	}
	for _, c := range batch {
		items = append(items, c.item)
	}
	out := b.out[:0]
	out = append(out, make([]R, len(batch))...)
	b.out = nil
	defer b.next(batch)
	defer func() {
		if v := recover(); v != nil {
			for _, c := range batch {
				c.res = b.failed(v)
			}
			panic(v)
		}
	}()
	b.flush(ctx, items, out)
	for i, c := range batch {
		c.res = out[i]
	}
	clear(out)
	b.out = out[:0]
	if b.ownItems {
		clear(items)
		b.items = items[:0]
	}
}

// next hands the queue to the first caller in it and wakes the others of
// batch, whose results are set.
func (b *batcher[T, R]) next(batch []*batchCall[T, R]) {
	b.mu.Lock()
	var next []*batchCall[T, R]
	if n := min(len(b.queue), b.max); n > 0 {
		next = b.queue[:n:n]
		b.queue = b.queue[n:]
		if len(b.queue) == 0 {
			b.queue = nil // let the backing array go
		}
	} else {
		b.busy = false
	}
	b.mu.Unlock()
	if next != nil {
		next[0].batch = next
		next[0].done <- struct{}{} // the next round trip starts before the wake-ups below
	}
	for _, c := range batch[1:] {
		c.done <- struct{}{}
	}
	if cap(batch) > 1 { // not the array of a call that went alone
		clear(batch)
		b.mu.Lock()
		if cap(batch) > cap(b.spare) {
			b.spare = batch[:0]
		}
		b.mu.Unlock()
	}
}
