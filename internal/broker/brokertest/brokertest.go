// Package brokertest is the conformance suite of [broker.Broker]: every
// broker (internal/redisbroker, internal/membroker) runs [Run] in its tests,
// so that both keep the same delivery contract.
//
// The suite waits for expiries by polling with a deadline, never by
// sleeping for an event, and asserts no timings: leases and timeouts are
// short (a few hundred milliseconds) and each check waits up to [Patience].
package brokertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// MaxMessageSize is the largest message content the suite expects a broker
// to accept: the broker newBroker returns must reject content of more than
// MaxMessageSize bytes (the default limit of both brokers is 1 MiB).
const MaxMessageSize = 1 << 20

// Patience is how long the suite waits for something that must happen (a
// lease to expire, a blocked call to return) before it fails.
const Patience = 15 * time.Second

// RawInjector is implemented by brokers that can append raw bytes to a
// receiver's queue in place of an encoded message, as a corrupt or foreign
// writer might. The suite requires it, to show that an entry that does not
// decode is dead-lettered and the consumer carries on.
type RawInjector interface {
	// InjectRaw appends an entry whose encoded message is raw to
	// receiver's queue.
	InjectRaw(ctx context.Context, receiver string, raw []byte) error
}

// Run runs the conformance suite against the brokers newBroker returns. It
// calls newBroker once per subtest, with the subtest's t; subtests run in
// parallel and use names of their own, so brokers may share one store. Run
// closes each broker when its subtest ends (Close must be idempotent).
func Run(t *testing.T, newBroker func(t *testing.T) broker.Broker) {
	tests := []struct {
		name string
		run  func(t *testing.T, b broker.Broker)
	}{
		{"Now", testNow},
		{"SendFetchAck", testSendFetchAck},
		{"SendValidation", testSendValidation},
		{"InvalidParams", testInvalidParams},
		{"SendBatch", testSendBatch},
		{"FetchOrderAndMax", testFetchOrderAndMax},
		{"FetchEmpty", testFetchEmpty},
		{"FetchWokenBySend", testFetchWokenBySend},
		{"FetchCancelled", testFetchCancelled},
		{"FetchWake", testFetchWake},
		{"FetchWakeBlockEnds", testFetchWakeBlockEnds},
		{"FetchWakeCancel", testFetchWakeCancel},
		{"FetchWakeClose", testFetchWakeClose},
		{"CompetingConsumers", testCompetingConsumers},
		{"LeaseExpiryRedelivers", testLeaseExpiryRedelivers},
		{"HolderLeaseDecides", testHolderLeaseDecides},
		{"HeartbeatLapse", testHeartbeatLapse},
		{"ExtendKeepsLease", testExtendKeepsLease},
		{"ExtendReportsLost", testExtendReportsLost},
		{"AckIdempotent", testAckIdempotent},
		{"RetryWithDelay", testRetryWithDelay},
		{"MaxAttemptsDeadLetters", testMaxAttemptsDeadLetters},
		{"DeadLetterRetryPurge", testDeadLetterRetryPurge},
		{"RetryAllDeadLetters", testRetryAllDeadLetters},
		{"UndecodableEntry", testUndecodableEntry},
		{"TimedReplyAccepted", testTimedReplyAccepted},
		{"LateReplyGetsTimeoutNotice", testLateReply},
		{"ExpireTimeoutsMax", testExpireTimeoutsMax},
		{"NoTimeoutBeforeDeadline", testNoTimeoutBeforeDeadline},
		{"InboxReply", testInboxReply},
		{"InboxGiveUp", testInboxGiveUp},
		{"InboxReplyRacesGiveUp", testInboxReplyRacesGiveUp},
		{"ReplyRacesTimeout", testReplyRacesTimeout},
		{"ReplyStreamConsumers", testReplyStreamConsumers},
		{"ReadRepliesWokenByReply", testReadRepliesWoken},
		{"InboxLapses", testInboxLapses},
		{"InboxRefresh", testInboxRefresh},
		{"InboxClose", testInboxClose},
		{"Streams", testStreams},
		{"StreamsSettled", testStreamsSettled},
		{"Lock", testLock},
		{"Workers", testWorkers},
		{"Receivers", testReceivers},
		{"Stats", testStats},
		{"StatsMany", testStatsMany},
		{"OldestQueued", testOldestQueued},
		{"Fate", testFate},
		{"DeadLettersAfter", testDeadLettersAfter},
		{"Dedup", testDedup},
		{"DedupUntilSettled", testDedupUntilSettled},
		{"Debounce", testDebounce},
		{"Pause", testPause},
		{"Idempotency", testIdempotency},
		{"IdempotencyLateRun", testIdempotencyLateRun},
		{"Priorities", testPriorities},
		{"PriorityReclaim", testPriorityReclaim},
		{"Tokens", testTokens},
		{"Slots", testSlots},
		{"RetryUncounted", testRetryUncounted},
		{"Deferred", testDeferred},
		{"DeferredPast", testDeferredPast},
		{"DeferredValidation", testDeferredValidation},
		{"DeferredNeverEarly", testDeferredNeverEarly},
		{"Expiry", testExpiry},
		{"SendProduct", testSendProduct},
		{"Results", testResults},
		{"ResultsExpire", testResultsExpire},
		{"ResultsRace", testResultsRace},
		{"ResultsInboxReply", testResultsInboxReply},
		{"ResultsStreamReply", testResultsStreamReply},
		{"ResultsLeasesLost", testResultsLeasesLost},
		{"BatchLeasesLost", testBatchLeasesLost},
		{"Cancel", testCancel},
		{"Batches", testBatches},
		{"BatchEdges", testBatchEdges},
		{"BatchIndex", testBatchIndex},
		{"BatchCancelledFlag", testBatchCancelledFlag},
		{"BatchChains", testBatchChains},
		{"BatchGroups", testBatchGroups},
		{"BatchGroupChain", testBatchGroupChain},
		{"NothingLeftBehind", testNothingLeftBehind},
		{"Close", testClose},
		{"SchedulePutList", testSchedulePutList},
		{"ScheduleTickOnce", testScheduleTickOnce},
		{"ScheduleMissed", testScheduleMissed},
		{"ScheduleTaken", testScheduleTaken},
		{"ScheduleInvalid", testScheduleInvalid},
		{"GroupsOrder", testGroupsOrder},
		{"GroupsConcurrency", testGroupsConcurrency},
		{"GroupsRetry", testGroupsRetry},
		{"GroupsSettle", testGroupsSettle},
		{"GroupsDeferred", testGroupsDeferred},
		{"GroupsLease", testGroupsLease},
		{"GroupsPriority", testGroupsPriority},
		{"GroupsRate", testGroupsRate},
		{"GroupsInvalid", testGroupsInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := newBroker(t)
			t.Cleanup(func() { _ = b.Close() })
			tc.run(t, b)
		})
	}
}

