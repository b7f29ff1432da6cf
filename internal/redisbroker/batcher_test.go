package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// mustDo is b.do with a context that does not end.
func mustDo[T, R any](t *testing.T, b *batcher[T, R], item T) R {
	r, err := b.do(context.Background(), item)
	if err != nil {
		t.Errorf("do(%v): %v", item, err)
	}
	return r
}

func TestBatcherLoneCallGoesAlone(t *testing.T) {
	t.Parallel()
	var flushes [][]int
	b := newBatcher(10, func(_ context.Context, items []int, out []int) {
		flushes = append(flushes, slices.Clone(items))
		for i, v := range items {
			out[i] = 2 * v
		}
	}, func(any) int { return -1 })
	for i := range 3 {
		if got := mustDo(t, b, i); got != 2*i {
			t.Fatalf("do(%d) = %d, want %d", i, got, 2*i)
		}
	}
	if fmt.Sprint(flushes) != "[[0] [1] [2]]" {
		t.Fatalf("sequential calls flushed as %v, want one flush each", flushes)
	}
}

// waitQueued waits until n calls wait in b's queue, failing t after 10s.
func waitQueued[T, R any](t testing.TB, b *batcher[T, R], n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d calls queued", n), func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.queue) == n
	})
}

// TestBatcherMergesConcurrentCalls holds the first flush until the other
// callers have queued, then checks that they went together (at most max a
// flush), one flush at a time, each caller with its own result.
func TestBatcherMergesConcurrentCalls(t *testing.T) {
	t.Parallel()
	const callers, max = 25, 10
	release := make(chan struct{})
	var inFlight, flushes atomic.Int32
	var sizes []int
	var mu sync.Mutex
	b := newBatcher(max, func(_ context.Context, items []int, out []string) {
		if inFlight.Add(1) != 1 {
			t.Error("two flushes in flight at once")
		}
		defer inFlight.Add(-1)
		if flushes.Add(1) == 1 {
			<-release
		}
		mu.Lock()
		sizes = append(sizes, len(items))
		mu.Unlock()
		if len(items) > max {
			t.Errorf("a flush of %d items, over max %d", len(items), max)
		}
		for i, v := range items {
			out[i] = fmt.Sprint("r", v)
		}
	}, func(v any) string { return fmt.Sprint("failed: ", v) })
	first := make(chan string)
	go func() { first <- mustDo(t, b, -1) }()
	eventually(t, "the first flush", func() bool { return flushes.Load() > 0 })
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			if got, want := mustDo(t, b, i), fmt.Sprint("r", i); got != want {
				t.Errorf("do(%d) = %q, want %q", i, got, want)
			}
		})
	}
	waitQueued(t, b, callers)
	close(release)
	if got := <-first; got != "r-1" {
		t.Fatalf("first do = %q", got)
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if fmt.Sprint(sizes) != "[1 10 10 5]" {
		t.Fatalf("flush sizes %v, want [1 10 10 5]: the queued callers go max at a time", sizes)
	}
	if b.busy || len(b.queue) != 0 {
		t.Fatalf("batcher not idle after the last flush: busy %v, queue %d", b.busy, len(b.queue))
	}
}

// TestBatcherPanic: a flush that panics fails the other calls of its
// batch, the panic goes on in the caller that ran it, and later calls work.
func TestBatcherPanic(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var flushes atomic.Int32
	b := newBatcher(10, func(_ context.Context, items []int, out []string) {
		if flushes.Add(1) == 1 {
			<-release // hold the first flush until 1 and 2 queued
		}
		for i, v := range items {
			if v == 1 {
				panic("boom")
			}
			out[i] = fmt.Sprint("r", v)
		}
	}, func(v any) string { return fmt.Sprint("failed: ", v) })
	first := make(chan string)
	go func() { first <- mustDo(t, b, 0) }()
	eventually(t, "the first flush", func() bool { return flushes.Load() > 0 })
	// 1 and 2 queue behind the first flush and go together in the second,
	// which panics: 1 leads it (the first queued), 2 follows.
	panicked := make(chan any, 1)
	go func() {
		defer func() { panicked <- recover() }()
		mustDo(t, b, 1)
	}()
	waitQueued(t, b, 1)
	second := make(chan string)
	go func() { second <- mustDo(t, b, 2) }()
	waitQueued(t, b, 2)
	close(release)
	if r := <-first; r != "r0" {
		t.Fatalf("do(0) = %q", r)
	}
	if v := <-panicked; v != "boom" {
		t.Fatalf("the panic in the caller that ran the flush = %v, want boom", v)
	}
	if r := <-second; r != "failed: boom" {
		t.Fatalf("the other call of the panicking flush got %q, want %q", r, "failed: boom")
	}
	if r := mustDo(t, b, 3); r != "r3" {
		t.Fatalf("a later call got %q", r)
	}
}

