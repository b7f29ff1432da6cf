package disker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/redistest"
)

// batchesLongEnv, when set, runs TestBatchesUnderKills at the full size
// of its contract: 1,000 batches of 20 children.
const batchesLongEnv = "DISKER_BATCHES_LONG"

// runBatchChildren is the child "batch-children": it serves the receivers
// of DISKER_TEST_RECEIVER (a comma-separated list), acknowledging each
// child after a moment, or failing it for good when its content starts
// with "fail", until it is killed.
func runBatchChildren(d *disker.Disker) int {
	for _, r := range strings.Split(os.Getenv("DISKER_TEST_RECEIVER"), ",") {
		err := d.Handle(r, disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			if strings.HasPrefix(string(m.Content), "fail") {
				return nil, disker.NoRetry(errors.New("planned failure"))
			}
			return nil, nil
		}), disker.WithLease(childLease), disker.WithConcurrency(8), disker.WithMaxAttempts(1000))
		if err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 2
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 3
}

// completionSeen is what the completion handler saw of one batch.
type completionSeen struct {
	ids  map[string]bool // the completion's message ids
	info *disker.BatchInfo
	// states counts the children's retained results when the completion
	// ran; early names a child that had no final result then.
	states map[disker.ResultState]int
	early  string
}

// TestBatchesUnderKills sends batches of 20 children on 3 receivers, served
// by 3 worker processes that are killed (SIGKILL) and restarted at random,
// while Redis (AOF, fsync always) is killed once and restarted: every
// batch's completion runs exactly once (one message id; a redelivery of it
// is the same id), never before its last child settled (each child's
// retained result is final when the completion runs), with counts equal to
// the children's outcomes. Half of each batch's children are keyed
// (WithGroup). Chains of 10 steps across the same workers, half of them
// with a keyed first step, reach their last step exactly once (each step
// is queued only by the success of the one before). It runs 60 batches; DISKER_BATCHES_LONG=1
// runs 1,000.
func TestBatchesUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills processes: runs without -short")
	}
	srv := redistest.Start(t, redistest.WithAOF())
	e := newEnv(t, true, srv.URL())
	nBatches, nChildren := 60, 20
	if os.Getenv(batchesLongEnv) != "" {
		nBatches = 1000
	}
	recvs := []string{"bk-r0", "bk-r1", "bk-r2"}
	workers := make([]*child, 3)
	startWorker := func(i int) {
		c := startChild(t, e, "batch-children", strings.Join(recvs, ","), "")
		if line := <-c.lines; line != "ready" {
			t.Fatalf("worker %d: %q", i, line)
		}
		workers[i] = c
	}
	for i := range workers {
		startWorker(i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	d, err := disker.New(ctx, e.base)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close(context.Background())

	var mu sync.Mutex
	seen := make(map[string]*completionSeen)
	children := make(map[string][]disker.Outgoing) // batch id -> children (Message.ID set)
	childIDs := make(map[string][]string)
	all := make(chan struct{})
	err = d.Handle("bk-done", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		id := m.Headers[disker.HeaderBatch]
		info, err := d.Batch(ctx, id)
		if err != nil {
			return nil, err // Redis is away: it comes again
		}
		mu.Lock()
		ids, msgs := childIDs[id], children[id]
		mu.Unlock()
		states := make(map[disker.ResultState]int)
		early := ""
		for i, cid := range ids {
			r, err := d.Result(ctx, msgs[i].Message.Receiver, cid)
			if err != nil {
				return nil, err
			}
			if !r.State.Final() && early == "" {
				early = cid
			}
			states[r.State]++
		}
		mu.Lock()
		defer mu.Unlock()
		s := seen[id]
		if s == nil {
			s = &completionSeen{ids: make(map[string]bool)}
			seen[id] = s
		}
		s.ids[m.ID], s.info, s.states, s.early = true, info, states, early
		if len(seen) == nBatches {
			select {
			case <-all:
			default:
				close(all)
			}
		}
		return nil, nil
	}), disker.WithMaxAttempts(1000))
	if err != nil {
		t.Fatal(err)
	}

	for b := range nBatches {
		bt, err := d.NewBatch(ctx, disker.BatchOptions{Completion: disker.Message{Receiver: "bk-done"}, Retention: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		msgs := make([]disker.Outgoing, nChildren)
		for i := range msgs {
			content := "ok"
			if (b+i)%7 == 3 {
				content = "fail"
			}
			msgs[i].Message = disker.Message{Receiver: recvs[i%len(recvs)], Content: []byte(content)}
			if i%2 == 0 {
				// Keyed: its settle, its key's release and its report are
				// one step.
				msgs[i].Options = []disker.SendOption{disker.WithGroup("k" + strconv.Itoa(b%4))}
			}
		}
		mu.Lock() // the completion may run before SendEach returns
		ids, err := bt.SendEach(ctx, msgs)
		if err == nil {
			children[bt.ID()], childIDs[bt.ID()] = msgs, ids
		}
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := bt.Seal(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// Chains of 10 across the worker processes' receivers, whose last step
	// comes back here.
	const nChains = 10
	chainEnds := make(map[string]map[string]bool) // chain -> its last step's message ids
	chainsDone := make(chan struct{})
	err = d.Handle("bk-chain-end", disker.HandlerFunc(func(ctx context.Context, m *disker.Message) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		c := string(m.Content)
		if chainEnds[c] == nil {
			chainEnds[c] = make(map[string]bool)
		}
		chainEnds[c][m.ID] = true
		if len(chainEnds) == nChains {
			select {
			case <-chainsDone:
			default:
				close(chainsDone)
			}
		}
		return nil, nil
	}))
	if err != nil {
		t.Fatal(err)
	}
	for c := range nChains {
		opts := []disker.SendOption{disker.WithThen(disker.Message{Receiver: "bk-chain-end", Content: []byte(strconv.Itoa(c))})}
		for k := 8; k >= 1; k-- {
			opts = []disker.SendOption{disker.WithThen(disker.Message{Receiver: recvs[k%len(recvs)], Content: []byte("ok")}, opts...)}
		}
		if c%2 == 0 {
			opts = append(opts, disker.WithGroup("chain"))
		}
		if _, err := d.Send(ctx, disker.Message{Receiver: recvs[0], Content: []byte("ok")}, opts...); err != nil {
			t.Fatal(err)
		}
	}

	// Faults: workers killed and restarted at random, Redis killed once.
	for k := range 8 {
		time.Sleep(150 * time.Millisecond)
		i := rand.IntN(len(workers))
		workers[i].kill(t)
		if k == 3 {
			srv.Restart()
		}
		startWorker(i)
	}
	select {
	case <-all:
	case <-ctx.Done():
		mu.Lock()
		t.Fatalf("%d of %d batches completed", len(seen), nBatches)
	}
	select {
	case <-chainsDone:
	case <-ctx.Done():
		t.Fatalf("%d of %d chains reached their last step", len(chainEnds), nChains)
	}
	time.Sleep(500 * time.Millisecond) // room for a completion queued twice to show
	mu.Lock()
	defer mu.Unlock()
	for c, ids := range chainEnds {
		if len(ids) != 1 {
			t.Errorf("chain %s: its last step was queued %d times, want once", c, len(ids))
		}
	}
	for id, s := range seen {
		want := map[disker.ResultState]int{}
		for _, m := range children[id] {
			if strings.HasPrefix(string(m.Message.Content), "fail") {
				want[disker.ResultDeadLettered]++
			} else {
				want[disker.ResultSucceeded]++
			}
		}
		i := s.info
		switch {
		case len(s.ids) != 1:
			t.Errorf("batch %s: %d completion messages, want exactly 1", id, len(s.ids))
		case s.early != "":
			t.Errorf("batch %s: the completion ran before child %s settled", id, s.early)
		case i.Children != nChildren || i.Settled != nChildren || i.State != disker.BatchCompleted:
			t.Errorf("batch %s: %+v, want %d children, all settled, completed", id, i, nChildren)
		case s.states[disker.ResultSucceeded] != want[disker.ResultSucceeded] || s.states[disker.ResultDeadLettered] != want[disker.ResultDeadLettered]:
			t.Errorf("batch %s: children's results %v, want %v", id, s.states, want)
		case i.Succeeded != s.states[disker.ResultSucceeded] || i.DeadLettered+i.Failed != s.states[disker.ResultDeadLettered]:
			t.Errorf("batch %s: counts %+v, children's results %v", id, i, s.states)
		}
	}
}
