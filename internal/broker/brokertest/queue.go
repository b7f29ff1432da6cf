package brokertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

func testNow(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	a, err := b.Now(ctx)
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	c, err := b.Now(ctx)
	if err != nil {
		t.Fatalf("Now: %v", err)
	}
	if a.IsZero() || c.Before(a) {
		t.Fatalf("Now: got %v then %v, want a non-zero clock that does not go back", a, c)
	}
}

func testSendFetchAck(t *testing.T, b broker.Broker) {
	r := name("recv")
	env := newEnv(r, "hello\x00\xff world")
	env.Headers["ünïcode"] = "välue"
	env.ErrorCode, env.ErrorText = "code", "text"
	if deadline := send(t, b, env); !deadline.IsZero() {
		t.Fatalf("Send of an untimed message: got deadline %v, want zero", deadline)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1, Pending: 0, DeadLetters: 0})

	d := fetchOne(t, b, r, "c1", longLease)
	checkEnv(t, "Fetch", d.Env, env)
	if d.Ref == "" || d.Attempt != 1 || !d.Deadline.IsZero() {
		t.Fatalf("Fetch: got ref %q attempt %d deadline %v, want a ref, attempt 1, no deadline", d.Ref, d.Attempt, d.Deadline)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 1, DeadLetters: 0})
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c2", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10}); len(ds) != 0 {
		t.Fatalf("second Fetch while leased: got %+v, want nothing", ds)
	}

	ack(t, b, r, d.Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10}); len(ds) != 0 {
		t.Fatalf("Fetch after Ack: got %+v, want nothing", ds)
	}

	// What the caller does with its envelope after Send, or with a
	// delivery, does not reach the broker's copy.
	env2 := newEnv(r, "original")
	want := newEnv(r, "original")
	want.ID, want.Sender = env2.ID, env2.Sender
	send(t, b, env2)
	env2.Content[0] = 'X'
	env2.Headers["k"] = "changed"
	d2 := fetchOne(t, b, r, "c1", shortLease)
	checkEnv(t, "Fetch after the sender changed its envelope", d2.Env, want)
	d2.Env.Content[0] = 'Y'
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c2", Lease: shortLease, MaxAttempts: 10})
	checkEnv(t, "redelivery after the consumer changed its delivery", ds[0].Env, want)
	ack(t, b, r, ds[0].Ref)
}

