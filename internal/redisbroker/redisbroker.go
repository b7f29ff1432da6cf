// Package redisbroker is the Redis engine of Disker: a [broker.Broker] over
// Redis Streams with consumer groups, where every state change that must be
// atomic is one Lua script and every time that decides an outcome is Redis
// server time. It talks to Redis with rueidis, which pipelines concurrent
// commands on a few shared connections; the blocking reads of all the
// receivers and reply streams of one consumer share one dedicated
// connection (a read hub, hub.go), so that no number of blocked receivers
// can starve sends, and the connections stay few.
//
// The key schema and the scripts are described in README.md next to this
// file.
package redisbroker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/bits"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// Defaults of the Config fields.
const (
	DefaultKeyPrefix              = "disker"
	DefaultMaxConnectionPoolSize  = 4
	DefaultMaxBlockingConnections = 1024
	DefaultMaxMessageSize         = 1 << 20
	DefaultDialTimeout            = 5 * time.Second
	DefaultIOTimeout              = 10 * time.Second
)

// Config configures a Broker. Only URL is required.
type Config struct {
	// URL is the Redis address: "redis://[user:password@]host[:port][/db]",
	// or "rediss://..." for TLS. The user and password are sent with AUTH
	// (ACL); db selects the database, 0 by default; the port defaults to
	// 6379. Query options of rueidis.ParseURL (for instance
	// "?master_set=NAME" for Sentinel, "&addr=host:port" for more seeds)
	// are honoured, except skip_verify, which is refused (verification is
	// turned off only by TLSConfig.InsecureSkipVerify).
	URL string
	// MaxConnectionPoolSize bounds the connections that carry ordinary
	// commands, which rueidis pipelines automatically. The broker uses the
	// largest power of two that is at most this, at most GOMAXPROCS and at
	// most 4: with pipelining, more connections only make smaller batches.
	// 0 means DefaultMaxConnectionPoolSize. Blocking reads never use these
	// connections.
	MaxConnectionPoolSize int
	// MaxBlockingConnections bounds the dedicated connections of blocking
	// reads, per server: those of the read hubs, which multiplex the
	// blocking reads of Fetch and ReadReplies (one hub per consumer name
	// and, on a Cluster, per slot), and those of ReadInbox. A hub beyond
	// the bound waits for a connection, and its waiters return empty at
	// their block time; ordinary commands are never affected. 0 means
	// DefaultMaxBlockingConnections.
	MaxBlockingConnections int
	// KeyPrefix starts every key; default "disker". It must not contain
	// braces (they would change the hash tags).
	KeyPrefix string
	// MaxMessageSize is the largest Content, in bytes, that Send and Reply
	// accept; 0 means DefaultMaxMessageSize.
	MaxMessageSize int
	// MaxResultBytes caps the bytes of the final results retained per
	// receiver (broker.Results): over it, those closest to the end of
	// their retention are evicted first. 0 means
	// broker.DefaultMaxResultBytes.
	MaxResultBytes int64
	// DialTimeout bounds a connection attempt; 0 means DefaultDialTimeout.
	DialTimeout time.Duration
	// IOTimeout bounds how long a command waits for Redis to answer on a
	// live connection (blocking reads wait their block time on top); 0 means
	// DefaultIOTimeout. With it, calls fail instead of hanging on a Redis
	// that stopped answering.
	IOTimeout time.Duration
	// TLSConfig, if set, is used for rediss:// URLs instead of the default
	// (system roots, server name from the URL).
	TLSConfig *tls.Config
}

// reclaimEvery is how often, at most, one broker runs the fetch script
// (reclaim of expired leases and due retries) for one busy stream (see
// idleReclaimMax); fetches in between only read new entries. A lease that expired, or a retry that came
// due, is redelivered up to this much later (plus the block time of a
// fetch that is waiting in Redis). A Retry through this broker makes its
// next fetch of that queue reclaim at once.
const reclaimEvery = 100 * time.Millisecond

