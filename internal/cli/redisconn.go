package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/diskerhq/disker"
)

// checkRedisURL parses --redis-url and refuses, as a usage error, what
// would fail later with a less helpful message: no scheme, an unknown
// scheme, no host, a port or database that is not a number, and the
// skip_verify parameter (verification is turned off only by the loud
// --tls-insecure-skip-verify).
func checkRedisURL(raw string) (*url.URL, error) {
	bad := func(format string, args ...any) error {
		return usagef("invalid %s %q: %s", redisURLFlag, redact(raw), fmt.Sprintf(format, args...))
	}
	if raw == "" {
		return nil, usagef("%s is empty: give redis://host:port/db, or mem://NAME for the in-process broker", redisURLFlag)
	}
	if !strings.Contains(raw, "://") {
		return nil, bad("no scheme; did you mean redis://%s?", raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, bad("%v", err)
	}
	switch u.Scheme {
	case "mem":
		return u, nil
	case "redis", "rediss":
	default:
		return nil, bad("scheme %q is not redis://, rediss:// (TLS) or mem://", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, bad("no host; want redis://host:port/db")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return nil, bad("port %q is not in 1..65535", p)
		}
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if n, err := strconv.Atoi(db); err != nil || n < 0 {
			return nil, bad("database %q is not a number >= 0", db)
		}
	}
	if u.Query().Has("skip_verify") {
		return nil, bad("the skip_verify parameter is not accepted; --tls-insecure-skip-verify (DISKER_TLS_INSECURE_SKIP_VERIFY) turns verification off, loudly")
	}
	return u, nil
}

// tlsConfig returns the TLS configuration the --tls-* flags give for u, or
// nil for a URL that is not rediss://.
func (c *connFlags) tlsConfig(u *url.URL) (*tls.Config, error) {
	if u.Scheme != "rediss" {
		for flag, set := range map[string]bool{"--tls-ca": c.tlsCA != "", "--tls-cert": c.tlsCert != "",
			"--tls-key": c.tlsKey != "", "--tls-server-name": c.tlsServerName != "", "--tls-insecure-skip-verify": c.tlsInsecure} {
			if set {
				return nil, usagef("%s needs a rediss:// %s (got %s://)", flag, redisURLFlag, u.Scheme)
			}
		}
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname(), InsecureSkipVerify: c.tlsInsecure}
	if c.tlsServerName != "" {
		tc.ServerName = c.tlsServerName
	}
	if c.tlsCA != "" {
		pem, err := os.ReadFile(c.tlsCA)
		if err != nil {
			return nil, usagef("invalid --tls-ca %q: %v", c.tlsCA, fileError(err))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, usagef("invalid --tls-ca %s: no PEM certificate in it", c.tlsCA)
		}
		tc.RootCAs = pool
	}
	switch {
	case c.tlsCert != "" && c.tlsKey != "":
		cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
		if err != nil {
			return nil, usagef("invalid --tls-cert/--tls-key: %v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	case c.tlsCert != "":
		return nil, usagef("--tls-cert needs --tls-key")
	case c.tlsKey != "":
		return nil, usagef("--tls-key needs --tls-cert")
	}
	return tc, nil
}

// tlsProbeTimeout bounds the TLS handshake of probeTLS: a plain-text Redis
// never answers a TLS client hello, it waits for more.
const tlsProbeTimeout = time.Second

// probeTLS makes one TLS handshake with the first host of u, so that a
// rediss:// URL at a plain-text port fails at once with an error that says
// so, and a certificate that does not verify fails with a hint. A host that
// cannot be reached is left to the connection proper.
func probeTLS(ctx context.Context, u *url.URL, tc *tls.Config) error {
	addr := redisAddr(u)
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		// Nothing to learn about TLS here, and the URL may name other
		// nodes: the connection proper will try them and explain.
		return nil
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(tlsProbeTimeout))
	var ne net.Error
	conn := tls.Client(raw, tc)
	err = conn.HandshakeContext(ctx)
	if err == nil {
		// With TLS 1.3 the server checks the client's certificate after
		// the client's side of the handshake: its refusal shows on use.
		_, err = conn.Write([]byte("PING\r\n"))
		if err == nil {
			_, err = bufio.NewReader(conn).ReadString('\n')
		}
		if err == nil || errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		if len(tc.Certificates) == 0 {
			return fmt.Errorf("cannot use Redis at %s: the server at %s ended the TLS connection (%v): it may want a client certificate: --tls-cert and --tls-key, or DISKER_TLS_CERT and DISKER_TLS_KEY",
				redact(u.String()), addr, err)
		}
		return fmt.Errorf("cannot use Redis at %s: the server at %s ended the TLS connection: %v", redact(u.String()), addr, err)
	}
	var (
		rhe tls.RecordHeaderError
		cve *tls.CertificateVerificationError
		hne x509.HostnameError
	)
	switch {
	case errors.As(err, &ne) && ne.Timeout(), errors.As(err, &rhe):
		return fmt.Errorf("cannot use Redis at %s: the server at %s did not answer TLS within %v: is it a plain-text port? (use redis:// for one)",
			redact(u.String()), addr, tlsProbeTimeout)
	case errors.As(err, &hne):
		return fmt.Errorf("cannot use Redis at %s: %v; --tls-server-name (DISKER_TLS_SERVER_NAME) sets the name to expect", redact(u.String()), err)
	case errors.As(err, &cve):
		return fmt.Errorf("cannot use Redis at %s: %v; --tls-ca (DISKER_TLS_CA) names the CA to trust", redact(u.String()), err)
	default:
		return fmt.Errorf("cannot use Redis at %s: TLS handshake with %s: %v", redact(u.String()), addr, err)
	}
}

// redisAddr returns the host:port of u, with Redis's default port.
func redisAddr(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = "6379"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// connectHint explains a failed dial to addr to a user.
func connectHint(addr string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("nothing answers at %s (connection refused): start redis-server there, or set %s to your Redis", addr, redisURLFlag)
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("no answer from %s (timed out): is the address right, and the port open? (%s)", addr, redisURLFlag)
	}
	return fmt.Errorf("cannot connect to %s: %v", addr, err)
}

// explainConnect turns the error of a failed disker.New into a message for
// the user: the URL (password masked) and what went wrong, without the
// layers' prefixes, with a hint found by talking to the address itself.
func explainConnect(ctx context.Context, u *url.URL, tc *tls.Config, err error) error {
	where := "cannot use Redis at " + redact(u.String())
	detail := innermost(err)
	if !errors.Is(err, disker.ErrUnavailable) {
		return fmt.Errorf("%s: %s", where, authHint(detail))
	}
	addr := redisAddr(u)
	if hint := diagnose(ctx, addr, tc); hint != "" {
		return fmt.Errorf("%s: %s", where, hint)
	}
	return fmt.Errorf("%s: %s", where, authHint(detail))
}

// authHint says what Redis's answer to bad credentials means: Redis's own
// text of NOAUTH is about its HELLO command.
func authHint(detail string) string {
	switch {
	case strings.Contains(detail, "NOAUTH"):
		return "Redis wants a password (NOAUTH) and " + redisURLFlag + " gives none: redis://:PASSWORD@HOST:PORT/DB, or redis://USER:PASSWORD@HOST:PORT/DB for an ACL user"
	case strings.Contains(detail, "WRONGPASS"):
		return "Redis refused the user and password (WRONGPASS): check them in " + redisURLFlag
	case strings.Contains(detail, "NOPERM"):
		return detail + " (the user of " + redisURLFlag + " lacks a permission Disker needs)"
	}
	return detail
}

// isAuthError reports whether an error's text is Redis refusing the
// credentials or the user's rights.
func isAuthError(text string) bool {
	for _, code := range []string{"WRONGPASS", "NOAUTH", "NOPERM"} {
		if strings.Contains(text, code) {
			return true
		}
	}
	return false
}

// innermost returns the text of err without the prefixes the layers added
// ("disker: connect: redisbroker: connect: Redis at ... is unreachable: ").
func innermost(err error) string {
	s := err.Error()
	for {
		t := s
		for _, p := range []string{"disker: ", "redisbroker: ", "connect: "} {
			t = strings.TrimPrefix(t, p)
		}
		if strings.HasPrefix(t, "Redis at ") {
			if _, rest, ok := strings.Cut(t, " is unreachable: "); ok {
				t = rest
			}
		}
		if t == s {
			return s
		}
		s = t
	}
}

// pingTimeout bounds diagnose's wait for the answer to its PING.
const pingTimeout = time.Second

// diagnose talks to addr to tell a user what is there when Disker could
// not use it: nothing (refused), something that is not Redis, a TLS port
// reached without TLS, or a server that does not answer (paused or
// overloaded). It returns "" when it finds nothing to add.
func diagnose(ctx context.Context, addr string, tc *tls.Config) string {
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return connectHint(addr, err).Error()
	}
	defer conn.Close()
	if tc != nil {
		// probeTLS made the handshake already: the trouble is past it.
		return ""
	}
	_ = conn.SetDeadline(time.Now().Add(pingTimeout))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return ""
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	var ne net.Error
	switch {
	case err != nil && line == "" && errors.As(err, &ne) && ne.Timeout():
		// A TLS port closes a connection that does not speak TLS; a
		// Redis paused (CLIENT PAUSE) or busy says nothing.
		return fmt.Sprintf("%s accepts connections but did not answer PING within %v: the server may be paused (CLIENT PAUSE) or overloaded", addr, pingTimeout)
	case err != nil && line == "":
		return fmt.Sprintf("%s accepts connections but closed one without answering PING; is it a TLS port? (use rediss:// for one)", addr)
	case strings.HasPrefix(line, "+PONG"), strings.HasPrefix(line, "-"):
		return ""
	default:
		return fmt.Sprintf("%s answers, but not as Redis: it said %q to PING; is %s right?", addr, clip(strings.TrimSpace(line), 40), redisURLFlag)
	}
}

// flagError names, in a validation error of a Config field, the flag and
// variable that set it, and in one of an option (a combination of send
// options the library refuses, with its reason), the flags that set them:
// "invalid --delay: --delay and --at both give the message a due time:
// give one".
func flagError(err error) error {
	s := strings.TrimPrefix(err.Error(), "disker: ")
	for field, flag := range map[string]string{
		"Config.RedisURL":              redisURLFlag,
		"Config.MaxMessageSize":        "--max-message-size (DISKER_MAX_MESSAGE_SIZE)",
		"Config.MaxConnectionPoolSize": "--max-connections (DISKER_MAX_CONNECTIONS)",
		"Config.KeyPrefix":             "--key-prefix (DISKER_KEY_PREFIX)",
	} {
		s = strings.ReplaceAll(s, field, flag)
	}
	s = optionName.ReplaceAllStringFunc(s, func(name string) string {
		if flag, ok := optionFlags[name]; ok {
			return flag
		}
		return name
	})
	// A batch names the message by its index in the batch: the command
	// names its line itself.
	return errors.New(batchIndex.ReplaceAllString(s, ""))
}

var (
	optionName = regexp.MustCompile(`\bWith[A-Z][A-Za-z]*(\.[a-z]+)?`)
	batchIndex = regexp.MustCompile(`\bmsgs\[[0-9]+\]: `)
)

// optionFlags are the flags that set the library's options.
var optionFlags = map[string]string{
	"WithTimeout":          "--timeout",
	"WithDelay":            "--delay",
	"WithDeliverAt":        "--at",
	"WithPriority":         "--priority",
	"WithDedupKey":         "--dedup-key",
	"WithIdempotencyKey":   "--idempotency-key",
	"WithGroup":            "--group",
	"WithExpiry":           "--expiry",
	"WithGroupConcurrency": "--group-concurrency",
	"WithGroupRate.rate":   "--group-rate",
	"WithGroupRate.burst":  "--group-burst",
}
