package cli

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/diskerhq/disker"
)

// defaultRedisURL is where the commands that need Redis look for it when
// neither --redis-url nor DISKER_REDIS_URL says otherwise.
const defaultRedisURL = "redis://127.0.0.1:6379/0"

// connFlags are the flags of the commands that connect to a broker.
type connFlags struct {
	redisURL  string
	keyPrefix string
	maxConns  int
}

func (c *connFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.redisURL, "redis-url", defaultRedisURL, "Redis to use: redis://[user:pass@]host:port/db, rediss:// for TLS, or mem://NAME for the in-process broker")
	fs.StringVar(&c.keyPrefix, "key-prefix", "disker", "prefix of every Redis key Disker uses")
	fs.IntVar(&c.maxConns, "max-connections", disker.DefaultMaxConnectionPoolSize, "bound on the pipelined Redis connections that carry commands (the largest power of two at most this, GOMAXPROCS and 4)")
}

// connect opens a Disker instance with the connection flags; edit, if not
// nil, adjusts the Config first.
func (a *app) connect(c *connFlags, edit func(*disker.Config)) (*disker.Disker, error) {
	if c.maxConns < 1 {
		return nil, usagef("invalid --max-connections %d: must be >= 1", c.maxConns)
	}
	if c.keyPrefix == "" {
		return nil, usagef("invalid --key-prefix: must not be empty")
	}
	cfg := disker.Config{
		RedisURL:              c.redisURL,
		KeyPrefix:             c.keyPrefix,
		MaxConnectionPoolSize: c.maxConns,
		Logger:                a.log,
	}
	if edit != nil {
		edit(&cfg)
	}
	d, err := disker.New(cfg)
	if err != nil {
		var ve *disker.ValidationError
		if errors.As(err, &ve) {
			return nil, usageError{err}
		}
		return nil, fmt.Errorf("cannot use Redis at %s: %w", redact(c.redisURL), err)
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

// isTerminal reports whether w is a terminal that understands cursor moves.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	if os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// adminFlags are the flags of long-running commands: the admin server and
// the graceful stop.
type adminFlags struct {
	admin           string
	shutdownTimeout time.Duration
}

func (f *adminFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.admin, "admin", "", "serve /metrics, /healthz and /readyz on this address (e.g. :9090); empty: none")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM or SIGINT, how long to let in-flight work finish")
}

func (f *adminFlags) check() error {
	if f.shutdownTimeout <= 0 {
		return usagef("invalid --shutdown-timeout %v: must be > 0", f.shutdownTimeout)
	}
	return nil
}

// long appends the rule for environment variables to a command's
// description.
func long(text string) string {
	return strings.TrimSpace(text) + "\n" + envHelp
}
