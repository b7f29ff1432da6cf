package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/pool"
)

// The features' part of the run: receivers that every worker serves with
// one feature each, the producers' loops that use them as a program
// would, and the schedules the workers run. checkfeatures.go judges what
// they record.

// Kinds of history events of the features.
const (
	// KindPause: the harness's Pause of Receiver ran from T to End
	// (Result ok or error: an error may have paused it all the same).
	KindPause = "pause"
	// KindResume: the harness's Resume of Receiver ran from T to End
	// (Result ok or error).
	KindResume = "resume"
	// KindTick: a handler got the message ID of schedule Key for the tick
	// Tick (HeaderTick), standing for N missed ticks when N > 0
	// (HeaderMissed).
	KindTick = "tick"
	// KindGivenBack: the handler of HandleWithPool got a broken pool
	// worker for attempt Attempt of Op and gave the message back.
	KindGivenBack = "given_back"
	// KindPoolState: a worker's pool became degraded (Result degraded) or
	// recovered (Result recovered).
	KindPoolState = "pool"
	// KindIdemOutcome: an idempotent Request of Op returned (Result
	// reply, with the reply's content in Reply; timeout, remote_error or
	// error, with Err).
	KindIdemOutcome = "idem_outcome"
	// KindSlotsLapsed: a worker learnt at End that the lease of its global
	// concurrency slots of Receiver had run out, at T at the earliest
	// (disker.EventSlotsLapsed): its handlers running then ran on beside
	// the slots' next holders.
	KindSlotsLapsed = "slots_lapsed"
)

// Modes of send of the features. The other features' sends are
// fire-and-forget (ModeFireAndForget) to their receiver (Event.Receiver).
const (
	// ModeDedup: fire-and-forget, WithDedupKey(Key, dedupTTL).
	ModeDedup = "dedup"
	// ModeDedupSettled: fire-and-forget, WithDedupUntilSettled(Key,
	// dedupHold).
	ModeDedupSettled = "dedup_settled"
	// ModeIdempotent: Request WithIdempotencyKey(Key) and
	// WithIdempotencyTTL(idemTTL); its KindSent event is WithOnSent's id
	// (the key's message), its result a KindIdemOutcome.
	ModeIdempotent = "idempotent"
)

// ResultDuplicate is the Result of the KindSent event of a send that the
// broker answered with a *DuplicateError: its ID is the key's holder.
const ResultDuplicate = "duplicate"

// FaultCrashWorker is a worker that killed itself (SIGKILL) after a
// reply to an idempotent Request was accepted and before the message was
// acknowledged; the worker records it, and the harness starts its next
// generation.
const FaultCrashWorker = "crash_worker"

// The receivers of the features.
const (
	recvPaused = "chaos.paused" // priorities; paused and resumed by the harness
	recvGlobal = "chaos.global" // WithGlobalConcurrency(globalLimit)
	recvRate   = "chaos.rate"   // WithRateLimit(rateLimit, rateBurst)
	recvPool   = "chaos.pool"   // HandleWithPool
	recvGroup1 = "chaos.group1" // WithGroup, WithGroupConcurrency(1)
	recvGroupN = "chaos.groupn" // WithGroup, WithGroupConcurrency(groupLimit)
	recvIdem   = "chaos.idem"   // WithIdempotencyKey
	recvTicks  = "chaos.ticks"  // the schedules' messages
)

// featureReceivers are the receivers of the features whose messages are
// producers' operations (the harness waits for them to drain, and records
// their dead letters).
var featureReceivers = []string{recvPaused, recvGlobal, recvRate, recvPool, recvGroup1, recvGroupN, recvIdem, recvBatchDone, recvChain}

// settledReceivers are the receivers the harness drains at the end.
func settledReceivers() []string {
	return append(append([]string{}, Receivers...), featureReceivers...)
}

