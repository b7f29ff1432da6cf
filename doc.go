// Package disker implements the dispatcher-worker pattern across processes
// and machines, over Redis (or an embedded in-memory broker in one process).
//
// A dispatcher sends a [Message] to a named receiver with [Disker.Send]. Any
// number of instances serve that receiver with [Disker.Handle] (competing
// consumers): each runs its [Handler] on a bounded pool of goroutines. A
// handler's response is the reply, which reaches the sender: the sender's
// name is its reply address, and its [ReplyHandler] ([Disker.OnReply])
// receives it. [Disker.Request] sends and waits for the reply in one call.
// [Disker.HandleBatch] serves a receiver a batch of messages at a time
// with a [BatchHandler], which returns an [Outcome] for each message.
//
// Send, SendBatch and Request all take a [Message]: what a message is lives
// in its fields (Receiver, Content, Headers, and Sender, its reply
// address), how it is sent in a [SendOption] ([WithTimeout]). A message
// without a Sender is fire-and-forget: nobody gets its reply, as with
// `disker send` without --from.
//
//	d, err := disker.New(ctx, disker.Config{RedisURL: "redis://localhost:6379/0"})
//	...
//	d.Handle("resize", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
//		return resize(ctx, m.Content)
//	}))
//	reply, err := d.Request(ctx, disker.Message{Receiver: "resize", Content: img}) // ctx's deadline is the timeout
//	id, err := d.Send(ctx, disker.Message{Sender: "me", Receiver: "resize", Content: img}, disker.WithTimeout(time.Minute))
//	_, err = d.Send(ctx, disker.Message{Receiver: "audit", Content: entry}) // fire-and-forget
//
// The delivery contract:
//
//   - [Disker.Send] returns the id once the broker accepted the message, in
//     one atomic step with its timeout if it has one.
//   - Delivery is at least once, to one worker at a time. A worker leases a
//     message ([WithLease]) and keeps extending the lease while its handler
//     runs; a worker that dies leaves the message to another one after the
//     lease. Failures are retried with a backoff ([WithBackoff]); after
//     [WithMaxAttempts] attempts, or at once for an error marked [NoRetry],
//     the message moves to the receiver's dead-letter stream
//     ([Disker.DeadLetters]) with the reason.
//   - A message with a timeout ([WithTimeout]) gets exactly one outcome at
//     its sender: the reply, or a timeout notice for its [TimeoutHandler]
//     ([Disker.OnTimeout]). A reply that comes too late is dropped and the
//     replier gets [ErrLate]. A worker never starts a message whose
//     deadline has passed, and the handler's context carries the deadline.
//   - [Disker.Close] stops fetching, lets in-flight handlers finish until its
//     context ends, and leaves the rest to be delivered again.
//   - A message sent [WithDelay] or [WithDeliverAt] is delivered no earlier
//     than its due time by the broker's clock (Redis time); until then it
//     is deferred, and counts as Deferred in [Disker.Stats].
//   - [Disker.Cancel] cancels a message: a deferred or queued one is never
//     delivered, and the handler of one in flight sees its context end with
//     the cause [ErrCancelled]; its sender gets the reply or a [RemoteError]
//     with [CodeCancelled], exactly one. A [Disker.Request] whose context is
//     cancelled cancels its message.
//
// Flow control, decided in the broker on its clock: [WithDedupKey] sends a
// message once per key and receiver within a window; [WithIdempotencyKey]
// makes Requests with one key share one run of the handler and its one
// reply; [Disker.Pause] and [Disker.Resume] stop and restart a receiver on
// every instance, while sends still queue; [WithPriority] sends a message
// ahead of (or behind) the normal ones; [WithGlobalConcurrency] and
// [WithRateLimit] bound a receiver across all its instances, and a message
// over a limit waits in the queue without using an attempt;
// [HandleWithPool] serves a receiver with the workers of a [pool.Pool],
// fetching only as many messages as it has workers ready.
//
// [WithExclusive] makes one instance at a time serve a receiver. The registry
// of live instances is [Disker.Workers]; queue and dead-letter statistics are
// [Disker.Stats], and [Config.OnEvent] and [Disker.LocalStats] feed metrics.
//
// [Disker.Schedule] registers a periodic [Schedule] (every interval, or a
// cron expression in a time zone) in the broker: every instance that
// serves a receiver runs the stored schedules, and each tick is sent
// exactly once across them, decided by the broker's clock in one atomic
// step; [Schedule.Missed] says what becomes of ticks missed while no
// instance ran. [Disker.Schedules] lists them, [Disker.RemoveSchedule]
// stops one.
//
// # Which calls block
//
// Every call that takes a context may block on the broker; the in-memory
// broker answers at once. Over Redis:
//
//   - [New] connects: until Redis answers, for at most 10 seconds, never
//     past ctx's end.
//   - [Disker.Send], [Disker.SendBatch] and [Disker.SendEach] make one
//     round trip (a few for a large batch) and return by ctx's end
//     whatever Redis's connection does (down, refusing connections, reset,
//     stalled with its sockets open, paused); when ctx has no deadline, by
//     [SendTimeout] for each 1,000 messages, with an error wrapping
//     [ErrUnavailable]. A send that returns so, without Redis's answer,
//     may have queued its message all the same.
//   - [Disker.Request] waits for the reply: until ctx's deadline, or until
//     ctx is cancelled when it has none, and returns by then plus
//     [RequestGrace], whatever Redis's connection does.
//   - [Disker.Reply], [Disker.Cancel], [Disker.Stats], [Disker.Workers],
//     [Disker.Receivers], [Disker.Pause], [Disker.Resume], the dead-letter
//     calls, [Disker.Schedules] and [Disker.RemoveSchedule] make one round
//     trip (a few for [Disker.Schedule]): each Redis command gives up after
//     10 seconds without an answer, with an error wrapping
//     [ErrUnavailable], and by ctx's end, but for two waits of the Redis
//     client that ctx does not end: for a connection being made (up to 5
//     seconds), and, on a stalled connection with 256 commands waiting,
//     for a place among them (until it gives up the connection, after 10
//     seconds without an answer).
//   - [Disker.Unhandle] and [Disker.Close] wait for in-flight handlers
//     until ctx ends, then cancel them and wait for them to return.
//
// Handle, HandleBatch, OnReply, OnTimeout, RemoveReplyHandler, RemoveTimeoutHandler,
// LocalStats and ID do not block.
//
// Names of receivers and senders are 1 to 200 bytes of [A-Za-z0-9._:-] and
// do not start with '_', which is reserved for Disker's own names (such as
// the private reply address of Request). Bad input is a [*ValidationError]
// that names the field.
package disker
