package dashboard

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// TestOldestWaitingColumn shows the receivers page's last column: the age
// of the oldest message waiting in a receiver nobody serves, and "-" for
// one whose queue is empty.
func TestOldestWaitingColumn(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	if _, err := f.dash.Send(ctx, disker.Message{Receiver: "unserved", Content: []byte("x"), FireAndForget: true}); err != nil {
		t.Fatal(err)
	}
	col := slices.IndexFunc(receiverColumns, func(c column[Receiver]) bool { return c.Title == "Oldest waiting" })
	if col < 0 {
		t.Fatal("no Oldest waiting column")
	}
	sent := time.Now()
	var snap apiSnapshot
	cell := func(name string) string {
		for _, r := range snap.Receivers {
			if r.Name == name {
				return r.Cells[col]
			}
		}
		return ""
	}
	waitFor(t, "a second's wait in the unserved receiver's oldest waiting age", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatal(err)
		}
		age, err := time.ParseDuration(cell("unserved"))
		return err == nil && age >= time.Second && age <= time.Since(sent)+time.Second
	})
	if got := cell("jobs"); got != "-" {
		t.Errorf("jobs, with nothing queued: oldest waiting %q, want -", got)
	}
	_, _, page := f.get(t, "/")
	if !strings.Contains(page, "<th class=\"num\" title=\"time since the oldest message not yet delivered was queued\">Oldest waiting</th>") {
		t.Errorf("the receivers page has no Oldest waiting column:\n%s", page)
	}
}
