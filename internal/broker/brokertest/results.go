package brokertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// result reads the record of id, failing on an error.
func result(t *testing.T, b broker.Broker, receiver, id string) broker.ResultRecord {
	t.Helper()
	rec, err := b.Result(ctxT(t), receiver, id)
	if err != nil {
		t.Fatalf("Result %s: %v", id, err)
	}
	return rec
}

// finish records the final outcome of d, acknowledging it.
func finish(t *testing.T, b broker.Broker, p broker.FinishResultParams) {
	t.Helper()
	if err := b.FinishResult(ctxT(t), &p); err != nil {
		t.Fatalf("FinishResult %s: %v", p.ID, err)
	}
}

// testResults follows messages sent with a retention through each way
// they settle: the record at the send (queued, with its deadline), the
// start of an attempt, progress, a reply recorded where it was accepted
// (or by FinishResult as its worker saw it), an acknowledgement, a dead
// letter, a cancellation and a drop; the first final outcome stays; a send
// that stores nothing records nothing; the records are listed, the latest
// to go first.
func testResults(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("res")
	const ret = time.Hour
	send := func(env *broker.Envelope, mod func(*broker.SendParams)) broker.SendResult {
		t.Helper()
		p := broker.SendParams{Env: *env, Retention: ret}
		if mod != nil {
			mod(&p)
		}
		return sendP(t, b, p)
	}
	timed := timedEnv(name("sender"), r, "timed", longLease)
	res := send(timed, nil)
	rec := result(t, b, r, timed.ID)
	if rec.State != broker.ResultQueued || !rec.Deadline.Equal(res.Deadline) || rec.Sent.IsZero() || rec.Retention != ret || rec.Reply != nil {
		t.Fatalf("after the send: %+v, want queued with deadline %v", rec, res.Deadline)
	}
	d := fetchOne(t, b, r, "w", longLease)
	if d.Env.Retention != ret {
		t.Fatalf("the delivery's Env.Retention is %v, want %v: it travels with the message", d.Env.Retention, ret)
	}
	if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: timed.ID, Worker: "w1", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.SetProgress(ctx, r, timed.ID, []byte("half")); err != nil {
		t.Fatal(err)
	}
	rec = result(t, b, r, timed.ID)
	if rec.State != broker.ResultRunning || rec.Worker != "w1" || rec.Attempts != 1 || rec.Started.IsZero() || string(rec.Progress) != "half" {
		t.Fatalf("after the start: %+v", rec)
	}
	if err := b.SetProgress(ctx, r, timed.ID, make([]byte, broker.MaxProgressSize+1)); err == nil {
		t.Fatal("SetProgress over MaxProgressSize: no error")
	}
	rep := replyTo(timed, "answer")
	rep.Retention = ret
	if err := reply(t, b, rep, broker.ReplyTimed); err != nil {
		t.Fatal(err)
	}
	// The reply is the outcome its sender saw, with its time, before the
	// worker's FinishResult.
	if rec = result(t, b, r, timed.ID); rec.Reply != nil && rec.Finished.IsZero() {
		t.Fatalf("after the reply, before the ack: %+v, a reply and no finish time", rec)
	}
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: timed.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w1", Attempt: 1, Reply: rep, Retention: ret})
	rec = result(t, b, r, timed.ID)
	if rec.State != broker.ResultDone || rec.Reply == nil || string(rec.Reply.Content) != "answer" || rec.Finished.IsZero() || string(rec.Progress) != "half" {
		t.Fatalf("after the reply and the ack: %+v", rec)
	}
	if !rec.Expires.After(rec.Now.Add(ret-time.Minute)) || rec.Expires.After(rec.Now.Add(ret+time.Second)) {
		t.Fatalf("expires %v, want about %v after %v", rec.Expires, ret, rec.Now)
	}
	if err := b.SetProgress(ctx, r, timed.ID, []byte("late")); !errors.Is(err, broker.ErrResultFinal) {
		t.Fatalf("SetProgress after the final outcome: %v, want ErrResultFinal", err)
	}
	// A second final outcome (a redelivery's) leaves the first.
	other := replyTo(timed, "other")
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: timed.ID, State: broker.ResultTimedOut, Worker: "w2", Reply: other, Retention: ret})
	if rec = result(t, b, r, timed.ID); rec.State != broker.ResultDone || string(rec.Reply.Content) != "answer" {
		t.Fatalf("after a second outcome: %+v, want the first", rec)
	}
	if st := stats(t, b, r); st.Length != 0 {
		t.Fatalf("FinishResult did not acknowledge: %+v", st)
	}
	ackReplies(t, b, timed.Sender, readReplies(t, b, broker.ReadRepliesParams{Sender: timed.Sender, Consumer: "c", Max: 10, Lease: longLease}))

	// A dead letter.
	dead := newEnv(r, "dead")
	send(dead, nil)
	d = fetchOne(t, b, r, "w", longLease)
	deadLetter(t, b, r, d, "it failed")
	if rec = result(t, b, r, dead.ID); rec.State != broker.ResultDeadLettered || rec.ErrorText != "it failed" || rec.Attempts != 1 {
		t.Fatalf("dead-lettered: %+v", rec)
	}
	if n, err := b.PurgeDeadLetters(ctx, r); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: %d, %v", n, err)
	}

	// A cancellation of a deferred message, then of one in flight.
	later := newEnv(r, "later")
	send(later, func(p *broker.SendParams) { p.Delay = time.Hour })
	if rec = result(t, b, r, later.ID); rec.State != broker.ResultQueued {
		t.Fatalf("deferred: %+v", rec)
	}
	if c := cancel(t, b, r, later.ID); c.State != broker.CancelDeferred {
		t.Fatalf("Cancel: %+v", c)
	}
	if rec = result(t, b, r, later.ID); rec.State != broker.ResultCancelled {
		t.Fatalf("cancelled while deferred: %+v", rec)
	}
	flying := newEnv(r, "flying")
	send(flying, nil)
	d = fetchOne(t, b, r, "w", longLease)
	if c := cancel(t, b, r, flying.ID); c.State != broker.CancelInFlight {
		t.Fatalf("Cancel: %+v", c)
	}
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: flying.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w1", Attempt: 1, Retention: ret})
	if rec = result(t, b, r, flying.ID); rec.State != broker.ResultCancelled {
		t.Fatalf("cancelled in flight, then acknowledged: %+v, want cancelled", rec)
	}

	// A drop of an expired message, counted as Drop counts it.
	expiring := newEnv(r, "expiring")
	send(expiring, nil)
	d = fetchOne(t, b, r, "w", longLease)
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: expiring.ID, Ref: d.Ref, State: broker.ResultExpired, Worker: "w1", Attempt: 1,
		ErrorCode: "expired", ErrorText: "it expired", Retention: ret})
	if rec = result(t, b, r, expiring.ID); rec.State != broker.ResultExpired || rec.ErrorCode != "expired" {
		t.Fatalf("expired: %+v", rec)
	}
	if st := stats(t, b, r); st.Expired != 1 || st.Length != 0 {
		t.Fatalf("stats after the drop: %+v, want 1 expired, nothing queued", st)
	}

	// A message sent without a retention, kept by its receiver's default
	// from its start; and one without any.
	plain := newEnv(r, "plain")
	sendP(t, b, broker.SendParams{Env: *plain})
	if _, err := b.Result(ctx, r, plain.ID); !errors.Is(err, broker.ErrNoResult) {
		t.Fatalf("a message sent without a retention: %v, want ErrNoResult", err)
	}
	d = fetchOne(t, b, r, "w", longLease)
	if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: plain.ID, Worker: "w1", Attempt: 1, Retention: ret}); err != nil {
		t.Fatal(err)
	}
	if rec = result(t, b, r, plain.ID); rec.State != broker.ResultRunning {
		t.Fatalf("kept from its start: %+v", rec)
	}
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: plain.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w1", Attempt: 1, Retention: ret})
	none := newEnv(r, "none")
	sendP(t, b, broker.SendParams{Env: *none})
	if err := b.SetProgress(ctx, r, none.ID, nil); !errors.Is(err, broker.ErrNoResult) {
		t.Fatalf("SetProgress without a record: %v, want ErrNoResult", err)
	}
	d = fetchOne(t, b, r, "w", longLease)
	ack(t, b, r, d.Ref)

	// A send that stores nothing records nothing.
	first, again := newEnv(r, "first"), newEnv(r, "again")
	dedup := func(p *broker.SendParams) { p.DedupKey, p.DedupTTL = "k", time.Minute }
	send(first, dedup)
	if res := send(again, dedup); res.Outcome != broker.Duplicate {
		t.Fatalf("second send: %+v", res)
	}
	if _, err := b.Result(ctx, r, again.ID); !errors.Is(err, broker.ErrNoResult) {
		t.Fatalf("a duplicate: %v, want ErrNoResult", err)
	}
	d = fetchOne(t, b, r, "w", longLease)
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: first.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w1", Attempt: 1, Retention: ret})

	checkListed(t, b, r, first.ID, plain.ID, expiring.ID, flying.ID, later.ID, dead.ID, timed.ID)
}

