package disker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/membroker"
	"github.com/diskerhq/disker/internal/redisbroker"
)

// Defaults of the Config fields.
const (
	DefaultMaxConnectionPoolSize   = 4
	DefaultReceiverBlockTimeout    = time.Second
	DefaultTimeoutMonitorFrequency = time.Second
	DefaultKeyPrefix               = "disker"
	DefaultMaxMessageSize          = 1 << 20
	DefaultHeartbeatInterval       = time.Second
	// MaxMessageSizeLimit is the largest MaxMessageSize allowed (Redis's
	// limit on a string is 512 MiB).
	MaxMessageSizeLimit = 256 << 20
)

// Config configures a Disker. The zero Config is valid: it selects the
// embedded in-memory broker with every default.
type Config struct {
	// RedisURL selects the broker: "redis://[user:pass@]host:port/db", or
	// "rediss://..." for TLS. For Redis Cluster, give any nodes, the rest as
	// addr parameters: "redis://host1:6379?addr=host2:6379&addr=host3:6379";
	// the client finds the others. For Redis Sentinel, give the sentinels
	// and the master set: "redis://s1:26379?addr=s2:26379&master_set=NAME".
	// "" or "mem://" or "mem://NAME" selects
	// the embedded in-memory broker: instances in one process with the same
	// NAME share it ("" and "mem://" mean NAME "default"); New logs a line
	// when "" selects it.
	RedisURL string
	// TLSConfig, if set, configures TLS for a "rediss://" RedisURL instead
	// of the default (the system's roots, the server name from the URL):
	// a private CA, a client certificate for a Redis that requires one, a
	// server name. It is ignored for "redis://" and the in-memory broker.
	TLSConfig *tls.Config
	// MaxConnectionPoolSize bounds the connections to Redis that carry the
	// commands, which are pipelined on them: the broker opens the largest
	// power of two that is at most this, at most GOMAXPROCS and at most 4
	// (more connections only make smaller pipelined batches); default 4.
	// The blocking reads of all receivers and reply handlers share one
	// connection of their own (one per slot in use on a Cluster), so no
	// number of receivers starves the others, and the connections stay
	// few.
	MaxConnectionPoolSize int
	// ReceiverBlockTimeout is how long a blocking read waits for messages
	// before it looks again; default 1s.
	ReceiverBlockTimeout time.Duration
	// TimeoutMonitorFrequency is how often the instance settles its senders'
	// expired timeouts; default 1s. A timeout notice comes at most this long
	// after the deadline while the instance that sent the message is alive,
	// and otherwise within 10 times this long while an instance with a
	// handler for the sender is: an instance with more than 100 senders
	// that it has handlers for but sent nothing timed as lately looks at
	// each of them every few periods, so that thousands of idle senders
	// cost the broker a bounded number of calls a period.
	TimeoutMonitorFrequency time.Duration
	// KeyPrefix starts every Redis key; default "disker".
	KeyPrefix string
	// MaxMessageSize is the largest content of a message (and of a reply),
	// in bytes; default 1 MiB, at most MaxMessageSizeLimit.
	MaxMessageSize int
	// MaxResultBytes caps the bytes of the results retained per receiver
	// (WithRetention): over it, the results closest to the end of their
	// retention are evicted first. Default 64 MiB. It is the broker's
	// setting: for the in-memory broker, the first instance's.
	MaxResultBytes int64
	// HeartbeatInterval is how often the instance renews its entry in the
	// registry of workers (Workers); default 1s. An entry lives 3 times this, and a
	// holder whose entry lapsed loses its messages to its peers (at least
	// once), so this bounds how long a dead instance's messages wait.
	HeartbeatInterval time.Duration
	// Logger receives the instance's logs; default slog.Default().
	Logger *slog.Logger
	// OnEvent, if set, observes every step of a message's life in this
	// instance, for metrics. It is called synchronously and must be fast.
	OnEvent func(Event)
	// InstanceID names this instance in the registry of workers and in the
	// broker's consumer groups; default a random id. 1..100 bytes of
	// [A-Za-z0-9._:-]. Two live instances must not share one.
	InstanceID string
}

