package disker_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
)

// chainOf returns the options of a chain of steps from..to to receiver r
// (content the step's number), the first step's message first.
func chainOf(r string, from, to int) (disker.Message, []disker.SendOption) {
	var opts []disker.SendOption
	for k := to; k > from; k-- {
		opts = []disker.SendOption{disker.WithThen(disker.Message{Receiver: r, Content: []byte(strconv.Itoa(k))}, opts...)}
	}
	return disker.Message{Receiver: r, Content: []byte(strconv.Itoa(from))}, opts
}

// TestChains: a chain of 10 runs each step once, in order, each after the
// one before succeeded; a step that fails stops the chain; bad chains are
// refused, nothing sent.
func TestChains(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := t.Context()
		var mu sync.Mutex
		var ran []string
		last := make(chan struct{})
		err := d.Handle("chain-step", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			mu.Lock()
			ran = append(ran, string(m.Content))
			mu.Unlock()
			switch string(m.Content) {
			case "10":
				close(last)
			case "33":
				return nil, disker.NoRetry(errors.New("step 33 fails"))
			}
			return nil, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		first, opts := chainOf("chain-step", 1, 10)
		if _, err := d.Send(ctx, first, opts...); err != nil {
			t.Fatal(err)
		}
		<-last
		mu.Lock()
		if got := fmt.Sprint(ran); got != "[1 2 3 4 5 6 7 8 9 10]" {
			t.Fatalf("steps ran %s, want 1 to 10 in order, once each", got)
		}
		ran = nil
		mu.Unlock()

		// Step 33 fails: 34 and 35 never run. The chain is the child of a
		// batch, which completes when the chain settled: its last step
		// cancelled, never sent.
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "chain-watch"}})
		if err != nil {
			t.Fatal(err)
		}
		first, opts = chainOf("chain-step", 31, 35)
		if _, err := b.Send(ctx, first, opts...); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		info := waitBatch(t, d, b.ID())
		if info.Cancels != 1 || info.Children != 1 {
			t.Fatalf("the batch of a chain that stopped: %+v, want its one child cancelled", info)
		}
		mu.Lock()
		defer mu.Unlock()
		if got := fmt.Sprint(ran); got != "[31 32 33]" {
			t.Fatalf("steps ran %s, want 31 to 33: the chain stops after step 33 failed", got)
		}

		bad := []disker.SendOption{
			disker.WithThen(disker.Message{Receiver: "chain-step", Sender: "me"}),
			disker.WithThen(disker.Message{Receiver: "chain-step"}, disker.WithDelay(time.Second)),
			disker.WithThen(disker.Message{Receiver: ""}),
		}
		for _, o := range bad {
			var ve *disker.ValidationError
			if _, err := d.Send(ctx, disker.Message{Receiver: "chain-bad"}, o); !errors.As(err, &ve) {
				t.Fatalf("a bad chain: %v, want a *ValidationError", err)
			}
		}
		if st, err := d.Stats(ctx, "chain-bad"); err != nil || st.Length != 0 {
			t.Fatalf("after bad chains: %+v, %v", st, err)
		}
	})
}

// waitBatch waits until batch id completed, and returns it.
func waitBatch(t *testing.T, d *disker.Disker, id string) *disker.BatchInfo {
	t.Helper()
	var info *disker.BatchInfo
	waitFor(t, 30*time.Second, "batch "+id+" completes", func() bool {
		var err error
		if info, err = d.Batch(t.Context(), id); err != nil {
			t.Fatal(err)
		}
		return info.State == disker.BatchCompleted
	})
	return info
}

// stepSeen is what a step's handler saw.
type stepSeen struct {
	content string
	headers map[string]string
}