// idleReclaimMax bounds the period of the fetch script's reclaim of a quiet
// stream: one that, at the last run of the script through this broker,
// had no pending entry (leased to anybody), no retry waiting and no entry
// at another priority level, and of which this broker has fetched nothing
// since. Such a stream runs the script at once when a worker leaves the
// registry or a message is queued at another priority level (the reclaim
// epoch: see Heartbeat), and otherwise, instead of every reclaimEvery,
// once per lease of its fetches, at most every idleReclaimMax; a queue
// fetched by a broker that heartbeats, with a lease at least its
// heartbeat's ttl, not by time at all: a dead holder of its entries leaves
// the registry before its lease would run out (see planFetch).
const idleReclaimMax = 30 * time.Second

// pruneIdle is how long a consumer of a group must have held nothing and
// been idle before a fetch deletes it; pruneEvery is how often one broker
// checks a stream for such consumers.
const (
	pruneIdle  = time.Hour
	pruneEvery = time.Minute
)

// Broker is a [broker.Broker] over Redis. It is safe for concurrent use.
type Broker struct {
	client  rueidis.Client
	keys    keys
	addr    string
	maxSize int
	cluster bool
	// maxResults is Config.MaxResultBytes, as a script argument.
	maxResults string
	// batchSweeps paces the hand-over of batch outboxes by Fetch.
	batchSweeps batchSweeps

	// reclaimEvery, pruneIdle and pruneEvery are the constants of those
	// names, but for tests.
	reclaimEvery time.Duration
	pruneIdle    time.Duration
	pruneEvery   time.Duration
	// streams keeps, per stream this broker fetches (a queue or a reply
	// stream, up to streamsKept), its keys, made at the first fetch so
	// that a fetch builds no key, and what decides how its next fetch
	// reads: see streamState.
	streams streamTable
	// reclaimEpoch is the reclaim epoch (keys.reclaimEpoch) + 1, as the
	// last heartbeat read it (0: none read yet): when it changes, every
	// stream reclaims at its next fetch (see Heartbeat).
	reclaimEpoch atomic.Int64
	// departed is the workers that left the registry, each followed by
	// when it left, as the last heartbeat read them (see keys.departed).
	departed atomic.Pointer[[]string]
	// heartbeatTTL is the ttl of this broker's last heartbeat, ns (0: it
	// made none): how soon, about, a dead holder of a queue's entries
	// leaves the registry (see fetchInputs.watched).
	heartbeatTTL atomic.Int64
	// sendQueues keeps the (normal level) queue keys of the receivers this
	// broker sends to, inboxReplies the reply-stream keys of the inboxes
	// it replies to or reads.
	sendQueues, inboxReplies nameCache[string]

	// offset is Redis time minus local time, from the readings of Now
	// (broker.Offset keeps the tightest): the clock of SendRequest, and of
	// Local.
	offset broker.Offset
	// cursors maps an inbox to its *inboxCursor: the id of the last entry
	// ReadInbox read.
	cursors sync.Map
	// replyCursors maps a reply stream to its *replyCursor: what
	// ReadReplies handed on of it (see recoverReplies).
	replyCursors sync.Map
	// lostReads counts the calls that failed without an answer from
	// Redis (a broken or closed connection): a read of a group's entries
	// among them may have been served, its entries delivered to the
	// consumer and never received. ReadReplies reads its consumer's
	// pending entries again when it changed (recoverReplies).
	lostReads atomic.Uint64

	// replies batches the timed replies.
	replies *batcher[timedReply, replyResult]
	// inboxWrites batches the writes of requests from inboxes: see doInbox.
	inboxWrites *batcher[rueidis.Completed, inboxResult]

	// hubs multiplex the blocking reads of Fetch and ReadReplies: one per
	// consumer (and Cluster slot), see hub.go. hubsWG counts their
	// goroutines; after Close (hubsClosed) none starts.
	hubsMu     sync.Mutex
	hubs       map[hubKey]*hub
	hubsClosed bool
	hubsWG     sync.WaitGroup
	// direct holds a token per blocking read made on its own connection
	// instead of through a hub (see directRead); nil: none (tests of the
	// hubs).
	direct    chan struct{}
	ioTimeout time.Duration
	parkFor   time.Duration // parkFor, but for tests

	closed    atomic.Bool
	closeOnce sync.Once
	// closing ends at Close, to wake blocked reads: rueidis does not end
	// commands in progress on its dedicated connections when it closes.
	closing     context.Context
	stopClosing context.CancelFunc
	// blocking holds the cancels of the blocking reads in progress
	// (blockingCtx), which Close calls.
	blocking blockingReads
}

