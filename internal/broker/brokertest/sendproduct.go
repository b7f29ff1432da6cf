package brokertest

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// The due times of the product of send options (testSendProduct).
const (
	dueNow   = "now"   // no Delay, no DeliverAt
	dueDelay = "delay" // Delay
	dueAt    = "at"    // DeliverAt in the future
	duePast  = "past"  // DeliverAt that has passed: due now
)

// productDelay is the delay of the deferred messages of testSendProduct:
// long enough that the suite looks at them before they are due.
const productDelay = 600 * time.Millisecond

// productTimeout is the timeout of its timed messages: long enough for
// the suite to answer every first message before its deadline.
const productTimeout = 4 * time.Second

// productIdemTTL is the window of its idempotency keys.
const productIdemTTL = time.Minute

// productExpiry is the expiry of its expiring messages, after their due
// time.
const productExpiry = time.Hour

// sendCombo is one combination of the send options, sent twice with the
// same options (a second message with the same keys) to a receiver of its
// own.
type sendCombo struct {
	due          string
	prio         int
	dedup, idem  bool
	timed        bool
	expire       bool
	retain       bool   // sent with a retention: every other combination
	batch        string // children of this batch (every other retained one), or ""
	route        broker.Route
	receiver     string
	start        time.Time // broker time before the first send
	first, again broker.SendParams
}

// String names the combination.
func (c *sendCombo) String() string {
	return fmt.Sprintf("due %s, priority %d, dedup %v, idempotent %v, timed %v, expiring %v, retained %v, batch %v, route %v",
		c.due, c.prio, c.dedup, c.idem, c.timed, c.expire, c.retain, c.batch != "", c.route)
}

// later reports whether its messages are deferred.
func (c *sendCombo) later() bool { return c.due == dueDelay || c.due == dueAt }

// stored is how many messages its two sends store: one when the second
// repeats a key of the first, else two.
func (c *sendCombo) stored() int {
	if c.dedup || c.idem {
		return 1
	}
	return 2
}

// params returns the send of a message of c with a fresh id.
func (c *sendCombo) params(content string) broker.SendParams {
	env := newEnv(c.receiver, content)
	env.Route = c.route
	switch c.route {
	case broker.RouteNone:
		env.Sender = ""
	case broker.RouteInbox:
		env.Sender = c.receiver + "-inbox"
	}
	env.Priority = c.prio
	p := broker.SendParams{Env: *env}
	if c.timed {
		p.Env.Timeout = productTimeout
	}
	switch c.due {
	case dueDelay:
		p.Delay = productDelay
	case dueAt:
		p.DeliverAt = c.start.Add(productDelay)
	case duePast:
		p.DeliverAt = c.start.Add(-time.Hour)
	}
	if c.dedup {
		p.DedupKey, p.DedupTTL = "dk", time.Minute
	}
	if c.idem {
		p.Env.IdempotencyKey, p.IdemTTL = "ik", productIdemTTL
	}
	if c.expire {
		p.Expiry = productExpiry
	}
	if c.retain {
		p.Retention = time.Hour
	}
	p.Batch = c.batch
	return p
}

// sendCombos returns every combination: each due time, level, dedup key
// or none, idempotency key or none, timed or not, expiring or not, and
// reply route (a timed message has one); every other one retained, and
// every other retained one the child of a batch.
func sendCombos() []*sendCombo {
	var cs []*sendCombo
	for _, due := range []string{dueNow, dueDelay, dueAt, duePast} {
		for _, prio := range []int{broker.PriorityLow, broker.PriorityNormal, broker.PriorityHigh} {
			for _, dedup := range []bool{false, true} {
				for _, idem := range []bool{false, true} {
					for _, timed := range []bool{false, true} {
						for _, expire := range []bool{false, true} {
							for _, route := range []broker.Route{broker.RouteNone, broker.RouteSender, broker.RouteInbox} {
								if timed && route == broker.RouteNone {
									continue // refused: see testInvalidParams
								}
								c := &sendCombo{due: due, prio: prio, dedup: dedup, idem: idem, timed: timed, expire: expire, route: route,
									retain: len(cs)%2 == 1, receiver: name("combo")}
								if c.retain && len(cs)%4 == 3 {
									c.batch = broker.NewBatchID(c.receiver+"-done", "b")
								}
								cs = append(cs, c)
							}
						}
					}
				}
			}
		}
	}
	return cs
}