func testSendValidation(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("recv")
	env := newEnv("", "x")
	if err := sendErr(ctx, b, broker.SendParams{Env: *env}); err == nil {
		t.Fatalf("Send with an empty receiver: got no error")
	}
	big := newEnv(r, strings.Repeat("x", MaxMessageSize+1))
	if err := sendErr(ctx, b, broker.SendParams{Env: *big}); err == nil {
		t.Fatalf("Send of %d bytes: got no error", len(big.Content))
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
	if receivers(t, b)[r] {
		t.Fatalf("Receivers lists %s after rejected sends", r)
	}
}

// testSendBatch sends many messages in one Send, untimed and timed, to
// two receivers: each is queued in order, the timed ones with their
// pending timeouts; an invalid message fails the whole call, unsent.
func testSendBatch(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r1, r2 := name("recv"), name("recv")
	timed := func(env *broker.Envelope) *broker.Envelope {
		env.Timeout = time.Minute
		return env
	}
	envs := []*broker.Envelope{newEnv(r1, "a"), timed(newEnv(r1, "b")), newEnv(r2, "c"), newEnv(r1, "d"), timed(newEnv(r2, "e")), timed(newEnv(r1, "f"))}
	before, err := b.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before = before.Truncate(time.Millisecond) // brokers may keep deadlines in ms
	ps := paramsOf(envs)
	if err := b.Send(ctx, ps); err != nil {
		t.Fatalf("Send of %d: %v", len(ps), err)
	}
	for i, env := range envs {
		res := ps[i].Result
		if res.Err != nil || res.Outcome != broker.Queued || res.ID != env.ID {
			t.Fatalf("Send: message %d: got %+v, want it queued", i, res)
		}
		if got := !res.Deadline.IsZero(); got != (env.Timeout > 0) || got && res.Deadline.Before(before.Add(env.Timeout)) {
			t.Fatalf("Send: deadline %d is %v; want zero for an untimed message, else at least %v", i, res.Deadline, before.Add(env.Timeout))
		}
	}
	for _, w := range []struct {
		r    string
		want []int
	}{{r1, []int{0, 1, 3, 5}}, {r2, []int{2, 4}}} {
		ds := fetch(t, b, broker.FetchParams{Receiver: w.r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
		if len(ds) != len(w.want) {
			t.Fatalf("Fetch %s after Send: got %d messages, want %d", w.r, len(ds), len(w.want))
		}
		for j, i := range w.want {
			checkEnv(t, fmt.Sprint("batch message ", i), ds[j].Env, envs[i])
			if !ds[j].Deadline.Equal(ps[i].Result.Deadline) {
				t.Fatalf("batch message %d: delivered with deadline %v, Send said %v", i, ds[j].Deadline, ps[i].Result.Deadline)
			}
			ack(t, b, w.r, ds[j].Ref)
		}
	}
	for _, i := range []int{1, 4, 5} {
		if err := b.Reply(ctx, replyTo(envs[i], "ok"), broker.ReplyTimed); err != nil {
			t.Fatalf("ReplyTimed to batch message %d: got %v; want it accepted, its pending timeout recorded", i, err)
		}
		ackReplies(t, b, envs[i].Sender, readReplies(t, b, broker.ReadRepliesParams{Sender: envs[i].Sender, Consumer: "c", Max: 10, Block: 0, Lease: longLease}))
	}

	if err := b.Send(ctx, nil); err != nil {
		t.Fatalf("Send of nothing: got %v, want nil", err)
	}
	bad := paramsOf([]*broker.Envelope{newEnv(r1, "x"), newEnv(r1, "y"), newEnv("", "z")})
	if err := b.Send(ctx, bad); err == nil || !strings.Contains(err.Error(), "message 2") {
		t.Fatalf("Send with an empty receiver at index 2: got %v, want an error naming message 2", err)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r1, Queued: 0, Pending: 0, DeadLetters: 0})
}

// paramsOf returns the params of sending each of envs now, with no key.
func paramsOf(envs []*broker.Envelope) []broker.SendParams {
	ps := make([]broker.SendParams, len(envs))
	for i, env := range envs {
		ps[i].Env = *env
	}
	return ps
}

func testFetchOrderAndMax(t *testing.T, b broker.Broker) {
	r := name("recv")
	var envs []*broker.Envelope
	for i := range 5 {
		env := newEnv(r, fmt.Sprint("m", i))
		envs = append(envs, env)
		send(t, b, env)
	}
	first := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 3, Block: 0, Lease: longLease, MaxAttempts: 10})
	rest := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(first) != 3 || len(rest) != 2 {
		t.Fatalf("Fetch max 3 then max 10 of 5 messages: got %d and %d", len(first), len(rest))
	}
	refs := map[string]bool{}
	for i, d := range append(first, rest...) {
		checkEnv(t, fmt.Sprint("delivery ", i), d.Env, envs[i])
		if refs[d.Ref] {
			t.Fatalf("ref %q delivered twice", d.Ref)
		}
		refs[d.Ref] = true
		ack(t, b, r, d.Ref)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testFetchEmpty(t *testing.T, b broker.Broker) {
	r := name("recv")
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10}); len(ds) != 0 {
		t.Fatalf("Fetch of an empty queue: got %+v", ds)
	}
	if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c1", Max: 10, Block: 100 * time.Millisecond, Lease: longLease, MaxAttempts: 10}); len(ds) != 0 {
		t.Fatalf("blocking Fetch of an empty queue: got %+v", ds)
	}
}

// fetchResult is what a Fetch run in a goroutine returned.
type fetchResult struct {
	ds  []broker.Delivery
	err error
}

func goFetch(ctx context.Context, b broker.Broker, receiver, consumer string, block time.Duration) <-chan fetchResult {
	ch := make(chan fetchResult, 1)
	go func() {
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: consumer, Max: 10, Block: block, Lease: longLease, MaxAttempts: 10})
		ch <- fetchResult{ds, err}
	}()
	return ch
}