// TestChainReplies: a step given no content takes the reply of the step
// before, its content and its headers under the step's own; a step that
// succeeded without a reply passes no content; a step given content keeps
// it; a reply over the cap on retained bytes stops the chain, its step
// failed with CodeReplyTooLarge.
func TestChainReplies(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open(func(c *disker.Config) { c.MaxResultBytes = 4 << 10 })
		ctx := t.Context()
		seen := make(chan stepSeen, 10)
		err := d.Handle("chain-reply", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			h := map[string]string{}
			for k, v := range m.Headers {
				if k != disker.HeaderBatch && k != disker.HeaderBatchOutcome {
					h[k] = v
				}
			}
			seen <- stepSeen{content: string(m.Content), headers: h}
			switch c := string(m.Content); c {
			case "quiet":
				return nil, nil
			case "huge":
				return bytes.Repeat([]byte("x"), 8<<10), nil
			default:
				m.SetReplyHeader("from", c)
				m.SetReplyHeader("own", "the reply's")
				return []byte(c + "."), nil
			}
		}))
		if err != nil {
			t.Fatal(err)
		}
		next := func(content string, headers map[string]string, opts ...disker.SendOption) disker.SendOption {
			var c []byte
			if content != "" {
				c = []byte(content)
			}
			return disker.WithThen(disker.Message{Receiver: "chain-reply", Content: c, Headers: headers}, opts...)
		}
		_, err = d.Send(ctx, disker.Message{Receiver: "chain-reply", Content: []byte("a")},
			next("", map[string]string{"own": "the step's"},
				next("", nil,
					next("given", nil,
						next("quiet", nil,
							next("", nil))))))
		if err != nil {
			t.Fatal(err)
		}
		want := []stepSeen{
			{"a", map[string]string{}},
			{"a.", map[string]string{"from": "a", "own": "the step's"}},
			{"a..", map[string]string{"from": "a.", "own": "the reply's"}},
			{"given", map[string]string{}},
			{"quiet", map[string]string{}},
			{"", map[string]string{}},
		}
		for i, w := range want {
			got := <-seen
			if got.content != w.content || fmt.Sprint(got.headers) != fmt.Sprint(w.headers) {
				t.Fatalf("step %d saw %+v, want %+v", i+1, got, w)
			}
		}

		// A reply over the cap: the step fails, the chain stops.
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "chain-reply-watch"}})
		if err != nil {
			t.Fatal(err)
		}
		id, err := b.Send(ctx, disker.Message{Receiver: "chain-reply", Content: []byte("huge")}, next("", nil))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		if info := waitBatch(t, d, b.ID()); info.Cancels != 1 {
			t.Fatalf("the batch of a chain whose reply is too large: %+v", info)
		}
		if got := <-seen; got.content != "huge" {
			t.Fatalf("saw %+v", got)
		}
		r, err := d.Result(ctx, "chain-reply", id)
		if err != nil || r.State != disker.ResultFailed || r.Err == nil || r.Err.Code != disker.CodeReplyTooLarge || r.Reply != nil {
			t.Fatalf("the result of a step whose reply is too large: %+v, %v", r, err)
		}
		select {
		case got := <-seen:
			t.Fatalf("a step ran after a reply too large: %+v", got)
		default:
		}
	})
}