// withDefaults fills in the defaults and validates the result.
func (c Config) withDefaults() (Config, error) {
	set := func(v *time.Duration, def time.Duration) {
		if *v == 0 {
			*v = def
		}
	}
	if c.MaxConnectionPoolSize == 0 {
		c.MaxConnectionPoolSize = DefaultMaxConnectionPoolSize
	}
	set(&c.ReceiverBlockTimeout, DefaultReceiverBlockTimeout)
	set(&c.TimeoutMonitorFrequency, DefaultTimeoutMonitorFrequency)
	set(&c.HeartbeatInterval, DefaultHeartbeatInterval)
	if c.KeyPrefix == "" {
		c.KeyPrefix = DefaultKeyPrefix
	}
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = DefaultMaxMessageSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.InstanceID == "" {
		c.InstanceID = newID()
	}
	switch {
	case c.MaxConnectionPoolSize < 1:
		return c, invalid("Config.MaxConnectionPoolSize", "must be >= 1, got %d", c.MaxConnectionPoolSize)
	case c.ReceiverBlockTimeout < time.Millisecond:
		return c, invalid("Config.ReceiverBlockTimeout", "must be >= 1ms, got %v", c.ReceiverBlockTimeout)
	case c.TimeoutMonitorFrequency < time.Millisecond:
		return c, invalid("Config.TimeoutMonitorFrequency", "must be >= 1ms, got %v", c.TimeoutMonitorFrequency)
	case c.HeartbeatInterval < time.Millisecond:
		return c, invalid("Config.HeartbeatInterval", "must be >= 1ms, got %v", c.HeartbeatInterval)
	case c.MaxMessageSize < 1 || c.MaxMessageSize > MaxMessageSizeLimit:
		return c, invalid("Config.MaxMessageSize", "must be in 1..%d, got %d", MaxMessageSizeLimit, c.MaxMessageSize)
	case c.MaxResultBytes < 0:
		return c, invalid("Config.MaxResultBytes", "must be >= 0 (0: the default), got %d", c.MaxResultBytes)
	case strings.ContainsAny(c.KeyPrefix, "{} \t\r\n*?[]"):
		return c, invalid("Config.KeyPrefix", "%q must not contain braces, blanks or glob characters", c.KeyPrefix)
	case len(c.InstanceID) > 100:
		return c, invalid("Config.InstanceID", "longer than 100 bytes")
	}
	if r := validName(c.InstanceID); r != "" {
		return c, invalid("Config.InstanceID", "%q %s", c.InstanceID, r)
	}
	if _, _, err := brokerKind(c.RedisURL); err != nil {
		return c, err
	}
	return c, nil
}

// brokerKind tells the embedded broker ("mem", name) from Redis ("redis").
func brokerKind(raw string) (kind, name string, err error) {
	if raw == "" {
		return "mem", "default", nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return "", "", invalid("Config.RedisURL", "%v", err)
	}
	switch u.Scheme {
	case "mem":
		name := u.Host + u.Path
		if name == "" {
			name = "default"
		}
		return "mem", name, nil
	case "redis", "rediss":
		if u.Host == "" {
			return "", "", invalid("Config.RedisURL", "%q has no host", raw)
		}
		return "redis", "", nil
	default:
		return "", "", invalid("Config.RedisURL", "scheme %q is not redis://, rediss:// or mem://", u.Scheme)
	}
}

