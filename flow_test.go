package disker_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// Flow control: WithDedupKey, WithIdempotencyKey, Pause and Resume.

// TestFlowValidation shows that each bad use of the flow-control calls is
// a *ValidationError naming the option or argument.
func TestFlowValidation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, false, "")
	d := e.open()
	ctx := ctxTimeout(t, 10*time.Second)
	msg := disker.Message{Receiver: "r", Content: []byte("x")}
	for _, tc := range []struct {
		field string
		opts  []disker.SendOption
	}{
		{"WithDedupKey", []disker.SendOption{disker.WithDedupKey("", time.Minute)}},
		{"WithDedupKey", []disker.SendOption{disker.WithDedupKey("k", 0)}},
		{"WithDedupKey", []disker.SendOption{disker.WithDedupKey("k", -time.Second)}},
		{"WithDedupKey", []disker.SendOption{disker.WithDedupKey(strings.Repeat("k", disker.MaxKeyLen+1), time.Minute)}},
		{"WithIdempotencyKey", []disker.SendOption{disker.WithIdempotencyKey("")}},
		{"WithIdempotencyTTL", []disker.SendOption{disker.WithIdempotencyKey("k"), disker.WithIdempotencyTTL(0)}},
		{"WithExpiry", []disker.SendOption{disker.WithExpiry(0)}},
		{"WithExpiry", []disker.SendOption{disker.WithExpiry(time.Microsecond)}},
		{"WithExpiry", []disker.SendOption{disker.WithExpiry(time.Second), disker.WithExpireAt(time.Now().Add(time.Hour))}},
		{"WithExpireAt", []disker.SendOption{disker.WithExpireAt(time.Time{})}},
		{"WithExpireAt", []disker.SendOption{disker.WithDelay(time.Hour), disker.WithExpireAt(time.Now().Add(time.Minute))}},
		{"WithExpireAt", []disker.SendOption{disker.WithDeliverAt(time.Now().Add(time.Hour)), disker.WithExpireAt(time.Now().Add(time.Minute))}},
	} {
		_, err := d.Send(ctx, msg, tc.opts...)
		wantValidation(t, err, tc.field)
	}
	for _, tc := range []struct {
		field string
		opts  []disker.SendOption
	}{
		{"WithIdempotencyKey", []disker.SendOption{disker.WithIdempotencyKey("")}},
		{"WithIdempotencyKey", []disker.SendOption{disker.WithIdempotencyKey(strings.Repeat("k", disker.MaxKeyLen+1))}},
		{"WithIdempotencyTTL", []disker.SendOption{disker.WithIdempotencyKey("k"), disker.WithIdempotencyTTL(-time.Second)}},
		{"WithIdempotencyTTL", []disker.SendOption{disker.WithIdempotencyTTL(time.Minute)}},
		{"WithIdempotencyTTL", []disker.SendOption{disker.WithIdempotencyKey("k"), disker.WithIdempotencyTTL(0)}},
		{"WithDedupKey", []disker.SendOption{disker.WithDedupKey("", time.Minute)}},
	} {
		_, err := d.Request(ctx, msg, tc.opts...)
		wantValidation(t, err, tc.field)
	}
	for _, name := range []string{"", "has space", "_reserved", "a{b}"} {
		wantValidation(t, d.Pause(ctx, name), "receiver")
		wantValidation(t, d.Resume(ctx, name), "receiver")
	}
	if st, err := d.Stats(ctx, "r"); err != nil || st.Queued != 0 {
		t.Fatalf("after the bad calls: %+v, %v; want nothing queued", st, err)
	}
}