// checkListed checks that ListResults lists the records of want (in any
// order of ids), the latest to go first.
func checkListed(t *testing.T, b broker.Broker, r string, want ...string) {
	t.Helper()
	list, err := b.ListResults(ctxT(t), r, 100)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, rec := range list {
		ids = append(ids, rec.ID)
		// Expires is read as a TTL in whole milliseconds, record by
		// record, while the order is the index's: a millisecond apart
		// is the same instant.
		if i > 0 && rec.Expires.After(list[i-1].Expires.Add(time.Millisecond)) {
			t.Fatalf("ListResults: %v goes after %v, listed before it: want the latest to go first", rec.Expires, list[i-1].Expires)
		}
	}
	slices.Sort(ids)
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(ids, want) {
		t.Fatalf("ListResults: %v, want %v", ids, want)
	}
}

// testResultsExpire shows that a record goes at the end of its retention,
// broker time, after its final outcome.
func testResultsExpire(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("resx")
	env := newEnv(r, "short")
	sendP(t, b, broker.SendParams{Env: *env, Retention: 200 * time.Millisecond})
	d := fetchOne(t, b, r, "w", longLease)
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: env.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w", Attempt: 1, Retention: 200 * time.Millisecond})
	rec := result(t, b, r, env.ID)
	eventually(t, "the record to go", func() bool {
		_, err := b.Result(ctx, r, env.ID)
		return errors.Is(err, broker.ErrNoResult)
	})
	if now := brokerNow(t, b); now.Before(rec.Expires.Add(-time.Millisecond)) {
		t.Fatalf("the record went at %v, before its end %v", now, rec.Expires)
	}
	if list, err := b.ListResults(ctx, r, 10); err != nil || len(list) != 0 {
		t.Fatalf("ListResults after the end: %+v, %v", list, err)
	}
}

