// Package dashboard serves the web dashboard of Disker: the receivers with a
// live chart of rates and queue depth, the live workers, and each receiver's
// dead letters, which it can retry or purge when actions are allowed.
//
// Pages are HTML rendered on the server with html/template; a little
// JavaScript (embedded, like the stylesheet) refreshes the numbers and draws
// the chart from /api/snapshot. Nothing is loaded from elsewhere, and the
// Content-Security-Policy says so to the browser.
//
// One poll loop per [Dashboard] reads the broker for every page open: each
// page's refresh reads the poller's cache, so the cost to Redis does not grow
// with the number of pages. The loop polls only while pages are open.
//
// Safe by default: it is read-only unless [Config.AllowActions] is set; it
// refuses to allow actions on an address that is not loopback unless
// [Config.Auth] is set; every POST carries a token bound to a cookie and must
// come from the dashboard's own origin.
package dashboard

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// Defaults of Config.
const (
	DefaultInterval = 2 * time.Second
	DefaultWindow   = 5 * time.Minute
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// Config configures a Dashboard.
type Config struct {
	// Disker is the instance the dashboard reads and acts through. Required.
	// If it serves no receiver, it is left out of the workers it shows.
	Disker *disker.Disker
	// Interval is how often the numbers are read from the broker and the
	// pages refresh. 0 means DefaultInterval; it must be >= 100ms.
	Interval time.Duration
	// Window is how far back the chart goes. 0 means DefaultWindow.
	Window time.Duration
	// AllowActions lets the dead-letter page retry and purge. False (the
	// default) makes the dashboard read-only.
	AllowActions bool
	// Auth, when set, is required of every request.
	Auth Auth
	// Addr is the address the dashboard is served on. New refuses
	// AllowActions without Auth when it is not a loopback address. Empty
	// means loopback (a handler mounted by the caller).
	Addr string
	// Base is the path the dashboard is mounted under, such as
	// "/dashboard"; empty means "/". The handler expects requests with
	// Base already stripped (http.StripPrefix).
	Base string
	// Logger receives the errors of the poll loop; nil means slog.Default().
	Logger *slog.Logger
}

// Auth is the authentication a Dashboard requires. The zero Auth requires
// none.
type Auth struct {
	// User and Password, when Password is set, are HTTP basic credentials.
	User, Password string
	// Token, when set, is accepted as "Authorization: Bearer TOKEN", and as
	// the password of basic authentication with any user name (so that a
	// browser can log in with it).
	Token string
}

// Enabled reports whether a is not the zero Auth.
func (a Auth) Enabled() bool { return a.Password != "" || a.Token != "" }

// ParseBasic reads "user:password" (as in a file given to the command, whose
// trailing newline it ignores) into basic credentials.
func ParseBasic(s string) (Auth, error) {
	user, pass, ok := strings.Cut(strings.TrimRight(s, "\r\n"), ":")
	if !ok || user == "" || pass == "" {
		return Auth{}, errors.New("dashboard: basic auth: want user:password, both non-empty")
	}
	return Auth{User: user, Password: pass}, nil
}

// Dashboard is the dashboard's HTTP handler and its poll loop. Close stops
// the loop.
type Dashboard struct {
	cfg    Config
	poll   *poller
	tmpl   map[string]*template.Template
	mux    *http.ServeMux
	csrf   *http.CrossOriginProtection
	secret [32]byte // of the CSRF tokens
	// batchNotes logs each unreadable batch record once.
	batchNotes notes
}

// New checks cfg and returns a Dashboard whose poll loop is running.
func New(cfg Config) (*Dashboard, error) {
	if cfg.Disker == nil {
		return nil, errors.New("dashboard: Config.Disker is required")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.Interval < 100*time.Millisecond {
		return nil, fmt.Errorf("dashboard: Config.Interval %v: must be >= 100ms", cfg.Interval)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Window < cfg.Interval {
		return nil, fmt.Errorf("dashboard: Config.Window %v: must be >= Interval", cfg.Window)
	}
	if cfg.Base != "" && (!strings.HasPrefix(cfg.Base, "/") || strings.HasSuffix(cfg.Base, "/")) {
		return nil, fmt.Errorf("dashboard: Config.Base %q: must start with '/' and not end with one", cfg.Base)
	}
	if cfg.AllowActions && !cfg.Auth.Enabled() && !Loopback(cfg.Addr) {
		return nil, fmt.Errorf("dashboard: Config.AllowActions on %q, which is not a loopback address, needs Config.Auth", cfg.Addr)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tmpl, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	d := &Dashboard{cfg: cfg, tmpl: tmpl, csrf: http.NewCrossOriginProtection()}
	if _, err := rand.Read(d.secret[:]); err != nil {
		return nil, fmt.Errorf("dashboard: csrf secret: %w", err)
	}
	d.routes()
	d.poll = newPoller(cfg.Disker, cfg.Interval, cfg.Window, cfg.Logger)
	return d, nil
}

// Close stops the poll loop and waits for it. It is safe to call twice.
func (d *Dashboard) Close() { d.poll.close() }

// Loopback reports whether addr (host:port, or a bare host) names only
// loopback interfaces: "localhost", 127.0.0.0/8 or ::1. An empty host (":8080")
// means every interface, so it is not loopback; an empty addr is.
func Loopback(addr string) bool {
	if addr == "" {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

func (d *Dashboard) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", d.receiversPage)
	m.HandleFunc("GET /workers", d.workersPage)
	m.HandleFunc("GET /message", d.messagePage)
	m.HandleFunc("GET /batches", d.batchesPage)
	m.HandleFunc("GET /batch", d.batchPage)
	m.HandleFunc("GET /receivers/{name}", d.receiverPage)
	m.HandleFunc("GET /receivers/{name}/dead-letters", d.deadLettersPage)
	m.HandleFunc("GET /receivers/{name}/dead-letters/{action}", d.confirmPage)
	m.HandleFunc("POST /receivers/{name}/dead-letters/{action}", d.act)
	m.HandleFunc("GET /api/snapshot", d.snapshotAPI)
	assets, _ := fs.Sub(assetFS, "assets")
	m.HandleFunc("GET /assets/{file}", func(w http.ResponseWriter, r *http.Request) {
		// Files only: a directory (/assets/ itself) is not listed.
		name := r.PathValue("file")
		if info, err := fs.Stat(assets, name); err != nil || info.IsDir() {
			http.NotFound(w, r)
			return
		}
		http.ServeFileFS(w, r, assets, name)
	})
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		// Asked for by browsers on pages without a link to an icon (an
		// error's text).
		http.ServeFileFS(w, r, assets, "favicon.svg")
	})
	d.mux = m
}

// ServeHTTP serves the dashboard: security headers on every answer, then
// authentication, then the cross-origin check of POSTs, then the page.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	if !d.authorized(r) {
		h.Set("WWW-Authenticate", `Basic realm="disker dashboard", charset="UTF-8"`)
		http.Error(w, "dashboard: authentication required", http.StatusUnauthorized)
		return
	}
	if err := d.csrf.Check(r); err != nil {
		http.Error(w, "dashboard: cross-origin request refused", http.StatusForbidden)
		return
	}
	d.mux.ServeHTTP(w, r)
}

func (d *Dashboard) authorized(r *http.Request) bool {
	a := d.cfg.Auth
	if !a.Enabled() {
		return true
	}
	if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && a.Token != "" {
		return equal(tok, a.Token)
	}
	user, pass, ok := r.BasicAuth()
	if !ok {
		return false
	}
	if a.Token != "" && equal(pass, a.Token) {
		return true
	}
	return a.Password != "" && equal(user, a.User) && equal(pass, a.Password)
}

// equal compares secrets in constant time.
func equal(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// csrfCookie holds the random value that a form's token is derived from.
const csrfCookie = "disker_csrf"

// csrfToken returns the token the forms of this response carry, setting the
// cookie it is bound to when the request has none.
func (d *Dashboard) csrfToken(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(csrfCookie)
	v := ""
	if err == nil && len(c.Value) == 32 {
		v = c.Value
	} else {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		v = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: d.cfg.Base + "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	}
	return d.sign(v)
}

func (d *Dashboard) sign(v string) string {
	h := sha256.Sum256(append(d.secret[:], v...))
	return hex.EncodeToString(h[:])
}

// csrfValid reports whether the form's token matches the request's cookie.
func (d *Dashboard) csrfValid(r *http.Request) bool {
	c, err := r.Cookie(csrfCookie)
	if err != nil || c.Value == "" {
		return false
	}
	return equal(r.PostFormValue("csrf"), d.sign(c.Value))
}
