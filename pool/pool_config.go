package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"time"
)

// Strategy is the order in which a [Pool] reuses its idle workers.
type Strategy int

const (
	// LIFO reuses the most recently returned worker first. It is the
	// default: a small set of workers stays warm and, under light load, the
	// others stay idle long enough for overflow workers to be reaped.
	LIFO Strategy = iota
	// FIFO reuses the worker that has been idle longest, so work is spread
	// evenly over all idle workers (round-robin).
	FIFO
)

// String returns "LIFO" or "FIFO".
func (s Strategy) String() string {
	switch s {
	case LIFO:
		return "LIFO"
	case FIFO:
		return "FIFO"
	}
	return fmt.Sprintf("Strategy(%d)", int(s))
}

// CheckPoint says when a [Pool] runs its health check (Config.Check).
// Combine the values with |.
type CheckPoint uint8

const (
	// CheckOnCheckout checks a worker before it is handed out. A worker that
	// was just made is not checked.
	CheckOnCheckout CheckPoint = 1 << iota
	// CheckOnRelease checks a worker when its lease is released, before it
	// goes back to the idle set or to a waiting caller.
	CheckOnRelease
)

// Default values of the Config fields left at zero.
const (
	// DefaultIdleTTL is how long an idle overflow worker lingers by default.
	DefaultIdleTTL = 30 * time.Second
	// DefaultMaxRestarts is the default restart intensity: constructor
	// failures tolerated within Period.
	DefaultMaxRestarts = 5
	// DefaultPeriod is the default window of the restart intensity.
	DefaultPeriod = 10 * time.Second
	// DefaultRestartBackoff is the default first delay before a failed
	// construction is retried.
	DefaultRestartBackoff = 100 * time.Millisecond
	// DefaultMaxRestartBackoff is the default cap of the retry delay.
	DefaultMaxRestartBackoff = 5 * time.Second
)

// Config configures a [Pool] of workers of type W. Only New is required.
type Config[W any] struct {
	// Name identifies the pool in its errors and logs, as in
	// `pool "db": closed`. Empty (the default) leaves the name out.
	Name string

	// New makes a worker. It is required. Its context is the caller's when
	// a checkout makes the worker, and one that ends at Close when the pool
	// makes it in the background. A panic in New is turned into an error.
	New func(ctx context.Context) (W, error)

	// Close closes a worker that the pool retires, reaps or shuts down; it
	// is called exactly once for every worker New made. nil (the default)
	// means workers need no closing. A panic in Close is turned into an
	// error.
	Close func(w W) error

	// Check reports whether a worker is still healthy: a worker that fails
	// it is retired (closed and replaced). When it runs is set by CheckOn.
	// nil (the default) means no health check.
	Check func(ctx context.Context, w W) error

	// CheckOn says when Check runs. 0 means CheckOnCheckout. It must be 0
	// when Check is nil. On checkout Check gets the caller's context; on
	// release it gets one that ends at Close.
	CheckOn CheckPoint

	// Size is the number of permanent workers: they are never reaped, and
	// one that is retired is replaced in the background. It must be >= 0.
	// 0 means no permanent workers (every worker is an overflow worker),
	// except that when Size and MaxOverflow are both 0, Size defaults to
	// runtime.GOMAXPROCS(0).
	Size int

	// MaxOverflow is how many temporary workers may be made beyond Size
	// when every worker is busy. It must be >= 0; 0 (the default) means
	// none.
	MaxOverflow int

	// IdleTTL is how long an overflow worker may stay idle before it is
	// closed. It must be >= 0; 0 means DefaultIdleTTL (30s).
	IdleTTL time.Duration

	// Strategy is the order in which idle workers are reused. The zero
	// value is LIFO.
	Strategy Strategy

	// Eager makes New build the Size permanent workers before it returns
	// (New fails if one cannot be made). false (the default) makes workers
	// on demand.
	Eager bool

	// MaxRestarts and Period set the restart intensity: when the
	// constructor fails more than MaxRestarts times within Period, the pool
	// is degraded (see ErrDegraded) until a construction succeeds again.
	// MaxRestarts must be >= 0; 0 means DefaultMaxRestarts (5).
	MaxRestarts int

	// Period is the window of the restart intensity. It must be >= 0; 0
	// means DefaultPeriod (10s).
	Period time.Duration

	// RestartBackoff is the delay before a failed background construction
	// is tried again; it doubles with every further failure, up to
	// MaxRestartBackoff, and each delay is jittered down by up to half. It
	// must be >= 0; 0 means DefaultRestartBackoff (100ms).
	RestartBackoff time.Duration

	// MaxRestartBackoff caps the retry delay. It must be >= 0 and, once
	// defaults are applied, >= RestartBackoff; 0 means
	// DefaultMaxRestartBackoff (5s).
	MaxRestartBackoff time.Duration

	// Logger receives what the pool cannot return to a caller: failed
	// background constructions, entering and leaving the degraded state,
	// errors from closing reaped workers, panics of abandoned transactions.
	// nil (the default) discards them.
	Logger *slog.Logger
}

