package membroker

import "time"

// timed is an element of a byTime heap: it knows its time and keeps its
// index in the heap (for heap.Fix and heap.Remove).
type timed interface {
	at() time.Time
	setIndex(i int)
}

// byTime is a heap (container/heap) of elements ordered by their time,
// earliest first: a sender's pending timeouts, a queue's messages sent
// for later.
type byTime[T timed] []T

func (h byTime[T]) Len() int           { return len(h) }
func (h byTime[T]) Less(i, j int) bool { return h[i].at().Before(h[j].at()) }
func (h byTime[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].setIndex(i)
	h[j].setIndex(j)
}

// Push appends x, which must be a T.
func (h *byTime[T]) Push(x any) {
	e := x.(T)
	e.setIndex(len(*h))
	*h = append(*h, e)
}

// Pop removes and returns the last element.
func (h *byTime[T]) Pop() any {
	old := *h
	e := old[len(old)-1]
	var zero T
	old[len(old)-1] = zero
	*h = old[:len(old)-1]
	return e
}
