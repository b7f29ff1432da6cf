package chaos

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/childproc"
)

// The names the processes use.
const (
	// Sender is the sender name every producer shares for its timed sends:
	// whichever producer is alive settles the timeouts.
	Sender = "chaos.sender"
)

// Receivers are the receivers every worker serves.
var Receivers = []string{"chaos.q1", "chaos.q2"}

// Timing of the processes, chosen so that a slow machine makes no false
// violation: a lease lost to slowness is a duplicate explained by its
// lease expiry, and timeouts are long against the handlers' work.
const (
	workerLease   = 2 * time.Second
	monitorPeriod = 250 * time.Millisecond
	blockTimeout  = 500 * time.Millisecond
	maxAttempts   = 8
	minTimeout    = 1 * time.Second
	maxTimeout    = 8 * time.Second
	maxWork       = 40 * time.Millisecond
	producerConc  = 4
	batchSize     = 5
)

// ProcConfig configures a worker or producer process.
type ProcConfig struct {
	// Name is the process's name in the history, such as "w1.g2".
	Name string
	// RedisURL is the broker the process uses.
	RedisURL string
	// Dir is the run directory, where the history goes.
	Dir string
	// Seed seeds the producer's choices.
	Seed uint64
}

// newDisker connects an instance; with rec, it records the lapses of its
// global concurrency slots (KindSlotsLapsed).
func newDisker(cfg ProcConfig, rec *Recorder) (*disker.Disker, error) {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	var d *disker.Disker
	var err error
	// Redis may be down while the process starts: try until it is up.
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		d, err = disker.New(ctx, disker.Config{
			RedisURL:                cfg.RedisURL,
			ReceiverBlockTimeout:    blockTimeout,
			TimeoutMonitorFrequency: monitorPeriod,
			Logger:                  log,
			InstanceID:              "chaos-" + cfg.Name,
			OnEvent:                 slotsLapses(rec),
		})
		cancel()
		if err == nil || time.Now().After(deadline) {
			return d, err
		}
		time.Sleep(100 * time.Millisecond) // a retry pace, not a wait for an event
	}
}

// slotsLapses returns the event hook that records in rec the lapses of
// the instance's global concurrency slots, or nil without rec.
func slotsLapses(rec *Recorder) func(disker.Event) {
	if rec == nil {
		return nil
	}
	return func(e disker.Event) {
		if e.Kind != disker.EventSlotsLapsed {
			return
		}
		now := time.Now().UnixNano()
		rec.Record(Event{T: now - int64(e.Duration), End: now, Kind: KindSlotsLapsed, Receiver: e.Receiver})
	}
}

// startProc opens the process's history and connects it to Redis.
func startProc(cfg ProcConfig) (*Recorder, *disker.Disker, error) {
	go childproc.ExitWithParent() // the harness is gone: so is the run
	rec, err := NewRecorder(cfg.Dir, cfg.Name)
	if err != nil {
		return nil, nil, err
	}
	rec.RecordAcks()
	rec.WatchDelays()
	d, err := newDisker(cfg, rec)
	if err != nil {
		rec.Close()
		return nil, nil, fmt.Errorf("chaos: %s: %w", cfg.Name, err)
	}
	return rec, d, nil
}

// opHash gives the deterministic behaviour of an operation's handler.
func opHash(op string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(op))
	return h.Sum32()
}

// RunWorker serves Receivers, and the receivers and schedules of the
// features (serveFeatures), until SIGTERM or SIGINT, recording every
// handler start and end and every reply. A handler works for up to
// maxWork; one op in twenty fails its first attempt (and is retried); one
// in a hundred fails for good (a dead letter).
func RunWorker(cfg ProcConfig) error {
	rec, d, err := startProc(cfg)
	if err != nil {
		return err
	}
	defer rec.Close()
	h := workerHandler(d, rec, maxWork, true)
	for _, r := range Receivers {
		if err := d.Handle(r, h, handleOptions()...); err != nil {
			return fmt.Errorf("chaos: worker %s: %w", cfg.Name, err)
		}
	}
	if err := serveFeatures(d, rec, cfg); err != nil {
		return err
	}
	waitSignal(syscall.SIGTERM, syscall.SIGINT)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.Close(ctx)
}