// testSendProduct walks the product of the send options and shows, for
// each combination, that the options compose: the second send of a
// message with the same keys stores nothing (Joined by its idempotency
// key, which comes first, else Duplicate by its dedup key); a deferred
// message counts as deferred, is delivered no earlier than its due time,
// at its level, with its deadline (its due time plus its timeout, or its
// idempotency key's window) and its expiry (its due time plus the
// expiry); and a timed message has exactly one outcome:
// a reply accepted before the deadline is accepted once, and one that
// nobody answered gets one timeout notice (a named sender's) or refuses a
// late reply (an inbox's).
func testSendProduct(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	combos := sendCombos()
	for _, c := range combos {
		if c.route == broker.RouteInbox {
			keepInbox(t, b, c.receiver+"-inbox", time.Hour)
		}
		c.start = brokerNow(t, b)
		c.first, c.again = c.params("first"), c.params("again")
		c.startBatch(t, b)
		c.first.Result = sendP(t, b, c.first)
		c.again.Result = sendP(t, b, c.again)
		c.sealBatch(t, b)
		checkFirstSend(t, c, brokerNow(t, b))
		checkAgain(t, c)
		checkRetained(t, b, c, false)
	}
	// Before their due time, the deferred messages wait, counted.
	for _, c := range combos {
		if c.later() && brokerNow(t, b).Before(c.start.Add(productDelay/2)) {
			if st := stats(t, b, c.receiver); st.Deferred != int64(c.stored()) || st.Length != 0 {
				t.Fatalf("%v: stats before the due time: %+v, want %d deferred, nothing queued", c, st, c.stored())
			}
		}
	}
	for _, c := range combos {
		ds := fetchCombo(t, b, c)
		settleCombo(t, b, c, ds)
		c.checkBatch(t, b)
	}
	// The timed messages nobody answered: one outcome each.
	for _, c := range combos {
		switch {
		case c.timed && c.stored() == 2:
			checkUnanswered(t, b, c)
		case c.timed && c.route == broker.RouteSender:
			// The second send stored nothing: it has no pending timeout
			// either, so its sender never hears of it.
			waitBrokerTime(t, b, c.first.Result.Deadline.Add(expirySlack))
			if n, err := b.ExpireTimeouts(ctx, c.again.Env.Sender, 10); err != nil || n != 0 {
				t.Fatalf("%v: %d timeout notices for a send that stored nothing, %v; want none", c, n, err)
			}
		}
		for _, p := range []*broker.SendParams{&c.first, &c.again} {
			if cl, err := b.Cancel(ctx, &broker.CancelParams{Receiver: c.receiver, ID: p.Env.ID, MaxScan: 100}); err != nil || cl.State != broker.CancelNotFound {
				t.Fatalf("%v: message %s is still somewhere after it was handled: %+v, %v", c, p.Env.ID, cl, err)
			}
			if c.route == broker.RouteSender {
				s := p.Env.Sender
				ackReplies(t, b, s, readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Lease: longLease}))
			}
		}
		if c.route == broker.RouteInbox {
			closeInbox(t, b, c.receiver+"-inbox")
		}
	}
}

// checkFirstSend checks the result of c's first send, made after c.start
// and before now (broker times).
func checkFirstSend(t *testing.T, c *sendCombo, now time.Time) {
	t.Helper()
	r := c.first.Result
	want := broker.Queued
	if c.later() {
		want = broker.Deferred
	}
	if r.Outcome != want || r.ID != c.first.Env.ID || r.Err != nil || r.Reply != nil {
		t.Fatalf("%v: first send: %+v, want %v with its own id", c, r, want)
	}
	if !c.timed {
		if !r.Deadline.IsZero() {
			t.Fatalf("%v: first send: deadline %v of an untimed message", c, r.Deadline)
		}
		return
	}
	// The due time is between the broker times around the send (the
	// broker's precision is a millisecond); an inbox's deadline may be
	// the broker's clock as the client estimates it.
	low, high := c.start, now
	if c.later() {
		low, high = low.Add(productDelay), high.Add(productDelay)
	}
	slack := time.Millisecond
	if c.route == broker.RouteInbox {
		slack = Patience / 10
	}
	if d := r.Deadline.Add(-productTimeout); d.Before(low.Add(-slack)) || d.After(high.Add(slack)) {
		t.Fatalf("%v: first send: deadline %v is not due time + timeout (due between %v and %v)", c, r.Deadline, low, high)
	}
}

