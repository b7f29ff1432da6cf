package pool

import "sync/atomic"

// idleRing holds a pool's idle workers in the order they came back: the
// front is the one idle longest. LIFO takes from the back, FIFO from the
// front, and the reaper always looks at the front.
type idleRing[W any] struct {
	buf  []*poolEntry[W]
	head int
	n    int
}

func (r *idleRing[W]) index(i int) int {
	i += r.head
	if i >= len(r.buf) {
		i -= len(r.buf)
	}
	return i
}

func (r *idleRing[W]) pushBack(e *poolEntry[W]) {
	if r.n == len(r.buf) {
		buf := make([]*poolEntry[W], max(4, 2*len(r.buf)))
		for i := 0; i < r.n; i++ {
			buf[i] = r.buf[r.index(i)]
		}
		r.buf, r.head = buf, 0
	}
	r.buf[r.index(r.n)] = e
	r.n++
}

func (r *idleRing[W]) front() *poolEntry[W] {
	if r.n == 0 {
		return nil
	}
	return r.buf[r.head]
}

func (r *idleRing[W]) popFront() *poolEntry[W] {
	if r.n == 0 {
		return nil
	}
	e := r.buf[r.head]
	r.buf[r.head] = nil
	r.head = r.index(1)
	r.n--
	return e
}

func (r *idleRing[W]) popBack() *poolEntry[W] {
	if r.n == 0 {
		return nil
	}
	i := r.index(r.n - 1)
	e := r.buf[i]
	r.buf[i] = nil
	r.n--
	return e
}

// poolWaiter is a caller of Checkout waiting for a worker. Waiters are
// reused: ch is buffered and receives exactly one value per wait, a worker
// or nil with err set.
type poolWaiter[W any] struct {
	ch         chan *poolEntry[W]
	err        error
	next, prev *poolWaiter[W]
	queued     bool
}

// waitList is the FIFO queue of waiters, linked through the waiters so
// that a waiter whose context ends leaves it in O(1).
type waitList[W any] struct {
	head, tail *poolWaiter[W]
	// n is the number of waiters. It changes under the pool's mutex and is
	// read without it by Release's fast path.
	n atomic.Int64
}

// len returns the number of waiters.
func (l *waitList[W]) len() int { return int(l.n.Load()) }

func (l *waitList[W]) push(w *poolWaiter[W]) {
	w.prev, w.next, w.queued = l.tail, nil, true
	if l.tail == nil {
		l.head = w
	} else {
		l.tail.next = w
	}
	l.tail = w
	l.n.Add(1)
}

func (l *waitList[W]) pop() *poolWaiter[W] {
	w := l.head
	if w != nil {
		l.remove(w)
	}
	return w
}

func (l *waitList[W]) remove(w *poolWaiter[W]) {
	if w.prev == nil {
		l.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		l.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.queued = nil, nil, false
	l.n.Add(-1)
}