// TestDedupSend shows WithDedupKey on each backend: a duplicate returns the
// first message's id and a *DuplicateError matching ErrDuplicate, the key
// of one receiver does not hold for another, and it frees after its ttl.
func TestDedupSend(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := ctxTimeout(t, 30*time.Second)
		msg := disker.Message{Receiver: "dd", Content: []byte("once")}
		const ttl = 300 * time.Millisecond
		first, err := d.Send(ctx, msg, disker.WithDedupKey("k", ttl))
		if err != nil {
			t.Fatal(err)
		}
		sentAt := time.Now()
		id, err := d.Send(ctx, msg, disker.WithDedupKey("k", ttl))
		var de *disker.DuplicateError
		if !errors.Is(err, disker.ErrDuplicate) || !errors.As(err, &de) || id != first || de.ID != first || de.Key != "k" || de.Receiver != "dd" {
			t.Fatalf("second send: id %q err %v; want %s and a *DuplicateError", id, err, first)
		}
		other := msg
		other.Receiver = "dd2"
		if _, err := d.Send(ctx, other, disker.WithDedupKey("k", ttl)); err != nil {
			t.Fatalf("same key, another receiver: %v", err)
		}
		if st, err := d.Stats(ctx, "dd"); err != nil || st.Queued != 1 {
			t.Fatalf("stats: %+v, %v; want one queued", st, err)
		}
		waitFor(t, 10*time.Second, "the key's ttl to end", func() bool { return time.Since(sentAt) > ttl+50*time.Millisecond })
		again, err := d.Send(ctx, msg, disker.WithDedupKey("k", ttl))
		if err != nil || again == first {
			t.Fatalf("after the ttl: id %q (first %s), %v; want a new message", again, first, err)
		}
		if st, err := d.Stats(ctx, "dd"); err != nil || st.Queued != 2 {
			t.Fatalf("stats: %+v, %v; want two queued", st, err)
		}
	})
}

// dedupLoad sends n messages to receiver from goroutines, with key
// "k<i mod keys>" and ttl, and returns how many were queued (not
// duplicates) and a digest of the id each key got, which every process
// sending the same keys must share.
func dedupLoad(ctx context.Context, d *disker.Disker, receiver string, n, keys, goroutines int, ttl time.Duration) (queued int64, digest string, err error) {
	var q atomic.Int64
	var mu sync.Mutex
	ids := make(map[string]string, keys)
	var wg sync.WaitGroup
	errc := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < n; i += goroutines {
				key := "k" + strconv.Itoa(i%keys)
				id, err := d.Send(ctx, disker.Message{Receiver: receiver, Content: []byte(key)}, disker.WithDedupKey(key, ttl))
				switch {
				case err == nil:
					q.Add(1)
				case !errors.Is(err, disker.ErrDuplicate):
					errc <- err
					return
				}
				mu.Lock()
				if prev, ok := ids[key]; ok && prev != id {
					mu.Unlock()
					errc <- fmt.Errorf("key %s got ids %s and %s", key, prev, id)
					return
				}
				ids[key] = id
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, "", err
	}
	lines := make([]string, 0, len(ids))
	for k, id := range ids {
		lines = append(lines, k+"="+id)
	}
	sort.Strings(lines)
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return q.Load(), hex.EncodeToString(h[:]), nil
}

// Sizes of the dedup load test: 10,000 sends with 1,000 keys, from 8
// goroutines, half of each in the test process and half in a child.
const (
	dedupSends      = 10000
	dedupKeys       = 1000
	dedupGoroutines = 8
)

// TestDedupConcurrentProcesses sends 10,000 messages with 1,000 dedup keys
// from 8 goroutines in 2 processes (this one and a child, 4 each, each
// process sending every key 5 times): exactly 1,000 are queued, one per
// key, and both processes got the same id for each key.
func TestDedupConcurrentProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test with a child process: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	d := e.open()
	c := startChild(t, e, "dedup-sender", "dedup", "")
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}
	ctx := ctxTimeout(t, 2*time.Minute)
	began := time.Now()
	queued, digest, err := dedupLoad(ctx, d, "dedup", dedupSends/2, dedupKeys, dedupGoroutines/2, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	l := recv(t, c.lines, 2*time.Minute, "the child's sends")
	var childQueued int64
	var childDigest string
	if _, err := fmt.Sscanf(l, "sent %d %s", &childQueued, &childDigest); err != nil {
		t.Fatalf("child said %q: %v", l, err)
	}
	t.Logf("%d sends with %d keys from 2 processes in %v: %d queued here, %d in the child",
		dedupSends, dedupKeys, time.Since(began).Round(time.Millisecond), queued, childQueued)
	if queued+childQueued != dedupKeys {
		t.Fatalf("queued %d + %d, want %d in all", queued, childQueued, dedupKeys)
	}
	if digest != childDigest {
		t.Fatal("the two processes got different ids for some keys")
	}
	st, err := d.Stats(ctx, "dedup")
	if err != nil || st.Queued != dedupKeys {
		t.Fatalf("stats: %+v, %v; want %d queued", st, err, dedupKeys)
	}
}