// Durations used across the suite.
const (
	shortLease = 200 * time.Millisecond // a lease the suite waits out
	longLease  = time.Minute            // a lease that does not expire during a test
	pollBlock  = 50 * time.Millisecond  // the block of each try of a polling read
	blockLong  = time.Minute            // a block that only an event ends
)

// name returns a receiver or sender name unique to this run.
func name(kind string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "bt-" + kind + "-" + hex.EncodeToString(b[:])
}

// newEnv returns a message for receiver from a named sender, with a fresh
// id, content and headers.
func newEnv(receiver, content string) *broker.Envelope {
	return &broker.Envelope{
		ID:       name("msg"),
		Sender:   name("sender"),
		Receiver: receiver,
		Content:  []byte(content),
		Headers:  map[string]string{"k": "v", "content": content},
		Route:    broker.RouteSender,
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*Patience)
	t.Cleanup(cancel)
	return ctx
}

// sameEnv reports whether two envelopes are equal, taking nil and empty
// content or headers as equal.
func sameEnv(a, b broker.Envelope) bool {
	return a.ID == b.ID && a.Sender == b.Sender && a.Receiver == b.Receiver &&
		bytes.Equal(a.Content, b.Content) && maps.Equal(a.Headers, b.Headers) &&
		a.Route == b.Route && a.Timeout == b.Timeout &&
		a.InReplyTo == b.InReplyTo && a.ErrorCode == b.ErrorCode && a.ErrorText == b.ErrorText &&
		a.IdempotencyKey == b.IdempotencyKey &&
		a.Priority == b.Priority
}

func checkEnv(t *testing.T, what string, got broker.Envelope, want *broker.Envelope) {
	t.Helper()
	if !sameEnv(got, *want) {
		t.Fatalf("%s: got envelope %+v, want %+v", what, got, *want)
	}
}

// eventually polls cond until it holds, failing after Patience.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Patience)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", Patience, what)
		}
		<-tick.C
	}
}

// waitBrokerTime polls the broker's clock until it reaches at.
func waitBrokerTime(t *testing.T, b broker.Broker, at time.Time) {
	t.Helper()
	ctx := ctxT(t)
	eventually(t, "broker time "+at.String(), func() bool {
		now, err := b.Now(ctx)
		if err != nil {
			t.Fatalf("Now: %v", err)
		}
		return !now.Before(at)
	})
}

// send sends env, due now and with no key, and returns its deadline.
func send(t *testing.T, b broker.Broker, env *broker.Envelope) time.Time {
	t.Helper()
	return sendP(t, b, broker.SendParams{Env: *env}).Deadline
}