// await receives from ch, failing after Patience.
func await[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Patience):
		t.Fatalf("gave up after %v waiting for %s", Patience, what)
		panic("unreachable")
	}
}

func testFetchWokenBySend(t *testing.T, b broker.Broker) {
	r := name("recv")
	ch := goFetch(ctxT(t), b, r, "c1", blockLong)
	env := newEnv(r, "wake up")
	send(t, b, env)
	res := await(t, "the blocked Fetch", ch)
	if res.err != nil || len(res.ds) != 1 {
		t.Fatalf("blocked Fetch: got %+v, %v; want the message", res.ds, res.err)
	}
	checkEnv(t, "blocked Fetch", res.ds[0].Env, env)
	ack(t, b, r, res.ds[0].Ref)
}

func testFetchCancelled(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx, cancel := context.WithCancel(ctxT(t))
	ch := goFetch(ctx, b, r, "c1", blockLong)
	cancel()
	res := await(t, "the cancelled Fetch", ch)
	if !errors.Is(res.err, context.Canceled) || len(res.ds) != 0 {
		t.Fatalf("cancelled Fetch: got %+v, %v; want context.Canceled", res.ds, res.err)
	}
	// The message sent after the cancellation is not lost to the gone
	// reader.
	env := newEnv(r, "after cancel")
	send(t, b, env)
	d := fetchOne(t, b, r, "c2", longLease)
	checkEnv(t, "Fetch after a cancelled Fetch", d.Env, env)
	ack(t, b, r, d.Ref)
}

func testCompetingConsumers(t *testing.T, b broker.Broker) {
	r := name("recv")
	const n, consumers = 60, 4
	for i := range n {
		send(t, b, newEnv(r, fmt.Sprint(i)))
	}
	var (
		mu   sync.Mutex
		seen = map[string]string{} // message id -> consumer
		errs errorList
		wg   sync.WaitGroup
	)
	ctx := ctxT(t)
	for c := range consumers {
		consumer := fmt.Sprint("c", c)
		wg.Go(func() {
			for {
				ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: consumer, Max: 3, Block: 0, Lease: longLease, MaxAttempts: 10})
				mu.Lock()
				if err != nil {
					errs.add(err)
				}
				for _, d := range ds {
					if other, dup := seen[d.Env.ID]; dup {
						errs.add(fmt.Errorf("message %s delivered to %s and %s", d.Env.ID, other, consumer))
					}
					seen[d.Env.ID] = consumer
				}
				mu.Unlock()
				if err != nil || len(ds) == 0 {
					return
				}
				refs := make([]string, len(ds))
				for i, d := range ds {
					refs[i] = d.Ref
				}
				if err := b.Ack(ctx, r, refs...); err != nil {
					errs.add(err)
					return
				}
			}
		})
	}
	wg.Wait()
	errs.check(t)
	if len(seen) != n {
		t.Fatalf("competing consumers got %d distinct messages, want %d", len(seen), n)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testLeaseExpiryRedelivers(t *testing.T, b broker.Broker) {
	r := name("recv")
	env := newEnv(r, "job")
	send(t, b, env)
	d1 := fetchOne(t, b, r, "dies", shortLease)
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "lives", Lease: shortLease, MaxAttempts: 10})
	if len(ds) != 1 {
		t.Fatalf("redelivery: got %d deliveries, want 1", len(ds))
	}
	d2 := ds[0]
	checkEnv(t, "redelivery", d2.Env, env)
	if d2.Ref != d1.Ref || d2.Attempt != 2 {
		t.Fatalf("redelivery: got ref %q attempt %d, want ref %q attempt 2", d2.Ref, d2.Attempt, d1.Ref)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 1, DeadLetters: 0})
	ack(t, b, r, d2.Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

// testHolderLeaseDecides: a delivery is reclaimed when its holder's lease
// (taken at fetch or at the last extension) is over, whatever the lease of
// the consumer that fetches next.
func testHolderLeaseDecides(t *testing.T, b broker.Broker) {
	r := name("recv")
	env := newEnv(r, "job")
	send(t, b, env)
	d1 := fetchOne(t, b, r, "short", shortLease)
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "long", Lease: longLease, MaxAttempts: 10})
	if len(ds) != 1 || ds[0].Ref != d1.Ref {
		t.Fatalf("a consumer with a long lease after a holder's short lease ran out: got %+v, want %q", ds, d1.Ref)
	}
	// Now "long" holds it for longLease: a consumer with a short lease may
	// not take it, however long it tries.
	until := time.Now().Add(4 * shortLease)
	for time.Now().Before(until) {
		if got := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "short", Max: 10, Block: pollBlock, Lease: shortLease, MaxAttempts: 10}); len(got) != 0 {
			t.Fatalf("a consumer with a short lease took a delivery held with a long one: %+v", got)
		}
	}
	// An extension records the lease it takes: a short-lease holder that
	// extends with longLease keeps its delivery.
	env2 := newEnv(r, "job2")
	send(t, b, env2)
	d2 := fetchOne(t, b, r, "short", shortLease)
	if lost, err := b.Extend(ctxT(t), &broker.ExtendParams{Receiver: r, Consumer: "short", Refs: []string{d2.Ref}, Lease: longLease}); err != nil || len(lost) != 0 {
		t.Fatalf("Extend: lost %v, %v", lost, err)
	}
	until = time.Now().Add(4 * shortLease)
	for time.Now().Before(until) {
		if got := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "thief", Max: 10, Block: pollBlock, Lease: shortLease, MaxAttempts: 10}); len(got) != 0 {
			t.Fatalf("a delivery extended with a long lease was taken after the short one: %+v", got)
		}
	}
	ack(t, b, r, ds[0].Ref, d2.Ref)
}

