// Package pool provides supervised, in-process worker pools.
//
// [Pool] is a checkout pool of stateful workers in the manner of Erlang's
// poolboy: Size permanent workers made by a constructor, up to MaxOverflow
// temporary ones under load, LIFO or FIFO reuse, checkouts that wait with a
// context, a transaction helper [Pool.Do] that always returns or retires the
// worker, and supervision that replaces retired workers under a restart
// intensity instead of crashing or spinning.
//
// [Executor] runs plain functions with bounded concurrency on reused worker
// goroutines: [Executor.Submit] waits for room and gives up with the
// context's error, an optional bounded queue rejects with [ErrFull], panics
// become a [*PanicError] for whoever waits, and [Executor.Close] drains.
// [Go] returns a typed [Future] for one task's result; [Group] waits for a set
// of tasks and cancels the rest on the first error.
package pool