// TestBatcherQueuedCallLeaves: a call whose context ends while it waits
// behind a flush in flight returns the context's error and is not flushed;
// the calls queued with it still are.
func TestBatcherQueuedCallLeaves(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var flushes atomic.Int32
	var mu sync.Mutex
	var flushed [][]int
	b := newBatcher(10, func(_ context.Context, items []int, out []int) {
		if flushes.Add(1) == 1 {
			<-release
		}
		mu.Lock()
		flushed = append(flushed, slices.Clone(items))
		mu.Unlock()
		copy(out, items)
	}, func(any) int { return -1 })
	first := make(chan int)
	go func() { first <- mustDo(t, b, 0) }()
	eventually(t, "the first flush", func() bool { return flushes.Load() > 0 })
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error)
	go func() {
		_, err := b.do(ctx, 1)
		left <- err
	}()
	waitQueued(t, b, 1)
	stayed := make(chan int)
	go func() { stayed <- mustDo(t, b, 2) }()
	waitQueued(t, b, 2)
	cancel()
	if err := <-left; !errors.Is(err, context.Canceled) {
		t.Fatalf("the queued call whose context ended returned %v, want context.Canceled", err)
	}
	close(release)
	if r := <-first; r != 0 {
		t.Fatalf("first call got %d", r)
	}
	if r := <-stayed; r != 2 {
		t.Fatalf("the call queued with it got %d", r)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(flushed) != "[[0] [2]]" {
		t.Fatalf("flushed %v, want [[0] [2]]: the call that left is not sent", flushed)
	}
}

// TestFlushReplies settles timed replies of two senders in one round trip:
// each accepted once, a second reply to one request in the same batch late,
// a reply to an unknown request late.
func TestFlushReplies(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	for _, s := range []string{"web", "api"} {
		for i := range 2 {
			req := env(fmt.Sprintf("%s-m%d", s, i), "orders")
			req.Sender, req.Timeout = s, time.Hour
			if _, err := sendEnv(ctx, b, req); err != nil {
				t.Fatal(err)
			}
		}
	}
	items := []timedReply{
		{sender: "web", id: "web-m0", data: "a"},
		{sender: "api", id: "api-m0", data: "b"},
		{sender: "web", id: "web-m1", data: "c"},
		{sender: "web", id: "web-m0", data: "d"}, // a second reply to web-m0
		{sender: "api", id: "nope", data: "e"},
		{sender: "api", id: "api-m1", data: "f"},
	}
	got := make([]replyResult, len(items))
	b.flushReplies(context.Background(), items, got)
	want := []int64{1, 1, 1, 0, 0, 1}
	for i, r := range got {
		if r.err != nil || r.accepted != want[i] {
			t.Fatalf("reply %d (%+v): accepted %d, err %v; want %d", i, items[i], r.accepted, r.err, want[i])
		}
	}
	for s, n := range map[string]int{"web": 2, "api": 2} {
		rs, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: s, Consumer: "c", Max: 10, Block: 0, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if len(rs) != n {
			t.Fatalf("%s has %d replies, want %d: %+v", s, len(rs), n, rs)
		}
		for _, r := range rs {
			if r.Kind != broker.KindReply {
				t.Fatalf("%s: %+v", s, r)
			}
		}
	}
	if n, _ := do(t, rawClient(t, srv), "ZCARD", b.keys.timeouts("web")).AsInt64(); n != 0 {
		t.Fatalf("%d pending timeouts of web left after its replies", n)
	}
}