// testHeartbeatLapse: once a holder's heartbeat (Registry.Heartbeat under
// the consumer's name) has lapsed, and a live worker's heartbeat saw it,
// another consumer takes its deliveries whatever their lease, and the
// holder's Extend reports them lost.
func testHeartbeatLapse(t *testing.T, b broker.Broker) {
	r, holder := name("recv"), name("holder")
	env := newEnv(r, "job")
	send(t, b, env)
	d := fetchOne(t, b, r, holder, longLease)
	if err := b.Heartbeat(ctxT(t), broker.WorkerInfo{ID: holder, Receivers: []string{r}}, shortLease); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	// Every live worker heartbeats: the survivor's heartbeats are what
	// see the holder's lapse, and its next fetch reclaims.
	var ds []broker.Delivery
	eventually(t, "the lapsed holder's delivery", func() bool {
		if err := b.Heartbeat(ctxT(t), broker.WorkerInfo{ID: "survivor", Receivers: []string{r}}, longLease); err != nil {
			t.Fatalf("Heartbeat: %v", err)
		}
		ds = fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "survivor", Max: 10, Block: pollBlock, Lease: longLease, MaxAttempts: 10})
		return len(ds) > 0
	})
	if len(ds) != 1 || ds[0].Ref != d.Ref || ds[0].Attempt != 2 {
		t.Fatalf("after the holder's heartbeat lapsed: got %+v, want %q attempt 2", ds, d.Ref)
	}
	lost, err := b.Extend(ctxT(t), &broker.ExtendParams{Receiver: r, Consumer: holder, Refs: []string{d.Ref}, Lease: longLease})
	if err != nil || len(lost) != 1 {
		t.Fatalf("the lapsed holder's Extend: lost %v, %v; want its delivery lost", lost, err)
	}
	ack(t, b, r, d.Ref)
	for _, id := range []string{holder, "survivor"} {
		if err := b.Deregister(ctxT(t), id); err != nil {
			t.Fatal(err)
		}
	}
}