// testResultsRace races timed replies against their timeouts, each
// settled as a worker settles it (the reply, then FinishResult with the
// reply when it was accepted, or a timeout when it was late): the record
// of each holds the one outcome its sender received.
func testResultsRace(t *testing.T, b broker.Broker) {
	const n = 200
	ctx := ctxT(t)
	s, r := name("sender"), name("resrace")
	envs := make([]*broker.Envelope, n)
	for i := range envs {
		envs[i] = timedEnv(s, r, fmt.Sprint(i), time.Duration(1+i%20)*time.Millisecond)
		sendP(t, b, broker.SendParams{Env: *envs[i], Retention: time.Hour})
	}
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w", Max: n, Lease: longLease, MaxAttempts: 10})
	var errs errorList
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() {
			rep := replyTo(&d.Env, "r")
			rep.Retention = time.Hour
			p := broker.FinishResultParams{Receiver: r, ID: d.Env.ID, Ref: d.Ref, State: broker.ResultDone, Worker: "w", Attempt: 1, Retention: time.Hour}
			switch err := b.Reply(ctx, rep, broker.ReplyTimed); {
			case err == nil:
				p.Reply = rep
			case errors.Is(err, broker.ErrLate):
				p.State = broker.ResultTimedOut
			default:
				errs.add(err)
				return
			}
			if err := b.FinishResult(ctx, &p); err != nil {
				errs.add(err)
			}
		})
	}
	wg.Go(func() {
		for range 20 {
			if _, err := b.ExpireTimeouts(ctx, s, n); err != nil {
				errs.add(err)
			}
			time.Sleep(time.Millisecond)
		}
	})
	wg.Wait()
	errs.check(t)
	waitBrokerTime(t, b, time.Now().Add(time.Second))
	for expire(t, b, s, n) > 0 {
	}
	got := make(map[string]broker.ReplyKind)
	for {
		rs := readReplies(t, b, broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: n, Lease: longLease})
		if len(rs) == 0 {
			break
		}
		for _, rp := range rs {
			if _, dup := got[rp.RequestID]; dup {
				t.Fatalf("two outcomes for %s", rp.RequestID)
			}
			got[rp.RequestID] = rp.Kind
			ackReplies(t, b, s, []broker.Reply{rp})
		}
	}
	for _, env := range envs {
		rec := result(t, b, r, env.ID)
		replied := rec.Reply != nil
		switch kind := got[env.ID]; {
		case kind == 0:
			t.Fatalf("%s: no outcome at the sender", env.ID)
		case (kind == broker.KindReply) != replied:
			t.Fatalf("%s: the sender got kind %v, the record says replied %v (%+v)", env.ID, kind, replied, rec)
		case kind == broker.KindTimeout && !rec.Now.After(rec.Deadline) && rec.State != broker.ResultTimedOut:
			t.Fatalf("%s: timed out for its sender, the record (read before its deadline) says %v", env.ID, rec.State)
		}
	}
}