var _ broker.Broker = (*Broker)(nil)

// New connects to Redis and returns a Broker. It fails with an error
// wrapping broker.ErrUnavailable when Redis cannot be reached.
func New(cfg Config) (*Broker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if u, err := url.Parse(cfg.URL); err == nil && u.Query().Has("skip_verify") {
		return nil, errors.New("redisbroker: Config.URL: the skip_verify parameter would turn TLS verification off silently and is refused; set Config.TLSConfig with InsecureSkipVerify to choose that")
	}
	opt, err := rueidis.ParseURL(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("redisbroker: Config.URL: %s", strings.TrimPrefix(err.Error(), "redis: "))
	}
	if cfg.TLSConfig != nil && opt.TLSConfig != nil {
		opt.TLSConfig = cfg.TLSConfig.Clone()
	}
	opt.ClientName = "disker"
	opt.DisableCache = true
	opt.DisableRetry = true // fail fast; callers back off and try again
	opt.AlwaysPipelining = true
	opt.PipelineMultiplex = pipelineMultiplex(cfg.MaxConnectionPoolSize, runtime.GOMAXPROCS(0))
	opt.BlockingPoolSize = cfg.MaxBlockingConnections
	opt.RingScaleEachConn = ringScale

	opt.Dialer.Timeout = cfg.DialTimeout
	opt.ConnWriteTimeout = cfg.IOTimeout
	b := &Broker{
		keys:         keys{prefix: cfg.KeyPrefix},
		addr:         strings.Join(opt.InitAddress, ","),
		maxSize:      cfg.MaxMessageSize,
		maxResults:   strconv.FormatInt(cfg.MaxResultBytes, 10),
		reclaimEvery: reclaimEvery,
		pruneIdle:    pruneIdle,
		pruneEvery:   pruneEvery,
		hubs:         make(map[hubKey]*hub),
		direct:       make(chan struct{}, directReads),
		ioTimeout:    cfg.IOTimeout,
		parkFor:      parkFor,
	}
	b.replies = newBatcher(maxBatch/2, b.flushReplies, func(v any) replyResult {
		return replyResult{err: fmt.Errorf("redisbroker: reply: panic: %v", v)}
	}).withOwnItems()
	b.inboxWrites = newBatcher(maxBatch, b.flushInbox, func(v any) inboxResult {
		return inboxResult{err: fmt.Errorf("redisbroker: panic: %v", v)}
	}).withOwnItems()
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, b.fail(context.Background(), "connect", err)
	}
	b.client = client
	b.closing, b.stopClosing = context.WithCancel(context.Background())
	b.cluster = client.Mode() == rueidis.ClientModeCluster
	return b, nil
}

// ringScale is rueidis's RingScaleEachConn: every connection, each
// dedicated one of a blocking read included, gets a ring of 2^ringScale
// slots, each with a sync.Cond and a channel. With rueidis's default, 10,
// creating the connections took most of the CPU of a test with 1,000
// senders that each read their replies, when each held a blocking
// connection of its own (before the read hubs); 8 makes them cheaper and
// leaves the benchmarks level. A blocking connection carries one command at a
// time, and the pipelined ones hold 256 calls in flight each (a DoMulti
// is one), beyond which callers wait.
const ringScale = 8

