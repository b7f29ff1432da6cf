package browsertest

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

var (
	cmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z_|]+):calls=(\d+)`)
	reads   = regexp.MustCompile(`(?m)^total_reads_processed:(\d+)`)
)

// readEvents reads INFO stats: how many times Redis has read from a
// client's socket. Every round trip is read at least once (a pipeline
// larger than Redis's read buffer, 16 KB, more than once), so the count
// bounds the round trips from above.
func readEvents(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("stats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	m := reads.FindStringSubmatch(info)
	if m == nil {
		t.Fatalf("INFO stats has no total_reads_processed:\n%s", info)
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// commandCalls reads INFO commandstats: calls per command.
func commandCalls(t *testing.T, c rueidis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, m := range cmdstat.FindAllStringSubmatch(info, -1) {
		out[m[1]], _ = strconv.ParseInt(m[2], 10, 64)
	}
	return out
}

// TestRedisCostWithThreePages counts the commands Redis runs (INFO
// commandstats) while one page of a dashboard over 1,000 receivers is open,
// then while three are. The pages share one poll loop, so three cost what
// one does: the test fails if they cost half as much again. It logs the
// commands per second.
func TestRedisCostWithThreePages(t *testing.T) {
	const receivers, interval, window = 1000, time.Second, 8 * time.Second
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	lib, err := disker.New(context.Background(), disker.Config{RedisURL: srv.URL(), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close(context.Background())
	msgs := make([]disker.Message, receivers)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: fmt.Sprintf("r%04d", i), Content: []byte("x")}
	}
	if _, err := lib.SendBatch(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	saved := redisURL
	redisURL = srv.URL()
	defer func() { redisURL = saved }()
	start(t, prefix, workerStarted, "worker", "--receiver", "r0000", "--exec", "cat")
	dash := dashboard(t, prefix, "--interval", interval.String())
	b := newBrowser(t)
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Before any page is open the dashboard does not poll: what Redis
	// reads then is the worker's and the dashboard's own heartbeats.
	idle := measure(t, c, window)
	tabs := []*browser{b}
	b.do(t, chromedp.Navigate(dash+"/"))
	b.waitJS(t, "every receiver", fmt.Sprintf(`document.querySelectorAll('#receivers tbody tr').length == %d`, receivers))
	one := measure(t, c, window)
	for range 2 {
		ctx, cancel := chromedp.NewContext(b.ctx)
		t.Cleanup(cancel)
		if err := chromedp.Do(ctx); err != nil {
			t.Fatal(err)
		}
		tab := &browser{ctx: ctx}
		tab.do(t, chromedp.Navigate(dash+"/"))
		tab.waitJS(t, "every receiver", fmt.Sprintf(`document.querySelectorAll('#receivers tbody tr').length == %d`, receivers))
		tabs = append(tabs, tab)
	}
	three := measure(t, c, window)
	t.Logf("Redis commands per second on %d receivers, interval %v (INFO commandstats; a script's commands count apart from it):\n%s",
		receivers, interval, table(one, three))
	// Pages that polled on their own would triple the cost.
	if total(three) > 1.5*total(one) {
		t.Errorf("%.0f commands/s with 3 pages, %.0f with 1: the pages do not share one poll", total(three), total(one))
	}
	// One poll per interval whatever the pages: each receiver's stats are
	// read at most once an interval.
	if max(one["evalsha_ro"], three["evalsha_ro"]) > 1.1*receivers/interval.Seconds() {
		t.Errorf("stats read %.0f/s with 1 page, %.0f/s with 3, for %d receivers every %v: more than one poll an interval",
			one["evalsha_ro"], three["evalsha_ro"], receivers, interval)
	}
	// The round trips of a poll, bounded by Redis's read events beyond
	// the idle ones: the workers (ZRANGE, then one pipeline of HMGET) and
	// one pipeline of every receiver's stats (StatsOf), which Redis reads
	// in 16 KB pieces (a stats call names ten keys of its receiver, so the
	// pipeline of 1,000 takes about thirty pieces), and every tenth poll
	// the scan of the keyspace. Reading the stats receiver by receiver,
	// even 16 at a time, would cost at least receivers/16 round trips a
	// poll.
	for _, m := range []struct {
		pages int
		rates map[string]float64
	}{{1, one}, {3, three}} {
		polls := m.rates["evalsha_ro"] / receivers
		perPoll := (m.rates[readsKey] - idle[readsKey]) / polls
		t.Logf("%d page(s): %.2f polls/s, %.1f Redis read events a poll (idle: %.1f read events/s)", m.pages, polls, perPoll, idle[readsKey])
		if perPoll >= receivers/16 {
			t.Errorf("%d page(s): %.1f read events a poll for %d receivers: the stats are not read in one round trip", m.pages, perPoll, receivers)
		}
	}
	for i, tab := range tabs {
		if n := eval[int](t, tab, `document.querySelectorAll('#receivers tbody tr').length`); n != receivers {
			t.Errorf("tab %d: %d rows, want %d", i, n, receivers)
		}
	}
	b.noErrors(t, "three pages")
}

// measure returns the commands per second Redis ran over a span (INFO
// itself left out).
func measure(t *testing.T, c rueidis.Client, span time.Duration) map[string]float64 {
	t.Helper()
	before, readsBefore := commandCalls(t, c), readEvents(t, c)
	began := time.Now()
	<-time.After(span) // the span measured
	after, readsAfter := commandCalls(t, c), readEvents(t, c)
	secs := time.Since(began).Seconds()
	// Each measure's two INFO commands are two reads.
	out := map[string]float64{readsKey: float64(readsAfter-readsBefore-2) / secs}
	for cmd, n := range after {
		if d := n - before[cmd]; d > 0 && cmd != "info" && cmd != readsKey {
			out[cmd] = float64(d) / secs
		}
	}
	return out
}

// readsKey holds, among a measure's commands per second, Redis's read
// events per second (readEvents), which total leaves out.
const readsKey = "(read events)"

func total(rates map[string]float64) float64 {
	sum := 0.0
	for cmd, r := range rates {
		if cmd != readsKey {
			sum += r
		}
	}
	return sum
}

// table shows two measures side by side, one command a line.
func table(one, three map[string]float64) string {
	var cmds []string
	for cmd := range three {
		cmds = append(cmds, cmd)
	}
	for cmd := range one {
		if _, ok := three[cmd]; !ok {
			cmds = append(cmds, cmd)
		}
	}
	sort.Strings(cmds)
	lines := []string{fmt.Sprintf("%-18s %10s %10s", "command", "1 page", "3 pages")}
	for _, cmd := range cmds {
		lines = append(lines, fmt.Sprintf("%-18s %10.1f %10.1f", cmd, one[cmd], three[cmd]))
	}
	lines = append(lines, fmt.Sprintf("%-18s %10.1f %10.1f", "total", total(one), total(three)))
	return strings.Join(lines, "\n")
}
