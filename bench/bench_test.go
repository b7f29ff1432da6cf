package bench

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker/internal/keyslot"
)

func TestMain(m *testing.M) {
	if ServePeerIfAsked() { // the NATS peer's server, a child of a test
		return
	}
	goleak.VerifyTestMain(m,
		// ants starts its package-level default pool in init; its two
		// housekeeping goroutines live as long as the process.
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).purgeStaleWorkers"),
		goleak.IgnoreTopFunction("github.com/panjf2000/ants/v2.(*poolCommon).ticktock"),
		// A rueidis Cluster client that refreshed its topology closes the
		// connections it replaced 5 s later, on a goroutine that outlives
		// the client (the Cluster suite); the main module ignores it too.
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
	)
}

// tiny runs every workload of every suite once at the smallest sizes. It
// proves that each implementation completes its workload and that every cell
// of every table holds a figure; it asserts nothing about speed.
var tiny = Options{Runs: 2, Tiny: true, Quick: true}

// tinyStats is tiny with the command statistics on, as -cmdstats sets them.
var tinyStats = Options{Runs: 1, Tiny: true, Quick: true, CommandStats: true}

func checkTables(t *testing.T, tables []Table, wantTables int) {
	t.Helper()
	if len(tables) != wantTables {
		t.Fatalf("got %d tables, want %d", len(tables), wantTables)
	}
	for _, tb := range tables {
		if len(tb.Rows) == 0 {
			t.Fatalf("table %q has no rows", tb.Title)
		}
		for _, r := range tb.Rows {
			if len(r) != len(tb.Header) {
				t.Fatalf("table %q: row %v has %d cells, header has %d", tb.Title, r, len(r), len(tb.Header))
			}
			for _, c := range r {
				if c == "" || strings.Contains(c, "n/a") || strings.Contains(c, "NaN") || strings.Contains(c, "Inf") {
					t.Fatalf("table %q: row %v has a missing figure", tb.Title, r)
				}
			}
		}
		md := tb.Markdown()
		if !strings.HasPrefix(md, "### "+tb.Title) || strings.Count(md, "\n|") != len(tb.Rows)+2 {
			t.Fatalf("table %q renders badly:\n%s", tb.Title, md)
		}
	}
}

func TestExecutorSuite(t *testing.T) {
	tables, err := ExecutorSuite(context.Background(), tiny)
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, 4)
	for _, tb := range tables {
		if len(tb.Rows) != len(executors()) {
			t.Fatalf("table %q: %d rows, want one per executor (%d)", tb.Title, len(tb.Rows), len(executors()))
		}
	}
}

func TestCheckoutSuite(t *testing.T) {
	tables, err := CheckoutSuite(context.Background(), tiny)
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, 1)
	if got, want := len(tables[0].Rows), 2*3*len(checkoutImpls()); got != want {
		t.Fatalf("checkout table: %d rows, want %d", got, want)
	}
}

func TestDiskerSuite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tables, err := DiskerSuite(ctx, tiny)
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, 14)
	// Every peer has its rows, but for one that could not run here (its
	// table then says why): NATS is built into the harness and always runs;
	// BullMQ needs node and its modules, River PostgreSQL's binaries.
	for _, peer := range []struct {
		name, table string
		rows        int // in its workloads' table
		optional    bool
	}{
		{nameJetStreamMem, "fire-and-forget, 8 producers", 1, false},
		{nameJetStreamFile, "fire-and-forget, 8 producers", 1, false},
		{nameNATSRequest, "request/reply", 2, false},
		{nameBullMQ, "fire-and-forget, 8 producers", 1, true},
		{nameRiver, "fire-and-forget, 8 producers", 1, true},
	} {
		t.Run(peer.name, func(t *testing.T) {
			tb := findTable(t, tables, peer.table)
			for _, n := range tb.Notes {
				if strings.HasPrefix(n, peer.name+": not run:") {
					if !peer.optional {
						t.Fatal(n)
					}
					t.Skip(n)
				}
			}
			if got := countRows(tb, peer.name); got != peer.rows {
				t.Fatalf("table %q has %d rows of %s, want %d", tb.Title, got, peer.name, peer.rows)
			}
			work := findTable(t, tables, "Work per message")
			if got := countRows(work, peer.name); got != peer.rows {
				t.Fatalf("the work table has %d rows of %s, want %d", got, peer.name, peer.rows)
			}
		})
	}
}

// findTable returns the table whose title contains part.
func findTable(t *testing.T, tables []Table, part string) Table {
	t.Helper()
	for _, tb := range tables {
		if strings.Contains(tb.Title, part) {
			return tb
		}
	}
	t.Fatalf("no table titled like %q", part)
	return Table{}
}

// countRows counts the rows of tb that name impl.
func countRows(tb Table, impl string) int {
	n := 0
	for _, r := range tb.Rows {
		if slices.Contains(r, impl) {
			n++
		}
	}
	return n
}

// TestClusterSuite runs the Cluster workloads at tiny sizes and checks that
// the receivers spread evenly over the masters, with a row of each table
// (throughput and CPU; work counted) for each workload and deployment.
func TestClusterSuite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tables, err := ClusterSuite(ctx, tiny)
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, 2)
	for i, tb := range tables {
		if got, want := len(tb.Rows), 6; got != want {
			t.Fatalf("cluster table %d: %d rows, want %d", i, got, want)
		}
	}
	per := make([]int, clusterMasters)
	for _, r := range spreadReceivers(clusterReceivers, clusterMasters, func(slot uint16) int { return int(slot) * clusterMasters / 16384 }) {
		per[int(keyslot.Of("{"+r+"}"))*clusterMasters/16384]++
	}
	for m, k := range per {
		if k != clusterReceivers/clusterMasters {
			t.Fatalf("master %d serves %d receivers, want %d: %v", m, k, clusterReceivers/clusterMasters, per)
		}
	}
}