// checkAgain checks the result of c's second send: Joined when idempotent,
// Duplicate when only deduplicated, else a message of its own.
func checkAgain(t *testing.T, c *sendCombo) {
	t.Helper()
	r := c.again.Result
	switch {
	case c.idem:
		if r.Outcome != broker.Joined || r.ID != c.first.Env.ID || r.Reply != nil {
			t.Fatalf("%v: second send with the idempotency key: %+v, want joined to %s", c, r, c.first.Env.ID)
		}
	case c.dedup:
		if r.Outcome != broker.Duplicate || r.ID != c.first.Env.ID {
			t.Fatalf("%v: second send with the dedup key: %+v, want a duplicate of %s", c, r, c.first.Env.ID)
		}
	case r.Outcome != c.first.Result.Outcome || r.ID != c.again.Env.ID:
		t.Fatalf("%v: second send: %+v, want it stored as the first", c, r)
	}
}

// fetchCombo fetches the messages c stored, checking that none comes
// before its due time, and each at its level with its envelope and
// deadline.
func fetchCombo(t *testing.T, b broker.Broker, c *sendCombo) []broker.Delivery {
	t.Helper()
	var got []broker.Delivery
	eventually(t, fmt.Sprint(c, ": its deliveries"), func() bool {
		ds := fetch(t, b, broker.FetchParams{Receiver: c.receiver, Consumer: "w", Max: 10, Block: pollBlock, Lease: longLease})
		if len(ds) > 0 && c.later() {
			if now := brokerNow(t, b); now.Before(c.start.Add(productDelay)) {
				t.Fatalf("%v: delivered at %v, before its due time (after %v)", c, now, c.start.Add(productDelay))
			}
		}
		got = append(got, ds...)
		return len(got) >= c.stored()
	})
	if len(got) != c.stored() {
		t.Fatalf("%v: %d deliveries, want %d", c, len(got), c.stored())
	}
	for i, d := range got {
		p := &c.first
		if d.Env.ID == c.again.Env.ID && c.stored() == 2 {
			p = &c.again
		}
		// Messages due now are queued in send order; deferred ones due in
		// the same millisecond in no particular order.
		if d.Env.ID != p.Env.ID || !c.later() && i == 1 && p != &c.again {
			t.Fatalf("%v: delivery %d is %s, want the first %s, then the second %s", c, i, d.Env.ID, c.first.Env.ID, c.again.Env.ID)
		}
		checkEnv(t, fmt.Sprint(c, ": delivery"), d.Env, &p.Env)
		checkExpiry(t, c, d)
		wantDeadline := p.Result.Deadline
		if c.idem {
			// The key's window, counted from the due time.
			low := c.start.Add(productIdemTTL)
			if c.later() {
				low = low.Add(productDelay)
			}
			// A due time given as a time (DeliverAt) reaches the broker
			// in whole milliseconds of its clock, which the client's
			// estimate of that clock may put a millisecond early.
			if d.Deadline.Before(low.Truncate(time.Millisecond).Add(-time.Millisecond)) || d.Deadline.After(low.Add(Patience)) {
				t.Fatalf("%v: delivered deadline %v, want the idempotency key's window end (after %v)", c, d.Deadline, low)
			}
			continue
		}
		if !d.Deadline.Equal(wantDeadline) {
			t.Fatalf("%v: delivered deadline %v, Send said %v", c, d.Deadline, wantDeadline)
		}
	}
	return got
}

