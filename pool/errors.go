package pool

import (
	"errors"
	"fmt"
	"runtime/debug"
)

// Errors returned by the pools in this package. Check them with errors.Is.
var (
	// ErrClosed is returned by every call on a pool or executor after Close.
	ErrClosed = errors.New("pool: closed")
	// ErrFull is returned by TrySubmit when the executor has no free worker
	// and no room in its queue. (Submit waits for room instead, until its
	// context ends.)
	ErrFull = errors.New("pool: full")
	// ErrNoWorker is returned by TryCheckout when no worker is idle and no
	// overflow worker may be made.
	ErrNoWorker = errors.New("pool: no worker available")
	// ErrDegraded is returned by checkouts while the pool cannot make workers
	// (its constructor failed more than MaxRestarts times in Period). The
	// returned error wraps it and the constructor's last error.
	ErrDegraded = errors.New("pool: degraded: workers cannot be made")
)

// PanicError is a panic recovered from a task or a transaction, turned into
// an error. It keeps the panic value and the stack of the goroutine that
// panicked.
type PanicError struct {
	// Value is the value passed to panic.
	Value any
	// Stack is the stack trace captured where the panic was recovered.
	Stack []byte
}

// NewPanicError builds a PanicError for v with the current goroutine's stack.
// Call it from the deferred function that recovered v.
func NewPanicError(v any) *PanicError {
	return &PanicError{Value: v, Stack: debug.Stack()}
}

// Error returns the panic value and the stack.
func (e *PanicError) Error() string {
	return fmt.Sprintf("pool: panic: %v\n\n%s", e.Value, e.Stack)
}

// Unwrap returns the panic value when it is an error, so errors.Is and
// errors.As see through the panic.
func (e *PanicError) Unwrap() error {
	if err, ok := e.Value.(error); ok {
		return err
	}
	return nil
}

// brokenError marks an error as meaning the worker is broken.
type brokenError struct{ err error }

func (e brokenError) Error() string { return e.err.Error() }
func (e brokenError) Unwrap() error { return e.err }

// Broken marks err as meaning the worker that returned it is broken: a
// transaction (Pool.Do) that returns such an error retires the worker and a
// new one replaces it. Broken(nil) returns nil.
func Broken(err error) error {
	if err == nil {
		return nil
	}
	return brokenError{err}
}

// IsBroken reports whether err, or an error it wraps, was marked by Broken.
func IsBroken(err error) bool {
	var b brokenError
	return errors.As(err, &b)
}