// Settings of the features, chosen so that each limit binds now and then
// while the receivers keep up with the producers.
const (
	// pausedConcurrency and pausedWork make the messages queued during a
	// pause wait for each other after the resume, so that their order
	// shows.
	pausedConcurrency = 1
	pausedWork        = 100 * time.Millisecond
	globalLimit       = 3
	globalWork        = 150 * time.Millisecond // a handler of recvGlobal works up to this
	rateLimit         = 15.0                   // per second
	rateBurst         = 4
	groupLimit        = 3
	groupWork         = 120 * time.Millisecond // a handler of recvGroupN works up to this
	groupKeys         = 4
	dedupTTL          = 300 * time.Millisecond
	dedupHold         = 10 * time.Second // WithDedupUntilSettled's bound
	dedupKeys         = 4
	idemTTL           = 5 * time.Second
	idemKeys          = 10
	idemWork          = 200 * time.Millisecond
	crashEvery        = 40 // one idempotent message in crashEvery crashes its worker
	// poolAttempts is the attempts of recvPool: its handler never fails,
	// so only faults count attempts (a given-back message counts none).
	poolAttempts = 3
)

// crashFirst is the worker that crashes on its first idempotent message,
// so that every run has a rerun of one after a crash.
const crashFirst = "w0.g1"

// chaosSchedule is a schedule that every worker registers.
type chaosSchedule struct {
	name   string
	every  time.Duration
	missed disker.Missed
}

// schedules are the run's periodic schedules; their ticks go to recvTicks.
var schedules = []chaosSchedule{
	{name: "chaos.every", every: 250 * time.Millisecond, missed: disker.MissedSkip},
	{name: "chaos.catchup", every: 400 * time.Millisecond, missed: disker.MissedOne},
}

// handleOptions are the options of every receiver a worker serves, before
// the feature's own.
func handleOptions(extra ...disker.HandleOption) []disker.HandleOption {
	return append([]disker.HandleOption{disker.WithLease(workerLease), disker.WithMaxAttempts(maxAttempts),
		disker.WithConcurrency(8), disker.WithBackoff(func(int) time.Duration { return 50 * time.Millisecond })}, extra...)
}

// workerHandler records every start and end of a handler and its reply,
// works up to work (by the op's hash) and, with failures, fails the first
// attempt of one op in twenty and one op in a hundred for good.
func workerHandler(d *disker.Disker, rec *Recorder, work time.Duration, failures bool) disker.HandlerFunc {
	return func(ctx context.Context, m *disker.Message) ([]byte, error) {
		op, hash, end, ok := begin(ctx, rec, m, work)
		if !ok {
			return nil, ctx.Err()
		}
		switch {
		case failures && poisoned(hash):
			end(ResultFailed)
			return nil, disker.NoRetry(errors.New("chaos: poison message"))
		case failures && failsFirst(hash, m.Attempt):
			end(ResultFailed)
			return nil, errors.New("chaos: first attempt fails")
		}
		if !m.ExpectsReply() {
			end(ResultOK)
			return nil, nil
		}
		if _, err := reply(ctx, d, rec, m, op); err != nil {
			end(ResultFailed)
			return nil, err
		}
		end(ResultOK)
		return nil, nil
	}
}

// begin records that a handler started m and works up to work (by the
// op's hash); it returns the op, its hash and the function that records
// the handler's end, or false, with the end recorded, when ctx ended
// first.
func begin(ctx context.Context, rec *Recorder, m *disker.Message, work time.Duration) (string, uint32, func(result string), bool) {
	op := string(m.Content)
	end := recordStart(rec, m)
	hash := opHash(op)
	if !sleepWork(ctx, time.Duration(hash%uint32(work/time.Millisecond))*time.Millisecond) {
		end(endCause(ctx))
		return op, hash, end, false
	}
	return op, hash, end, true
}

// recordStart records that a handler started m, and returns the function
// that records its end.
func recordStart(rec *Recorder, m *disker.Message) func(result string) {
	op := string(m.Content)
	e := Event{T: time.Now().UnixNano(), Kind: KindStart, Op: op, ID: m.ID, Attempt: m.Attempt,
		Receiver: m.Receiver, Priority: int(m.Priority), Key: m.Group}
	if !m.Deadline.IsZero() {
		e.Deadline = m.Deadline.UnixNano()
	}
	rec.Record(e)
	return func(result string) {
		rec.Record(Event{Kind: KindEnd, Op: op, ID: m.ID, Attempt: m.Attempt, Result: result})
	}
}

