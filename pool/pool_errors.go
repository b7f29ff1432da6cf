package pool

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrReleased is returned by [Lease.Release] and [Lease.Retire] when the
// lease was already released or retired (or is the zero Lease). Such a call
// does nothing else: the worker may already be leased to someone else.
var ErrReleased = errors.New("pool: lease already released")

// errDoGoexit is what Do returns when its function called runtime.Goexit
// (t.FailNow, for one) on the goroutine Do ran it on.
var errDoGoexit = errors.New("pool: function called runtime.Goexit")

// namedError is one of the package's errors with the pool's name in its
// text: `pool "db": closed`. It wraps the sentinel, so errors.Is still works.
type namedError struct {
	msg string
	err error
}

func (e *namedError) Error() string { return e.msg }
func (e *namedError) Unwrap() error { return e.err }

// named returns err (a "pool: ..." sentinel) with prefix in place of "pool".
func named(prefix string, err error) error {
	if prefix == "pool" {
		return err
	}
	return &namedError{msg: prefix + strings.TrimPrefix(err.Error(), "pool"), err: err}
}

// degradedError says why a pool is degraded. It wraps ErrDegraded and the
// constructor's last error.
type degradedError struct {
	prefix   string
	failures int
	period   time.Duration
	last     error
}

func (e *degradedError) Error() string {
	return fmt.Sprintf("%s: degraded: workers cannot be made: the constructor failed %d times within %v; last error: %v",
		e.prefix, e.failures, e.period, e.last)
}

func (e *degradedError) Unwrap() []error { return []error{ErrDegraded, e.last} }
