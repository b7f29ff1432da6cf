// Package chaos is Disker's fault-injection harness: it runs real worker and
// producer processes against a real Redis, injects faults at random (seeded),
// records every operation and outcome as a history of JSON lines, and checks
// the history against the delivery contract (see RELIABILITY.md).
//
// The harness ([Run]) and the processes it starts ([RunWorker],
// [RunProducer]) live in one binary, cmd/chaos, which starts copies of
// itself as workers and producers. [Check] reads a history and reports.
package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/diskerhq/disker/internal/testhook"
)

// Kinds of history events.
const (
	// KindSend: a producer is about to send Op (Mode; Timeout for timed
	// sends and requests; Deadline, its context's, for a request).
	KindSend = "send"
	// KindSent: the broker acknowledged Op's send; ID is its message id.
	KindSent = "sent"
	// KindSendFailed: Op's send returned an error (Err): the message may
	// or may not exist.
	KindSendFailed = "send_failed"
	// KindOutcome: the sender learnt Op's outcome (Result: reply, timeout
	// or remote_error).
	KindOutcome = "outcome"
	// KindStart: a handler started Op (ID, Attempt, Deadline as the
	// handler saw it, T by the host clock, which is Redis's clock: Redis
	// runs on the same host).
	KindStart = "start"
	// KindEnd: a handler returned (Result: ok, failed, lease_lost,
	// expired or stopped).
	KindEnd = "end"
	// KindReply: a worker's Reply returned (Result: accepted, late or
	// error).
	KindReply = "reply"
	// KindAcked: the acknowledgement of a handled delivery (ID, Attempt)
	// returned, by the worker's clock (Result: ok, or error with Err: it
	// failed, and its retries too). Op is "id:" and the message's id.
	KindAcked = "acked"
	// KindCancelCall: a producer is about to call Cancel for Op (ID). A
	// call with no KindCancel after it (its producer was killed during
	// it) may have taken effect.
	KindCancelCall = "cancel_call"
	// KindCancel: a producer's Cancel of Op (ID) returned: Result is what
	// it found (scheduled, queued, in_flight, not_found), or error.
	KindCancel = "cancel"
	// KindIdle: a producer stopped sending and its calls returned.
	KindIdle = "idle"
	// KindFault: the harness injected a fault (Fault, Target) from T to
	// End.
	KindFault = "fault"
	// KindDeadLetter: Op was found in a dead-letter stream at the end.
	KindDeadLetter = "dead_letter"
	// KindSettle: the faults stopped at T; the system settles from then.
	KindSettle = "settle"
	// KindFinal: the end of the run: N messages were still in the queues;
	// Result says whether the system settled; when it did not, Err
	// describes what each receiver still held.
	KindFinal = "final"
)

// Modes of send.
const (
	ModeFireAndForget = "ff"
	ModeTimed         = "timed"
	ModeRequest       = "request"
	ModeBatch         = "batch"
	// ModeDelayed: fire-and-forget, sent WithDelay (Event.Timeout holds
	// the delay), and cancelled now and then.
	ModeDelayed = "delayed"
)

// Results of operations.
const (
	ResultReply       = "reply"
	ResultTimeout     = "timeout"
	ResultRemoteError = "remote_error"
	ResultOK          = "ok"
	ResultFailed      = "failed"
	ResultLeaseLost   = "lease_lost"
	ResultExpired     = "expired"
	ResultStopped     = "stopped"
	ResultAccepted    = "accepted"
	ResultLate        = "late"
	ResultError       = "error"
	ResultSettled     = "settled"
	ResultNotSettled  = "not_settled"
	ResultCancelled   = "cancelled"
	// What Cancel found (KindCancel).
	CancelDeferred = "deferred"
	CancelQueued   = "queued"
	CancelInFlight = "in_flight"
	CancelNotFound = "not_found"
)

// Kinds of fault.
const (
	FaultKillWorker       = "kill_worker"
	FaultStopWorker       = "stop_worker"
	FaultKillProducer     = "kill_producer"
	FaultStopProducer     = "stop_producer"
	FaultKillRedis        = "kill_redis"
	FaultResetConns       = "reset_conns"
	FaultStallConns       = "stall_conns"
	FaultCutAnswers       = "cut_answers"
	FaultClientPause      = "client_pause"
	FaultSentinelFailover = "sentinel_failover"
)

// Event is one line of a history. Times are Unix nanoseconds by the host's
// clock.
type Event struct {
	T        int64  `json:"t"`
	Proc     string `json:"proc"`
	Kind     string `json:"kind"`
	Op       string `json:"op,omitempty"`
	Mode     string `json:"mode,omitempty"`
	Timeout  int64  `json:"timeout,omitempty"`
	ID       string `json:"id,omitempty"`
	Attempt  int    `json:"attempt,omitempty"`
	Deadline int64  `json:"deadline,omitempty"`
	Result   string `json:"result,omitempty"`
	Err      string `json:"err,omitempty"`
	Fault    string `json:"fault,omitempty"`
	Target   string `json:"target,omitempty"`
	End      int64  `json:"end,omitempty"`
	N        int64  `json:"n,omitempty"`
	// The features (features.go): the receiver of a send or a start, its
	// priority level, its dedup, idempotency or group key (a schedule's
	// name for KindTick), a reply's content, a schedule's tick.
	Receiver string `json:"receiver,omitempty"`
	Priority int    `json:"priority,omitempty"`
	Key      string `json:"key,omitempty"`
	Reply    string `json:"reply,omitempty"`
	Tick     int64  `json:"tick,omitempty"`
	// Counts are a batch's counts (KindBatchCounts).
	Counts *BatchCounts `json:"counts,omitempty"`
}