// sleepWork works for d, or until ctx ends (false).
func sleepWork(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// reply replies content to m and records the reply; it returns whether
// the reply was accepted, and the error of a reply that failed (not one
// refused as late).
func reply(ctx context.Context, d *disker.Disker, rec *Recorder, m *disker.Message, content string) (bool, error) {
	err := d.Reply(ctx, m, []byte(content))
	e := Event{Kind: KindReply, Op: string(m.Content), ID: m.ID, Attempt: m.Attempt, Result: ResultAccepted}
	if m.Receiver == recvIdem {
		e.Reply = content
	}
	switch {
	case err == nil:
	case errors.Is(err, disker.ErrLate):
		e.Result, err = ResultLate, nil
	default:
		e.Result, e.Err = ResultError, err.Error()
	}
	rec.Record(e)
	return e.Result == ResultAccepted, err
}

// idemReply is the reply of a run of an idempotent message: which run it
// was, so that the checker knows which reply every caller got.
func idemReply(op, proc string, attempt int) string {
	return op + "|" + proc + "|" + strconv.Itoa(attempt)
}

// idemHandler handles the idempotent messages: it works up to idemWork,
// replies which run it was, and, on a first attempt whose reply was
// accepted, crashes the worker (SIGKILL) for the first idempotent message
// of crashFirst and one in crashEvery of the others: the message is then
// delivered again, and its callers must all get the first reply.
func idemHandler(d *disker.Disker, rec *Recorder, proc string) disker.HandlerFunc {
	var first atomic.Bool
	first.Store(proc == crashFirst)
	return func(ctx context.Context, m *disker.Message) ([]byte, error) {
		op, hash, end, ok := begin(ctx, rec, m, idemWork)
		if !ok {
			return nil, ctx.Err()
		}
		accepted, err := reply(ctx, d, rec, m, idemReply(op, proc, m.Attempt))
		if err != nil {
			end(ResultFailed)
			return nil, err
		}
		if accepted && m.Attempt == 1 && (first.Swap(false) || hash%crashEvery == 5) {
			now := time.Now().UnixNano()
			rec.Record(Event{T: now, Kind: KindFault, Fault: FaultCrashWorker, Target: proc, End: now})
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		}
		end(ResultOK)
		return nil, nil
	}
}

// tickHandler records each message of a schedule.
func tickHandler(rec *Recorder) disker.HandlerFunc {
	return func(_ context.Context, m *disker.Message) ([]byte, error) {
		e := Event{Kind: KindTick, Key: m.Headers[disker.HeaderSchedule], ID: m.ID, Attempt: m.Attempt, Receiver: m.Receiver}
		tick, err := time.Parse(disker.TickTimeFormat, m.Headers[disker.HeaderTick])
		if err != nil {
			e.Err = err.Error()
		}
		e.Tick = tick.UnixNano()
		if s := m.Headers[disker.HeaderMissed]; s != "" {
			n, err := strconv.Atoi(s)
			if err != nil {
				e.Err = err.Error()
			}
			e.N = int64(n)
		}
		rec.Record(e)
		return nil, nil
	}
}

// serveFeatures serves the receivers of the features and registers the
// schedules.
func serveFeatures(d *disker.Disker, rec *Recorder, cfg ProcConfig) error {
	handlers := []struct {
		receiver string
		h        disker.Handler
		opts     []disker.HandleOption
	}{
		{recvPaused, workerHandler(d, rec, pausedWork, true), []disker.HandleOption{disker.WithConcurrency(pausedConcurrency)}},
		{recvGlobal, workerHandler(d, rec, globalWork, true), []disker.HandleOption{disker.WithGlobalConcurrency(globalLimit)}},
		{recvRate, workerHandler(d, rec, maxWork, true), []disker.HandleOption{disker.WithRateLimit(rateLimit, rateBurst)}},
		{recvGroup1, workerHandler(d, rec, maxWork, true), []disker.HandleOption{disker.WithGroupConcurrency(1)}},
		{recvGroupN, workerHandler(d, rec, groupWork, true), []disker.HandleOption{disker.WithGroupConcurrency(groupLimit)}},
		{recvIdem, idemHandler(d, rec, cfg.Name), nil},
		{recvTicks, tickHandler(rec), nil},
		{recvBatchDone, completionHandler(d, rec), nil},
		{recvChain, chainHandler(rec), nil},
	}
	for _, h := range handlers {
		if err := d.Handle(h.receiver, h.h, handleOptions(h.opts...)...); err != nil {
			return fmt.Errorf("chaos: worker %s: %s: %w", cfg.Name, h.receiver, err)
		}
	}
	if err := servePool(d, rec, cfg); err != nil {
		return err
	}
	return registerSchedules(d)
}

// registerSchedules registers the schedules, as every worker does at its
// start (registering one unchanged changes nothing), trying for a minute
// while Redis is down.
func registerSchedules(d *disker.Disker) error {
	deadline := time.Now().Add(time.Minute)
	for _, s := range schedules {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := d.Schedule(ctx, disker.Schedule{Name: s.name, Receiver: recvTicks, Content: []byte(s.name), Every: s.every, Missed: s.missed})
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("chaos: schedule %s: %w", s.name, err)
			}
			time.Sleep(100 * time.Millisecond) // a retry pace, not a wait for an event
		}
	}
	return nil
}

