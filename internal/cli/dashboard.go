package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/cli/metrics"
	"github.com/diskerhq/disker/internal/dashboard"
)

type dashboardOptions struct {
	conn          connFlags
	listen        string
	interval      time.Duration
	window        time.Duration
	allowActions  bool
	basicAuth     string
	basicAuthFile string
	token         string
	tokenFile     string
}

func (a *app) dashboardCommand() *cobra.Command {
	o := &dashboardOptions{}
	cmd := &cobra.Command{
		Use:         "dashboard",
		Annotations: map[string]string{longRunning: "true"},
		Short:       "Serve a web page of receivers, workers and dead letters",
		Long: long(`Serve the dashboard: the receivers (queued, pending, in flight, dead letters,
handled per second, workers) with a live chart of rates and queue depth, the
live workers, and each receiver's dead letters with their reason, headers,
attempts and content.

Safe by default: it listens on 127.0.0.1, and it is read-only unless
--allow-actions lets the dead-letter page retry and purge (each action asks
for confirmation). Authentication is optional: HTTP basic with
--basic-auth-file (a file holding user:password) or DISKER_BASIC_AUTH, or a
token with --token-file or DISKER_TOKEN (sent as "Authorization: Bearer
TOKEN", or typed as the password of any user in a browser). --allow-actions
on an address that is not loopback is refused without authentication.

One poll loop reads the broker every --interval for all the pages open, and
only while a page is open.`),
		Example: `  disker dashboard
  disker dashboard --listen 127.0.0.1:8090 --allow-actions
  DISKER_BASIC_AUTH=ops:s3cret disker dashboard --listen :8090 --allow-actions`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runDashboard(cmd.Context(), o)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8090", "address to serve the dashboard on")
	fs.DurationVar(&o.interval, "interval", dashboard.DefaultInterval, "how often the numbers are read and the pages refresh")
	fs.DurationVar(&o.window, "window", dashboard.DefaultWindow, "how far back the chart goes")
	fs.BoolVar(&o.allowActions, "allow-actions", false, "let the dead-letter page retry and purge")
	fs.StringVar(&o.basicAuth, "basic-auth", "", "require HTTP basic auth user:password (prefer DISKER_BASIC_AUTH or --basic-auth-file: a flag shows in ps)")
	fs.StringVar(&o.basicAuthFile, "basic-auth-file", "", "require HTTP basic auth with the user:password this file holds")
	fs.StringVar(&o.token, "token", "", "require this bearer token (prefer DISKER_TOKEN or --token-file)")
	fs.StringVar(&o.tokenFile, "token-file", "", "require the bearer token this file holds")
	o.conn.register(fs)
	return cmd
}

// auth reads the authentication the flags ask for.
func (o *dashboardOptions) auth() (dashboard.Auth, error) {
	var auth dashboard.Auth
	basic, err := flagOrFile("basic-auth", o.basicAuth, o.basicAuthFile)
	if err != nil {
		return auth, err
	}
	if basic != "" {
		if auth, err = dashboard.ParseBasic(basic); err != nil {
			return auth, usagef("invalid --basic-auth: want user:password, both non-empty")
		}
	}
	if auth.Token, err = flagOrFile("token", o.token, o.tokenFile); err != nil {
		return auth, err
	}
	return auth, nil
}

// flagOrFile returns the secret given by --NAME or read from --NAME-file.
func flagOrFile(name, value, file string) (string, error) {
	if file == "" {
		return value, nil
	}
	if value != "" {
		return "", usagef("give --%s or --%s-file, not both", name, name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", usagef("invalid --%s-file %q: %v", name, file, fileError(err))
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", usagef("invalid --%s-file %s: it is empty", name, file)
	}
	return s, nil
}

func (a *app) runDashboard(ctx context.Context, o *dashboardOptions) error {
	if err := checkAddr("listen", o.listen); err != nil {
		return err
	}
	switch {
	case o.interval < 100*time.Millisecond:
		return usagef("invalid --interval %v: must be >= 100ms", o.interval)
	case o.window < o.interval:
		return usagef("invalid --window %v: must be >= --interval (%v)", o.window, o.interval)
	}
	auth, err := o.auth()
	if err != nil {
		return err
	}
	if o.allowActions && !auth.Enabled() && !dashboard.Loopback(o.listen) {
		return usagef("--allow-actions on %s, which is not a loopback address, needs --basic-auth-file, --token-file or their variables", o.listen)
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	dash, err := dashboard.New(dashboard.Config{
		Disker: d, Interval: o.interval, Window: o.window, AllowActions: o.allowActions,
		Auth: auth, Addr: o.listen, Logger: a.log,
	})
	if err != nil {
		return usageError{err}
	}
	defer dash.Close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return listenError("listen", o.listen, err)
	}
	srv := &http.Server{Handler: dash, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	a.log.Info("dashboard started", "url", "http://"+ln.Addr().String()+"/", "actions", o.allowActions,
		"auth", auth.Enabled(), "redis", redact(o.conn.redisURL))
	select {
	case err := <-served:
		return fmt.Errorf("dashboard: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("dashboard: stop: %w", err)
	}
	a.log.Info("dashboard stopped")
	return nil
}

// adminDashboard serves a read-only dashboard of d under /dashboard/ on a
// worker's or gateway's admin server (--admin-dashboard), and returns what
// stops its poll loop.
func (a *app) adminDashboard(admin *metrics.Server, d *disker.Disker) (func(), error) {
	dash, err := dashboard.New(dashboard.Config{Disker: d, Base: "/dashboard", Logger: a.log})
	if err != nil {
		return nil, err
	}
	admin.Handle("/dashboard/", http.StripPrefix("/dashboard", dash))
	return dash.Close, nil
}
