// Package cli implements the disker command: its cobra commands, flags with
// environment-variable fallbacks, logging, signals and exit codes.
//
// Every flag --some-flag falls back to the environment variable
// DISKER_SOME_FLAG (DISKER_ + the flag's name upper-cased, '-' turned into
// '_') when it is not given on the command line. Exit codes: 0 success, 1 a
// runtime failure (Redis unreachable, a request that timed out, ...), 2 a
// usage error (a bad flag, a missing argument, a name that is not allowed).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

// tracingFlushTimeout bounds how long a command waits, as it exits, for its
// last spans to be exported.
const tracingFlushTimeout = 5 * time.Second

// Exit codes of the disker command.
const (
	ExitOK      = 0
	ExitRuntime = 1
	ExitUsage   = 2
)

// EnvPrefix starts the environment variable that a flag falls back to.
const EnvPrefix = "DISKER_"

// repeatWindow is how soon after the first signal a second one counts as the
// same delivery rather than a request to exit at once.
const repeatWindow = 250 * time.Millisecond

// Main runs the command with the process's arguments and standard streams
// and returns its exit code. The first SIGINT or SIGTERM cancels the
// command's context (long-running commands then stop gracefully); a second
// one (more than 250ms later) exits at once with code 1.
func Main() int { return MainWith(nil) }

// MainWith is Main with t tracing the worker and gateway commands (nil:
// none).
func MainWith(t Tracing) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-sigs:
		case <-done:
			return
		}
		cancel()
		first := time.Now()
		for {
			select {
			case s := <-sigs:
				if time.Since(first) < repeatWindow {
					// The same stop request delivered twice (timeout(1)
					// signals the process and its group): not a second one.
					continue
				}
				fmt.Fprintf(os.Stderr, "disker: second signal (%v): exiting now; unfinished messages will be redelivered after their lease\n", s)
				os.Exit(ExitRuntime)
			case <-done:
				return
			}
		}
	}()
	return RunWith(ctx, t, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
}

// Run runs the command line args (without the program name) and returns the
// exit code. Cancelling ctx asks a long-running command to stop gracefully.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return RunWith(ctx, nil, args, stdin, stdout, stderr)
}

// RunWith is Run with t tracing the worker and gateway commands (nil: none).
func RunWith(ctx context.Context, t Tracing, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	app := &app{stdin: stdin, stdout: stdout, stderr: stderr, tracing: t, fromEnv: map[string]bool{}}
	root := app.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	code := ExitUsage
	var re runtimeError
	if errors.As(err, &re) {
		code = ExitRuntime
		err = re.err
	}
	var ve *disker.ValidationError
	if errors.As(err, &ve) {
		code = ExitUsage
		err = flagError(err)
	}
	msg := oneLine(strings.TrimPrefix(err.Error(), "disker: "))
	if code == ExitUsage {
		msg = app.namingVariables(msg)
		if cmd != nil && cmd.Name() == "help" && cmd.HasParent() {
			cmd = cmd.Parent() // "disker help frob": the commands are there
		}
		if cmd != nil {
			msg += fmt.Sprintf(" (see '%s --help')", cmd.CommandPath())
		}
	}
	fmt.Fprintf(stderr, "disker: %s\n", msg)
	return code
}

func oneLine(s string) string {
	s = strings.TrimSpace(s)
	return strings.Join(strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }), " | ")
}

// usageError marks an error as the user's: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// runtimeError marks an error returned by a command's work: exit code 1.
// Errors that are not marked (cobra's own: unknown flags, bad arguments) are
// usage errors.
type runtimeError struct{ err error }

func (e runtimeError) Error() string { return e.err.Error() }
func (e runtimeError) Unwrap() error { return e.err }

// runE adapts a command's function so that its errors are runtime errors
// unless they are usage errors.
func runE(f func(cmd *cobra.Command, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		err := f(cmd, args)
		if err == nil {
			return nil
		}
		var ue usageError
		if errors.As(err, &ue) {
			return ue
		}
		return runtimeError{err}
	}
}

