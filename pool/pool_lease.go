package pool

// Lease is a worker checked out of a [Pool]. It is a small value: copy it
// freely, but end it exactly once, with Release (the worker is fine) or
// Retire (the worker is broken). A second end, through the same Lease or a
// copy, does nothing and returns an error wrapping [ErrReleased], even when
// the worker has since been leased to another caller.
type Lease[W any] struct {
	e  *poolEntry[W]
	id uint64
}

// Worker returns the leased worker (the zero W for the zero Lease). Do not
// use it after the lease has ended.
func (l Lease[W]) Worker() W {
	if l.e == nil {
		var zero W
		return zero
	}
	return l.e.w
}

// Release gives the worker back to the pool: to the caller that has waited
// longest, else to the idle set. If the pool runs its health check on
// release and the worker fails it, the worker is retired instead. After
// Close, or when the pool has shrunk, the worker is closed and Release
// returns the Close hook's error. A second end of the lease returns an error
// wrapping ErrReleased and does nothing.
func (l Lease[W]) Release() error {
	if l.e == nil {
		return ErrReleased
	}
	return l.e.p.release(l, true)
}

// Retire ends the lease and closes the worker, because it is broken; the
// pool makes a replacement in the background when it needs one. It returns
// the Close hook's error. A second end of the lease returns an error
// wrapping ErrReleased and does nothing.
func (l Lease[W]) Retire() error {
	if l.e == nil {
		return ErrReleased
	}
	return l.e.p.retire(l)
}
