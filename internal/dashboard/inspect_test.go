package dashboard

import (
	"context"
	"encoding/json"
	"net/url"
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
	if _, err := f.dash.Send(ctx, disker.Message{Receiver: "unserved", Content: []byte("x")}); err != nil {
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

// TestMessagePage finds messages by id through the message page: queued,
// dead-lettered (its reason shown as text), gone; and refuses an empty
// receiver.
func TestMessagePage(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	queued, err := f.dash.Send(ctx, disker.Message{Receiver: "unserved", Content: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	find := func(receiver, id string) (int, string) {
		t.Helper()
		code, _, body := f.get(t, "/message?"+url.Values{"receiver": {receiver}, "id": {id}}.Encode())
		return code, body
	}
	if code, body := find("unserved", queued); code != 200 || !strings.Contains(body, `data-state="queued"`) {
		t.Errorf("a queued message: %d\n%s", code, body)
	}
	f.deadLetter(t, "<script>alert(1)</script>")
	dls, err := f.dash.DeadLetters(ctx, "jobs", 10)
	if err != nil || len(dls) != 1 {
		t.Fatalf("DeadLetters: %v, %v", dls, err)
	}
	code, body := find("jobs", dls[0].Message.ID)
	if code != 200 || !strings.Contains(body, `data-state="dead_lettered"`) || !strings.Contains(body, dls[0].ID) ||
		!strings.Contains(body, "refused: &lt;script&gt;alert(1)&lt;/script&gt;") || strings.Contains(body, "<script>alert") {
		t.Errorf("a dead letter: %d\n%s", code, body)
	}
	done, err := f.dash.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte("ok")})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the handled message gone", func() bool {
		code, body := find("jobs", done)
		return code == 200 && strings.Contains(body, `data-state="gone"`)
	})
	if code, _, body := f.get(t, "/message"); code != 200 || strings.Contains(body, `id="fate"`) || !strings.Contains(body, `name="id"`) {
		t.Errorf("the empty form: %d\n%s", code, body)
	}
	if code, _ := find("", queued); code != 400 {
		t.Errorf("an empty receiver: %d, want 400", code)
	}
}

// TestRetainedResults: a message sent with a retention shows its result on
// the message page (its state, attempts and reply, escaped), and its
// receiver's page lists it among the completed ones, linked to it.
func TestRetainedResults(t *testing.T) {
	t.Parallel()
	f := newFixture(t, Config{})
	ctx := context.Background()
	id, err := f.dash.Send(ctx, disker.Message{Receiver: "jobs", Content: []byte("<b>ok</b>")}, disker.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.dash.WaitResult(ctx, "jobs", id); err != nil {
		t.Fatal(err)
	}
	code, _, body := f.get(t, "/message?"+url.Values{"receiver": {"jobs"}, "id": {id}}.Encode())
	if code != 200 || !strings.Contains(body, `<section id="result" data-state="succeeded">`) ||
		!strings.Contains(body, `<dd id="result-attempts">1</dd>`) || !strings.Contains(body, `&#34;&lt;b&gt;ok&lt;/b&gt;&#34;`) {
		t.Errorf("the message page of a retained result: %d\n%s", code, body)
	}
	code, _, body = f.get(t, "/receivers/jobs")
	if code != 200 || !strings.Contains(body, `id="completed"`) || !strings.Contains(body, "id="+id) {
		t.Errorf("the receiver page's completed messages: %d\n%s", code, body)
	}
	code, _, body = f.get(t, "/receivers/unserved")
	if code != 200 || !strings.Contains(body, `id="completed-empty"`) {
		t.Errorf("a receiver without retained results: %d\n%s", code, body)
	}
}