// runDedupChild is the "dedup-sender" child: it prints "ready", waits a
// moment for the parent to start too, sends its half of the dedup load and
// prints "sent QUEUED DIGEST".
func runDedupChild(d *disker.Disker) {
	fmt.Println("ready")
	queued, digest, err := dedupLoad(context.Background(), d, os.Getenv("DISKER_TEST_RECEIVER"), dedupSends/2, dedupKeys, dedupGoroutines/2, time.Hour)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("sent", queued, digest)
}

// idemHandler replies to each message with its key and a random nonce, so
// that two runs for one key give different replies, and counts the runs by
// key.
type idemHandler struct {
	mu   sync.Mutex
	runs map[string]int
}

func (h *idemHandler) Handle(_ context.Context, m *disker.Message) ([]byte, error) {
	h.mu.Lock()
	h.runs[string(m.Content)]++
	h.mu.Unlock()
	m.SetReplyHeader("h", "v")
	return []byte(string(m.Content) + ":" + rand.Text()), nil
}

// idemLoad makes, for each of keys, `per` concurrent Requests with
// WithIdempotencyKey (at most 64 at once), and returns the reply each key
// got: it fails if two Requests of one key got different replies.
func idemLoad(ctx context.Context, d *disker.Disker, receiver string, keys, per int) (map[string]string, error) {
	var mu sync.Mutex
	got := make(map[string]string, keys)
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	errc := make(chan error, keys*per)
	for k := range keys {
		key := "key-" + strconv.Itoa(k)
		for range per {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				rctx, cancel := context.WithTimeout(ctx, time.Minute)
				defer cancel()
				rep, err := d.Request(rctx, disker.Message{Receiver: receiver, Content: []byte(key)}, disker.WithIdempotencyKey(key))
				if err != nil {
					errc <- fmt.Errorf("key %s: %w", key, err)
					return
				}
				if rep.Headers["h"] != "v" {
					errc <- fmt.Errorf("key %s: reply headers %v", key, rep.Headers)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if prev, ok := got[key]; ok && prev != string(rep.Content) {
					errc <- fmt.Errorf("key %s: replies %q and %q", key, prev, rep.Content)
					return
				}
				got[key] = string(rep.Content)
			})
		}
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return nil, err
	}
	return got, nil
}