func testExtendKeepsLease(t *testing.T, b broker.Broker) {
	// The holder extends its lease every lease/4 for twice the lease while
	// a thief tries to take the message. A theft fails the test unless the
	// machine stalled so long that the lease really lapsed since the last
	// renewal; such a round proves nothing and is tried again.
	const lease = 400 * time.Millisecond
	ctx := ctxT(t)
	for round := 1; round <= 3; round++ {
		r := name("recv")
		send(t, b, newEnv(r, "long job"))
		d := fetchOne(t, b, r, "holder", lease)
		stolen := false
		for i := 0; i < 8 && !stolen; i++ {
			<-time.After(lease / 4) // pacing: time must pass, there is no event to wait for
			start := time.Now()
			lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: r, Consumer: "holder", Refs: []string{d.Ref}, Lease: lease})
			if err != nil {
				t.Fatalf("Extend: %v", err)
			}
			if len(lost) != 0 {
				t.Fatalf("Extend %d of a lease nobody took: got lost %v", i, lost)
			}
			if ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "thief", Max: 10, Block: 0, Lease: lease, MaxAttempts: 10}); len(ds) > 0 {
				if since := time.Since(start); since < lease-5*time.Millisecond {
					t.Fatalf("round %d: a consumer took a message whose lease was extended %v ago, lease %v", round, since, lease)
				}
				stolen = true
			}
		}
		if !stolen {
			checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 1, DeadLetters: 0})
			ack(t, b, r, d.Ref)
			return
		}
		t.Logf("round %d: the machine stalled for a whole lease; trying again", round)
		ack(t, b, r, d.Ref)
	}
	t.Fatalf("the machine stalled for a whole lease in each of 3 rounds; cannot tell")
}

func testExtendReportsLost(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	send(t, b, newEnv(r, "a"))
	send(t, b, newEnv(r, "b"))
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "first", Max: 10, Block: 0, Lease: shortLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d, want 2", len(ds))
	}
	// A message whose lease expired and that another consumer took is lost
	// to the first; one that is acknowledged is lost to everybody.
	taken := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "second", Lease: shortLease, MaxAttempts: 10})
	if len(taken) != 2 {
		// Both expired together, but a poll may catch them apart.
		taken = append(taken, pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "second", Lease: shortLease, MaxAttempts: 10})...)
	}
	lost, err := b.Extend(ctx, &broker.ExtendParams{Receiver: r, Consumer: "first", Refs: []string{ds[0].Ref, ds[1].Ref}, Lease: longLease})
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if len(lost) != 2 {
		t.Fatalf("Extend of leases taken over: got lost %v, want both %s and %s", lost, ds[0].Ref, ds[1].Ref)
	}
	ack(t, b, r, taken[0].Ref)
	lost, err = b.Extend(ctx, &broker.ExtendParams{Receiver: r, Consumer: "second", Refs: []string{taken[0].Ref, taken[1].Ref}, Lease: longLease})
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if len(lost) != 1 || lost[0] != taken[0].Ref {
		t.Fatalf("Extend after Ack of %s: got lost %v, want just it", taken[0].Ref, lost)
	}
	ack(t, b, r, taken[1].Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testAckIdempotent(t *testing.T, b broker.Broker) {
	r := name("recv")
	send(t, b, newEnv(r, "a"))
	send(t, b, newEnv(r, "b"))
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d, want 2", len(ds))
	}
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	ack(t, b, r)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testRetryWithDelay(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	later, soon := newEnv(r, "later"), newEnv(r, "soon")
	send(t, b, later)
	send(t, b, soon)
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "first", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch: got %d, want 2", len(ds))
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "first", Ref: ds[0].Ref, Delay: longLease / 2, Lease: longLease}); err != nil {
		t.Fatalf("Retry after %v: %v", longLease/2, err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "first", Ref: ds[1].Ref, Delay: 100 * time.Millisecond, Lease: longLease}); err != nil {
		t.Fatalf("Retry after 100ms: %v", err)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "other", Ref: ds[0].Ref, Delay: 0, Lease: longLease}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry by a consumer that does not hold the lease: got %v, want ErrLeaseLost", err)
	}
	got := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "second", Lease: longLease, MaxAttempts: 10})
	if len(got) != 1 {
		t.Fatalf("Fetch after the retry delay: got %d deliveries, want only the one retried soon", len(got))
	}
	checkEnv(t, "retried message", got[0].Env, soon)
	if got[0].Attempt != 2 || got[0].Ref != ds[1].Ref {
		t.Fatalf("retried message: got ref %q attempt %d, want ref %q attempt 2", got[0].Ref, got[0].Attempt, ds[1].Ref)
	}
	if err := b.Retry(ctx, &broker.RetryParams{Receiver: r, Consumer: "first", Ref: ds[1].Ref, Delay: 0, Lease: longLease}); !errors.Is(err, broker.ErrLeaseLost) {
		t.Fatalf("Retry by the consumer that lost the message: got %v, want ErrLeaseLost", err)
	}
	if more := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "second", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10}); len(more) != 0 {
		t.Fatalf("Fetch before the %v retry delay: got %+v", longLease/2, more)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 2, DeadLetters: 0})
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testMaxAttemptsDeadLetters(t *testing.T, b broker.Broker) {
	r := name("recv")
	env := newEnv(r, "poison")
	send(t, b, env)
	fetchOne(t, b, r, "c1", shortLease)
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c2", Lease: shortLease, MaxAttempts: 2})
	if ds[0].Attempt != 2 {
		t.Fatalf("second delivery: got attempt %d, want 2", ds[0].Attempt)
	}
	var dls []broker.DeadLetter
	eventually(t, "the dead letter", func() bool {
		if got := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c3", Max: 10, Block: pollBlock, Lease: shortLease, MaxAttempts: 2}); len(got) != 0 {
			t.Fatalf("delivery beyond maxAttempts 2: %+v", got)
		}
		dls = deadLetters(t, b, r)
		return len(dls) > 0
	})
	dl := dls[0]
	checkEnv(t, "dead letter", dl.Env, env)
	if len(dls) != 1 || dl.Attempts != 2 || !strings.Contains(dl.Reason, "lease expired") || dl.Ref == "" || dl.At.IsZero() || dl.Raw != nil {
		t.Fatalf("dead letters: got %+v, want one with 2 attempts, a lease expiry reason, a ref and a time", dls)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 1})
	if n, err := b.PurgeDeadLetters(ctxT(t), r); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: got %d, %v; want 1", n, err)
	}
}

