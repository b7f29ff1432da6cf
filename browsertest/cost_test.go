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

var cmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z|]+):calls=(\d+)`)

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

// TestRedisCostWithThreePages opens three pages of a dashboard over 1,000
// receivers and counts the commands Redis runs meanwhile (INFO
// commandstats). The pages share one poll loop, so the cost is that of one
// poll per interval whatever the number of pages: the test fails if it
// reaches that of two. It logs the commands per second.
func TestRedisCostWithThreePages(t *testing.T) {
	const receivers, interval, window = 1000, time.Second, 10 * time.Second
	srv := redistest.Start(t)
	prefix := redistest.Prefix(t)
	lib, err := disker.New(disker.Config{RedisURL: srv.URL(), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close(context.Background())
	msgs := make([]disker.Message, receivers)
	for i := range msgs {
		msgs[i] = disker.Message{Receiver: fmt.Sprintf("r%04d", i), Content: []byte("x"), FireAndForget: true}
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
	tabs := []context.Context{b.ctx}
	for range 2 {
		ctx, cancel := chromedp.NewContext(b.ctx)
		t.Cleanup(cancel)
		tabs = append(tabs, ctx)
	}
	for _, tab := range tabs {
		ctx, cancel := context.WithTimeout(tab, 60*time.Second)
		_, err := chromedp.Run(ctx, chromedp.Steps(chromedp.Navigate(dash+"/"),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`document.querySelectorAll('#receivers tbody tr').length == %d`, receivers), chromedp.WithPollingTimeout(50*time.Second))))
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := commandCalls(t, c)
	began := time.Now()
	<-time.After(window) // the span measured
	after := commandCalls(t, c)
	secs := time.Since(began).Seconds()
	var lines []string
	perSecond := map[string]float64{}
	for cmd, n := range after {
		if d := n - before[cmd]; d > 0 && cmd != "info" {
			perSecond[cmd] = float64(d) / secs
			lines = append(lines, fmt.Sprintf("%-12s %8.1f/s", cmd, perSecond[cmd]))
		}
	}
	sort.Strings(lines)
	t.Logf("Redis commands with 3 pages open on %d receivers, interval %v, over %.1fs:\n%s", receivers, interval, secs, strings.Join(lines, "\n"))
	// One poll reads each receiver's Stats once (one EVALSHA): three pages
	// polling on their own would triple that.
	if got, onePoll := perSecond["evalsha"], float64(receivers)/interval.Seconds(); got > 1.5*onePoll {
		t.Errorf("%.0f EVALSHA/s with 3 pages: more than one poll per interval (%.0f/s)", got, onePoll)
	}
	for i, tab := range tabs {
		if n, err := chromedp.Run(tab, chromedp.Evaluate[int](`document.querySelectorAll('#receivers tbody tr').length`)); err != nil || n != receivers {
			t.Errorf("tab %d: %d rows (%v), want %d", i, n, err, receivers)
		}
	}
	b.noErrors(t, "three pages")
}