// Recorder appends a process's events to its history file, one write per
// event, so that what was recorded before a SIGKILL is in the file.
type Recorder struct {
	proc string
	mu   sync.Mutex
	f    *os.File
	// stopDelays stops the delay ticker (WatchDelays), if any.
	stopDelays context.CancelFunc
}

// NewRecorder creates the history file of process proc in dir.
func NewRecorder(dir, proc string) (*Recorder, error) {
	f, err := os.OpenFile(filepath.Join(dir, proc+".jsonl"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("chaos: history of %s: %w", proc, err)
	}
	return &Recorder{proc: proc, f: f}, nil
}

// Record stamps e with the process and, if unset, the time, and appends it.
func (r *Recorder) Record(e Event) {
	e.Proc = r.proc
	if e.T == 0 {
		e.T = time.Now().UnixNano()
	}
	b, err := json.Marshal(e)
	if err != nil {
		panic(fmt.Sprintf("chaos: encode event: %v", err))
	}
	b = append(b, '\n')
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.f.Write(b); err != nil {
		fmt.Fprintf(os.Stderr, "chaos: %s: write history: %v\n", r.proc, err)
	}
}

// RecordAcks makes r record how the acknowledgement of each delivery
// that this process's instances handled ended (KindAcked). Call it before
// the process opens an instance.
func (r *Recorder) RecordAcks() {
	testhook.Acked = func(_, id string, attempt int, err error) {
		e := Event{Kind: KindAcked, Op: "id:" + id, ID: id, Attempt: attempt, Result: ResultOK}
		if err != nil {
			e.Result, e.Err = ResultError, err.Error()
		}
		r.Record(e)
	}
}

// WatchDelays makes r record the process's scheduling delays
// (KindSchedDelay, delays.go) until Close.
func (r *Recorder) WatchDelays() {
	ctx, cancel := context.WithCancel(context.Background())
	r.stopDelays = cancel
	go watchDelays(ctx, r)
}

// Close stops the delay ticker and closes the history file.
func (r *Recorder) Close() error {
	if r.stopDelays != nil {
		r.stopDelays()
	}
	return r.f.Close()
}

// ReadHistory reads every *.jsonl file in dir and returns their events
// sorted by time. A last line cut short by a kill is skipped. The events
// go into one slice sized by the files' lines, and the texts that many
// events repeat (process names, kinds, modes, results, receivers, keys,
// faults) are held once each, so that a long run's history takes little
// more memory than its events.
func ReadHistory(dir string) ([]Event, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("chaos: history: %w", err)
	}
	lines := 0
	for _, name := range files {
		n, err := countLines(name)
		if err != nil {
			return nil, err
		}
		lines += n
	}
	in := interner{}
	events := make([]Event, 0, lines)
	for _, name := range files {
		if events, err = readFile(name, events, in); err != nil {
			return nil, err
		}
	}
	sort.SliceStable(events, func(i, j int) bool { return events[i].T < events[j].T })
	return events, nil
}

// countLines returns how many lines the file holds, counting a last line
// without its newline.
func countLines(name string) (int, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, fmt.Errorf("chaos: history: %w", err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	n, last := 0, byte('\n')
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += bytes.Count(buf[:k], []byte{'\n'})
			last = buf[k-1]
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("chaos: history %s: %w", name, err)
		}
	}
	if last != '\n' {
		n++
	}
	return n, nil
}

// readFile appends the events of the named file to events.
func readFile(name string, events []Event, in interner) ([]Event, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("chaos: history: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var e Event
		if err := json.Unmarshal(line, &e); err != nil {
			continue // a line cut short by a kill
		}
		in.event(&e)
		events = append(events, e)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, os.ErrClosed) {
		return nil, fmt.Errorf("chaos: history %s: %w", name, err)
	}
	return events, nil
}

// interner holds one copy of each text it was given.
type interner map[string]string

// of returns the copy of s that in holds.
func (in interner) of(s string) string {
	if v, ok := in[s]; ok {
		return v
	}
	in[s] = s
	return s
}

// event replaces e's texts that recur across events (not its op, id,
// error or reply) by in's copies.
func (in interner) event(e *Event) {
	for _, f := range []*string{&e.Proc, &e.Kind, &e.Mode, &e.Result, &e.Fault, &e.Target, &e.Receiver, &e.Key} {
		if *f != "" {
			*f = in.of(*f)
		}
	}
}