// testResultsInboxReply shows a reply to a request from an inbox recorded
// where the inbox accepts it: the record holds the reply before any
// FinishResult, and the final write of a later attempt that finds the
// deadline passed (a timeout, with no reply of its own) keeps it and
// reads done. A late reply is not recorded, so a request whose only reply
// was late reads timed out; a reply to an inbox that is gone is not
// recorded; a reply without a retention writes no record.
func testResultsInboxReply(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	ib, r := inboxName(), name("resinbox")
	const ret = time.Hour
	keepInbox(t, b, ib, longLease)
	request := retainedRequest(t, b, ib, r, false)

	env, deadline := request("ping", time.Second, ret)
	d := fetchOne(t, b, r, "w1", longLease)
	if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: env.ID, Worker: "w1", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	if err := b.ReplyInbox(ctx, answer(env, "pong", ret), deadline); err != nil {
		t.Fatalf("ReplyInbox before the deadline: %v", err)
	}
	rec := result(t, b, r, env.ID)
	if rec.State != broker.ResultRunning || rec.Reply == nil || string(rec.Reply.Content) != "pong" {
		t.Fatalf("after the accepted reply, before any FinishResult: %+v, want running with the reply", rec)
	}
	// The first attempt's acknowledgement is lost. A later attempt, after
	// the deadline, finds the request answered: its own reply is late,
	// and it records a timeout with no reply.
	waitBrokerTime(t, b, deadline)
	if err := b.ReplyInbox(ctx, answer(env, "late", ret), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox after the deadline: %v, want ErrLate", err)
	}
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: env.ID, Ref: d.Ref, State: broker.ResultTimedOut, Worker: "w2", Attempt: 2, Retention: ret})
	rec = result(t, b, r, env.ID)
	if rec.State != broker.ResultDone || rec.Reply == nil || string(rec.Reply.Content) != "pong" || rec.Worker != "w2" || rec.Attempts != 2 {
		t.Fatalf("after the later attempt's timeout: %+v, want done by w2 with the accepted reply", rec)
	}
	rs := readInbox(t, b, ib, 10)
	if len(rs) != 2 || string(rs[0].Env.Content) != "pong" || !rs[0].At.Before(deadline) || rs[1].At.Before(deadline) {
		t.Fatalf("the inbox: %+v, want the reply before the deadline, then the late one", rs)
	}
	ackInbox(t, b, ib, rs)

	// Only a late reply: not recorded, and the request timed out.
	lateReply(t, b, r, request, b.ReplyInbox)
	ackInbox(t, b, ib, readInbox(t, b, ib, 10))

	// Without a retention: no record.
	unretainedReply(t, b, r, request, b.ReplyInbox)

	// The inbox gone: the reply is dropped, and not recorded.
	gone, deadline := request("gone", longLease, ret)
	d = fetchOne(t, b, r, "w1", longLease)
	closeInbox(t, b, ib)
	if err := b.ReplyInbox(ctx, answer(gone, "x", ret), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyInbox to a closed inbox: %v, want ErrLate", err)
	}
	if rec = result(t, b, r, gone.ID); rec.Reply != nil {
		t.Fatalf("after a reply to a closed inbox: %+v, want no reply", rec)
	}
	ack(t, b, r, d.Ref)
}