// TestIdempotentRequests makes 5 concurrent Requests for each of 1,000
// keys (200 on the Cluster, and with -short) on each backend, from each of
// two instances (two clients in this process): the
// handler runs once per key, and every caller of a key gets the same reply
// bytes; a later Request with the key gets it at once.
func TestIdempotentRequests(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		keys := 1000
		if strings.HasSuffix(t.Name(), "/cluster") || testing.Short() {
			keys = 200
		}
		h := &idemHandler{runs: map[string]int{}}
		w1, w2 := e.open(), e.open()
		for _, w := range []*disker.Disker{w1, w2} {
			if err := w.Handle("idem", h); err != nil {
				t.Fatal(err)
			}
		}
		r1, r2 := e.open(), e.open()
		ctx := ctxTimeout(t, 3*time.Minute)
		began := time.Now()
		var got [2]map[string]string
		var errs [2]error
		var wg sync.WaitGroup
		for i, r := range []*disker.Disker{r1, r2} {
			wg.Go(func() { got[i], errs[i] = idemLoad(ctx, r, "idem", keys, 5) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%d keys x 5 Requests x 2 instances in %v", keys, time.Since(began).Round(time.Millisecond))
		for k, v := range got[0] {
			if got[1][k] != v {
				t.Fatalf("key %s: the instances got %q and %q", k, v, got[1][k])
			}
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		if len(h.runs) != keys {
			t.Fatalf("the handler ran for %d keys, want %d", len(h.runs), keys)
		}
		for k, n := range h.runs {
			if n != 1 {
				t.Fatalf("the handler ran %d times for %s, want once", n, k)
			}
		}
		rep, err := r1.Request(ctx, disker.Message{Receiver: "idem", Content: []byte("key-0")}, disker.WithIdempotencyKey("key-0"))
		if err != nil || string(rep.Content) != got[0]["key-0"] {
			t.Fatalf("a later Request: %v, %v; want %q", rep, err, got[0]["key-0"])
		}
	})
}

// idemDigest is a digest of the reply each key got, which every process
// requesting the same keys must share.
func idemDigest(got map[string]string) string {
	lines := make([]string, 0, len(got))
	for k, v := range got {
		lines = append(lines, k+"="+v)
	}
	sort.Strings(lines)
	h := sha256.Sum256([]byte(strings.Join(lines, "\n")))
	return hex.EncodeToString(h[:])
}

// idemKeys is how many keys TestIdempotentRequestsTwoProcesses requests.
const idemKeys = 1000

// TestIdempotentRequestsTwoProcesses requests each of 1,000 keys 5 times
// concurrently from each of 2 processes (this one and a child): the
// handler, served by two instances here, runs once per key, and both
// processes got the same reply bytes for every key.
func TestIdempotentRequestsTwoProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test with a child process: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	h := &idemHandler{runs: map[string]int{}}
	for range 2 {
		if err := e.open().Handle("idem2", h); err != nil {
			t.Fatal(err)
		}
	}
	c := startChild(t, e, "idem-requester", "idem2", "")
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}
	ctx := ctxTimeout(t, 3*time.Minute)
	got, err := idemLoad(ctx, e.open(), "idem2", idemKeys, 5)
	if err != nil {
		t.Fatal(err)
	}
	l := recv(t, c.lines, 3*time.Minute, "the child's requests")
	if l != "replies "+idemDigest(got) {
		t.Fatalf("child said %q; want the digest of this process's replies %s", l, idemDigest(got))
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.runs) != idemKeys {
		t.Fatalf("the handler ran for %d keys, want %d", len(h.runs), idemKeys)
	}
	for k, n := range h.runs {
		if n != 1 {
			t.Fatalf("the handler ran %d times for %s, want once", n, k)
		}
	}
}

// runIdemChild is the "idem-requester" child: it prints "ready", makes its
// half of TestIdempotentRequestsTwoProcesses's Requests and prints
// "replies DIGEST".
func runIdemChild(d *disker.Disker) {
	fmt.Println("ready")
	got, err := idemLoad(context.Background(), d, os.Getenv("DISKER_TEST_RECEIVER"), idemKeys, 5)
	if err != nil {
		fmt.Println("error", err)
		return
	}
	fmt.Println("replies", idemDigest(got))
}

