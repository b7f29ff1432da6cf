package chaos

// Retained results (disker.WithRetention) in the harness: a share of the
// timed sends and requests is sent with a retention; at the end, its
// producer looks each up (KindResult), and the checker demands that the
// retained fate is the outcome the sender saw (checkresults.go).

import (
	"context"
	"errors"
	"hash/crc32"
	"sync"
	"time"

	"github.com/diskerhq/disker"
)

// KindResult is the kind of the event of a retained result: at the end, a
// producer looked up the result of Op (ID): Result is its state (disker.ResultState's name), ResultNotFound
// or error (Err); Reply its reply's content; Key its error's code.
const KindResult = "result"

// ResultNotFound is the Result of a KindResult that found no record.
const ResultNotFound = "not_found"

// resultShare: one timed send or request in resultShare is retained,
// chosen by a hash of its op, so that the producers' seeded choices stay
// as they were.
const resultShare = 4

// resultRetention is the retention of the retained sends: longer than
// any run.
const resultRetention = 2 * time.Hour

// retainedOps are a producer's retained messages, by op.
type retainedOps struct {
	mu  sync.Mutex
	ids map[string][2]string // receiver, id
}

// retained reports whether op is sent with a retention.
func retained(op string) bool { return crc32.ChecksumIEEE([]byte(op))%resultShare == 0 }

// retention returns the send options of op's retention, if it has one.
func retention(op string) []disker.SendOption {
	if !retained(op) {
		return nil
	}
	return []disker.SendOption{disker.WithRetention(resultRetention)}
}

// keep notes id, the message of op to receiver, for the lookup at the
// end, when op is retained.
func (r *retainedOps) keep(op, receiver, id string) {
	if !retained(op) || id == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[string][2]string{}
	}
	r.ids[op] = [2]string{receiver, id}
}

// lookUp records the retained result of each kept message (KindResult),
// reading them within a few seconds at most.
func (r *retainedOps) lookUp(d *disker.Disker, rec *Recorder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for op, m := range r.ids {
		e := Event{Kind: KindResult, Op: op, ID: m[1], Receiver: m[0]}
		res, err := d.Result(ctx, m[0], m[1])
		switch {
		case errors.Is(err, disker.ErrResultNotFound):
			e.Result = ResultNotFound
		case err != nil:
			e.Result, e.Err = ResultError, err.Error()
		default:
			e.Result, e.Reply = res.State.String(), string(res.Reply)
			if res.Err != nil {
				e.Key = res.Err.Code
			}
		}
		rec.Record(e)
	}
}
