package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/diskerhq/disker"
)

// TestGroupsColumnAndBusiestKeys: keyed messages (WithGroup) to a receiver
// nobody serves wait behind the first of their key: the receivers page's
// Groups column counts them and their keys ("-" for a receiver with none),
// and the receiver's page, which its name opens, lists its busiest keys,
// most waiting first (a key that is not text quoted), and links its dead
// letters.
func TestGroupsColumnAndBusiestKeys(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	for key, n := range map[string]int{"a": 4, "b": 2, "\x00bin": 3} {
		for range n {
			if _, err := f.dash.Send(ctx, disker.Message{Receiver: "orders", Content: []byte("x")}, disker.WithGroup(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	col := slices.IndexFunc(receiverColumns, func(c column[Receiver]) bool { return c.Title == "Groups" })
	if col < 0 {
		t.Fatal("no Groups column")
	}
	cells := map[string]string{}
	waitFor(t, "the Groups column of orders and of jobs", func() bool {
		_, _, body := f.get(t, "/api/snapshot")
		var snap apiSnapshot
		if err := json.Unmarshal([]byte(body), &snap); err != nil {
			t.Fatal(err)
		}
		for _, r := range snap.Receivers {
			cells[r.Name] = r.Cells[col]
		}
		return cells["orders"] == "6 (3 keys)" && cells["jobs"] == "-"
	})
	_, _, page := f.get(t, "/")
	if !strings.Contains(page, `>Groups</th>`) || !strings.Contains(page, `href="/receivers/orders"`) {
		t.Errorf("the receivers page has no Groups column, or no link to the receiver's page:\n%s", page)
	}

	code, _, page := f.get(t, "/receivers/orders")
	if code != http.StatusOK {
		t.Fatalf("GET /receivers/orders: %d\n%s", code, page)
	}
	want := []string{`<td class="id">a</td><td class="num">3</td>`, `<td class="id">&#34;\x00bin&#34;</td><td class="num">2</td>`, `<td class="id">b</td><td class="num">1</td>`}
	at := 0
	for _, w := range want {
		i := strings.Index(page[at:], w)
		if i < 0 {
			t.Fatalf("the receiver's page does not list %s after the keys before it:\n%s", w, page)
		}
		at += i
	}
	if !strings.Contains(page, `href="/receivers/orders/dead-letters"`) || !strings.Contains(page, "6 (3 keys)") {
		t.Errorf("the receiver's page has no link to its dead letters, or not its numbers:\n%s", page)
	}
	if _, _, page := f.get(t, "/receivers/jobs"); !strings.Contains(page, `id="groups-empty"`) {
		t.Errorf("the page of jobs, without keyed messages, lists keys:\n%s", page)
	}
	if code, _, _ := f.get(t, "/receivers/_bad"); code != http.StatusBadRequest {
		t.Errorf("GET /receivers/_bad: %d, want 400", code)
	}
}