// openBroker connects to the broker cfg selects.
func openBroker(ctx context.Context, cfg Config) (broker.Broker, error) {
	kind, name, err := brokerKind(cfg.RedisURL)
	if err != nil {
		return nil, err
	}
	if kind == "mem" {
		return membroker.Shared(name, membroker.Options{MaxMessageSize: cfg.MaxMessageSize, MaxResultBytes: cfg.MaxResultBytes}), nil
	}
	rcfg := redisbroker.Config{
		URL:                   cfg.RedisURL,
		MaxConnectionPoolSize: cfg.MaxConnectionPoolSize,
		KeyPrefix:             cfg.KeyPrefix,
		MaxMessageSize:        cfg.MaxMessageSize,
		MaxResultBytes:        cfg.MaxResultBytes,
		TLSConfig:             cfg.TLSConfig,
	}
	// The Redis client connects without a context, bounded by its dial
	// and I/O timeouts: connect on the side, and give up when ctx ends
	// first, leaving the attempt to close what it opens.
	type opened struct {
		b   *redisbroker.Broker
		err error
	}
	done := make(chan opened, 1)
	go func() {
		b, err := redisbroker.New(rcfg)
		done <- opened{b, err}
	}()
	select {
	case o := <-done:
		if o.err != nil {
			return nil, o.err
		}
		return o.b, nil
	case <-ctx.Done():
		go func() {
			if o := <-done; o.err == nil {
				_ = o.b.Close()
			}
		}()
		return nil, fmt.Errorf("disker: connect: %w: %w", ErrUnavailable, context.Cause(ctx))
	}
}

// Disker is a connection to a broker through which a process sends messages,
// serves receivers, and receives replies and timeout notices. It is safe for
// concurrent use. One per process is the normal use; several are allowed.
type Disker struct {
	cfg     Config
	b       broker.Broker
	log     *slog.Logger
	onEvent func(Event)
	id      string
	host    string
	started time.Time

	health  health
	monitor *monitor
	// manual is set on an instance that the test kit drives by hand
	// (manual.go): its loops of receivers, reply streams, schedules and
	// timeouts run when the kit says, not in goroutines of their own.
	manual bool
	// beatNow asks the heartbeat loop for a heartbeat at once (a receiver
	// was added); the requests made while one runs make one more.
	beatNow chan struct{}

	bgCtx    context.Context // ends when Close stops the background loops
	bgCancel context.CancelFunc
	opCtx    context.Context // for settling deliveries; ends when Close is done with the broker
	opCancel context.CancelFunc
	wg       sync.WaitGroup // background goroutines
	closed   atomic.Bool
	closing  chan struct{} // closed when Close starts
	done     chan struct{} // closed when Close is done
	closeErr error

	mu         sync.Mutex
	consumers  map[string]*consumer
	starts     loopStarts     // the fetch loops' first runs
	unhandling sync.WaitGroup // Unhandle calls in progress
	senders    map[string]*senderHandlers

	rq *requester // Request's side: the inbox
	// remote is set when the broker is across a network (Redis): sends
	// and Requests then run their broker I/O apart from their caller,
	// which goes on by its bound whatever the connection does
	// (sendApart); the in-memory broker answers at once.
	remote bool
	sends  detachedCalls // the sends run apart from their callers (sendApart)
	tk     *ticker       // the schedules' loop, once started (schedule.go); guarded by mu

	answered sync.Map // message id -> struct{}: answered with Reply from this instance
	// sentReplies: message id -> *broker.Envelope, the reply accepted from
	// this instance for a retained message whose final outcome it has not
	// recorded yet (see priorReply).
	sentReplies sync.Map

	sent, replied, late, timedOut atomic.Int64
	unhandledReplies              atomic.Int64 // see LocalStats.UnhandledReplies
}

// New connects to the broker that cfg selects and starts the instance: the
// timeout monitor and the heartbeat of the registry of workers. It fails
// with a *ValidationError for a bad Config, and with an error wrapping
// ErrUnavailable when the broker cannot be reached.
//
// Connecting to Redis blocks until Redis answers, for at most 10 seconds
// and never past ctx's end: when ctx ends first, New returns an error that
// matches both ErrUnavailable and ctx's error (context.DeadlineExceeded or
// context.Canceled). ctx bounds only the connecting: the instance lives
// until Close. The in-memory broker does not block.
func New(ctx context.Context, cfg Config) (*Disker, error) {
	return open(ctx, cfg, nil)
}