// TestIdempotentRunAfterWindow runs a key's message past the key's window:
// a Request after the window takes the key for a new message, and the old
// run, replying while the new message is handled, is refused as late; the
// new message's callers get the new message's reply, never the old run's.
func TestIdempotentRunAfterWindow(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		const ttl = 300 * time.Millisecond
		ctx := ctxTimeout(t, time.Minute)
		started := make(chan time.Time, 1) // the old run's deadline
		release, oldDone := make(chan struct{}), make(chan struct{})
		oldKind := make(chan disker.EventKind, 1)
		var oldID atomic.Value
		oldID.Store("")
		var once sync.Once
		w := e.open(func(c *disker.Config) {
			c.OnEvent = func(ev disker.Event) {
				if ev.MessageID == oldID.Load() && (ev.Kind == disker.EventReplied || ev.Kind == disker.EventLate) {
					once.Do(func() {
						oldKind <- ev.Kind
						close(oldDone)
					})
				}
			}
		})
		err := w.Handle("idem-late", disker.HandlerFunc(func(_ context.Context, msg *disker.Message) ([]byte, error) {
			wait, reply := oldDone, "new reply" // the new message replies after the old run
			if string(msg.Content) == "old" {
				oldID.Store(msg.ID)
				started <- msg.Deadline
				wait, reply = release, "old reply" // outlives the key's window
			}
			select {
			case <-wait:
			case <-ctx.Done():
			}
			return []byte(reply), nil
		}), disker.WithConcurrency(2))
		if err != nil {
			t.Fatal(err)
		}
		r := e.open()
		request := func(content string, timeout time.Duration, sent chan<- string) string {
			rep, err := r.Request(ctx, disker.Message{Receiver: "idem-late", Content: []byte(content)},
				disker.WithIdempotencyKey("k"), disker.WithIdempotencyTTL(ttl), disker.WithTimeout(timeout),
				disker.WithOnSent(func(id string) { sent <- id }))
			if err != nil {
				return err.Error()
			}
			return string(rep.Content)
		}
		oldSent, oldRep := make(chan string, 1), make(chan string, 1)
		go func() { oldRep <- request("old", 3*time.Second, oldSent) }()
		deadline := recv(t, started, 30*time.Second, "the old run to start")
		old := recv(t, oldSent, 30*time.Second, "the old message to be sent")
		time.Sleep(time.Until(deadline.Add(200 * time.Millisecond))) // the key's window ends
		const callers = 3
		sent, replies := make(chan string, callers), make(chan string, callers)
		for range callers {
			go func() { replies <- request("new", 30*time.Second, sent) }()
		}
		var newID string
		for i := range callers {
			id := recv(t, sent, 30*time.Second, "a new caller's send")
			if id == old || (i > 0 && id != newID) {
				t.Fatalf("a caller after the window sent %s; want one new message (the old was %s, the first new %s)", id, old, newID)
			}
			newID = id
		}
		close(release) // the old run replies now, while the new message waits
		if kind := recv(t, oldKind, 30*time.Second, "the old run's reply"); kind != disker.EventLate {
			t.Errorf("the old run's reply was %v, want late (the key is the new message's)", kind)
		}
		for range callers {
			if rep := recv(t, replies, 30*time.Second, "a new caller's reply"); rep != "new reply" {
				t.Errorf("a caller of the new message got %q, want %q", rep, "new reply")
			}
		}
		if rep := recv(t, oldRep, 30*time.Second, "the old caller's outcome"); rep == "new reply" {
			t.Errorf("the old caller got the new message's reply")
		}
	})
}

