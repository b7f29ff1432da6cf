package pool

import "sync/atomic"

// idleStack is the lock-free top of a LIFO pool's idle set: the workers
// that came back while the fast path was on (see Pool.syncFastLocked), the
// last one on top. It is a Treiber stack linked by the entries' indexes in
// table, and head holds a version that every push and pop changes, so that
// a pop that read a stale head fails its compare-and-swap even when the same
// entry is on top again (the ABA problem).
type idleStack[W any] struct {
	// head packs the stack:
	//
	//	bits  0-15 the top entry's idx (0: empty)
	//	bits 16-31 the number of entries on the stack
	//	bits 32-63 a version, incremented by every push and pop
	head atomic.Uint64
	// table holds every entry with an idx at index idx-1. It only grows,
	// under the pool's mutex, and a larger copy replaces it.
	table atomic.Pointer[[]*poolEntry[W]]
}

// maxStacked is the most entries that can have an idx: 16 bits of head.
// Entries made beyond it never go on the stack.
const maxStacked = 1<<16 - 1

const (
	stackIdxMask = 1<<16 - 1
	stackOne     = 1 << 16 // one entry in the count field
	stackVersion = 1 << 32 // one version
)

// push puts e, whose idx is not 0, on top.
func (s *idleStack[W]) push(e *poolEntry[W]) {
	for {
		h := s.head.Load()
		e.next.Store(uint32(h & stackIdxMask))
		nh := (h&^stackIdxMask + stackOne + stackVersion) | uint64(e.idx)
		if s.head.CompareAndSwap(h, nh) {
			return
		}
	}
}

// pop takes the top entry off, or returns nil if the stack is empty.
func (s *idleStack[W]) pop() *poolEntry[W] {
	for {
		h := s.head.Load()
		i := h & stackIdxMask
		if i == 0 {
			return nil
		}
		e := (*s.table.Load())[i-1]
		nh := (h&^stackIdxMask - stackOne + stackVersion) | uint64(e.next.Load())
		if s.head.CompareAndSwap(h, nh) {
			return e
		}
	}
}

// len returns the number of entries on the stack.
func (s *idleStack[W]) len() int { return int(s.head.Load() >> 16 & stackIdxMask) }

// version returns a number that changes with every push and pop.
func (s *idleStack[W]) version() uint64 { return s.head.Load() >> 32 }

// register gives e the next idx, if one is left, and adds it to the table.
// The pool's mutex is held.
func (s *idleStack[W]) register(e *poolEntry[W]) {
	var t []*poolEntry[W]
	if p := s.table.Load(); p != nil {
		t = *p
	}
	if len(t) >= maxStacked {
		return
	}
	t = append(t, e)
	e.idx = uint32(len(t))
	s.table.Store(&t)
}