// open is New. Given a broker b, it makes an instance on b that the test
// kit drives by hand (manual.go) instead of the broker cfg selects.
func open(ctx context.Context, cfg Config, b broker.Broker) (*Disker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	manual := b != nil
	if cfg.RedisURL == "" && !manual {
		cfg.Logger.Info("disker: Config.RedisURL is empty: using the in-memory broker; messages stay in this process")
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if !manual {
		if b, err = openBroker(ctx, cfg); err != nil {
			return nil, wrapBroker("connect", err)
		}
	}
	host, _ := os.Hostname()
	d := &Disker{
		cfg:       cfg,
		b:         b,
		log:       cfg.Logger,
		onEvent:   cfg.OnEvent,
		id:        cfg.InstanceID,
		host:      host,
		started:   time.Now(),
		monitor:   newMonitor(),
		closing:   make(chan struct{}),
		done:      make(chan struct{}),
		consumers: make(map[string]*consumer),
		senders:   make(map[string]*senderHandlers),
		beatNow:   make(chan struct{}, 1),
		manual:    manual,
	}
	_, d.remote = b.(*redisbroker.Broker)
	d.rq = newRequester(d)
	d.health.d = d
	d.bgCtx, d.bgCancel = context.WithCancel(context.Background())
	d.opCtx, d.opCancel = context.WithCancel(context.Background())

	if _, err := b.Now(ctx); err != nil { // measures the broker's clock
		_ = b.Close()
		d.bgCancel()
		d.opCancel()
		return nil, fmt.Errorf("disker: cannot reach the broker: %w", errors.Join(err, context.Cause(ctx)))
	}
	d.heartbeat(ctx)
	if !manual {
		d.wg.Go(func() { d.runMonitor(d.bgCtx) })
	}
	d.wg.Go(func() { d.runHeartbeat(d.bgCtx) })
	d.wg.Go(func() { d.runPauseWatch(d.bgCtx) })
	return d, nil
}

// connectTimeout bounds New's connecting when ctx allows longer.
const connectTimeout = 10 * time.Second

// ID returns the instance's id (Config.InstanceID), as Workers lists it.
func (d *Disker) ID() string { return d.id }

// Close stops the instance: it stops fetching, waits for in-flight handlers
// until ctx ends, then cancels their contexts and waits for them to return,
// leaving what did not finish to be delivered again (to another instance,
// after its lease). Requests still waiting return ErrClosed. It then stops
// the background loops, deletes the state of the instance's inbox (see
// Request), leaves the registry of workers and closes the broker
// connection.
//
// Close is idempotent: later calls wait for the first to finish and return
// nil. It returns ctx's error when handlers did not finish in time.
func (d *Disker) Close(ctx context.Context) error {
	if !d.closed.CompareAndSwap(false, true) {
		select {
		case <-d.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	close(d.closing)
	d.mu.Lock()
	consumers := make([]*consumer, 0, len(d.consumers))
	for _, c := range d.consumers {
		consumers = append(consumers, c)
	}
	d.mu.Unlock()

	var (
		wg     sync.WaitGroup
		errMu  sync.Mutex
		errors []error
	)
	for _, c := range consumers {
		wg.Go(func() {
			if err := c.stop(ctx); err != nil {
				errMu.Lock()
				errors = append(errors, err)
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	d.unhandling.Wait()
	d.rq.requests.Wait() // they return ErrClosed, or end their last broker call

	d.bgCancel() // the monitor, the heartbeat, the reply readers
	d.wg.Wait()
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	d.rq.close(dctx)
	if err := d.b.Deregister(dctx, d.id); err != nil {
		d.log.Warn("disker: cannot leave the registry of workers; the entry expires by itself", "error", err)
	}
	cancel()
	d.opCancel()
	if err := d.b.Close(); err != nil {
		d.log.Warn("disker: closing the broker", "error", err)
	}
	// The sends whose callers left first end soon, the broker closed.
	d.sends.close()
	if len(errors) > 0 {
		d.closeErr = errors[0]
	}
	close(d.done)
	return d.closeErr
}
