package bench

import (
	"context"
	"strings"
	"sync"
	"testing"
)

// TestGoCounters checks that the counters see allocations and wake-ups.
func TestGoCounters(t *testing.T) {
	const n = 4000
	sink := make([]*[64]byte, n)
	c0 := readGoCounters()
	for i := range sink {
		sink[i] = new([64]byte)
	}
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			pong <- struct{}{}
		}
	}()
	for range n {
		ping <- struct{}{}
		<-pong
	}
	close(ping)
	d := readGoCounters().sub(c0)
	if d.allocs < n || d.bytes < 64*n {
		t.Fatalf("%d allocations of %d bytes counted, want at least %d of %d", d.allocs, d.bytes, n, 64*n)
	}
	// Each of the n exchanges parks and wakes the other goroutine at least
	// once; the runtime samples one in trackingPeriod of them.
	if d.wakeups() < n {
		t.Fatalf("%d wake-ups estimated (%d samples), want at least %d", d.wakeups(), d.latencySamples, n)
	}
	if d.created < 1 {
		t.Fatalf("%d goroutines created, want at least 1", d.created)
	}
}

// TestWorkTableMarksWhatDoesNotApply checks that counts that do not apply
// to a row (the Go counts of clients outside this process, the commands
// of a server that is not Redis) show "–".
func TestWorkTableMarksWhatDoesNotApply(t *testing.T) {
	node := sample{ops: 10, work: work{clientExternal: true, commands: 30, clientIOOK: true, clientIO: ioCalls{reads: 10, writes: 10}}}
	other := sample{ops: 10, work: work{goCounts: goCounters{allocs: 200, latencySamples: 10}, commands: -1}}
	tb := workTable([]workRow{{"ff", "node clients", []sample{node}}, {"ff", "a server not Redis", []sample{other}}, {"ff", "absent", nil}})
	want := [][]string{
		{"ff", "node clients", "–", "–", "–", "–", "3.00", "2.00", "–"},
		{"ff", "a server not Redis", "20.0", "0.00", "8.00", "0.00", "–", "–", "–"},
	}
	if len(tb.Rows) != len(want) {
		t.Fatalf("rows %v, want %v", tb.Rows, want)
	}
	for i := range want {
		if strings.Join(tb.Rows[i], "|") != strings.Join(want[i], "|") {
			t.Fatalf("row %d: %v, want %v", i, tb.Rows[i], want[i])
		}
	}
}

// TestHarnessLoopsAllocateNothingPerOp backs the work table's attribution:
// the producers' loop, the countdown and the requesters' loop allocate
// nothing per operation, so what a row counts per operation is its
// clients'.
func TestHarnessLoopsAllocateNothingPerOp(t *testing.T) {
	const n = 20000
	cd := newCountdown(n)
	errc := make(chan error, 1)
	c0 := readGoCounters()
	if _, err := timedRun(context.Background(), n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produce(ctx, n, errc, func(context.Context) error { cd.add(); return nil })
	}); err != nil {
		t.Fatal(err)
	}
	if d := readGoCounters().sub(c0); float64(d.allocs)/n > 0.01 {
		t.Fatalf("fire-and-forget's loops: %d allocations for %d messages", d.allocs, n)
	}
	c0 = readGoCounters()
	if _, err := runRequests(context.Background(), n, 32, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if d := readGoCounters().sub(c0); float64(d.allocs)/n > 0.01 {
		t.Fatalf("request/reply's loops: %d allocations for %d round trips", d.allocs, n)
	}
}