// sendP sends p and returns its result, failing on an error.
func sendP(t *testing.T, b broker.Broker, p broker.SendParams) broker.SendResult {
	t.Helper()
	res, err := broker.SendOne(ctxT(t), b, p)
	if err != nil {
		t.Fatalf("Send %s: %v", p.Env.ID, err)
	}
	return res
}

// sendErr sends p alone and returns the call's error.
func sendErr(ctx context.Context, b broker.Broker, p broker.SendParams) error {
	_, err := broker.SendOne(ctx, b, p)
	return err
}

func fetch(t *testing.T, b broker.Broker, p broker.FetchParams) []broker.Delivery {
	t.Helper()
	ds, err := b.Fetch(ctxT(t), &p)
	if err != nil {
		t.Fatalf("Fetch %s by %s: %v", p.Receiver, p.Consumer, err)
	}
	return ds
}

// fetchOne fetches exactly one delivery without blocking.
func fetchOne(t *testing.T, b broker.Broker, receiver, consumer string, lease time.Duration) broker.Delivery {
	t.Helper()
	ds := fetch(t, b, broker.FetchParams{Receiver: receiver, Consumer: consumer, Max: 10, Block: 0, Lease: lease, MaxAttempts: 10})
	if len(ds) != 1 {
		t.Fatalf("Fetch %s: got %d deliveries, want 1: %+v", receiver, len(ds), ds)
	}
	return ds[0]
}

// pollFetch fetches with short blocks (p.Block) up to 10 deliveries
// (p.Max) until it has one, failing after Patience.
func pollFetch(t *testing.T, b broker.Broker, p broker.FetchParams) []broker.Delivery {
	t.Helper()
	p.Max, p.Block = 10, pollBlock
	var ds []broker.Delivery
	eventually(t, "a delivery of "+p.Receiver+" to "+p.Consumer, func() bool {
		ds = fetch(t, b, p)
		return len(ds) > 0
	})
	return ds
}

func ack(t *testing.T, b broker.Broker, receiver string, refs ...string) {
	t.Helper()
	if err := b.Ack(ctxT(t), receiver, refs...); err != nil {
		t.Fatalf("Ack %s %v: %v", receiver, refs, err)
	}
}

func stats(t *testing.T, b broker.Broker, receiver string) broker.ReceiverStats {
	t.Helper()
	st, err := b.Stats(ctxT(t), receiver)
	if err != nil {
		t.Fatalf("Stats %s: %v", receiver, err)
	}
	return st
}

// checkStats compares the stats of want.Receiver with want's Queued,
// Pending and DeadLetters (Length is their sum).
func checkStats(t *testing.T, b broker.Broker, want broker.ReceiverStats) {
	t.Helper()
	want.Length = want.Queued + want.Pending
	got := stats(t, b, want.Receiver)
	got.OldestQueued = time.Time{} // testOldestQueued checks it
	if got != want {
		t.Fatalf("Stats: got %+v, want %+v", got, want)
	}
}

func deadLetters(t *testing.T, b broker.Broker, receiver string) []broker.DeadLetter {
	t.Helper()
	dls, err := b.DeadLetters(ctxT(t), receiver, 1000)
	if err != nil {
		t.Fatalf("DeadLetters %s: %v", receiver, err)
	}
	return dls
}

func readReplies(t *testing.T, b broker.Broker, p broker.ReadRepliesParams) []broker.Reply {
	t.Helper()
	rs, err := b.ReadReplies(ctxT(t), &p)
	if err != nil {
		t.Fatalf("ReadReplies %s by %s: %v", p.Sender, p.Consumer, err)
	}
	return rs
}

func receivers(t *testing.T, b broker.Broker) map[string]bool {
	t.Helper()
	rs, err := b.Receivers(ctxT(t))
	if err != nil {
		t.Fatalf("Receivers: %v", err)
	}
	set := make(map[string]bool, len(rs))
	for _, r := range rs {
		set[r] = true
	}
	return set
}

// replyTo returns a reply to env from its receiver.
func replyTo(env *broker.Envelope, content string) *broker.Envelope {
	return &broker.Envelope{
		ID:        name("reply"),
		Sender:    env.Receiver,
		Receiver:  env.Sender,
		InReplyTo: env.ID,
		Content:   []byte(content),
		Headers:   map[string]string{"status": "ok"},
	}
}

// errorList gathers the errors of a test's goroutines, which must not call
// t.Fatal themselves.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(err error) {
	l.mu.Lock()
	l.errs = append(l.errs, err)
	l.mu.Unlock()
}

// check fails t with every error gathered, if there is one.
func (l *errorList) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) > 0 {
		t.Fatal(errors.Join(l.errs...))
	}
}
