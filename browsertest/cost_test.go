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

var cmdstat = regexp.MustCompile(`(?m)^cmdstat_([a-z_|]+):calls=(\d+)`)

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
	before := commandCalls(t, c)
	began := time.Now()
	<-time.After(span) // the span measured
	after := commandCalls(t, c)
	secs := time.Since(began).Seconds()
	out := map[string]float64{}
	for cmd, n := range after {
		if d := n - before[cmd]; d > 0 && cmd != "info" {
			out[cmd] = float64(d) / secs
		}
	}
	return out
}

func total(rates map[string]float64) float64 {
	sum := 0.0
	for _, r := range rates {
		sum += r
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