// pipelineMultiplex returns rueidis's PipelineMultiplex (log2 of the number
// of pipelined connections) for at most maxConns connections: the largest
// power of two <= maxConns, and no more than rueidis would choose for procs
// CPUs (one per CPU, at most 4), since with automatic pipelining more
// connections than CPUs only make smaller batches. rueidis reads 0 as "its
// default", so one connection is -1.
func pipelineMultiplex(maxConns, procs int) int {
	n := min(maxConns, procs, 4)
	m := bits.Len(uint(max(n, 1))) - 1
	if m == 0 {
		return -1
	}
	return m
}

func (c Config) withDefaults() (Config, error) {
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.MaxConnectionPoolSize == 0 {
		c.MaxConnectionPoolSize = DefaultMaxConnectionPoolSize
	}
	if c.MaxBlockingConnections == 0 {
		c.MaxBlockingConnections = DefaultMaxBlockingConnections
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = broker.DefaultMaxResultBytes
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.IOTimeout == 0 {
		c.IOTimeout = DefaultIOTimeout
	}
	invalid := func(field, format string, args ...any) error {
		return fmt.Errorf("redisbroker: Config.%s: %s", field, fmt.Sprintf(format, args...))
	}
	switch {
	case c.MaxConnectionPoolSize < 0:
		return c, invalid("MaxConnectionPoolSize", "must be >= 0, got %d", c.MaxConnectionPoolSize)
	case c.MaxBlockingConnections < 0:
		return c, invalid("MaxBlockingConnections", "must be >= 0, got %d", c.MaxBlockingConnections)
	case c.MaxResultBytes < 0:
		return c, invalid("MaxResultBytes", "must be >= 0, got %d", c.MaxResultBytes)
	case c.MaxMessageSize < 0:
		return c, invalid("MaxMessageSize", "must be >= 0, got %d", c.MaxMessageSize)
	case c.DialTimeout < 0:
		return c, invalid("DialTimeout", "must be >= 0, got %v", c.DialTimeout)
	case c.IOTimeout < 0:
		return c, invalid("IOTimeout", "must be >= 0, got %v", c.IOTimeout)
	case strings.ContainsAny(c.KeyPrefix, "{}"):
		return c, invalid("KeyPrefix", "%q must not contain braces", c.KeyPrefix)
	}
	if c.URL == "" {
		return c, invalid("URL", "empty; want redis://host:port/db or rediss://...")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		// url's error repeats the URL, password included: keep only the cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return c, invalid("URL", "%v", err)
	}
	switch u.Scheme {
	case "redis", "rediss":
	default:
		return c, invalid("URL", "scheme %q is not redis:// or rediss://", u.Scheme)
	}
	if u.Hostname() == "" {
		return c, invalid("URL", "%q has no host", u.Redacted())
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return c, invalid("URL", "port %q is not in 1..65535", p)
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if n, err := strconv.Atoi(db); err != nil || n < 0 {
			return c, invalid("URL", "database %q is not a number >= 0", db)
		}
	}
	return c, nil
}

// Close closes the connections. Calls in progress fail; later calls return
// broker.ErrClosed. It is safe to call more than once.
func (b *Broker) Close() error {
	b.closeOnce.Do(func() {
		b.closed.Store(true)
		b.hubsMu.Lock()
		b.hubsClosed = true
		b.hubsMu.Unlock()
		b.stopClosing()
		b.blocking.close()
		b.hubsWG.Wait() // their reads end with closing
		b.client.Close()
	})
	return nil
}

// Now returns Redis server time.
func (b *Broker) Now(ctx context.Context) (time.Time, error) {
	if err := b.check(); err != nil {
		return time.Time{}, err
	}
	sent := time.Now()
	v, err := b.client.Do(ctx, b.client.B().Time().Build()).AsStrSlice()
	if err != nil {
		return time.Time{}, b.fail(ctx, "now", err)
	}
	got := time.Now()
	if len(v) != 2 {
		return time.Time{}, fmt.Errorf("redisbroker: now: TIME answered %q", v)
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	usec, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("redisbroker: now: TIME answered %q", v)
	}
	now := time.Unix(sec, usec*1000)
	b.offset.Measure(sent, now, got)
	return now, nil
}

// Local turns Redis time t into local time (see broker.Clock).
func (b *Broker) Local(t time.Time) time.Time { return b.offset.Local(t) }

// estimateNow returns Redis time as the offset estimates it from the
// readings of Now, calling Now if none was made.
func (b *Broker) estimateNow(ctx context.Context) (time.Time, error) {
	if now, ok := b.offset.Estimate(); ok {
		return now, nil
	}
	return b.Now(ctx)
}

func (b *Broker) check() error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	return nil
}

