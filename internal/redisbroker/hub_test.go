package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/redistest"
	"github.com/redis/rueidis"
)

// hubWaiters returns the number of reads waiting in b's hubs (for tests).
func (b *Broker) hubWaiters() int {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	n := 0
	for _, h := range b.hubs {
		h.mu.Lock()
		n += len(h.waiters)
		h.mu.Unlock()
	}
	return n
}

// hubCovers reports whether the read in progress of consumer's hub covers
// stream.
func (b *Broker) hubCovers(consumer, stream string) bool {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	k := hubKey{consumer: consumer}
	if b.cluster {
		k.slot = keyslot.Of(stream)
	}
	h, ok := b.hubs[k]
	if !ok {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok = h.readSet[stream]
	return h.reading && ok
}

// TestHubGivesBackWhatItReadForAWaiterThatLeft: a fetch waiting in the
// hub leaves (its context ends) while the hub's read, kept up by another
// fetch, still covers its queue; a message sent to that queue then is read
// by the hub, parked for the queue's next fetch, and given back when none
// comes (after parkFor), so another consumer's fetch gets it as attempt 1,
// not after a lease and not as a retry. A fetch of that queue that begins
// later reads it on a direct read again.
func TestHubGivesBackWhatItReadForAWaiterThatLeft(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.direct = nil // every blocking read through the hub
	ctx := ctxT(t)
	fetch := func(ctx context.Context, receiver string) error {
		_, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
		return err
	}
	endB := leftWaiter(t, ctx, b, fetch)
	if !b.hubCovers("c", b.keys.queue("a")) {
		t.Fatal("the read ended when a waiter left")
	}
	if _, err := sendEnv(ctx, b, env("m1", "a")); err != nil {
		t.Fatal(err)
	}
	waitGivenBack(t, ctx, b, "a")
	ds := fetch1(t, b, broker.FetchParams{Receiver: "a", Consumer: "d", Lease: time.Minute})
	if len(ds) != 1 || ds[0].Env.ID != "m1" || ds[0].Attempt != 1 {
		t.Fatalf("Fetch after the give-back = %+v; want m1 as attempt 1", ds)
	}
	endB()
	// A fetch that begins after the give-back may read a on a connection
	// of its own again.
	b.direct = make(chan struct{}, directReads)
	got := make(chan []broker.Delivery, 1)
	go func() {
		ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: "a", Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
		if err != nil {
			t.Error(err)
		}
		got <- ds
	}()
	eventually(t, "a direct read of a", func() bool { return len(b.direct) == 1 })
	if n := b.hubWaiters(); n != 0 {
		t.Fatalf("%d reads wait in the hub; want the one fetch on a direct read", n)
	}
	if _, err := sendEnv(ctx, b, env("m2", "a")); err != nil {
		t.Fatal(err)
	}
	if ds := <-got; len(ds) != 1 || ds[0].Env.ID != "m2" {
		t.Fatalf("Fetch on the direct read = %+v; want m2", ds)
	}
}

// leftWaiter starts fetches of queues a and b through b's hub for consumer
// c (fetch), waits for one read to cover both, and ends a's: the hub's
// read, kept up by b's fetch, still covers a. It returns what ends b's
// fetch and waits for it.
func leftWaiter(t *testing.T, ctx context.Context, b *Broker, fetch func(context.Context, string) error) func() {
	t.Helper()
	ctxB, cancelB := context.WithCancel(ctx)
	doneB := make(chan error, 1)
	go func() { doneB <- fetch(ctxB, "b") }()
	ctxA, cancelA := context.WithCancel(ctx)
	doneA := make(chan error, 1)
	go func() { doneA <- fetch(ctxA, "a") }()
	eventually(t, "a read covering both queues", func() bool {
		return b.hubCovers("c", b.keys.queue("a")) && b.hubCovers("c", b.keys.queue("b"))
	})
	cancelA()
	if err := <-doneA; !errors.Is(err, context.Canceled) {
		t.Fatalf("the fetch that left = %v; want context.Canceled", err)
	}
	return func() {
		t.Helper()
		cancelB()
		if err := <-doneB; !errors.Is(err, context.Canceled) {
			t.Fatalf("the other fetch = %v; want context.Canceled", err)
		}
	}
}

// waitGivenBack waits until receiver's queue holds one pending entry, with
// no delivery counted: read by the hub and given back.
func waitGivenBack(t *testing.T, ctx context.Context, b *Broker, receiver string) {
	t.Helper()
	raw := rawClient(t, srv)
	eventually(t, "the entry read and given back", func() bool {
		p, err := raw.Do(ctx, raw.B().Xpending().Key(b.keys.queue(receiver)).Group("g").Start("-").End("+").Count(10).Build()).ToArray()
		if err != nil || len(p) != 1 {
			return false
		}
		e, _ := p[0].ToArray()
		n, _ := e[3].AsInt64()
		return n == 0
	})
}

// TestHubWithoutClientUnblock: for a Redis user whose ACL refuses CLIENT
// UNBLOCK, a fetch that joins the hub while its read is blocked still
// gets its message without waiting for the block time: the read is
// aborted (its connection replaced) instead.
func TestHubWithoutClientUnblock(t *testing.T) {
	t.Parallel()
	raw := rawClient(t, srv)
	user := "nounblock-" + strings.ReplaceAll(redistest.Prefix(t), ":", "-")
	if err := do(t, raw, "ACL", "SETUSER", user, "on", ">pw", "~*", "&*", "+@all", "-client|unblock").Error(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { do(t, raw, "ACL", "DELUSER", user) })
	b, err := New(Config{URL: "redis://" + user + ":pw@" + srv.Addr(), KeyPrefix: redistest.Prefix(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	b.direct = nil // every blocking read through the hub
	ctx := ctxT(t)
	fetch := func(receiver string) chan []broker.Delivery {
		got := make(chan []broker.Delivery, 1)
		go func() {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
			if err != nil && !errors.Is(err, broker.ErrClosed) {
				t.Error(err)
			}
			got <- ds
		}()
		return got
	}
	gotA := fetch("a")
	eventually(t, "a blocked read", func() bool { return b.hubCovers("c", b.keys.queue("a")) })
	got := fetch("b")
	if _, err := sendEnv(ctx, b, env("m1", "b")); err != nil {
		t.Fatal(err)
	}
	select {
	case ds := <-got:
		if len(ds) != 1 || ds[0].Env.ID != "m1" {
			t.Fatalf("Fetch of b = %+v; want m1", ds)
		}
	case <-time.After(10 * time.Second): // half the block time
		t.Fatal("the fetch that joined waited for the block time")
	}
	b.Close()
	<-gotA // Close ended it
}

// TestClusterHubPerSlot: on a Cluster, the blocked fetches of receivers
// of different slots wait in one hub per slot, each blocked on the master
// of its slot; a reply reader of a name whose queue is waiting (the same
// slot) joins that hub by interrupting its read on that master; every one
// gets what is sent to it well within the block time.
func TestClusterHubPerSlot(t *testing.T) {
	if testing.Short() {
		t.Skip("a Cluster test: runs without -short")
	}
	t.Parallel()
	c := redistest.StartCluster(t, 3)
	b := clusterBroker(t, c)
	b.direct = nil // every blocking read through the hub
	ctx := ctxT(t)
	const n = 10
	slots := make(map[uint16]bool)
	got := make(chan string, n+1)
	for i := range n {
		r := fmt.Sprint("r", i)
		slots[keyslot.Of(b.keys.queue(r))] = true
		go func() {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: r, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
			if err != nil || len(ds) != 1 {
				t.Errorf("Fetch of %s = %+v, %v", r, ds, err)
				got <- ""
				return
			}
			got <- ds[0].Env.ID
		}()
	}
	eventually(t, "every queue in a blocked read", func() bool {
		for i := range n {
			if !b.hubCovers("c", b.keys.queue(fmt.Sprint("r", i))) {
				return false
			}
		}
		return true
	})
	if h := b.hubCount(); h != len(slots) {
		t.Fatalf("%d hubs for %d slots", h, len(slots))
	}
	go func() {
		rs, err := b.ReadReplies(ctx, &broker.ReadRepliesParams{Sender: "r0", Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
		if err != nil || len(rs) != 1 {
			t.Errorf("ReadReplies = %+v, %v", rs, err)
			got <- ""
			return
		}
		got <- "reply to " + rs[0].RequestID
	}()
	eventually(t, "the reply stream in the read of its slot", func() bool { return b.hubCovers("c", b.keys.replies("r0")) })
	if h := b.hubCount(); h != len(slots) {
		t.Fatalf("%d hubs for %d slots after the reply reader joined", h, len(slots))
	}
	for i := range n {
		if _, err := sendEnv(ctx, b, env(fmt.Sprint("m", i), fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Reply(ctx, &broker.Envelope{ID: "rep", Receiver: "r0", InReplyTo: "q"}, broker.ReplyUntimed); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"reply to q": true}
	for i := range n {
		want[fmt.Sprint("m", i)] = true
	}
	deadline := time.After(10 * time.Second) // half the block time
	for range n + 1 {
		select {
		case id := <-got:
			if !want[id] {
				t.Fatalf("got %q; want one of %v", id, want)
			}
			delete(want, id)
		case <-deadline:
			t.Fatalf("still waiting for %v", want)
		}
	}
}

// hubCount returns the number of b's hubs.
func (b *Broker) hubCount() int {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	return len(b.hubs)
}

// TestHubParksForTheNextFetch: a message read by the hub for a queue
// whose consumer loop is between two fetches (its stream stays in the
// read after its fetch was answered) goes to that queue's next fetch at
// once, as attempt 1.
func TestHubParksForTheNextFetch(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.direct = nil          // every blocking read through the hub
	b.parkFor = time.Minute // longer than the test: nothing is given back
	ctx := ctxT(t)
	p := func(receiver string) *broker.FetchParams {
		return &broker.FetchParams{Receiver: receiver, Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute}
	}
	ctxB, cancelB := context.WithCancel(ctx)
	doneB := make(chan error, 1)
	go func() { _, err := b.Fetch(ctxB, p("b")); doneB <- err }()
	got := make(chan []broker.Delivery, 1)
	go func() {
		ds, err := b.Fetch(ctx, p("a"))
		if err != nil {
			t.Error(err)
		}
		got <- ds
	}()
	eventually(t, "a read covering a", func() bool { return b.hubCovers("c", b.keys.queue("a")) })
	if _, err := sendEnv(ctx, b, env("m1", "a")); err != nil {
		t.Fatal(err)
	}
	if ds := <-got; len(ds) != 1 || ds[0].Env.ID != "m1" {
		t.Fatalf("first Fetch = %+v; want m1", ds)
	}
	eventually(t, "a read still covering a", func() bool { return b.hubCovers("c", b.keys.queue("a")) })
	if _, err := sendEnv(ctx, b, env("m2", "a")); err != nil {
		t.Fatal(err)
	}
	raw := rawClient(t, srv)
	eventually(t, "m2 read by the hub", func() bool {
		n, err := raw.Do(ctx, raw.B().Xpending().Key(b.keys.queue("a")).Group("g").Build()).ToArray()
		if err != nil || len(n) == 0 {
			return false
		}
		c, _ := n[0].AsInt64()
		return c == 2
	})
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second) // half the block time
	defer cancel()
	ds, err := b.Fetch(fctx, p("a"))
	if err != nil || len(ds) != 1 || ds[0].Env.ID != "m2" || ds[0].Attempt != 1 {
		t.Fatalf("next Fetch = %+v, %v; want m2 at once, as attempt 1", ds, err)
	}
	cancelB()
	<-doneB
}

// hubRounds returns the reads the hub of consumer ended so far (0 without
// a hub).
func (b *Broker) hubRounds(consumer string) uint64 {
	b.hubsMu.Lock()
	defer b.hubsMu.Unlock()
	h, ok := b.hubs[hubKey{consumer: consumer}]
	if !ok {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.round
}

// TestHubAnswersDeadlinesTogether: waiters that joined one after the
// other over a second, each with its own deadline, are answered in a
// few reads, not a read each: a read that ends answers the waiters whose
// deadline is less than an eighth of their block time away (earlyDiv),
// so with a block time of 5s, those of a second go in 3 reads at most.
// Each answered at its own deadline, the hub would end and start a read
// of every stream once per waiter (issue 16).
func TestHubAnswersDeadlinesTogether(t *testing.T) {
	t.Parallel()
	b := newBroker(t)
	b.direct = nil // every blocking read through the hub
	const n = 100
	const block, spread = 5 * time.Second, time.Second
	done := make(chan error, n)
	start := time.Now()
	for i := range n {
		go func() {
			_, err := b.Fetch(ctxT(t), &broker.FetchParams{Receiver: fmt.Sprint("r", i), Consumer: "c", Max: 1, Block: block, Lease: time.Minute})
			done <- err
		}()
		time.Sleep(spread / n)
	}
	eventually(t, "every waiter joined", func() bool { return b.hubWaiters() == n })
	// On a loaded host the joins spread over more than spread: the bound
	// below counts from the spread they took.
	took := max(spread, time.Since(start))
	// All have joined: from here on, reads end only at deadlines.
	before := b.hubRounds("c")
	for range n {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	rounds := b.hubRounds("c") - before
	t.Logf("%d reads ended for the deadlines of %d waiters", rounds, n)
	// The deadlines span the spread; each read that ends at one answers
	// those of the next block/earlyDiv too.
	most := uint64(took/(block/earlyDiv)) + 2
	if rounds > most {
		t.Fatalf("%d reads ended for the deadlines of %d waiters; want <= %d", rounds, n, most)
	}
}

// TestDirectReadsBeforeTheHub: the first directReads blocking reads of a
// broker wait on connections of their own, the others in the hub; each
// gets its message.
func TestDirectReadsBeforeTheHub(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	ctx := ctxT(t)
	const n = directReads + 2
	got := make(chan string, n)
	for i := range n {
		go func() {
			ds, err := b.Fetch(ctx, &broker.FetchParams{Receiver: fmt.Sprint("r", i), Consumer: "c", Max: 1, Block: 20 * time.Second, Lease: time.Minute})
			if err != nil || len(ds) != 1 {
				t.Errorf("Fetch of r%d = %+v, %v", i, ds, err)
				got <- ""
				return
			}
			got <- ds[0].Env.ID
		}()
	}
	raw := rawClient(t, s)
	eventually(t, "the direct reads and the hub's read blocked", func() bool {
		info, _ := do(t, raw, "INFO", "clients").ToString()
		return len(b.direct) == directReads && b.hubWaiters() == n-directReads &&
			strings.Contains(info, fmt.Sprintf("blocked_clients:%d\r", 1+directReads))
	})
	for i := range n {
		if _, err := sendEnv(ctx, b, env(fmt.Sprint("m", i), fmt.Sprint("r", i))); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	for range n {
		seen[<-got] = true
	}
	for i := range n {
		if !seen[fmt.Sprint("m", i)] {
			t.Errorf("m%d was not fetched", i)
		}
	}
}

// commandCalls returns how many times the server has run the command
// name (lower case), as INFO commandstats counts it.
func commandCalls(t *testing.T, raw rueidis.Client, name string) int {
	t.Helper()
	info, err := do(t, raw, "INFO", "commandstats").ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(info, "cmdstat_"+name+":calls=")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDrainedStreamFetchesWithOneRead: once a fetch found a queue empty,
// the next fetch that waits for a message makes one blocking read (not a
// read without BLOCK first); a fetch that finds a backlog goes back to
// reads without BLOCK.
func TestDrainedStreamFetchesWithOneRead(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	b.reclaimEvery = time.Hour // the fetch script runs once only
	raw := rawClient(t, s)
	ctx := ctxT(t)
	fp := func(block time.Duration, max int) *broker.FetchParams {
		return &broker.FetchParams{Receiver: "r", Consumer: "c", Max: max, Block: block, Lease: time.Minute}
	}
	// The first fetch runs the script (group and lease); the second
	// finds the queue empty.
	for range 2 {
		if ds, err := b.Fetch(ctx, fp(10*time.Millisecond, 1)); err != nil || len(ds) != 0 {
			t.Fatalf("Fetch of an empty queue = %+v, %v", ds, err)
		}
	}
	st := b.queueState("r")
	if !st.drained.Load() {
		t.Fatal("the queue was found empty, but is not marked drained")
	}
	before := commandCalls(t, raw, "xreadgroup")
	got := make(chan error, 1)
	go func() {
		ds, err := b.Fetch(ctx, fp(20*time.Second, 10))
		if err == nil && len(ds) != 1 {
			err = fmt.Errorf("fetched %d entries, want 1", len(ds))
		}
		got <- err
	}()
	eventually(t, "the fetch blocked", func() bool {
		info, _ := do(t, raw, "INFO", "clients").ToString()
		return strings.Contains(info, "blocked_clients:1\r")
	})
	if _, err := sendEnv(ctx, b, env("m0", "r")); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := commandCalls(t, raw, "xreadgroup") - before; n != 1 {
		t.Fatalf("the fetch of a drained queue made %d XREADGROUPs, want 1", n)
	}
	// A backlog: the direct read returns a full batch, and the stream is
	// read without BLOCK again.
	for i := range 5 {
		if _, err := sendEnv(ctx, b, env(fmt.Sprint("b", i), "r")); err != nil {
			t.Fatal(err)
		}
	}
	if ds, err := b.Fetch(ctx, fp(time.Second, 3)); err != nil || len(ds) != 3 {
		t.Fatalf("Fetch of a backlog = %d entries, %v; want 3", len(ds), err)
	}
	if st.drained.Load() {
		t.Fatal("a fetch returned a full batch, but the queue is still marked drained")
	}
	if ds, err := b.Fetch(ctx, fp(time.Second, 3)); err != nil || len(ds) != 2 {
		t.Fatalf("Fetch of the rest = %d entries, %v; want 2", len(ds), err)
	}
}