// poolConn is a worker of the pool: a stand-in for a connection, broken
// after a few uses.
type poolConn struct{ uses int }

// brokenEvery: a pool worker breaks at every brokenEvery-th use.
const brokenEvery = 4

// errBackendDown is the pool's constructor's error while its backend is
// down.
var errBackendDown = errors.New("chaos: the pool's backend is down")

// servePool serves recvPool with HandleWithPool: a pool whose workers
// break now and then (the message is given back) and whose constructor
// fails while its backend is down, at random (seeded) for 0.5 to 2 s every
// 2 to 6 s, so that the pool is degraded.
func servePool(d *disker.Disker, rec *Recorder, cfg ProcConfig) error {
	var down atomic.Bool
	p, err := pool.New(pool.Config[*poolConn]{
		Name: "chaos",
		New: func(context.Context) (*poolConn, error) {
			if down.Load() {
				return nil, errBackendDown
			}
			return &poolConn{}, nil
		},
		Size: 2, MaxOverflow: 1, MaxRestarts: 1, Period: 5 * time.Second,
		RestartBackoff: 20 * time.Millisecond, MaxRestartBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		return fmt.Errorf("chaos: pool: %w", err)
	}
	go outages(&down, rand.New(rand.NewPCG(cfg.Seed, 0x706f6f6c)))
	go watchPool(p, rec)
	h := workerHandler(d, rec, maxWork, false)
	return disker.HandleWithPool(d, recvPool, p, func(ctx context.Context, c *poolConn, m *disker.Message) ([]byte, error) {
		c.uses++
		if c.uses%brokenEvery == 0 {
			rec.Record(Event{Kind: KindGivenBack, Op: string(m.Content), ID: m.ID, Attempt: m.Attempt, Receiver: m.Receiver})
			return nil, pool.Broken(errors.New("chaos: the pool worker broke"))
		}
		return h(ctx, m)
	}, handleOptions(disker.WithMaxAttempts(poolAttempts))...)
}

// outages takes the pool's backend down and up for the process's life.
func outages(down *atomic.Bool, rng *rand.Rand) {
	for {
		time.Sleep(2*time.Second + time.Duration(rng.Int64N(int64(4*time.Second))))
		down.Store(true)
		time.Sleep(500*time.Millisecond + time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		down.Store(false)
	}
}

// watchPool records when the pool becomes degraded and recovers.
func watchPool(p *pool.Pool[*poolConn], rec *Recorder) {
	degraded := false
	for {
		time.Sleep(20 * time.Millisecond) // a poll of Stats: the pool tells no one
		if s := p.Stats(); s.Degraded != degraded {
			degraded = s.Degraded
			result := "recovered"
			if degraded {
				result = "degraded"
			}
			rec.Record(Event{Kind: KindPoolState, Receiver: recvPool, Result: result})
		}
	}
}

// featureLoop is a producer's loop of one feature: op sends the operation
// named op, then the loop waits up to pace.
type featureLoop struct {
	op   func(rng *rand.Rand, op string)
	pace time.Duration
}

// startFeatures starts the producer's loops of the features, which run
// until ctx ends.
func (p *producer) startFeatures(ctx context.Context, wg *sync.WaitGroup) {
	loops := []featureLoop{
		{p.prioritised, 300 * time.Millisecond},
		{p.deduplicated, 200 * time.Millisecond},
		{p.idempotent, 200 * time.Millisecond},
		{p.limited(recvGlobal), time.Second},
		{p.rated, 6 * time.Second},
		{p.pooled, 300 * time.Millisecond},
		{p.grouped, 400 * time.Millisecond},
		{p.batched, 600 * time.Millisecond},
		{p.chained, 600 * time.Millisecond},
	}
	for i, l := range loops {
		rng := rand.New(rand.NewPCG(p.cfg.Seed, uint64(100+i)))
		wg.Go(func() {
			for n := 0; ctx.Err() == nil; n++ {
				l.op(rng, fmt.Sprintf("%s-f%d-%d", p.cfg.Name, i, n))
				time.Sleep(time.Duration(rng.Int64N(int64(l.pace)))) // pacing
			}
		})
	}
}

// sendFeature sends one fire-and-forget message whose send is e (Op,
// Mode, Receiver and the feature's fields), and records its result: a
// duplicate (WithDedupKey) is a KindSent with ResultDuplicate and the
// holder's id.
func (p *producer) sendFeature(e Event, opts ...disker.SendOption) {
	e.Kind = KindSend
	p.rec.Record(e)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := p.d.Send(ctx, disker.Message{Receiver: e.Receiver, Content: []byte(e.Op)}, opts...)
	var dup *disker.DuplicateError
	switch {
	case errors.As(err, &dup):
		p.rec.Record(Event{Kind: KindSent, Op: e.Op, ID: dup.ID, Result: ResultDuplicate})
	case err != nil:
		p.rec.Record(Event{Kind: KindSendFailed, Op: e.Op, Err: err.Error()})
	default:
		p.rec.Record(Event{Kind: KindSent, Op: e.Op, ID: id})
	}
}

// sendBatch sends one SendBatch of es (their Op, Mode and fields) to
// receiver with opts, recording each send and its result.
func (p *producer) sendBatch(receiver string, es []Event, opts ...disker.SendOption) {
	msgs := make([]disker.Message, len(es))
	for i, e := range es {
		msgs[i] = disker.Message{Receiver: receiver, Content: []byte(e.Op)}
		e.Kind, e.Receiver = KindSend, receiver
		p.rec.Record(e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := p.d.SendBatch(ctx, msgs, opts...)
	ops := make([]string, len(es))
	for i, e := range es {
		ops[i] = e.Op
	}
	p.recordSent(ops, ids, err)
}

// recordSent records the result of each of ops, the messages of one
// SendBatch or SendEach call that returned ids and err.
func (p *producer) recordSent(ops, ids []string, err error) {
	var be *disker.BatchError
	errors.As(err, &be)
	for i, op := range ops {
		switch {
		case i < len(ids) && ids[i] != "":
			p.rec.Record(Event{Kind: KindSent, Op: op, ID: ids[i]})
		case be != nil && i < len(be.Errs) && be.Errs[i] != nil:
			p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: be.Errs[i].Error()})
		case err != nil:
			p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: err.Error()})
		}
	}
}