// unavailableError is a failure to reach Redis.
type unavailableError struct {
	op, addr string
	err      error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("redisbroker: %s: Redis at %s is unreachable: %v", e.op, e.addr, e.err)
}

func (e *unavailableError) Unwrap() error { return e.err }

func (e *unavailableError) Is(target error) bool { return target == broker.ErrUnavailable }

// fail turns an error of rueidis into the broker's: broker.ErrClosed after
// Close, the context's error when ctx ended, an error wrapping
// broker.ErrUnavailable when Redis cannot be reached (or is loading its
// data), and a prefixed error otherwise.
func (b *Broker) fail(ctx context.Context, op string, err error) error {
	if b.closed.Load() {
		return broker.ErrClosed
	}
	if _, answered := rueidis.IsRedisErr(err); !answered {
		b.lostReads.Add(1) // see recoverReplies
	}
	if ctx.Err() != nil {
		return fmt.Errorf("redisbroker: %s: %w", op, ctx.Err())
	}
	if dl, ok := ctx.Deadline(); ok && errors.Is(err, context.DeadlineExceeded) && !time.Now().Before(dl) {
		// rueidis timed out at ctx's deadline a moment before ctx's own
		// timer ended it: that is ctx's error, not an unreachable Redis.
		return fmt.Errorf("redisbroker: %s: %w", op, context.DeadlineExceeded)
	}
	if re, ok := rueidis.IsRedisErr(err); ok {
		msg := re.Error()
		if re.IsLoading() || re.IsTryAgain() || re.IsClusterDown() || strings.HasPrefix(msg, "MASTERDOWN") || isCredentialErr(msg) {
			return &unavailableError{op: op, addr: b.addr, err: err}
		}
		return fmt.Errorf("redisbroker: %s: %w", op, err)
	}
	return &unavailableError{op: op, addr: b.addr, err: err}
}

// isCredentialErr reports an error reply that refuses the connection's
// credentials (a password rotated, a user disabled, a permission revoked
// under a running instance): Redis is there but cannot be used with them,
// which the caller should treat as unavailable, not as its own mistake.
func isCredentialErr(msg string) bool {
	for _, p := range []string{"WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// ms returns d in whole milliseconds, at least 1 for a positive d.
func ms(d time.Duration) int64 {
	n := d.Milliseconds()
	if n == 0 && d > 0 {
		n = 1
	}
	return n
}

func msString(d time.Duration) string { return strconv.FormatInt(ms(d), 10) }

func unixMS(s string) (time.Time, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}

// isNoGroup reports a NOGROUP error: the stream or its group is gone.
func isNoGroup(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(re.Error(), "NOGROUP")
}

// maxBatch bounds the ids passed to one script call (Lua's unpack has a
// limit near 8000).
const maxBatch = 1000

func (b *Broker) failIf(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	return b.fail(ctx, op, err)
}
