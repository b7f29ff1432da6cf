// Package diskertest is a kit for testing the code that uses disker: its
// handlers and its senders, with no Redis, no sleeping and no goroutines
// to wait for.
//
// [New] returns a [Kit] for one test: a [disker.Disker] on an in-memory
// broker of its own, whose clock moves only when the test says. Hand
// [Kit.Disker] to the code under test; it sends, serves receivers and
// replies as any Disker does. What a Disker does by itself when messages
// come or time passes, the kit does when the test asks:
//
//   - [Kit.Drain] runs, on the test's goroutine, the handlers of the
//     messages that are due, one at a time, and settles each as the
//     Disker would (reply and acknowledgement, retry after a backoff, dead
//     letter), then the reply and timeout handlers of senders; it returns
//     the deliveries it ran, with their outcomes.
//   - [Kit.Advance] moves the clock: deferred messages, retries and
//     expired leases come due, deadlines and expiries pass, schedules
//     tick (once per interval crossed), timeouts are settled.
//   - [Kit.Request] makes a Request and runs the Drain that answers it.
//
// Then look at what happened: [Kit.Sent], [Kit.Delivered],
// [Kit.Replies], [Kit.DeadLetters], or assert it with [Kit.RequireSent],
// [Kit.RequireNotSent], [Kit.RequireDelivered], [Kit.RequireReply] and
// [Kit.RequireDeadLetter], which take conditions ([Content],
// [ContentJSON], [Header], [DueIn], [Ended], [Reason] and the others) and,
// when none matches, print every candidate with how it differs:
//
//	diskertest: RequireSent: no message sent to "mail" matches:
//	    Content: "welcome ann@example.com"
//	1 message sent to "mail" (-want +got):
//	  #1 id 01m90rfwzbp44gs0z826pedqew, content "welcome bob@example.com"
//	      Content: -"welcome ann@example.com" +"welcome bob@example.com"
//
// A test of a handler:
//
//	func TestResize(t *testing.T) {
//		t.Parallel()
//		kit := diskertest.New(t)
//		d := kit.Disker()
//		if err := d.Handle("resize", disker.HandlerFunc(resize)); err != nil {
//			t.Fatal(err)
//		}
//		ctx := context.Background()
//		d.Send(ctx, disker.Message{Sender: "web", Receiver: "resize", Content: []byte("cat.png 64x64")})
//		d.Send(ctx, disker.Message{Sender: "web", Receiver: "resize", Content: []byte("dog.png")})
//		kit.Drain()
//		kit.RequireReply("web", diskertest.Content("cat-64x64.png"))
//		kit.RequireDeadLetter("resize", diskertest.Content("dog.png"), diskertest.Reason("no size"))
//	}
//
// A test of a sender, and of time:
//
//	func TestSignup(t *testing.T) {
//		t.Parallel()
//		kit := diskertest.New(t)
//		if err := signup(context.Background(), kit.Disker(), "ann@example.com"); err != nil {
//			t.Fatal(err)
//		}
//		kit.RequireSent("mail", diskertest.Content("welcome ann@example.com"))
//		kit.RequireSent("mail", diskertest.Content("still there?"), diskertest.DueIn(24*time.Hour))
//		kit.RequireNotSent("sms")
//	}
//
// Each kit has its own broker and clock, so tests that use kits run in
// parallel (t.Parallel) and in milliseconds.
//
// # The clock
//
// The kit's clock is the broker's: it starts at the time of New (or
// [WithStart]) and stands still until [Kit.Advance]. Everything disker
// decides by the broker's time moves with it: the due times of WithDelay
// and WithDeliverAt, the delays of retries (WithBackoff), the deadlines of
// WithTimeout (a worker does not start a message past its deadline, a
// reply after it is refused, and the sender's TimeoutHandler gets the
// notice), the expiries of WithExpiry and WithExpireAt, the leases of
// deliveries (one left unsettled is delivered again once its lease has
// run out), the windows of WithDedupKey and WithIdempotencyKey, the
// tokens of WithRateLimit, the leases of WithGlobalConcurrency, the ticks
// of schedules, and the times the kit reports ([Sent].At and Due,
// [Delivery].RetryAt, [disker.DeadLetter].At). While Advance moves it,
// the kit's Disker stays alive: it keeps its entry in the registry of
// workers, its deliveries and its inbox.
//
// What runs in real time:
//
//   - A handler's context: when a handler starts, its context gets the
//     message's deadline as the local time the kit's clock would take to
//     reach it, and from then on that deadline passes in real time (an
//     Advance made while the handler runs does not end it).
//     [disker.Message].Deadline is that local time; [Delivery] reports the
//     deadline on the kit's clock.
//   - Request: it waits for its context, whose deadline is real time, and
//     its message's timeout is what is left of that deadline when it
//     sends. A Request whose deadline passes in real time before its
//     message is settled returns disker.ErrOutcomeUnknown, since the
//     kit's clock has not reached the deadline that decides it; give a
//     Request made in a test a deadline longer than the test, and test
//     timeouts with Send, WithTimeout and OnTimeout, which are on the
//     kit's clock.
//   - The times in message ids, which Disker makes from the local clock
//     (the kit's broker finds a message by its id whatever its clock
//     says), and the checks that options make when they are given
//     (WithExpireAt against WithDelay compares with the local clock).
//   - DefaultBackoff's jitter is random: give WithBackoff a function
//     without jitter to assert when a retry comes.
//
// # What runs where
//
// Drain runs a receiver's messages one at a time (a batch handler's,
// HandleBatch, in batches of up to its batch size), each to its end, in
// the order the Disker's own loop would fetch them (higher priority first,
// then retries and expired leases, then the oldest), and follows the
// receiver's options: attempts and backoff, pause (a paused receiver's
// messages are not run), rate limits (no more than its tokens at the
// kit's time) and expiry. Concurrency, prefetching and the exclusive lock
// do not apply: the kit's Disker is the one instance, and runs one message
// at a time. The heartbeat, the pause watch and Request's reading of its
// replies run in goroutines, as in production; none changes an outcome.
package diskertest
