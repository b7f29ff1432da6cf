package brokertest

import (
	"errors"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// wakeParams returns the params of a Fetch of receiver with Wake, and the
// channel its calls signal.
func wakeParams(receiver string, block time.Duration) (*broker.FetchParams, chan struct{}) {
	woken := make(chan struct{}, 1)
	p := &broker.FetchParams{Receiver: receiver, Consumer: "c1", Max: 10, Block: block, Lease: longLease, MaxAttempts: 10,
		Wake: func() {
			select {
			case woken <- struct{}{}:
			default:
			}
		}}
	return p, woken
}

// parkFetch fetches with p (Wake set) until a Fetch leaves its wait
// registered (p.Wait), failing should one return a delivery.
func parkFetch(t *testing.T, b broker.Broker, p *broker.FetchParams) {
	t.Helper()
	deadline := time.Now().Add(Patience)
	for p.Wait == nil {
		ds, err := b.Fetch(ctxT(t), p)
		if err != nil || len(ds) > 0 {
			t.Fatalf("Fetch with Wake of an empty queue: got %+v, %v", ds, err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for a Fetch with Wake to leave a wait", Patience)
		}
	}
}

// fetchWoken fetches with p, waiting for its Wake after each Fetch that
// left a wait, until one returns deliveries.
func fetchWoken(t *testing.T, b broker.Broker, p *broker.FetchParams, woken <-chan struct{}) []broker.Delivery {
	t.Helper()
	deadline := time.Now().Add(Patience)
	for time.Now().Before(deadline) {
		if p.Wait != nil {
			await(t, "the wake of a Fetch's wait", woken)
		}
		ds, err := b.Fetch(ctxT(t), p)
		if err != nil {
			t.Fatalf("Fetch with Wake: %v", err)
		}
		if len(ds) > 0 {
			return ds
		}
	}
	t.Fatalf("gave up after %v waiting for a Fetch with Wake to deliver", Patience)
	return nil
}

// parkThenSend leaves the wait of a Fetch with Wake of a new receiver r,
// then sends env to r.
func parkThenSend(t *testing.T, b broker.Broker) (r string, p *broker.FetchParams, woken chan struct{}, env *broker.Envelope) {
	t.Helper()
	r = name("recv")
	p, woken = wakeParams(r, blockLong)
	parkFetch(t, b, p)
	env = newEnv(r, "after the wait was left")
	send(t, b, env)
	return r, p, woken, env
}

// testFetchWake: a Fetch with Wake that finds nothing returns at once,
// with its wait left (Wait); a message sent then wakes it, and the next
// Fetch with the same params delivers it.
func testFetchWake(t *testing.T, b broker.Broker) {
	r, p, woken, env := parkThenSend(t, b)
	ds := fetchWoken(t, b, p, woken)
	if len(ds) != 1 {
		t.Fatalf("woken Fetch: got %+v; want the message", ds)
	}
	checkEnv(t, "woken Fetch", ds[0].Env, env)
	ack(t, b, r, ds[0].Ref)
	if p.Wait != nil {
		p.Wait.Cancel()
	}
}

// testFetchWakeBlockEnds: a wait left by a Fetch with Wake wakes at the
// end of its block time, nothing sent.
func testFetchWakeBlockEnds(t *testing.T, b broker.Broker) {
	p, woken := wakeParams(name("recv"), 300*time.Millisecond)
	parkFetch(t, b, p)
	await(t, "the wake at the end of the block time", woken)
	if ds, err := b.Fetch(ctxT(t), p); err != nil || len(ds) != 0 {
		t.Fatalf("Fetch after the block time: got %+v, %v", ds, err)
	}
	if p.Wait != nil {
		p.Wait.Cancel()
	}
}

// testFetchWakeCancel: a message sent to a receiver whose wait was
// cancelled goes to the next consumer, whether the wait had read it or
// not.
func testFetchWakeCancel(t *testing.T, b broker.Broker) {
	r, p, woken, env := parkThenSend(t, b)
	select {
	case <-woken:
	case <-time.After(100 * time.Millisecond): // cancelled before or after it read
	}
	p.Wait.Cancel()
	ds := pollFetch(t, b, broker.FetchParams{Receiver: r, Consumer: "c2", Max: 10, Block: pollBlock, Lease: longLease, MaxAttempts: 10})
	if len(ds) != 1 {
		t.Fatalf("Fetch after a cancelled wait: got %+v; want the message", ds)
	}
	checkEnv(t, "Fetch after a cancelled wait", ds[0].Env, env)
	if ds[0].Attempt != 1 {
		t.Fatalf("Fetch after a cancelled wait: attempt %d, want 1 (the wait's read does not count)", ds[0].Attempt)
	}
	ack(t, b, r, ds[0].Ref)
}

// testFetchWakeClose: Close wakes a wait left by a Fetch with Wake, and
// the next Fetch returns ErrClosed.
func testFetchWakeClose(t *testing.T, b broker.Broker) {
	p, woken := wakeParams(name("recv"), blockLong)
	parkFetch(t, b, p)
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	await(t, "the wake of Close", woken)
	if _, err := b.Fetch(ctxT(t), p); !errors.Is(err, broker.ErrClosed) {
		t.Fatalf("Fetch after Close: %v, want ErrClosed", err)
	}
}