// prioritised sends to recvPaused at a random level.
func (p *producer) prioritised(rng *rand.Rand, op string) {
	level := disker.Priority(rng.IntN(3) - 1)
	p.sendFeature(Event{Op: op, Mode: ModeFireAndForget, Receiver: recvPaused, Priority: int(level)}, disker.WithPriority(level))
}

// deduplicated sends to a base receiver with a dedup key: of a fixed
// window (WithDedupKey) or held until the message is settled
// (WithDedupUntilSettled).
func (p *producer) deduplicated(rng *rand.Rand, op string) {
	e := Event{Op: op, Receiver: Receivers[rng.IntN(len(Receivers))]}
	if rng.IntN(2) == 0 {
		e.Mode, e.Key = ModeDedup, fmt.Sprintf("w%d", rng.IntN(dedupKeys))
		p.sendFeature(e, disker.WithDedupKey(e.Key, dedupTTL))
		return
	}
	e.Mode, e.Key = ModeDedupSettled, fmt.Sprintf("s%d", rng.IntN(dedupKeys))
	p.sendFeature(e, disker.WithDedupUntilSettled(e.Key, dedupHold))
}

// idempotent makes a Request to recvIdem with an idempotency key and a
// timeout of 1 to 5 s.
func (p *producer) idempotent(rng *rand.Rand, op string) {
	key := fmt.Sprintf("k%d", rng.IntN(idemKeys))
	timeout := time.Second + time.Duration(rng.Int64N(int64(4*time.Second)))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	p.rec.Record(Event{Kind: KindSend, Op: op, Mode: ModeIdempotent, Receiver: recvIdem, Key: key})
	onSent := func(id string) { p.rec.Record(Event{Kind: KindSent, Op: op, ID: id}) }
	reply, err := p.d.Request(ctx, disker.Message{Receiver: recvIdem, Content: []byte(op)},
		disker.WithIdempotencyKey(key), disker.WithIdempotencyTTL(idemTTL), disker.WithOnSent(onSent))
	e := Event{Kind: KindIdemOutcome, Op: op, Key: key}
	var remote *disker.RemoteError
	switch {
	case err == nil:
		e.Result, e.Reply = ResultReply, string(reply.Content)
	case errors.Is(err, disker.ErrTimeout):
		e.Result, e.Err = ResultTimeout, err.Error()
	case errors.As(err, &remote):
		e.Result, e.Err = ResultRemoteError, err.Error()
	default:
		e.Result, e.Err = ResultError, err.Error()
	}
	p.rec.Record(e)
}

