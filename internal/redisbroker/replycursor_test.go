package redisbroker

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// TestReadRepliesAfterLostAnswer: a read of a reply stream that Redis
// served but whose answer the connection lost leaves its entries pending
// with the consumer. The next ReadReplies hands them on at once (not a
// lease later), and only them: an entry handed on before and not yet
// acknowledged does not come twice.
func TestReadRepliesAfterLostAnswer(t *testing.T) {
	t.Parallel()
	proxy, reader, writer := cutReader(t)
	raw := rawClient(t, srv)
	ctx := ctxT(t)
	const sender, consumer = "web", "web-1"
	p := &broker.ReadRepliesParams{Sender: sender, Consumer: consumer, Max: 10, Block: 50 * time.Millisecond, Lease: time.Minute}
	reply := func(id string) {
		t.Helper()
		env := &broker.Envelope{ID: "r-" + id, Receiver: sender, InReplyTo: id, Content: []byte("content-of-" + id)}
		if err := writer.Reply(ctx, env, broker.ReplyUntimed); err != nil {
			t.Fatal(err)
		}
	}
	read := func() []string {
		t.Helper()
		rs, err := reader.ReadReplies(ctx, p)
		if err != nil {
			t.Fatalf("ReadReplies: %v", err)
		}
		var ids []string
		for _, r := range rs {
			ids = append(ids, r.RequestID)
		}
		return ids
	}
	for round := range 5 {
		// m1 is handed on and not acknowledged; m2's read loses its answer.
		reply("m1")
		var held []string
		for len(held) == 0 {
			held = read()
		}
		if !slices.Equal(held, []string{"m1"}) {
			t.Fatalf("round %d: read %v, want [m1]", round, held)
		}
		refs := reader.replyCursorRefs(sender)
		m2 := fmt.Sprintf("m2-%d", round)
		proxy.CutAnswerWith("content-of-" + m2)
		reply(m2)
		if _, err := reader.ReadReplies(ctx, p); !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("round %d: ReadReplies with its answer cut = %v, want ErrUnavailable", round, err)
		}
		n, err := do(t, raw, "XLEN", writer.keys.replies(sender)).AsInt64()
		if err != nil || n != 2 {
			t.Fatalf("round %d: the reply stream holds %d entries (%v), want m1 and %s", round, n, err, m2)
		}
		pend, err := do(t, raw, "XPENDING", writer.keys.replies(sender), "g").ToArray()
		if err != nil {
			t.Fatal(err)
		}
		if held, _ := pend[0].AsInt64(); held != 2 {
			t.Fatalf("round %d: %d entries pending, want 2: m1 handed on, m2 delivered by the read whose answer was lost", round, held)
		}
		// At once: well within the minute of the lease.
		got := read()
		if !slices.Equal(got, []string{m2}) {
			t.Fatalf("round %d: read after the lost answer = %v, want [%s] alone", round, got, m2)
		}
		if got := read(); len(got) != 0 {
			t.Fatalf("round %d: read again = %v, want nothing", round, got)
		}
		all := append(refs, reader.replyCursorRefs(sender)...)
		if err := reader.AckReplies(ctx, sender, all...); err != nil {
			t.Fatal(err)
		}
	}
}

// cutReader returns a cut proxy to srv, a broker through it (the reader)
// and one straight to srv with the same key prefix (the writer).
func cutReader(t *testing.T) (*redistest.CutProxy, *Broker, *Broker) {
	t.Helper()
	proxy := redistest.StartCutProxy(t, srv.Addr())
	prefix := redistest.Prefix(t)
	reader, err := New(Config{URL: proxy.URL(), KeyPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close() })
	return proxy, reader, newBrokerOn(t, srv, Config{KeyPrefix: prefix})
}

// replyCursorRefs returns the refs ReadReplies handed on of sender's reply
// stream that are not acknowledged yet.
func (b *Broker) replyCursorRefs(sender string) []string {
	c := b.replyCursor(b.keys.replies(sender))
	c.mu.Lock()
	defer c.mu.Unlock()
	var refs []string
	for id := range c.out {
		refs = append(refs, id)
	}
	return refs
}

// TestReadRepliesAfterLostAnswerThroughHub: as
// TestReadRepliesAfterLostAnswer, with every blocking read through the
// consumer's hub, which a fetch of a queue keeps reading all the while:
// the lost entry comes within a few reads, once.
func TestReadRepliesAfterLostAnswerThroughHub(t *testing.T) {
	t.Parallel()
	proxy, reader, writer := cutReader(t)
	reader.direct = nil // every blocking read through the hub
	ctx := ctxT(t)
	const sender, consumer = "web", "web-1"
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		fp := &broker.FetchParams{Receiver: "busy", Consumer: consumer, Max: 1, Block: 30 * time.Millisecond, Lease: time.Minute}
		for {
			select {
			case <-done:
				return
			default:
			}
			_, _ = reader.Fetch(ctx, fp)
		}
	}()
	defer func() { close(done); <-stopped }()
	p := &broker.ReadRepliesParams{Sender: sender, Consumer: consumer, Max: 10, Block: 50 * time.Millisecond, Lease: time.Minute}
	seen := map[string]int{}
	var refs []string
	read := func() {
		rs, err := reader.ReadReplies(ctx, p)
		if err != nil && !errors.Is(err, broker.ErrUnavailable) {
			t.Fatalf("ReadReplies: %v", err)
		}
		for _, r := range rs {
			seen[r.RequestID]++
			refs = append(refs, r.Ref)
		}
	}
	for round := range 5 {
		id := fmt.Sprintf("m-%d", round)
		proxy.CutAnswerWith("content-of-" + id)
		env := &broker.Envelope{ID: "r-" + id, Receiver: sender, InReplyTo: id, Content: []byte("content-of-" + id)}
		if err := writer.Reply(ctx, env, broker.ReplyUntimed); err != nil {
			t.Fatal(err)
		}
		for i := 0; seen[id] == 0; i++ {
			if i == 200 {
				t.Fatalf("round %d: %s not read again after 200 reads (its lease is a minute)", round, id)
			}
			read()
		}
		read()
		if err := reader.AckReplies(ctx, sender, refs...); err != nil {
			t.Fatal(err)
		}
		refs = nil
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s read %d times, want once", id, n)
		}
	}
}