// testResultsStreamReply shows the final reply to a streamed request
// recorded where its inbox accepts it, as testResultsInboxReply shows an
// inbox reply: the record holds the reply before any FinishResult, and a
// later attempt's timeout after the deadline keeps it and reads done. A
// reply the stream refuses (after the deadline, after the marker, after
// the first reply) is not recorded; a reply without a retention writes no
// record.
func testResultsStreamReply(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	ib, r := inboxName(), name("resstream")
	const ret = time.Hour
	keepInbox(t, b, ib, longLease)
	request := retainedRequest(t, b, ib, r, true)

	// A second before the deadline: room for the fetch and the partial on
	// a loaded host.
	env, deadline := request("ping", time.Second, ret)
	d := fetchOne(t, b, r, "w1", longLease)
	if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: env.ID, Worker: "w1", Attempt: 1}); err != nil {
		t.Fatal(err)
	}
	mustPartial(t, b, env, 1, "part", deadline)
	if rec := result(t, b, r, env.ID); rec.Reply != nil {
		t.Fatalf("after a partial: %+v, want no reply", rec)
	}
	if err := b.ReplyStream(ctx, answer(env, "pong", ret), deadline); err != nil {
		t.Fatalf("ReplyStream before the deadline: %v", err)
	}
	rec := result(t, b, r, env.ID)
	if rec.State != broker.ResultRunning || rec.Reply == nil || string(rec.Reply.Content) != "pong" {
		t.Fatalf("after the accepted reply, before any FinishResult: %+v, want running with the reply", rec)
	}
	// A second reply is refused, and the record keeps the first.
	if err := b.ReplyStream(ctx, answer(env, "again", ret), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("a second ReplyStream: %v, want ErrLate", err)
	}
	// The first attempt's acknowledgement is lost; a later attempt after
	// the deadline records a timeout with no reply of its own.
	waitBrokerTime(t, b, deadline)
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: env.ID, Ref: d.Ref, State: broker.ResultTimedOut, Worker: "w2", Attempt: 2, Retention: ret})
	rec = result(t, b, r, env.ID)
	if rec.State != broker.ResultDone || rec.Reply == nil || string(rec.Reply.Content) != "pong" || rec.Worker != "w2" || rec.Attempts != 2 {
		t.Fatalf("after the later attempt's timeout: %+v, want done by w2 with the accepted reply", rec)
	}
	rs := readInbox(t, b, ib, 10)
	if len(rs) != 2 || rs[0].Kind != broker.KindPartial || rs[1].Kind != broker.KindReply || string(rs[1].Env.Content) != "pong" {
		t.Fatalf("the inbox: %+v, want the partial and the reply", rs)
	}
	ackInbox(t, b, ib, rs)

	// Only a late reply: refused, not recorded, and the request timed out.
	lateReply(t, b, r, request, b.ReplyStream)

	// A reply after the requester gave up: refused, not recorded.
	given, deadline := request("given", longLease, ret)
	d = fetchOne(t, b, r, "w1", longLease)
	if _, err := b.GiveUpStream(ctx, ib, given.ID); err != nil {
		t.Fatalf("GiveUpStream: %v", err)
	}
	if err := b.ReplyStream(ctx, answer(given, "x", ret), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("ReplyStream after the marker: %v, want ErrLate", err)
	}
	noReply(t, b, r, given.ID, "after a reply refused for the marker")
	ack(t, b, r, d.Ref)
	ackInbox(t, b, ib, readInbox(t, b, ib, 10))

	// Without a retention: no record.
	unretainedReply(t, b, r, request, b.ReplyStream)
	closeInbox(t, b, ib)
}