// TestFootprintSuite measures the footprint at tiny sizes: every instance
// holds connections, and adding receivers adds some.
func TestFootprintSuite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tables, err := FootprintSuite(ctx, tiny)
	if err != nil {
		t.Fatal(err)
	}
	checkTables(t, tables, 1)
	rows := tables[0].Rows
	if got := len(rows); got != 4 {
		t.Fatalf("footprint table: %d rows, want 4", got)
	}
	// Only the last configuration sends a message to each receiver, and
	// says how long they took to be handled.
	for i, row := range rows {
		if handled := row[len(row)-1]; (handled != "-") != (i == len(rows)-1) {
			t.Errorf("footprint row %d (%s): handle time %q", i, row[0], handled)
		}
	}
}

// TestDiskerSuiteCommandStats checks that -cmdstats reports the commands of
// every Redis run, with the ones each implementation must issue.
func TestDiskerSuiteCommandStats(t *testing.T) {
	var out strings.Builder
	o := tinyStats
	o.Progress = &out
	if _, err := DiskerSuite(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(out.String(), "redis commands per op:")
	want := len(ffImpls(1)) + len(ffManyImpls(1)) + 2*len(rrImpls(1, 1)) + len(dedupImpls(1)) + len(limitsImpls(1)) + len(delayedImpls(1)) + len(groupsImpls(1)) + len(batchImpls(1)) + len(retentionImpls(1)) + len(batchesImpls(1)) + len(streamImpls(1))
	if _, err := bullmqReady(); err == nil {
		want++ // BullMQ runs on the workload's redis-server
	}
	if lines != want {
		t.Fatalf("%d command statistics lines, want %d:\n%s", lines, want, out.String())
	}
	// The rows on servers of their own (NATS, River) have no Redis commands
	// to show, and say their system calls.
	peerLines := strings.Count(out.String(), "NATS JetStream, memory storage: system calls per op:") +
		strings.Count(out.String(), "NATS request/reply (core NATS): system calls per op:")
	if peerLines != 3 {
		t.Fatalf("%d system call lines of the NATS rows, want 3 (fire-and-forget, r=1, r=32):\n%s", peerLines, out.String())
	}
	_, procIO := readIOCalls("self")
	for _, l := range strings.Split(out.String(), "\n") {
		if procIO && strings.Contains(l, "redis commands per op:") &&
			(!strings.Contains(l, "system calls per op: go read ") && !strings.Contains(l, "system calls per op: node read ") ||
				!strings.Contains(l, ", redis read ")) {
			t.Fatalf("-cmdstats should count the system calls of both processes where /proc/PID/io is readable: %s", l)
		}
		if strings.Contains(l, "fire-and-forget / bare list, go-redis:") &&
			(!strings.Contains(l, "lpush 1.") || !strings.Contains(l, "brpop 1.")) {
			t.Fatalf("the bare list queue should issue one LPUSH and one BRPOP per message: %s", l)
		}
	}
}

// TestExecutorsRunEveryTask checks that each executor runs each task exactly
// once and has finished them all when it returns.
func TestExecutorsRunEveryTask(t *testing.T) {
	for _, e := range executors() {
		for _, c := range []int{1, 4, 1000} {
			var n int64
			var mu = make(chan struct{}, 1)
			task := func() {
				mu <- struct{}{}
				n++
				<-mu
			}
			if err := e.run(3000, c, task); err != nil {
				t.Fatalf("%s c=%d: %v", e.name, c, err)
			}
			mu <- struct{}{}
			got := n
			<-mu
			if got != 3000 {
				t.Fatalf("%s c=%d: ran %d tasks, want 3000", e.name, c, got)
			}
		}
	}
}

func TestPercentiles(t *testing.T) {
	ds := make([]time.Duration, 100)
	for i := range ds {
		ds[i] = time.Duration(100-i) * time.Microsecond
	}
	p50, p99 := percentiles(ds)
	if p50 != 50 || p99 != 99 {
		t.Fatalf("percentiles of 1..100µs = %v, %v; want 50, 99", p50, p99)
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		in            []float64
		med, min, max float64
	}{
		{[]float64{3, 1, 2}, 2, 1, 3},
		{[]float64{4, 1, 3, 2}, 2.5, 1, 4},
		{[]float64{7}, 7, 7, 7},
	} {
		s := summarize(tc.in)
		if s.med != tc.med || s.min != tc.min || s.max != tc.max {
			t.Fatalf("summarize(%v) = %+v, want med %v min %v max %v", tc.in, s, tc.med, tc.min, tc.max)
		}
	}
}

func TestRunAlternatingRotates(t *testing.T) {
	var order []string
	mk := func(name string) impl {
		return impl{name: name, run: func(context.Context) (sample, error) {
			order = append(order, name)
			return sample{elapsed: time.Millisecond, ops: 1}, nil
		}}
	}
	res, err := runAlternating(context.Background(), Options{Runs: 3, Progress: io.Discard}, "w", []impl{mk("a"), mk("b"), mk("c")})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(order, ""), "abcbcacab"; got != want {
		t.Fatalf("run order %q, want %q", got, want)
	}
	for _, name := range []string{"a", "b", "c"} {
		if len(res[name]) != 3 {
			t.Fatalf("%s has %d samples, want 3", name, len(res[name]))
		}
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -4500: "-4,500"} {
		if got := thousands(in); got != want {
			t.Fatalf("thousands(%d) = %q, want %q", in, got, want)
		}
	}
}
