package brokertest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// testStatsMany shows that StatsMany answers, in the order asked, what
// Stats answers for each receiver, and refuses an empty name.
func testStatsMany(t *testing.T, b broker.Broker) {
	busy, empty, dead := name("recv"), name("recv"), name("recv")
	for range 3 {
		send(t, b, newEnv(busy, "x"))
	}
	send(t, b, newEnv(dead, "y"))
	send(t, b, newEnv(dead, "z"))
	ds := fetch(t, b, broker.FetchParams{Receiver: dead, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	deadLetter(t, b, dead, ds[0], "no")
	asked := []string{busy, empty, dead, busy}
	got, err := b.StatsMany(ctxT(t), asked)
	if err != nil {
		t.Fatalf("StatsMany: %v", err)
	}
	if len(got) != len(asked) {
		t.Fatalf("StatsMany of %d receivers: got %d", len(asked), len(got))
	}
	for i, r := range asked {
		if want := stats(t, b, r); got[i] != want {
			t.Errorf("StatsMany[%d]: got %+v, Stats says %+v", i, got[i], want)
		}
	}
	if got[0].Queued != 3 || got[1].Length != 0 || got[2].DeadLetters != 1 || got[2].Queued != 1 {
		t.Errorf("StatsMany: got %+v", got)
	}
	if none, err := b.StatsMany(ctxT(t), nil); err != nil || len(none) != 0 {
		t.Errorf("StatsMany of no receiver: got %v, %v; want none, nil", none, err)
	}
	if _, err := b.StatsMany(ctxT(t), []string{busy, ""}); err == nil {
		t.Errorf("StatsMany with an empty name: got no error")
	}
	drainQueue(t, b, busy)
	drainQueue(t, b, dead)
	purgeAll(t, b, dead)
}

func purgeAll(t *testing.T, b broker.Broker, receiver string) {
	t.Helper()
	if _, err := b.PurgeDeadLetters(ctxT(t), receiver); err != nil {
		t.Fatalf("PurgeDeadLetters %s: %v", receiver, err)
	}
}

// testOldestQueued shows that OldestQueued is the broker time the oldest
// message not yet delivered was queued: zero with none, then that of the
// first one sent, then that of the next once the first is delivered.
func testOldestQueued(t *testing.T, b broker.Broker) {
	r := name("recv")
	if st := stats(t, b, r); !st.OldestQueued.IsZero() {
		t.Fatalf("OldestQueued of an empty queue: got %v, want zero", st.OldestQueued)
	}
	before := brokerNow(t, b).Truncate(time.Millisecond)
	send(t, b, newEnv(r, "first"))
	first := stats(t, b, r).OldestQueued
	mid := brokerNow(t, b)
	if first.Before(before) || first.After(mid) {
		t.Fatalf("OldestQueued: got %v, want between %v and %v", first, before, mid)
	}
	waitBrokerTime(t, b, mid.Add(2*time.Millisecond))
	send(t, b, newEnv(r, "second"))
	if got := stats(t, b, r).OldestQueued; !got.Equal(first) {
		t.Fatalf("OldestQueued after a second send: got %v, want the first's %v", got, first)
	}
	a := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	second := stats(t, b, r).OldestQueued
	if !second.After(mid) {
		t.Fatalf("OldestQueued once the first is delivered: got %v, want the second's (after %v)", second, mid)
	}
	c := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	if got := stats(t, b, r).OldestQueued; !got.IsZero() {
		t.Fatalf("OldestQueued with every message delivered: got %v, want zero", got)
	}
	ack(t, b, r, a[0].Ref, c[0].Ref)
}

// testFate shows that Fate finds a message queued, pending with its
// attempts, or dead-lettered with its reason; that one acknowledged, or
// queued before Since, is gone when the scan read everything; and that
// the scan stops at MaxScan, leaving the message unknown.
func testFate(t *testing.T, b broker.Broker) {
	r := name("recv")
	before := brokerNow(t, b).Add(-time.Second)
	a, ok, dead, last := newEnv(r, "a"), newEnv(r, "ok"), newEnv(r, "dead"), newEnv(r, "last")
	for _, env := range []*broker.Envelope{a, ok, dead, last} {
		send(t, b, env)
	}
	after := brokerNow(t, b)
	held := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Lease: longLease, MaxAttempts: 10})
	ds := fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 2, Lease: longLease, MaxAttempts: 10})
	ack(t, b, r, ds[0].Ref)
	deadLetter(t, b, r, ds[1], "no")
	fate := func(id string, since time.Time, maxScan int) broker.Fate {
		t.Helper()
		f, err := b.Fate(ctxT(t), &broker.FateParams{Receiver: r, ID: id, Since: since, MaxScan: maxScan})
		if err != nil {
			t.Fatalf("Fate %s: %v", id, err)
		}
		return f
	}
	if f := fate(a.ID, before, 100); f.State != broker.StatePending || f.Attempts != 1 || f.Ref != held[0].Ref {
		t.Errorf("Fate of a delivered message: got %+v, want pending, 1 attempt, ref %s", f, held[0].Ref)
	}
	if f := fate(dead.ID, before, 100); f.State != broker.StateDeadLettered || f.Reason != "no" || f.Attempts != 1 || f.At.Before(before) {
		t.Errorf("Fate of a dead letter: got %+v, want dead-lettered for no after 1 attempt", f)
	}
	if f := fate(last.ID, before, 100); f.State != broker.StateQueued || f.At.Before(before.Truncate(time.Millisecond)) || f.At.After(after) {
		t.Errorf("Fate of a queued message: got %+v, want queued between %v and %v", f, before, after)
	}
	if f := fate(last.ID, time.Time{}, 100); f.State != broker.StateQueued {
		t.Errorf("Fate from the start: got %+v, want queued", f)
	}
	if f := fate(ok.ID, before, 100); f.State != broker.StateGone {
		t.Errorf("Fate of an acknowledged message: got %+v, want gone", f)
	}
	if f := fate("never-sent", before, 100); f.State != broker.StateGone {
		t.Errorf("Fate of an id never sent: got %+v, want gone", f)
	}
	if f := fate(a.ID, after.Add(time.Second), 100); f.State != broker.StateGone {
		t.Errorf("Fate with Since after the message was queued: got %+v, want gone (not read)", f)
	}
	if f := fate(last.ID, before, 1); f.State != broker.StateUnknown {
		t.Errorf("Fate reading 1 entry of 2: got %+v, want unknown", f)
	}
	ack(t, b, r, held[0].Ref)
	drainQueue(t, b, r)
	purgeAll(t, b, r)
}