// sendRequestFunc sends a request with content, timeout and retention and
// returns it with its deadline.
type sendRequestFunc func(content string, timeout, retention time.Duration) (*broker.Envelope, time.Time)

// retainedRequest returns a sendRequestFunc for requests from inbox ib to
// receiver r, streamed when stream.
func retainedRequest(t *testing.T, b broker.Broker, ib, r string, stream bool) sendRequestFunc {
	return func(content string, timeout, retention time.Duration) (*broker.Envelope, time.Time) {
		t.Helper()
		env := timedEnv(ib, r, content, timeout)
		env.Route, env.Stream = broker.RouteInbox, stream
		return env, sendP(t, b, broker.SendParams{Env: *env, Retention: retention}).Deadline
	}
}

// answer returns a reply to env with content and retention.
func answer(env *broker.Envelope, content string, retention time.Duration) *broker.Envelope {
	rep := replyTo(env, content)
	rep.Retention = retention
	return rep
}

// unretainedReply sends a request without a retention to receiver r with
// request, answers it with reply (ReplyInbox or ReplyStream), and fails t
// when that wrote a record.
func unretainedReply(t *testing.T, b broker.Broker, r string, request sendRequestFunc, reply func(context.Context, *broker.Envelope, time.Time) error) {
	t.Helper()
	plain, deadline := request("plain", longLease, 0)
	d := fetchOne(t, b, r, "w1", longLease)
	if err := reply(ctxT(t), answer(plain, "x", 0), deadline); err != nil {
		t.Fatalf("the reply: %v", err)
	}
	if rec, err := b.Result(ctxT(t), r, plain.ID); !errors.Is(err, broker.ErrNoResult) {
		t.Fatalf("a reply without a retention: the record %+v, %v, want ErrNoResult", rec, err)
	}
	ack(t, b, r, d.Ref)
}

// lateReply sends a request with a short timeout to receiver r with
// request, answers it with reply (ReplyInbox or ReplyStream) after its
// deadline, and fails t unless that was refused as late and not recorded,
// so that the request's timeout reads timed out with no reply.
func lateReply(t *testing.T, b broker.Broker, r string, request sendRequestFunc, reply func(context.Context, *broker.Envelope, time.Time) error) {
	t.Helper()
	const ret = time.Hour
	slow, deadline := request("slow", shortLease, ret)
	d := fetchOne(t, b, r, "w1", longLease)
	waitBrokerTime(t, b, deadline)
	if err := reply(ctxT(t), answer(slow, "late", ret), deadline); !errors.Is(err, broker.ErrLate) {
		t.Fatalf("the reply after the deadline: %v, want ErrLate", err)
	}
	noReply(t, b, r, slow.ID, "after a late reply")
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: slow.ID, Ref: d.Ref, State: broker.ResultTimedOut, Worker: "w1", Attempt: 1, Retention: ret})
	if rec := result(t, b, r, slow.ID); rec.Reply != nil || rec.State != broker.ResultTimedOut {
		t.Fatalf("after the timeout: %+v, want timed out with no reply", rec)
	}
}

// noReply fails t unless the record of r's message id is queued with no
// reply, when.
func noReply(t *testing.T, b broker.Broker, r, id, when string) {
	t.Helper()
	if rec := result(t, b, r, id); rec.Reply != nil || rec.State != broker.ResultQueued {
		t.Fatalf("%s: %+v, want queued with no reply", when, rec)
	}
}
