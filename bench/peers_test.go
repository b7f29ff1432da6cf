package bench

import (
	"context"
	"errors"
	"io"
	"os"
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