// limited returns the loop that sends bursts of 1 to 6 messages at once
// (SendBatch) to a receiver with a limit across its workers.
func (p *producer) limited(receiver string) func(rng *rand.Rand, op string) {
	return func(rng *rand.Rand, op string) {
		p.sendBatch(receiver, burst(op, 1+rng.IntN(6), ModeFireAndForget, ""))
	}
}

// rated sends bursts of 5 to 15 messages at once to recvRate: more than
// its burst and a second of its rate, so that a missing limit shows.
func (p *producer) rated(rng *rand.Rand, op string) {
	p.sendBatch(recvRate, burst(op, 5+rng.IntN(11), ModeFireAndForget, ""))
}

// burst returns the sends of a batch of n messages named after op.
func burst(op string, n int, mode, key string) []Event {
	es := make([]Event, n)
	for i := range es {
		es[i] = Event{Op: fmt.Sprintf("%s.%d", op, i), Mode: mode, Key: key}
	}
	return es
}

// pooled sends to recvPool.
func (p *producer) pooled(_ *rand.Rand, op string) {
	p.sendFeature(Event{Op: op, Mode: ModeFireAndForget, Receiver: recvPool})
}

// grouped sends 1 to 3 messages of one group key at once to recvGroup1 or
// recvGroupN.
func (p *producer) grouped(rng *rand.Rand, op string) {
	receiver := recvGroup1
	if rng.IntN(2) == 0 {
		receiver = recvGroupN
	}
	key := fmt.Sprintf("g%d", rng.IntN(groupKeys))
	p.sendBatch(receiver, burst(op, 1+rng.IntN(3), ModeFireAndForget, key), disker.WithGroup(key))
}