func deadLetter(t *testing.T, b broker.Broker, receiver string, d broker.Delivery, reason string) {
	t.Helper()
	if err := b.DeadLetter(ctxT(t), receiver, d, reason); err != nil {
		t.Fatalf("DeadLetter %s: %v", d.Ref, err)
	}
}

func testDeadLetterRetryPurge(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	m1, m2, m3 := newEnv(r, "one"), newEnv(r, "two"), newEnv(r, "three")
	for _, m := range []*broker.Envelope{m1, m2, m3} {
		send(t, b, m)
	}
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 3 {
		t.Fatalf("Fetch: got %d, want 3", len(ds))
	}
	deadLetter(t, b, r, ds[0], "reason one")
	deadLetter(t, b, r, ds[1], "reason two")
	ack(t, b, r, ds[2].Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 2})
	if !receivers(t, b)[r] {
		t.Fatalf("Receivers does not list %s, which holds dead letters", r)
	}

	dls := deadLetters(t, b, r)
	if len(dls) != 2 {
		t.Fatalf("DeadLetters: got %d, want 2", len(dls))
	}
	for i, want := range []struct {
		env    *broker.Envelope
		reason string
	}{{m1, "reason one"}, {m2, "reason two"}} {
		checkEnv(t, fmt.Sprint("dead letter ", i), dls[i].Env, want.env)
		if dls[i].Reason != want.reason || dls[i].Attempts != 1 || dls[i].At.IsZero() || dls[i].Ref == "" {
			t.Fatalf("dead letter %d: got %+v, want reason %q, 1 attempt, a time and a ref", i, dls[i], want.reason)
		}
	}
	if dls[0].Ref == dls[1].Ref {
		t.Fatalf("dead letters share the ref %q", dls[0].Ref)
	}
	if first, err := b.DeadLetters(ctx, r, 1); err != nil || len(first) != 1 || first[0].Ref != dls[0].Ref {
		t.Fatalf("DeadLetters max 1: got %+v, %v; want the oldest", first, err)
	}

	// Retry one: it is queued again, with its attempts starting over.
	if n, err := b.RetryDeadLetters(ctx, r, dls[0].Ref); err != nil || n != 1 {
		t.Fatalf("RetryDeadLetters: got %d, %v; want 1", n, err)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 1, Pending: 0, DeadLetters: 1})
	d := fetchOne(t, b, r, "c", longLease)
	checkEnv(t, "retried dead letter", d.Env, m1)
	if d.Attempt != 1 {
		t.Fatalf("retried dead letter: got attempt %d, want 1", d.Attempt)
	}
	deadLetter(t, b, r, d, "again")
	dls = deadLetters(t, b, r)
	if len(dls) != 2 || dls[0].Env.ID != m2.ID || dls[1].Env.ID != m1.ID || dls[1].Reason != "again" {
		t.Fatalf("DeadLetters after a second dead-lettering: got %+v, want two then one", dls)
	}

	// Purge one by ref, then the rest.
	if n, err := b.PurgeDeadLetters(ctx, r, dls[0].Ref); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters by ref: got %d, %v; want 1", n, err)
	}
	if n, err := b.PurgeDeadLetters(ctx, r); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters of all: got %d, %v; want 1", n, err)
	}
	if n, err := b.PurgeDeadLetters(ctx, r); err != nil || n != 0 {
		t.Fatalf("PurgeDeadLetters of none: got %d, %v; want 0", n, err)
	}
	if dls := deadLetters(t, b, r); len(dls) != 0 {
		t.Fatalf("DeadLetters after purge: got %+v", dls)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
	if receivers(t, b)[r] {
		t.Fatalf("Receivers lists %s, which holds nothing", r)
	}
}