// testDeadLettersAfter pages through dead letters with DeadLettersAfter:
// each page starts after the last one's final ref, also when that dead
// letter is gone since; an After of the wrong form is ErrBadRef.
func testDeadLettersAfter(t *testing.T, b broker.Broker) {
	r := name("recv")
	for i := range 5 {
		send(t, b, newEnv(r, fmt.Sprint("m", i)))
	}
	for _, d := range fetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c", Max: 5, Lease: longLease, MaxAttempts: 10}) {
		deadLetter(t, b, r, d, "no")
	}
	page := func(after string, max int) []string {
		t.Helper()
		dls, err := b.DeadLettersAfter(ctxT(t), &broker.DeadLettersParams{Receiver: r, After: after, Max: max})
		if err != nil {
			t.Fatalf("DeadLettersAfter %q: %v", after, err)
		}
		out := make([]string, len(dls))
		for i, dl := range dls {
			out[i] = string(dl.Env.Content)
		}
		return out
	}
	all := deadLetters(t, b, r)
	if len(all) != 5 {
		t.Fatalf("DeadLetters: got %d, want 5", len(all))
	}
	for _, tc := range []struct {
		after string
		want  string
	}{
		{"", "m0 m1"},
		{all[1].Ref, "m2 m3"},
		{all[3].Ref, "m4"},
		{all[4].Ref, ""},
	} {
		if got := strings.Join(page(tc.after, 2), " "); got != tc.want {
			t.Errorf("DeadLettersAfter %q, 2: got %q, want %q", tc.after, got, tc.want)
		}
	}
	if n, err := b.PurgeDeadLetters(ctxT(t), r, all[2].Ref); err != nil || n != 1 {
		t.Fatalf("PurgeDeadLetters: %d, %v", n, err)
	}
	if got := strings.Join(page(all[2].Ref, 10), " "); got != "m3 m4" {
		t.Errorf("DeadLettersAfter a purged dead letter: got %q, want m3 m4", got)
	}
	if got := strings.Join(page("", 10), " "); got != "m0 m1 m3 m4" {
		t.Errorf("DeadLettersAfter from the start: got %q", got)
	}
	if _, err := b.DeadLettersAfter(ctxT(t), &broker.DeadLettersParams{Receiver: r, After: "not a ref", Max: 1}); !errors.Is(err, broker.ErrBadRef) {
		t.Errorf("DeadLettersAfter with a bad After: got %v, want ErrBadRef", err)
	}
	purgeAll(t, b, r)
}