// TestIdempotentRequestWorkerKilled kills a worker process with SIGKILL
// while its handler runs the message of idempotent Requests: the message
// is redelivered, the handler runs again here, and every caller of the
// key, those that waited from before the kill and one that came after,
// gets one same reply.
func TestIdempotentRequestWorkerKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	e := newEnv(t, true, redisURL(t))
	c := startChild(t, e, "worker", "idem-killed", "")
	if l := recv(t, c.lines, 30*time.Second, "the child to be ready"); l != "ready" {
		t.Fatalf("child said %q, want ready", l)
	}
	r1, r2 := e.open(), e.open()
	ctx := ctxTimeout(t, 2*time.Minute)
	const callers = 5
	replies := make(chan string, 2*callers+1)
	errc := make(chan error, 2*callers+1)
	request := func(r *disker.Disker) {
		rep, err := r.Request(ctx, disker.Message{Receiver: "idem-killed", Content: []byte("k")}, disker.WithIdempotencyKey("k"))
		if err != nil {
			errc <- err
			return
		}
		replies <- string(rep.Content)
	}
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() { request(r1) })
		wg.Go(func() { request(r2) })
	}
	l := recv(t, c.lines, 30*time.Second, "the child to start the handler")
	if !strings.HasPrefix(l, "started ") || !strings.HasSuffix(l, " 1") {
		t.Fatalf("child said %q, want the first attempt started", l)
	}
	c.kill(t)
	wg.Go(func() { request(r1) }) // comes while the message waits for redelivery
	h := &idemHandler{runs: map[string]int{}}
	w := e.open()
	if err := w.Handle("idem-killed", h, disker.WithLease(childLease)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(replies)
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	var first string
	n := 0
	for rep := range replies {
		if n++; first == "" {
			first = rep
		}
		if rep != first {
			t.Fatalf("callers got %q and %q", first, rep)
		}
	}
	if n != 2*callers+1 || !strings.HasPrefix(first, "k:") {
		t.Fatalf("%d replies, first %q; want %d", n, first, 2*callers+1)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.runs["k"] != 1 {
		t.Fatalf("after the kill, the handler ran %d times here, want once", h.runs["k"])
	}
}

// TestPauseResume serves a receiver on 3 instances while messages are
// sent, pauses it from one of them: within a second no instance starts a
// message, while sends still queue and Stats reports it paused; after
// Resume (from another instance) handlers start again within a second,
// and every message is handled exactly once.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, e *env) {
		ctx := ctxTimeout(t, 2*time.Minute)
		var mu sync.Mutex
		starts := map[string]int{}
		var last atomic.Int64 // unix ns of the latest handler start
		h := disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			last.Store(time.Now().UnixNano())
			mu.Lock()
			starts[m.ID]++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // a little work, so that some are in flight
			return nil, nil
		})
		var ds [3]*disker.Disker
		for i := range ds {
			ds[i] = e.open()
			if err := ds[i].Handle("paused", h, disker.WithConcurrency(4)); err != nil {
				t.Fatal(err)
			}
		}
		sender := e.open()
		var sent atomic.Int64
		stopSending := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				select {
				case <-stopSending:
					return
				default:
				}
				if _, err := sender.Send(ctx, disker.Message{Receiver: "paused", Content: []byte("x")}); err != nil {
					t.Error(err)
					return
				}
				sent.Add(1)
				time.Sleep(time.Millisecond) // a steady stream, not a flood
			}
		})
		defer func() { close(stopSending); wg.Wait() }()
		waitFor(t, 30*time.Second, "handlers to run", func() bool { mu.Lock(); defer mu.Unlock(); return len(starts) > 50 })

		if err := ds[0].Pause(ctx, "paused"); err != nil {
			t.Fatal(err)
		}
		paused := time.Now()
		// Wait until no handler has started for 2 poll intervals plus a
		// margin, and at most 1s after Pause returned.
		waitFor(t, 30*time.Second, "the pause to take hold", func() bool {
			return time.Since(time.Unix(0, last.Load())) > time.Second
		})
		took := time.Unix(0, last.Load()).Sub(paused)
		t.Logf("the last handler started %v after Pause returned", took.Round(time.Millisecond))
		if took > time.Second {
			t.Fatalf("a handler started %v after Pause returned, want within 1s", took)
		}
		before := sent.Load()
		waitFor(t, 30*time.Second, "sends during the pause", func() bool { return sent.Load() > before+20 })
		st, err := ds[1].Stats(ctx, "paused")
		if err != nil || !st.Paused || st.Queued < 20 {
			t.Fatalf("stats while paused: %+v, %v; want Paused and messages queued", st, err)
		}
		if d := time.Since(time.Unix(0, last.Load())); d < time.Second {
			t.Fatalf("a handler started %v ago, during the pause", d)
		}

		if err := ds[2].Resume(ctx, "paused"); err != nil {
			t.Fatal(err)
		}
		resumed := time.Now()
		waitFor(t, 30*time.Second, "a handler to start after Resume", func() bool { return last.Load() > resumed.UnixNano() })
		t.Logf("the first handler started %v after Resume returned", time.Unix(0, last.Load()).Sub(resumed).Round(time.Millisecond))
		if d := time.Unix(0, last.Load()).Sub(resumed); d > time.Second {
			t.Fatalf("the first handler started %v after Resume returned, want within 1s", d)
		}
		close(stopSending)
		wg.Wait()
		stopSending = make(chan struct{})
		total := sent.Load()
		waitFor(t, time.Minute, "every message to be handled", func() bool { mu.Lock(); defer mu.Unlock(); return int64(len(starts)) == total })
		mu.Lock()
		defer mu.Unlock()
		for id, n := range starts {
			if n != 1 {
				t.Fatalf("message %s started %d times, want once", id, n)
			}
		}
		if st, err := ds[0].Stats(ctx, "paused"); err != nil || st.Paused {
			t.Fatalf("stats after Resume: %+v, %v", st, err)
		}
	})
}