// endCause names why a handler's context ended.
func endCause(ctx context.Context) string {
	cause := context.Cause(ctx)
	switch {
	case errors.Is(cause, disker.ErrLeaseLost):
		return ResultLeaseLost
	case errors.Is(cause, context.DeadlineExceeded):
		return ResultExpired
	case errors.Is(cause, disker.ErrCancelled):
		return ResultCancelled
	}
	return ResultStopped
}

func waitSignal(sigs ...os.Signal) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sigs...)
	<-ch
	signal.Stop(ch)
}

// RunProducer sends until SIGTERM, then waits for its calls in flight
// and keeps settling the shared sender's outcomes until SIGINT. It
// records each send before it begins and its result after.
func RunProducer(cfg ProcConfig) error {
	rec, d, err := startProc(cfg)
	if err != nil {
		return err
	}
	defer rec.Close()
	if err := d.OnReply(Sender, disker.ReplyHandlerFunc(func(_ context.Context, m *disker.Message) {
		result := ResultReply
		if m.Error != nil {
			result = ResultRemoteError
		}
		rec.Record(Event{Kind: KindOutcome, Op: opOfReply(m), ID: m.InReplyTo, Result: result, Reply: string(m.Content)})
	})); err != nil {
		return err
	}
	if err := d.OnTimeout(Sender, disker.TimeoutHandlerFunc(func(_ context.Context, m *disker.Message) {
		rec.Record(Event{Kind: KindOutcome, Op: string(m.Content), ID: m.ID, Result: ResultTimeout})
	})); err != nil {
		return err
	}
	p := &producer{cfg: cfg, d: d, rec: rec}
	sendCtx, stopSending := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for g := range producerConc {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(g)))
		wg.Go(func() { p.loop(sendCtx, rng, g) })
	}
	p.startFeatures(sendCtx, &wg)
	waitSignal(syscall.SIGTERM)
	stopSending()
	wg.Wait()
	rec.Record(Event{Kind: KindIdle})
	waitSignal(syscall.SIGINT, syscall.SIGTERM)
	p.results.lookUp(d, rec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return d.Close(ctx)
}

// opOfReply gives the op a reply answers: the worker replies with the op.
func opOfReply(m *disker.Message) string {
	if m.Error != nil {
		// A dead letter's error reply carries no content: the harness
		// matches it by the request's id.
		return "id:" + m.InReplyTo
	}
	return string(m.Content)
}

type producer struct {
	cfg     ProcConfig
	d       *disker.Disker
	rec     *Recorder
	results retainedOps // the retained messages (results.go)
}

// loop runs operations until ctx ends: a mix of fire-and-forget sends,
// timed sends, requests and batches.
func (p *producer) loop(ctx context.Context, rng *rand.Rand, g int) {
	for n := 0; ctx.Err() == nil; n++ {
		op := fmt.Sprintf("%s-%d-%d", p.cfg.Name, g, n)
		receiver := Receivers[rng.IntN(len(Receivers))]
		timeout := minTimeout + time.Duration(rng.Int64N(int64(maxTimeout-minTimeout)))
		switch k := rng.IntN(20); {
		case k < 5:
			p.send(op, receiver, ModeFireAndForget, 0)
		case k < 11:
			p.send(op, receiver, ModeTimed, timeout)
		case k < 17:
			p.request(op, receiver, timeout)
		case k < 19:
			p.batch(op, receiver)
		default:
			p.delayed(ctx, rng, op, receiver)
		}
		time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond) // pacing
	}
}

