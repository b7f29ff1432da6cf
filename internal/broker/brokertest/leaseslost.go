package brokertest

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// loseLeases delivers the n messages queued in r twice, to consumers that
// never settle them (their leases lapse), each attempt started in the
// messages' records (StartResult, with retention ret for a message
// without a record); then a Fetch with MaxAttempts 2 dead-letters them
// all, and purges the dead letters.
func loseLeases(t *testing.T, b broker.Broker, r string, n int, ret time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	for attempt, worker := range []string{"w1", "w2"} {
		seen := map[string]bool{}
		eventually(t, "the attempt of "+worker, func() bool {
			for _, d := range fetch(t, b, broker.FetchParams{Receiver: r, Consumer: worker, Max: 10, Block: pollBlock, Lease: shortLease, MaxAttempts: 2}) {
				if d.Attempt != attempt+1 {
					t.Fatalf("%s got attempt %d of %s, want %d", worker, d.Attempt, d.Env.ID, attempt+1)
				}
				seen[d.Env.ID] = true
				if err := b.StartResult(ctx, &broker.StartResultParams{Receiver: r, ID: d.Env.ID, Worker: worker, Attempt: d.Attempt, Retention: ret}); err != nil {
					t.Fatal(err)
				}
			}
			return len(seen) == n
		})
	}
	eventually(t, "the dead letters", func() bool {
		if got := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "w3", Max: 10, Block: pollBlock, Lease: shortLease, MaxAttempts: 2}); len(got) != 0 {
			t.Fatalf("a delivery beyond MaxAttempts 2: %+v", got)
		}
		return len(deadLetters(t, b, r)) == n
	})
	if got, err := b.PurgeDeadLetters(ctxT(t), r); err != nil || got != n {
		t.Fatalf("PurgeDeadLetters: %d, %v; want %d", got, err, n)
	}
}

// testResultsLeasesLost shows that a message whose leases lapsed
// MaxAttempts times, dead-lettered by Fetch, gets its final record there,
// in the same step: dead-lettered, with the reason and the attempts, at
// each priority level, with a long id, and for a record its receiver's
// default retention made at its start; a message without a record gets none; a later
// outcome leaves the first.
func testResultsLeasesLost(t *testing.T, b broker.Broker) {
	ctx := ctxT(t)
	r := name("resll")
	const ret = time.Hour
	kept, high, none := newEnv(r, "kept"), newEnv(r, "high"), newEnv(r, "none")
	high.Priority = broker.PriorityHigh
	kept.ID += strings.Repeat("-long", 40) // over 127 bytes: its length takes two bytes in the encoding
	sendP(t, b, broker.SendParams{Env: *kept, Retention: ret})
	sendP(t, b, broker.SendParams{Env: *high, Retention: ret})
	sendP(t, b, broker.SendParams{Env: *none})
	// Its workers keep no results by default: the starts of none record
	// nothing.
	loseLeases(t, b, r, 3, 0)
	if _, err := b.Result(ctx, r, none.ID); !errors.Is(err, broker.ErrNoResult) {
		t.Fatalf("dead-lettered without a record: %v, want ErrNoResult", err)
	}
	// A message sent without a retention, its record made at its start by
	// its receiver's default.
	started := newEnv(r, "started")
	sendP(t, b, broker.SendParams{Env: *started})
	loseLeases(t, b, r, 1, ret)
	for _, env := range []*broker.Envelope{kept, high, started} {
		rec := result(t, b, r, env.ID)
		if rec.State != broker.ResultDeadLettered || rec.Attempts != 2 || rec.Worker != "w2" || rec.ErrorCode != "dead_letter" ||
			!strings.Contains(rec.ErrorText, "lease expired") || rec.Finished.IsZero() || rec.Retention != ret {
			t.Fatalf("%s, dead-lettered by Fetch: %+v", env.Content, rec)
		}
		if !rec.Expires.After(rec.Now.Add(ret-time.Minute)) || rec.Expires.After(rec.Now.Add(ret+time.Second)) {
			t.Fatalf("%s: expires %v, want about %v after %v", env.Content, rec.Expires, ret, rec.Now)
		}
		if err := b.SetProgress(ctx, r, env.ID, []byte("late")); !errors.Is(err, broker.ErrResultFinal) {
			t.Fatalf("SetProgress after the dead letter: %v, want ErrResultFinal", err)
		}
	}
	// The lost worker's late outcome leaves the first.
	finish(t, b, broker.FinishResultParams{Receiver: r, ID: kept.ID, State: broker.ResultDone, Worker: "w2", Attempt: 2, Retention: ret})
	if rec := result(t, b, r, kept.ID); rec.State != broker.ResultDeadLettered {
		t.Fatalf("after a late outcome: %+v, want dead-lettered", rec)
	}
	checkListed(t, b, r, kept.ID, high.ID, started.ID)
}

// testBatchLeasesLost shows that a batch whose only child is dead-lettered
// by Fetch, its leases lapsed MaxAttempts times, counts it and completes:
// in all-succeed mode, with its failure message.
func testBatchLeasesLost(t *testing.T, b broker.Broker) {
	r := name("r")
	bt := newBatch(t, b, true, true)
	child := bt.add(r, nil)
	bt.seal()
	loseLeases(t, b, r, 1, 0)
	info := bt.info()
	if info.State != broker.BatchCompleted || info.Fired != broker.FiredFailure || info.Counts != (broker.BatchCounts{Children: 1, DeadLettered: 1}) {
		t.Fatalf("a batch whose child was dead-lettered by Fetch: %+v", info)
	}
	bt.fired(bt.fail)
	if rec := result(t, b, r, child.ID); rec.State != broker.ResultDeadLettered || rec.Attempts != 2 {
		t.Fatalf("the child: %+v", rec)
	}
}
