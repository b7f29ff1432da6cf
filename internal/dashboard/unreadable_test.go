package dashboard

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker"
)

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.b.String(), s)
}

// redisDo runs a command on the test's Redis.
func redisDo(t *testing.T, args ...string) {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{strings.TrimSuffix(strings.TrimPrefix(redisURL, "redis://"), "/0")}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Do(context.Background(), c.B().Arbitrary(args...).Build()).Error(); err != nil {
		t.Fatalf("%v: %v", args, err)
	}
}

// TestUnreadableRecordsAreSkipped: a worker's record that names a receiver
// by a name that breaks the name rule (as an older or a foreign client may
// write it), and a receiver whose keys do not read as Disker's, are left
// out of the dashboard, which says so once in the page and once in the
// log, and shows everything else: the receiver and the worker that read.
func TestUnreadableRecordsAreSkipped(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	f := newFixture(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if _, err := f.dash.Request(context.Background(), disker.Message{Receiver: "jobs", Content: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	info := `{"id":"foreign","host":"elsewhere","pid":7,"receivers":["bad name"],"concurrency":{"bad name":1}}`
	redisDo(t, "HSET", f.prefix+":{workers}:w:foreign", "info", info, "seen", strconv.FormatInt(time.Now().UnixMilli(), 10))
	redisDo(t, "ZADD", f.prefix+":{workers}:ids", strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10), "foreign")
	// A queue stream, so that the receiver is listed, and a dead-letter
	// key that is not a stream, so that its stats do not read.
	redisDo(t, "XADD", f.prefix+":{broken}:q", "*", "x", "1")
	redisDo(t, "SET", f.prefix+":{broken}:dlq", "not a stream")

	badName := `worker foreign lists a receiver "bad name", which is not a valid receiver name`
	broken := "receiver broken: its stats do not read"
	var snap apiSnapshot
	waitFor(t, "a snapshot that skips both and shows the rest", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		snap = apiSnapshot{}
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatal(err)
		}
		return len(snap.Skipped) == 2 && len(snap.Workers) == 2
	})
	if snap.Error != "" {
		t.Errorf("the snapshot has an error: %q", snap.Error)
	}
	if !strings.HasPrefix(snap.Skipped[0], badName) || !strings.HasPrefix(snap.Skipped[1], broken) {
		t.Errorf("skipped %q, want %q and %q", snap.Skipped, badName, broken)
	}
	if len(snap.Receivers) != 1 || snap.Receivers[0].Name != "jobs" || snap.Receivers[0].Cells[5] != "1" {
		t.Errorf("receivers %+v, want jobs, with its worker", snap.Receivers)
	}
	// Some more polls: each line is logged once, not at every poll.
	polls := time.Now()
	waitFor(t, "five more polls", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		_ = json.Unmarshal([]byte(body), &snap)
		return time.UnixMilli(snap.At).After(polls.Add(500 * time.Millisecond))
	})
	for _, line := range []string{badName, broken} {
		if n := logs.count(strings.ReplaceAll(line, `"`, `\"`)); n != 1 {
			t.Errorf("the log has %q %d times, want once:\n%s", line, n, logs.String())
		}
		for _, path := range []string{"/", "/workers"} {
			_, _, page := f.get(t, path)
			if n := strings.Count(page, strings.ReplaceAll(line, `"`, "&#34;")); n != 1 {
				t.Errorf("GET %s shows %q %d times, want once:\n%s", path, line, n, page)
			}
			if !strings.Contains(page, "jobs") {
				t.Errorf("GET %s does not show the receiver jobs", path)
			}
		}
	}
}
