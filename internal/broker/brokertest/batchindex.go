package brokertest

import (
	"slices"
	"testing"

	"github.com/diskerhq/disker/internal/broker"
)

// listBatches lists the batches of receivers and returns their ids.
func listBatches(t *testing.T, b broker.Broker, max int, receivers ...string) ([]string, broker.BatchList) {
	t.Helper()
	l, err := b.ListBatches(ctxT(t), &broker.ListBatchesParams{Receivers: receivers, Max: max})
	if err != nil {
		t.Fatalf("ListBatches(%v, %d): %v", receivers, max, err)
	}
	if len(l.Unreadable) != 0 {
		t.Fatalf("ListBatches(%v, %d): unreadable %v", receivers, max, l.Unreadable)
	}
	ids := make([]string, len(l.Batches))
	for i, info := range l.Batches {
		ids[i] = info.ID
	}
	return ids, l
}

// testBatchIndex: the batches created are listed by their completion's
// receivers, the latest created first, with their state as Batch reads
// it; a list stops at its max, and an index keeps the BatchIndexCap
// latest created.
func testBatchIndex(t *testing.T, b broker.Broker) {
	a1, c1 := newBatch(t, b, false, false), newBatch(t, b, true, false)
	a2 := &batchT{t: t, b: b, id: broker.NewBatchID(a1.recv, name("batch")), recv: a1.recv, recvs: map[string]bool{}}
	comp := newEnv(a1.recv, "completion")
	comp.Route, comp.Sender = broker.RouteNone, ""
	if err := b.CreateBatch(ctxT(t), &broker.CreateBatchParams{ID: a2.id, Completion: *comp, Retention: batchRetention}); err != nil {
		t.Fatalf("CreateBatch: %v", err)
	}
	a2.comp = comp
	kid := name("kid")
	child := a2.add(kid, nil)
	if rec, err := b.Result(ctxT(t), kid, child.ID); err != nil || rec.Batch != a2.id {
		t.Fatalf("Result of a child: batch %q, %v, want %q", rec.Batch, err, a2.id)
	}
	c1.seal() // no child: it completes
	c1.fired(c1.comp)

	ids, l := listBatches(t, b, 10, a1.recv, c1.recv, name("none"))
	if want := []string{a2.id, c1.id, a1.id}; !slices.Equal(ids, want) {
		t.Fatalf("ListBatches: %v, want the latest created first: %v", ids, want)
	}
	for _, got := range l.Batches {
		want, err := b.Batch(ctxT(t), got.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != want.State || got.Counts != want.Counts || got.Fired != want.Fired || got.OnlyIfAllSucceed != want.OnlyIfAllSucceed ||
			!got.Created.Equal(want.Created) {
			t.Fatalf("ListBatches: %+v, Batch: %+v", got, want)
		}
	}
	if l.Batches[0].Counts.Children != 1 || l.Batches[0].State != broker.BatchOpen || l.Batches[1].State != broker.BatchCompleted || !l.Batches[1].OnlyIfAllSucceed {
		t.Fatalf("ListBatches: %+v", l.Batches)
	}
	if ids, _ := listBatches(t, b, 1, a1.recv, c1.recv); !slices.Equal(ids, []string{a2.id}) {
		t.Fatalf("ListBatches max 1: %v, want %v", ids, []string{a2.id})
	}
	if ids, _ := listBatches(t, b, 10, c1.recv); !slices.Equal(ids, []string{c1.id}) {
		t.Fatalf("ListBatches of %s: %v", c1.recv, ids)
	}
	if ids, _ := listBatches(t, b, 10, name("none")); len(ids) != 0 {
		t.Fatalf("ListBatches of a receiver without batches: %v", ids)
	}
	settle(t, b, kid, broker.ResultDone, false)
	a2.seal()
	a2.fired(comp)
	if _, l := listBatches(t, b, 1, a1.recv); l.Batches[0].State != broker.BatchCompleted || l.Batches[0].Counts.Succeeded != 1 {
		t.Fatalf("ListBatches after the child settled: %+v", l.Batches[0])
	}

	for _, p := range []broker.ListBatchesParams{{Max: 1}, {Receivers: []string{a1.recv}}, {Receivers: []string{a1.recv}, Max: broker.BatchIndexCap + 1},
		{Receivers: []string{""}, Max: 1}} {
		if _, err := b.ListBatches(ctxT(t), &p); err == nil {
			t.Fatalf("ListBatches(%+v): no error", p)
		}
	}

	// The cap: one batch past it drops the first created from the index.
	recv := name("capped")
	var created []string
	for range broker.BatchIndexCap + 1 {
		id := broker.NewBatchID(recv, name("batch"))
		comp := newEnv(recv, "completion")
		comp.Route, comp.Sender = broker.RouteNone, ""
		if err := b.CreateBatch(ctxT(t), &broker.CreateBatchParams{ID: id, Completion: *comp, Retention: batchRetention}); err != nil {
			t.Fatalf("CreateBatch: %v", err)
		}
		created = append(created, id)
	}
	ids, _ = listBatches(t, b, broker.BatchIndexCap, recv)
	slices.Reverse(created)
	if !slices.Equal(ids, created[:broker.BatchIndexCap]) {
		t.Fatalf("ListBatches of %d batches: %d listed, want the %d latest created", len(created), len(ids), broker.BatchIndexCap)
	}
	if _, err := b.Batch(ctxT(t), created[len(created)-1]); err != nil {
		t.Fatalf("the batch out of the index: %v, want it kept", err)
	}
}