// checkExpiry checks that delivery d of c carries its expiry: none, or
// its due time plus productExpiry (the due time is after c.start, and it
// is delivered after it).
func checkExpiry(t *testing.T, c *sendCombo, d broker.Delivery) {
	t.Helper()
	if !c.expire {
		if !d.Expiry.IsZero() {
			t.Fatalf("%v: delivered with expiry %v, want none", c, d.Expiry)
		}
		return
	}
	low := c.start.Add(productExpiry)
	if c.later() {
		low = low.Add(productDelay)
	}
	if d.Expiry.Before(low.Truncate(time.Millisecond)) || d.Expiry.After(time.Now().Add(productExpiry+Patience)) {
		t.Fatalf("%v: delivered expiry %v, want its due time + %v (after %v)", c, d.Expiry, productExpiry, low)
	}
}

// settleCombo answers the first message of c before its deadline, and
// acknowledges every delivery: a timed message's reply is accepted once;
// an idempotent message's reply is stored under its key, with the sends
// from an inbox as its waiters.
func settleCombo(t *testing.T, b broker.Broker, c *sendCombo, ds []broker.Delivery) {
	t.Helper()
	ctx := ctxT(t)
	rep := replyTo(&c.first.Env, "answer")
	if c.idem {
		_, ws, found, err := b.SettleIdempotent(ctx, c.receiver, "ik", rep)
		want := 0
		if c.route == broker.RouteInbox {
			want = 2 // the first send and the one that joined it
		}
		if err != nil || !found || len(ws) != want {
			t.Fatalf("%v: SettleIdempotent: found %v, waiters %+v, %v; want %d waiters", c, found, ws, err, want)
		}
	}
	switch {
	case c.route == broker.RouteInbox:
		if err := b.ReplyInbox(ctx, rep, c.first.Result.Deadline); err != nil {
			t.Fatalf("%v: ReplyInbox before the deadline: %v", c, err)
		}
	case c.route == broker.RouteSender && c.timed:
		if err := b.Reply(ctx, rep, broker.ReplyTimed); err != nil {
			t.Fatalf("%v: timed reply before the deadline: %v", c, err)
		}
		if err := b.Reply(ctx, rep, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
			t.Fatalf("%v: a second timed reply: %v, want ErrLate (one outcome)", c, err)
		}
	}
	for _, d := range ds {
		if c.retain {
			finish(t, b, broker.FinishResultParams{Receiver: c.receiver, ID: d.Env.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w", Attempt: d.Attempt, Retention: time.Hour})
			continue
		}
		ack(t, b, c.receiver, d.Ref)
	}
	checkRetained(t, b, c, true)
}

// checkRetained checks the records of c's messages: a message stored
// with a retention has one (queued until settled, final after), a send
// that stored nothing, or one without a retention, none.
func checkRetained(t *testing.T, b broker.Broker, c *sendCombo, settled bool) {
	t.Helper()
	for i, p := range []*broker.SendParams{&c.first, &c.again} {
		stored := i == 0 || c.stored() == 2
		rec, err := b.Result(ctxT(t), c.receiver, p.Env.ID)
		switch {
		case !c.retain || !stored:
			if !errors.Is(err, broker.ErrNoResult) {
				t.Fatalf("%v: message %d: record %+v, %v; want ErrNoResult", c, i, rec, err)
			}
		case err != nil:
			t.Fatalf("%v: message %d: Result: %v", c, i, err)
		case !settled && rec.State != broker.ResultQueued:
			t.Fatalf("%v: message %d: record %+v before delivery, want queued", c, i, rec)
		case settled && rec.State != broker.ResultDone:
			t.Fatalf("%v: message %d: record %+v after it was settled, want done", c, i, rec)
		case c.timed && !rec.Deadline.Equal(p.Result.Deadline):
			t.Fatalf("%v: message %d: record's deadline %v, the send's %v", c, i, rec.Deadline, p.Result.Deadline)
		}
	}
}

// checkUnanswered waits out the deadline of c's second message, which
// nobody answered: a named sender gets exactly one timeout notice for it
// (and the first message, answered, none); a reply to an inbox is refused.
func checkUnanswered(t *testing.T, b broker.Broker, c *sendCombo) {
	t.Helper()
	ctx := ctxT(t)
	deadline := c.again.Result.Deadline
	waitBrokerTime(t, b, deadline.Add(expirySlack))
	late := replyTo(&c.again.Env, "late")
	if c.route == broker.RouteInbox {
		if err := b.ReplyInbox(ctx, late, deadline); !errors.Is(err, broker.ErrLate) {
			t.Fatalf("%v: a reply after the deadline to an inbox: %v, want ErrLate", c, err)
		}
		return
	}
	sender := c.again.Env.Sender
	notices := 0
	eventually(t, fmt.Sprint(c, ": the timeout notice"), func() bool {
		n, err := b.ExpireTimeouts(ctx, sender, 10)
		if err != nil {
			t.Fatalf("%v: ExpireTimeouts: %v", c, err)
		}
		notices += n
		return notices > 0
	})
	if n, err := b.ExpireTimeouts(ctx, sender, 10); err != nil || n+notices != 1 {
		t.Fatalf("%v: %d timeout notices, %v; want exactly one", c, n+notices, err)
	}
	if err := b.Reply(ctx, late, broker.ReplyTimed); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("%v: a reply after the timeout notice: %v, want ErrLate", c, err)
	}
}

// startBatch creates c's batch, if it has one, and registers its two
// messages as children, as a send with WithBatch does.
func (c *sendCombo) startBatch(t *testing.T, b broker.Broker) {
	t.Helper()
	if c.batch == "" {
		return
	}
	done := newEnv(c.receiver+"-done", "done")
	done.Route, done.Sender = broker.RouteNone, ""
	ctx := ctxT(t)
	if err := b.CreateBatch(ctx, &broker.CreateBatchParams{ID: c.batch, Completion: *done, Retention: time.Hour}); err != nil {
		t.Fatalf("%v: CreateBatch: %v", c, err)
	}
	children := []broker.BatchChild{{ID: c.first.Env.ID, Receiver: c.receiver}, {ID: c.again.Env.ID, Receiver: c.receiver}}
	if err := b.AddBatchChildren(ctx, c.batch, children); err != nil {
		t.Fatalf("%v: AddBatchChildren: %v", c, err)
	}
}

// sealBatch forgets in c's batch a second send that stored nothing, as
// the disker package does, and seals the batch.
func (c *sendCombo) sealBatch(t *testing.T, b broker.Broker) {
	t.Helper()
	if c.batch == "" {
		return
	}
	ctx := ctxT(t)
	if c.stored() == 1 {
		if err := b.RemoveBatchChild(ctx, c.batch, c.again.Env.ID); err != nil {
			t.Fatalf("%v: RemoveBatchChild: %v", c, err)
		}
	}
	if info, err := b.SealBatch(ctx, c.batch); err != nil || info.State != broker.BatchSealed || info.Counts.Children != c.stored() {
		t.Fatalf("%v: SealBatch: %+v, %v; want it sealed with %d children", c, info, err, c.stored())
	}
}

// checkBatch checks c's batch, once its messages were settled: each
// stored message counted once, succeeded, and the completion queued once.
func (c *sendCombo) checkBatch(t *testing.T, b broker.Broker) {
	t.Helper()
	if c.batch == "" {
		return
	}
	ctx := ctxT(t)
	if err := b.SettleBatchReports(ctx, c.receiver); err != nil {
		t.Fatalf("%v: SettleBatchReports: %v", c, err)
	}
	info, err := b.Batch(ctx, c.batch)
	if err != nil || info.State != broker.BatchCompleted || info.Fired != broker.FiredCompletion ||
		info.Counts != (broker.BatchCounts{Children: c.stored(), Succeeded: c.stored()}) {
		t.Fatalf("%v: the batch after its children: %+v, %v; want completed, %d succeeded", c, info, err, c.stored())
	}
	recv, _, _ := broker.ParseBatchID(c.batch)
	ds := fetch(t, b, broker.FetchParams{Receiver: recv, Consumer: "w", Max: 10, Lease: longLease})
	if len(ds) != 1 || ds[0].Env.ID != info.CompletionID {
		t.Fatalf("%v: the batch queued %d messages, want its completion once", c, len(ds))
	}
	ack(t, b, recv, ds[0].Ref)
}
