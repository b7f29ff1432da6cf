package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/diskerhq/disker"
)

// defaultRedisURL is where the commands that need Redis look for it when
// neither --redis-url nor DISKER_REDIS_URL says otherwise.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

// redisURLFlag names the Redis URL as a user sets it, for messages.
const redisURLFlag = "--redis-url (DISKER_REDIS_URL)"

// connFlags are the flags of the commands that connect to a broker.
type connFlags struct {
	redisURL      string
	keyPrefix     string
	maxConns      int
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tlsInsecure   bool
}

func (c *connFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.redisURL, "redis-url", defaultRedisURL, "Redis to use: redis://[user:pass@]host:port/db, rediss:// for TLS, or mem://NAME for the in-process broker")
	fs.StringVar(&c.keyPrefix, "key-prefix", "disker", "prefix of every Redis key Disker uses")
	fs.IntVar(&c.maxConns, "max-connections", disker.DefaultMaxConnectionPoolSize, "bound on the pipelined Redis connections that carry commands (the largest power of two at most this, GOMAXPROCS and 4)")
	fs.StringVar(&c.tlsCA, "tls-ca", "", "with rediss://, trust the CA certificates in this PEM file instead of the system's")
	fs.StringVar(&c.tlsCert, "tls-cert", "", "with rediss://, present this client certificate (PEM; needs --tls-key)")
	fs.StringVar(&c.tlsKey, "tls-key", "", "with rediss://, the private key of --tls-cert (PEM)")
	fs.StringVar(&c.tlsServerName, "tls-server-name", "", "with rediss://, the name the server's certificate must carry (default: the URL's host)")
	fs.BoolVar(&c.tlsInsecure, "tls-insecure-skip-verify", false, "with rediss://, accept any server certificate: encrypted but NOT authenticated (testing only)")
}

// connect opens a Disker instance with the connection flags; edit, if not
// nil, adjusts the Config first. It logs which broker it uses.
func (a *app) connect(ctx context.Context, c *connFlags, edit func(*disker.Config)) (*disker.Disker, error) {
	cfg, u, err := a.brokerConfig(ctx, c)
	if err != nil {
		return nil, err
	}
	if edit != nil {
		edit(&cfg)
	}
	return openDisker(ctx, cfg, u)
}

// brokerConfig checks the connection flags, logs which broker they select
// (the password masked) and returns the Config that uses it. For a
// rediss:// URL it makes a TLS handshake first, so that TLS trouble is
// reported at once and in plain words.
func (a *app) brokerConfig(ctx context.Context, c *connFlags) (disker.Config, *url.URL, error) {
	if c.maxConns < 1 {
		return disker.Config{}, nil, usagef("invalid --max-connections %d: must be >= 1", c.maxConns)
	}
	if c.keyPrefix == "" {
		return disker.Config{}, nil, usagef("invalid --key-prefix: must not be empty")
	}
	u, err := checkRedisURL(c.redisURL)
	if err != nil {
		return disker.Config{}, nil, err
	}
	tc, err := c.tlsConfig(u)
	if err != nil {
		return disker.Config{}, nil, err
	}
	cfg := disker.Config{
		RedisURL:              c.redisURL,
		KeyPrefix:             c.keyPrefix,
		MaxConnectionPoolSize: c.maxConns,
		Logger:                a.log,
		TLSConfig:             tc,
	}
	attrs := []any{"redis", redact(c.redisURL), "key_prefix", c.keyPrefix}
	if tc != nil && tc.InsecureSkipVerify {
		a.log.Warn("--tls-insecure-skip-verify: the Redis server's certificate is NOT verified; anyone on the path can read and change the traffic", attrs...)
	}
	if u.Scheme == "mem" {
		a.log.Info("using the in-process broker: messages stay in this process", attrs...)
	} else {
		a.log.Info("using Redis", attrs...)
	}
	if tc != nil {
		if err := probeTLS(ctx, u, tc); err != nil {
			return disker.Config{}, nil, err
		}
	}
	return cfg, u, nil
}

// openDisker opens a Disker instance with cfg, which brokerConfig made for
// u, and explains a failure to a user.
func openDisker(ctx context.Context, cfg disker.Config, u *url.URL) (*disker.Disker, error) {
	d, err := disker.New(ctx, cfg)
	if err != nil {
		var ve *disker.ValidationError
		if errors.As(err, &ve) {
			return nil, usageError{flagError(err)}
		}
		return nil, explainConnect(ctx, u, cfg.TLSConfig, err)
	}
	return d, nil
}

