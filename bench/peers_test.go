package bench

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestRunAlternatingGoesOnWithoutARowThatCannotRun checks that a row whose
// run says errNotRun is left out of the rest of the runs, with no samples,
// while the others run every time.
func TestRunAlternatingGoesOnWithoutARowThatCannotRun(t *testing.T) {
	pe := newPeers(Options{Progress: io.Discard})
	calls := map[string]int{}
	ok := impl{name: "ok", run: func(context.Context) (sample, error) {
		calls["ok"]++
		return sample{elapsed: time.Millisecond, ops: 1}, nil
	}}
	missing := impl{name: nameBullMQ, run: func(context.Context) (sample, error) {
		calls[nameBullMQ]++
		return sample{}, pe.missing(nameBullMQ, errors.New("node not found on PATH"))
	}}
	res, err := runAlternating(context.Background(), Options{Runs: 3, Progress: io.Discard}, "w", []impl{ok, missing})
	if err != nil {
		t.Fatal(err)
	}
	if calls["ok"] != 3 || calls[nameBullMQ] != 1 || len(res["ok"]) != 3 || len(res[nameBullMQ]) != 0 {
		t.Fatalf("calls %v, samples ok %d, missing %d; want 3 and 1 calls, 3 and 0 samples", calls, len(res["ok"]), len(res[nameBullMQ]))
	}
	if got := pe.notes(nameBullMQ, nameRiver); len(got) != 1 || got[0] != nameBullMQ+": not run: node not found on PATH." {
		t.Fatalf("notes %q", got)
	}
}

// TestTablesSayWhyAPeerDidNotRun checks that the fire-and-forget table
// leaves out the row of a peer that did not run and says why.
func TestTablesSayWhyAPeerDidNotRun(t *testing.T) {
	pe := newPeers(Options{Progress: io.Discard})
	_ = pe.missing(nameRiver, errors.New("PostgreSQL's initdb and postgres not found"))
	res := map[string][]sample{}
	for _, im := range ffAllImpls(pe, 10) {
		if im.name != nameRiver {
			res[im.name] = []sample{{elapsed: time.Second, ops: 10, serverCPU: time.Millisecond, clientCPU: time.Millisecond}}
		}
	}
	tb := ffTable(res, 10, pe)
	if countRows(tb, nameRiver) != 0 || len(tb.Rows) != len(ffAllImpls(pe, 10))-1 {
		t.Fatalf("rows %v", tb.Rows)
	}
	if !strings.Contains(tb.Markdown(), nameRiver+": not run: PostgreSQL's initdb and postgres not found.") {
		t.Fatalf("the table does not say why River did not run:\n%s", tb.Markdown())
	}
}

// TestProcStat checks the parsing of /proc/PID/stat where it exists.
func TestProcStat(t *testing.T) {
	st, ok := readProcStat(os.Getpid())
	if !ok {
		t.Skip("/proc/PID/stat cannot be read here (not Linux)")
	}
	if st.ppid != os.Getppid() {
		t.Fatalf("ppid %d, want %d", st.ppid, os.Getppid())
	}
	if tree := processTree(os.Getppid()); len(tree) < 2 || tree[0] != os.Getppid() {
		t.Fatalf("tree of the parent %v should hold it and this process", tree)
	}
	if treeCPU(os.Getpid()) < st.cpu {
		t.Fatal("the tree's CPU is less than its root's")
	}
}

// TestFailingPeerLeavesItsRowOut checks that a peer's run that fails (here
// its program is not where the row looks for it) leaves the peer's row out
// of the table with the reason, printed and in a note, while the workload
// goes on: Disker's row runs every time.
func TestFailingPeerLeavesItsRowOut(t *testing.T) {
	var progress strings.Builder
	o := Options{Runs: 2, Tiny: true, Quick: true, Progress: &progress}
	pe := newPeers(o)
	const n = 200
	bad := filepath.Join(t.TempDir(), "no-such-node")
	peer := redisImpl{name: nameBullMQ, peers: pe, run: func(context.Context, *redisServer) (sample, error) {
		return sample{}, exec.Command(bad, "bullmq.mjs", "producer").Run()
	}}
	res, err := runRedisWorkload(context.Background(), o, "fire-and-forget", []redisImpl{ffImpls(n)[0], peer})
	if err != nil {
		t.Fatalf("the workload ended with the peer's failure: %v", err)
	}
	if len(res[nameDisker]) != 2 || len(res[nameBullMQ]) != 0 {
		t.Fatalf("samples: Disker %d, the failing peer %d; want 2 and 0", len(res[nameDisker]), len(res[nameBullMQ]))
	}
	why := nameBullMQ + ": failed in fire-and-forget: fork/exec " + bad + ": no such file or directory"
	if !strings.Contains(progress.String(), why+"\n") {
		t.Fatalf("the progress does not say why the peer has no row; want %q in:\n%s", why, progress.String())
	}
	tb := ffTable(res, n, pe)
	if countRows(tb, nameBullMQ) != 0 || countRows(tb, nameDisker) != 1 {
		t.Fatalf("rows %v", tb.Rows)
	}
	if !strings.Contains(tb.Markdown(), why+".") {
		t.Fatalf("the table does not say why the peer has no row:\n%s", tb.Markdown())
	}
}