// withDefaults validates c and returns it with every zero field that has a
// default filled in. It is the one place where defaults are applied.
func (c Config[W]) withDefaults() (Config[W], error) {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("pool: Config."+format, args...))
	}
	if c.New == nil {
		bad("New must not be nil")
	}
	if c.Check == nil && c.CheckOn != 0 {
		bad("CheckOn must be 0 when Config.Check is nil")
	}
	if c.CheckOn&^(CheckOnCheckout|CheckOnRelease) != 0 {
		bad("CheckOn has unknown bits %#x", uint8(c.CheckOn))
	}
	if c.Size < 0 {
		bad("Size must be >= 0, got %d", c.Size)
	}
	if c.MaxOverflow < 0 {
		bad("MaxOverflow must be >= 0, got %d", c.MaxOverflow)
	}
	if c.IdleTTL < 0 {
		bad("IdleTTL must be >= 0, got %v", c.IdleTTL)
	}
	if c.Strategy != LIFO && c.Strategy != FIFO {
		bad("Strategy must be LIFO or FIFO, got %v", c.Strategy)
	}
	if c.MaxRestarts < 0 {
		bad("MaxRestarts must be >= 0, got %d", c.MaxRestarts)
	}
	if c.Period < 0 {
		bad("Period must be >= 0, got %v", c.Period)
	}
	if c.RestartBackoff < 0 {
		bad("RestartBackoff must be >= 0, got %v", c.RestartBackoff)
	}
	if c.MaxRestartBackoff < 0 {
		bad("MaxRestartBackoff must be >= 0, got %v", c.MaxRestartBackoff)
	}
	if len(errs) > 0 {
		return c, errors.Join(errs...)
	}

	if c.Check != nil && c.CheckOn == 0 {
		c.CheckOn = CheckOnCheckout
	}
	if c.Size == 0 && c.MaxOverflow == 0 {
		c.Size = runtime.GOMAXPROCS(0)
	}
	if c.IdleTTL == 0 {
		c.IdleTTL = DefaultIdleTTL
	}
	if c.MaxRestarts == 0 {
		c.MaxRestarts = DefaultMaxRestarts
	}
	if c.Period == 0 {
		c.Period = DefaultPeriod
	}
	if c.RestartBackoff == 0 {
		c.RestartBackoff = DefaultRestartBackoff
	}
	if c.MaxRestartBackoff == 0 {
		c.MaxRestartBackoff = DefaultMaxRestartBackoff
	}
	if c.MaxRestartBackoff < c.RestartBackoff {
		return c, fmt.Errorf("pool: Config.MaxRestartBackoff (%v) must be >= Config.RestartBackoff (%v)",
			c.MaxRestartBackoff, c.RestartBackoff)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