// app holds the streams and the global options of one run.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	logFormat      string
	logLevel       string
	verbose        bool
	log            *slog.Logger
	cmd            *cobra.Command  // the command that runs
	fromEnv        map[string]bool // the flags set from their variables
	tracing        Tracing         // nil: no tracing
	tracer         Tracer          // set by startTracing
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "disker",
		Short: "Dispatch work to workers on many machines, over Redis",
		Long: `disker runs the dispatcher-worker pattern from the shell. A dispatcher sends
messages to a named receiver; any number of workers on any machines serve it,
and a worker's reply goes back to the sender. Redis carries the messages.

Start with "disker demo": it runs everything in one process, with no setup.

Every flag --some-flag can also be set with the environment variable
DISKER_SOME_FLAG (DISKER_ + the flag name upper-cased, '-' turned into '_');
a flag given on the command line wins. Exit codes: 0 success, 1 runtime
failure, 2 usage error.`,
		Example: `  disker demo
  disker worker --receiver upper --exec 'tr a-z A-Z'
  disker gateway --listen :8080 --receiver web --timeout 10s
  disker send --to upper --wait hello
  disker stats --watch`,
		Version:           version(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: true},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			a.cmd = cmd
			if err := a.applyEnv(cmd); err != nil {
				return err
			}
			level := a.logLevel
			if a.verbose && a.set("log-level") && a.given("verbose") == a.given("log-level") {
				return usagef("give -v or --log-level, not both")
			}
			switch {
			case a.verbose && !a.given("log-level"): // the command line wins
				level = "debug"
			case level == "" && cmd.Annotations[longRunning] != "":
				level = "info"
			case level == "":
				// A command that runs once says what it must and prints
				// its result: no log of what went well unless asked.
				level = "warn"
			}
			log, err := newLogger(a.stderr, a.logFormat, level)
			if err != nil {
				return err
			}
			a.log = log
			return a.checkNeeds()
		},
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(cmd, args[0])
			}
			return cmd.Help()
		},
	}
	root.PersistentFlags().StringVar(&a.logFormat, "log-format", "text", "log format on stderr: text or json")
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "", "log level: debug, info, warn or error (default info for worker, gateway, dashboard and demo, warn for the commands that run once)")
	root.PersistentFlags().BoolVarP(&a.verbose, "verbose", "v", false, "log everything the command does (--log-level debug)")
	root.SetVersionTemplate(versionLine() + "\n")
	root.SetFlagErrorFunc(flagParseError)
	root.SetHelpCommand(helpCommand(root))
	root.AddCommand(
		a.demoCommand(),
		a.workerCommand(),
		a.gatewayCommand(),
		a.sendCommand(),
		a.statsCommand(),
		a.dlqCommand(),
		a.pauseCommand(false),
		a.pauseCommand(true),
		a.scheduleCommand(),
		a.schedulesCommand(),
		a.cancelCommand(),
		a.resultCommand(),
		a.batchCommand(),
		a.dashboardCommand(),
		a.versionCommand(),
	)
	// The completion command holds one command per shell: an unknown one
	// is a usage error, as for dlq and schedule.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Args, c.RunE = cobra.ArbitraryArgs, groupRunE
		}
		if c.Flags().Lookup("admin-dashboard") != nil {
			needs(c, "admin-dashboard", "admin")
		}
	}
	if a.tracing != nil {
		for _, c := range root.Commands() {
			if tracingCommands[c.Name()] {
				a.tracing.Flags(c.Flags())
			}
		}
	}
	return root
}

// longRunning is the annotation of the commands that run until stopped (or,
// for the demo, show a run): they log at info level by default.
const longRunning = "long-running"

// envName returns the environment variable that flag name falls back to.
func envName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, usagef("invalid --log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: readableDuration}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, usagef("invalid --log-format %q: want text or json", format)
	}
}

// readableDuration writes a duration as text ("30s", "1.5ms") in every log
// format: the JSON handler would write it as a number of nanoseconds.
func readableDuration(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// envHelp is appended to every command's help: the rule for environment
// variables.
const envHelp = `
Every flag also reads the environment variable DISKER_<FLAG>, the flag's name
upper-cased with '-' turned into '_' (--redis-url: DISKER_REDIS_URL).`