func testRetryAllDeadLetters(t *testing.T, b broker.Broker) {
	r := name("recv")
	ctx := ctxT(t)
	m1, m2 := newEnv(r, "one"), newEnv(r, "two")
	send(t, b, m1)
	send(t, b, m2)
	for _, d := range fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10}) {
		deadLetter(t, b, r, d, "failed")
	}
	if n, err := b.RetryDeadLetters(ctx, r); err != nil || n != 2 {
		t.Fatalf("RetryDeadLetters of all: got %d, %v; want 2", n, err)
	}
	if n, err := b.RetryDeadLetters(ctx, r); err != nil || n != 0 {
		t.Fatalf("RetryDeadLetters of none: got %d, %v; want 0", n, err)
	}
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: 0, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 2 {
		t.Fatalf("Fetch of retried dead letters: got %d, want 2", len(ds))
	}
	checkEnv(t, "first retried", ds[0].Env, m1)
	checkEnv(t, "second retried", ds[1].Env, m2)
	ack(t, b, r, ds[0].Ref, ds[1].Ref)
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}

func testUndecodableEntry(t *testing.T, b broker.Broker) {
	inj, ok := b.(RawInjector)
	if !ok {
		t.Fatalf("%T does not implement brokertest.RawInjector", b)
	}
	r := name("recv")
	ctx := ctxT(t)
	raw := []byte("\xffnot an envelope")
	if err := inj.InjectRaw(ctx, r, raw); err != nil {
		t.Fatalf("InjectRaw: %v", err)
	}
	good := newEnv(r, "good")
	send(t, b, good)
	// The consumer gets the good message and never the bad one.
	var got []broker.Delivery
	eventually(t, "the good message", func() bool {
		got = append(got, fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 10, Block: pollBlock, Lease: longLease, MaxAttempts: 10})...)
		return len(got) > 0
	})
	if len(got) != 1 {
		t.Fatalf("Fetch: got %d deliveries, want only the good one", len(got))
	}
	checkEnv(t, "Fetch past an undecodable entry", got[0].Env, good)
	ack(t, b, r, got[0].Ref)

	dls := deadLetters(t, b, r)
	if len(dls) != 1 || dls[0].Env.ID != "" || string(dls[0].Raw) != string(raw) || dls[0].Reason == "" {
		t.Fatalf("DeadLetters: got %+v, want the raw entry with a reason", dls)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 1})
	if n, err := b.RetryDeadLetters(ctx, r); err != nil || n != 0 {
		t.Fatalf("RetryDeadLetters of an undecodable entry: got %d, %v; want 0 (it stays)", n, err)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 1})
	if n, err := b.PurgeDeadLetters(ctx, r, dls[0].Ref); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: got %d, %v; want 1", n, err)
	}
	checkStats(t, b, broker.ReceiverStats{Receiver: r, Queued: 0, Pending: 0, DeadLetters: 0})
}