// TestBatchNesting: a batch of chains counts each chain once, by its last
// step (cancelled when it stopped before); a batch's completion starts a
// chain that takes its reply; a batch nested in another counts there by
// its completion.
func TestBatchNesting(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := t.Context()
		got := make(chan string, 20)
		for _, r := range []string{"nest-work", "nest-done", "nest-album", "nest-publish", "nest-inner", "nest-top"} {
			err := d.Handle(r, disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
				c := string(m.Content)
				got <- m.Receiver + ":" + c
				if c == "fail" {
					return nil, disker.NoRetry(errors.New("it fails"))
				}
				return []byte(m.Receiver), nil
			}))
			if err != nil {
				t.Fatal(err)
			}
		}
		drain := func(n int) []string {
			out := make([]string, n)
			for i := range out {
				out[i] = <-got
			}
			slices.Sort(out)
			return out
		}

		// A batch of three chains; one stops at its first step.
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-done", Content: []byte("chains")}})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"one", "two", "fail"} {
			if _, err := b.Send(ctx, disker.Message{Receiver: "nest-work", Content: []byte(c)},
				disker.WithThen(disker.Message{Receiver: "nest-work"})); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		want := []string{"nest-done:chains", "nest-work:fail", "nest-work:nest-work", "nest-work:nest-work", "nest-work:one", "nest-work:two"}
		if ran := drain(6); !slices.Equal(ran, want) {
			t.Fatalf("the batch of chains ran %v, want %v", ran, want)
		}
		if info := waitBatch(t, d, b.ID()); info.Succeeded != 2 || info.Cancels != 1 || !info.CompletionSent {
			t.Fatalf("the batch of chains: %+v", info)
		}

		// A batch whose completion starts a chain, which takes its reply;
		// and that batch nested in another: the top batch completes after
		// the inner batch's completion.
		top, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-top", Content: []byte("top")}})
		if err != nil {
			t.Fatal(err)
		}
		album, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-album", Content: []byte("album")},
			CompletionOptions: []disker.SendOption{disker.WithThen(disker.Message{Receiver: "nest-publish"}), disker.WithBatch(top.ID())}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := top.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		for _, c := range []string{"img1", "img2"} {
			if _, err := album.Send(ctx, disker.Message{Receiver: "nest-work", Content: []byte(c)}); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := album.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		want = []string{"nest-album:album", "nest-publish:nest-album", "nest-top:top", "nest-work:img1", "nest-work:img2"}
		if ran := drain(5); !slices.Equal(ran, want) {
			t.Fatalf("the nested batches ran %v, want %v", ran, want)
		}
		if info := waitBatch(t, d, top.ID()); info.Succeeded != 1 || info.Children != 1 {
			t.Fatalf("the top batch: %+v", info)
		}

		// A nested batch whose children failed: its completion is never
		// sent, and counts as cancelled in the top batch.
		top, err = d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-top", Content: []byte("top2")}})
		if err != nil {
			t.Fatal(err)
		}
		inner, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-inner", Content: []byte("inner")},
			OnlyIfAllSucceed: true, CompletionOptions: []disker.SendOption{disker.WithBatch(top.ID())}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := top.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := inner.Send(ctx, disker.Message{Receiver: "nest-work", Content: []byte("fail")}); err != nil {
			t.Fatal(err)
		}
		if _, err := inner.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		want = []string{"nest-top:top2", "nest-work:fail"}
		if ran := drain(2); !slices.Equal(ran, want) {
			t.Fatalf("the failed nested batch ran %v, want %v", ran, want)
		}
		if info := waitBatch(t, d, top.ID()); info.Cancels != 1 || !info.CompletionSent {
			t.Fatalf("the top batch over a failed one: %+v", info)
		}
		if info, err := d.Batch(ctx, inner.ID()); err != nil || info.CompletionSent {
			t.Fatalf("the failed nested batch: %+v, %v", info, err)
		}

		// A chain sent twice with one dedup key: the second is a duplicate,
		// its chain never starts, and the batch counts the first only.
		b, err = d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "nest-done", Content: []byte("dedup")}})
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			_, err := b.Send(ctx, disker.Message{Receiver: "nest-work", Content: []byte("once")},
				disker.WithThen(disker.Message{Receiver: "nest-work"}), disker.WithDedupKey("once", time.Minute))
			var de *disker.DuplicateError
			if err != nil && !errors.As(err, &de) {
				t.Fatal(err)
			}
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		want = []string{"nest-done:dedup", "nest-work:nest-work", "nest-work:once"}
		if ran := drain(3); !slices.Equal(ran, want) {
			t.Fatalf("the deduplicated chain ran %v, want %v", ran, want)
		}
		if info := waitBatch(t, d, b.ID()); info.Children != 1 || info.Succeeded != 1 {
			t.Fatalf("the batch of a deduplicated chain: %+v", info)
		}
		select {
		case s := <-got:
			t.Fatalf("%s ran after the batch completed", s)
		default:
		}
	})
}