// TestFlushInbox runs merged inbox writes in one round trip: each command
// gets its own result, in order, a write to a stream that is gone among
// them included; after Close the round trip fails instead of waiting.
func TestFlushInbox(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	key, gone := b.keys.replies("_inbox.a"), b.keys.replies("_inbox.gone")
	xadd := func(key, v string) rueidis.Completed {
		return b.client.B().Xadd().Key(key).Nomkstream().Id("*").FieldValue().FieldValue("v", v).Build()
	}
	do(t, rawClient(t, srv), "XADD", key, "*", "v", "0")
	res := make([]inboxResult, 3)
	b.flushInbox(context.Background(), []rueidis.Completed{xadd(key, "1"), xadd(gone, "2"), xadd(key, "3")}, res)
	first, err1 := res[0].res.ToString()
	_, err2 := res[1].res.ToString()
	third, err3 := res[2].res.ToString()
	if err1 != nil || err3 != nil || !rueidis.IsRedisNil(err2) {
		t.Fatalf("results: %v, %v, %v; want two ids and nil for the stream that is gone", err1, err2, err3)
	}
	ms1, seq1, _ := parseID(first)
	ms3, seq3, _ := parseID(third)
	if ms3 < ms1 || ms3 == ms1 && seq3 <= seq1 {
		t.Fatalf("ids %s then %s: not in the order sent", first, third)
	}
	if n, _ := do(t, rawClient(t, srv), "XLEN", key).AsInt64(); n != 3 {
		t.Fatalf("XLEN %d, want 3", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if b.flushInbox(context.Background(), []rueidis.Completed{xadd(key, "4")}, res[:1]); res[0].res.Error() == nil {
		t.Fatal("a flush after Close succeeded")
	}
}

// TestInboxWritesMerge: concurrent replies and markers to an inbox share
// round trips, and each still gets its own entry and result.
func TestInboxWritesMerge(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	ctx := ctxT(t)
	var mu sync.Mutex
	var sizes []int
	b.inboxWrites = newBatcher(maxBatch, func(lead context.Context, cmds []rueidis.Completed, out []inboxResult) {
		mu.Lock()
		sizes = append(sizes, len(cmds))
		mu.Unlock()
		b.flushInbox(lead, cmds, out)
	}, func(v any) inboxResult { return inboxResult{err: fmt.Errorf("panic: %v", v)} })
	const inbox, writers, each = "_inbox.merge", 32, 20
	if err := b.KeepInbox(ctx, inbox, time.Minute); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				id := fmt.Sprintf("w%d-%d", w, i)
				var err error
				if i%2 == 0 {
					err = b.ReplyInbox(ctx, &broker.Envelope{ID: "r-" + id, Sender: "worker", Receiver: inbox, InReplyTo: id}, time.Time{})
				} else {
					_, err = b.GiveUp(ctx, inbox, id)
				}
				if err != nil {
					t.Errorf("%s: %v", id, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n, _ := do(t, rawClient(t, srv), "XLEN", b.keys.replies(inbox)).AsInt64(); n != writers*each {
		t.Fatalf("the inbox has %d entries, want %d", n, writers*each)
	}
	mu.Lock()
	defer mu.Unlock()
	total, merged := 0, 0
	for _, n := range sizes {
		total += n
		if n > 1 {
			merged++
		}
	}
	if total != writers*each || merged == 0 {
		t.Fatalf("%d writes in %d round trips, %d of them merged: want %d writes, some merged", total, len(sizes), merged, writers*each)
	}
	t.Logf("%d writes in %d round trips", total, len(sizes))
}

// TestBatcherCallAllocatesItsItems: a lone call reuses its call and the
// flush's results, so the batcher allocates per call only the items it
// hands to flush, which the client may read after it answered.
func TestBatcherCallAllocatesItsItems(t *testing.T) {
	b := newBatcher(10, func(_ context.Context, items []int, out []int) {
		copy(out, items)
	}, func(any) int { return -1 })
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if r, err := b.do(ctx, 7); r != 7 || err != nil {
			t.Fatalf("do(7) = %d, %v", r, err)
		}
	})
	if allocs > 1 {
		t.Fatalf("%v allocations per lone call, want 1 at most (its items)", allocs)
	}
}

// TestBatcherOwnItemsAllocateNothing: a batcher made withOwnItems reuses
// the items it hands to flush too, so a lone call allocates nothing; a
// flush gets items cleared of the last flush's.
func TestBatcherOwnItemsAllocateNothing(t *testing.T) {
	if raceOn {
		t.Skip("the race detector drops what sync.Pool keeps")
	}
	b := newBatcher(10, func(_ context.Context, items []*int, out []int) {
		if len(items) != 1 || items[:cap(items)][0] == nil {
			panic("items not as handed")
		}
		for _, it := range items[len(items):cap(items)] {
			if it != nil {
				panic("items keep a value of the last flush")
			}
		}
		out[0] = *items[0]
	}, func(any) int { return -1 }).withOwnItems()
	ctx := context.Background()
	v := 7
	allocs := testing.AllocsPerRun(1000, func() {
		if r, err := b.do(ctx, &v); r != 7 || err != nil {
			t.Fatalf("do(7) = %d, %v", r, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per lone call, want 0", allocs)
	}
	if b.items == nil || b.items[:cap(b.items)][0] != nil {
		t.Fatalf("the batcher did not keep its items cleared: %v", b.items)
	}
}

// TestInboxWriteAllocations counts the heap allocations of a lone write of
// an inbox over Redis, the client's reading of the answer included: the
// batcher reuses its call, its items and its results, and the client gets
// the command alone (Do), not a slice of the batch (a pinned command, and
// an answer of a simple string, allocate nothing). Counted, not timed.
func TestInboxWriteAllocations(t *testing.T) {
	if raceOn {
		t.Skip("the race detector drops what sync.Pool keeps")
	}
	b := newBroker(t)
	ctx := context.Background()
	cmd := b.client.B().Set().Key("allocs").Value("v").Build().Pin()
	// rueidis opens each wire of its pipeline at its first use and picks
	// one at random per command: open them all before counting.
	for range 100 {
		if _, err := b.doInbox(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := b.doInbox(ctx, cmd); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a lone inbox write allocates %v times, want 0", allocs)
	}
}