// redact hides the password of a Redis URL.
func redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// checkName reports a receiver or sender name that Disker would refuse
// (disker.ValidateName has the rule), as a usage error naming the flag and
// the name: `invalid --receiver "my queue": has a character outside ...`.
func checkName(flag, name string) error {
	if name == "" {
		return usagef("--%s is required", flag)
	}
	var ve *disker.ValidationError
	if err := disker.ValidateName(name); errors.As(err, &ve) {
		// The reason starts with the quoted name, which the message
		// already gives.
		return usagef("invalid --%s %q: %s", flag, name, strings.TrimPrefix(ve.Reason, strconv.Quote(name)+" "))
	}
	return nil
}

// byteSize is a flag value for a size in bytes: "1048576", "512KiB", "1MiB",
// "2G" (K, M and G are powers of 1024).
type byteSize int64

func (s *byteSize) String() string {
	v := int64(*s)
	for _, u := range []struct {
		suffix string
		n      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if v >= u.n && v%u.n == 0 {
			return strconv.FormatInt(v/u.n, 10) + u.suffix
		}
	}
	return strconv.FormatInt(v, 10)
}

func (s *byteSize) Set(v string) error {
	t := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		n      int64
	}{
		{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"GB", 1 << 30}, {"MB", 1 << 20}, {"KB", 1 << 10},
		{"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"k", 1 << 10}, {"B", 1},
	} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.n
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/mult {
		return fmt.Errorf("want a size such as 1048576, 512KiB or 1MiB")
	}
	*s = byteSize(n * mult)
	return nil
}

func (s *byteSize) Type() string { return "size" }

// fileError is the reason of a failed file operation without the
// operation and the path, which the message gives already: "no such file
// or directory".
func fileError(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// isTerminal reports whether w is a terminal that understands cursor moves.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	return term.IsTerminal(int(f.Fd()))
}

// adminFlags are the flags of long-running commands: the admin server and
// the graceful stop.
type adminFlags struct {
	admin           string
	dashboard       bool
	shutdownTimeout time.Duration
}

func (f *adminFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.admin, "admin", "", "serve /metrics, /healthz and /readyz on this address (e.g. :9090); empty: none")
	fs.BoolVar(&f.dashboard, "admin-dashboard", false, "also serve the read-only dashboard under /dashboard/ on --admin")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or SIGINT, how long to let in-flight work finish")
}

func (f *adminFlags) check() error {
	if f.shutdownTimeout <= 0 {
		return usagef("invalid --shutdown-timeout %v: must be > 0", f.shutdownTimeout)
	}
	if f.admin != "" {
		return checkAddr("admin", f.admin)
	}
	return nil
}

// checkAddr refuses, as a usage error, a --flag address to listen on that
// cannot be one: no port, or a port that is not a number.
func checkAddr(flag, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return usagef("invalid --%s %q: want HOST:PORT or :PORT, such as 127.0.0.1:9090 or :9090", flag, addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return usagef("invalid --%s %q: the port %q is not a number in 0..65535", flag, addr, port)
	}
	return nil
}

// listenError says why listening on the address of --flag failed, in
// words rather than the socket layer's ("listen tcp 127.0.0.1:80: bind:
// permission denied").
func listenError(flag, addr string, err error) error {
	var dnsErr *net.DNSError
	reason := err.Error()
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		reason = "the address is in use: another process listens there"
	case errors.Is(err, syscall.EACCES):
		reason = "permission denied: a port below 1024 needs privileges"
	case errors.Is(err, syscall.EADDRNOTAVAIL):
		reason = "no network interface of this machine has that address"
	case errors.As(err, &dnsErr):
		reason = fmt.Sprintf("the host %q is unknown", dnsErr.Name)
	default:
		var oe *net.OpError
		if errors.As(err, &oe) {
			reason = oe.Err.Error()
		}
	}
	return fmt.Errorf("cannot listen on --%s %s: %s", flag, addr, reason)
}

// long appends the rule for environment variables to a command's
// description.
func long(text string) string {
	return strings.TrimSpace(text) + "\n" + envHelp
}