// TestKeyedBatchAndChain: a batch whose children are keyed (WithGroup,
// two keys, WithGroupConcurrency(1)) runs each key's children one at a
// time, in order (a child dead-lettered, NoRetry, lets its key go on),
// and completes exactly once with the right counts; a
// chain whose first step is keyed goes on to its next step with the
// step's reply.
func TestKeyedBatchAndChain(t *testing.T) {
	eachBackend(t, func(t *testing.T, e *env) {
		d := e.open()
		ctx := t.Context()
		var mu sync.Mutex
		out := map[string]int{}        // key -> children of it being handled
		order := map[string][]string{} // key -> contents, as handled
		overlap := ""                  // a child handled while another of its key was
		err := d.Handle("keyed-work", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			c := string(m.Content)
			key := c[:1]
			mu.Lock()
			if out[key]++; out[key] > 1 {
				overlap = c
			}
			order[key] = append(order[key], c)
			mu.Unlock()
			defer func() {
				mu.Lock()
				out[key]--
				mu.Unlock()
			}()
			if c == "b3" {
				return nil, disker.NoRetry(errors.New("b3 fails"))
			}
			return []byte("reply of " + c), nil
		}), disker.WithConcurrency(4), disker.WithGroupConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		completions := make(chan string, 10)
		err = d.Handle("keyed-done", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			completions <- string(m.Content)
			return nil, nil
		}), disker.WithConcurrency(1))
		if err != nil {
			t.Fatal(err)
		}
		b, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "keyed-done", Content: []byte("done")}})
		if err != nil {
			t.Fatal(err)
		}
		for i := range 5 {
			for _, key := range []string{"a", "b"} {
				if _, err := b.Send(ctx, disker.Message{Receiver: "keyed-work", Content: []byte(key + strconv.Itoa(i))}, disker.WithGroup(key)); err != nil {
					t.Fatal(err)
				}
			}
		}
		if _, err := b.Seal(ctx); err != nil {
			t.Fatal(err)
		}
		info := waitBatch(t, d, b.ID())
		if info.Children != 10 || info.Succeeded != 9 || info.DeadLettered != 1 || info.Settled != 10 || !info.CompletionSent {
			t.Fatalf("the keyed batch: %+v, want 10 children, 9 succeeded and 1 dead-lettered", info)
		}
		if got := <-completions; got != "done" {
			t.Fatalf("completion %q", got)
		}
		// A second completion would be queued before this message, which
		// the one worker of keyed-done handles after it.
		if _, err := d.Send(ctx, disker.Message{Receiver: "keyed-done", Content: []byte("after")}); err != nil {
			t.Fatal(err)
		}
		if got := <-completions; got != "after" {
			t.Fatalf("after the completion, keyed-done got %q, want the message sent after it", got)
		}
		mu.Lock()
		if overlap != "" || fmt.Sprint(order["a"]) != "[a0 a1 a2 a3 a4]" || fmt.Sprint(order["b"]) != "[b0 b1 b2 b3 b4]" {
			t.Fatalf("keys ran %v (overlap %q), want each key's children once, in order, one at a time", order, overlap)
		}
		mu.Unlock()

		// A chain whose first step is keyed: its next step takes its reply.
		next := make(chan string, 1)
		err = d.Handle("keyed-next", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			next <- string(m.Content)
			return nil, nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: "keyed-work", Content: []byte("c0")}, disker.WithGroup("c"),
			disker.WithThen(disker.Message{Receiver: "keyed-next"})); err != nil {
			t.Fatal(err)
		}
		if got := <-next; got != "reply of c0" {
			t.Fatalf("the step after a keyed step got %q, want its reply", got)
		}
	})
}