func (p *producer) send(op, receiver, mode string, timeout time.Duration) {
	// A message without a Sender is fire-and-forget.
	msg := disker.Message{Receiver: receiver, Content: []byte(op)}
	var opts []disker.SendOption
	if mode != ModeFireAndForget {
		msg.Sender = Sender
		opts = append(opts, disker.WithTimeout(timeout))
		opts = append(opts, retention(op)...)
	}
	p.rec.Record(Event{Kind: KindSend, Op: op, Mode: mode, Timeout: int64(timeout)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := p.d.Send(ctx, msg, opts...)
	if err != nil {
		p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: err.Error()})
		return
	}
	p.rec.Record(Event{Kind: KindSent, Op: op, ID: id})
	if mode != ModeFireAndForget {
		p.results.keep(op, receiver, id)
	}
}

// delayed sends a fire-and-forget message WithDelay (1 to 300ms), and
// cancels one in three of them, at a random moment around its due time.
func (p *producer) delayed(ctx context.Context, rng *rand.Rand, op, receiver string) {
	delay := time.Millisecond + time.Duration(rng.Int64N(int64(300*time.Millisecond)))
	cancelAfter := time.Duration(-1)
	if rng.IntN(3) == 0 {
		cancelAfter = time.Duration(rng.Int64N(int64(delay * 3 / 2)))
	}
	p.rec.Record(Event{Kind: KindSend, Op: op, Mode: ModeDelayed, Timeout: int64(delay)})
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := p.d.Send(sctx, disker.Message{Receiver: receiver, Content: []byte(op)}, disker.WithDelay(delay))
	if err != nil {
		p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: err.Error()})
		return
	}
	p.rec.Record(Event{Kind: KindSent, Op: op, ID: id})
	if cancelAfter < 0 {
		return
	}
	select {
	case <-time.After(cancelAfter):
	case <-ctx.Done():
		return
	}
	p.rec.Record(Event{Kind: KindCancelCall, Op: op, ID: id})
	res, err := p.d.Cancel(sctx, receiver, id)
	e := Event{Kind: KindCancel, Op: op, ID: id}
	switch {
	case err != nil:
		e.Result, e.Err = ResultError, err.Error()
	case res == disker.CancelDeferred:
		e.Result = CancelDeferred
	case res == disker.CancelQueued:
		e.Result = CancelQueued
	case res == disker.CancelInFlight:
		e.Result = CancelInFlight
	default:
		e.Result = CancelNotFound
	}
	p.rec.Record(e)
}

func (p *producer) request(op, receiver string, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	dl, _ := ctx.Deadline()
	p.rec.Record(Event{Kind: KindSend, Op: op, Mode: ModeRequest, Timeout: int64(timeout), Deadline: dl.UnixNano()})
	reply, err := p.d.Request(ctx, disker.Message{Receiver: receiver, Content: []byte(op)}, retention(op)...)
	var remote *disker.RemoteError
	switch {
	case err == nil:
		p.rec.Record(Event{Kind: KindOutcome, Op: op, ID: reply.InReplyTo, Result: ResultReply, Reply: string(reply.Content)})
		p.results.keep(op, receiver, reply.InReplyTo)
	case errors.Is(err, disker.ErrTimeout):
		p.rec.Record(Event{Kind: KindOutcome, Op: op, Result: ResultTimeout, Err: err.Error()})
	case errors.As(err, &remote):
		p.rec.Record(Event{Kind: KindOutcome, Op: op, Result: ResultRemoteError, Err: err.Error()})
		p.results.keep(op, receiver, remote.MessageID)
	default:
		// Not sent (Redis unreachable at once), or its outcome unknown
		// (ErrOutcomeUnknown: Redis did not answer in time to settle it):
		// nothing can be demanded of it.
		p.rec.Record(Event{Kind: KindSendFailed, Op: op, Err: err.Error()})
	}
}

func (p *producer) batch(op, receiver string) {
	p.sendBatch(receiver, burst(op, batchSize, ModeBatch, ""))
}
