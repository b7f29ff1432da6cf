package cli

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// This file puts what goes wrong on a command line in the user's words:
// the flag or variable as typed, what a value should look like, the
// command or argument that was expected, and a near name when one fits.

// applyEnv sets every flag of cmd that was not given on the command line
// from its environment variable, if that is set, and remembers which flags
// took their value from there.
func (a *app) applyEnv(cmd *cobra.Command) error {
	var err error
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		v, ok := os.LookupEnv(envName(f.Name))
		if !ok {
			return
		}
		if serr := cmd.Flags().Set(f.Name, v); serr != nil {
			err = usagef("invalid %s %q (for --%s): %s", envName(f.Name), v, f.Name, wantOf(f, serr))
			return
		}
		a.fromEnv[f.Name] = true
	})
	return err
}

// given reports whether flag name was given on the command line, rather
// than taken from its environment variable or left at its default.
func (a *app) given(name string) bool {
	return a.cmd != nil && a.cmd.Flags().Changed(name) && !a.fromEnv[name]
}

// set reports whether flag name has a value from the command line or from
// its environment variable.
func (a *app) set(name string) bool {
	return a.cmd != nil && a.cmd.Flags().Changed(name)
}

// needsPrefix starts the annotation of a command that says a flag means
// something only beside others (see needs).
const needsPrefix = "needs --"

// needs declares that cmd's flag means nothing unless one of others has a
// value: "--tz needs --cron".
func needs(cmd *cobra.Command, flag string, others ...string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[needsPrefix+flag] = strings.Join(others, " ")
}

// checkNeeds enforces what needs declared for the running command. A flag
// given on the command line where it means nothing is a usage error. One
// taken from its variable, which other commands and modes share
// (DISKER_CONCURRENCY serves worker and send, DISKER_TIMEOUT gateway and
// send), goes back to its default and the run goes on.
func (a *app) checkNeeds() error {
	var keys []string
	for k := range a.cmd.Annotations {
		if strings.HasPrefix(k, needsPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		name := strings.TrimPrefix(k, needsPrefix)
		others := strings.Fields(a.cmd.Annotations[k])
		if !a.set(name) || slices.ContainsFunc(others, a.hasValue) {
			continue
		}
		if a.given(name) {
			want := make([]string, len(others))
			for i, o := range others {
				want[i] = "--" + o
			}
			return usagef("--%s needs %s", name, orList(want))
		}
		f := a.cmd.Flags().Lookup(name)
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			_ = sv.Replace(nil)
		} else {
			_ = f.Value.Set(f.DefValue)
		}
		f.Changed = false
		delete(a.fromEnv, name)
		a.log.Debug("ignored: it means nothing with the other flags", "variable", envName(name), "needs", others)
	}
	return nil
}

// hasValue reports whether flag name was set, on the command line or by
// its variable, to something else than its default.
func (a *app) hasValue(name string) bool {
	f := a.cmd.Flags().Lookup(name)
	return f != nil && f.Changed && f.Value.String() != f.DefValue
}

// wantOf says what a value of flag f should look like, for err, the error
// of setting it to something else. The flag library's parse errors quote
// Go (strconv.ParseInt: ...); the values of this package say it already.
func wantOf(f *pflag.Flag, err error) string {
	var ive *pflag.InvalidValueError
	if errors.As(err, &ive) {
		err = ive.Unwrap()
	}
	switch f.Value.Type() {
	case "int", "int64", "int32", "uint", "uint64":
		if errors.Is(err, strconv.ErrRange) {
			return "out of range"
		}
		return "want a whole number"
	case "float64", "float32":
		if errors.Is(err, strconv.ErrRange) {
			return "out of range"
		}
		return "want a number, such as 2.5"
	case "duration":
		return "want a duration such as 30s, 1m30s or 500ms"
	case "bool":
		return "want true or false"
	}
	return err.Error()
}

// flagParseError puts an error of the flag library in the user's words:
// cmd's flags did not parse.
func flagParseError(cmd *cobra.Command, err error) error {
	if pos := cmd.Flags().Args(); len(pos) > 0 && cmd.HasAvailableSubCommands() {
		// "dlq purgee --all": the command is what went wrong, not the
		// flag that only its intended command has.
		return unknownCommand(cmd, pos[0])
	}
	var (
		ive *pflag.InvalidValueError
		vre *pflag.ValueRequiredError
		nee *pflag.NotExistError
	)
	switch {
	case errors.As(err, &ive):
		return usagef("invalid --%s %q: %s", ive.GetFlag().Name, ive.GetValue(), wantOf(ive.GetFlag(), err))
	case errors.As(err, &vre):
		return usagef("%s needs a value", strings.TrimPrefix(err.Error(), "flag needs an argument: "))
	case errors.As(err, &nee) && nee.GetSpecifiedShortnames() == "":
		msg := err.Error()
		if near := nearFlag(cmd, nee.GetSpecifiedName()); near != "" {
			msg += "; did you mean --" + near + "?"
		}
		return usageError{errors.New(msg)}
	}
	return usageError{err}
}

// nearFlag returns the flag of cmd whose name is closest to name, within
// two edits or as its prefix, or "".
func nearFlag(cmd *cobra.Command, name string) string {
	best, bestD := "", 3
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := editDistance(name, f.Name)
		if strings.HasPrefix(f.Name, name) && len(name) >= 3 {
			d = min(d, 1)
		}
		if d < bestD {
			best, bestD = f.Name, d
		}
	})
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// unknownCommand is the error of an argument that should have been one of
// cmd's commands.
func unknownCommand(cmd *cobra.Command, arg string) error {
	msg := fmt.Sprintf("unknown command %q for %q", arg, cmd.CommandPath())
	names := commandNames(cmd)
	if cmd.SuggestionsMinimumDistance <= 0 {
		cmd.SuggestionsMinimumDistance = 2
	}
	switch near := cmd.SuggestionsFor(arg); {
	case len(near) > 0:
		msg += fmt.Sprintf("; did you mean %q?", near[0])
	case len(names) == 1:
		msg += "; its command is " + names[0]
	default:
		msg += "; the commands are " + orList(names)
	}
	return usageError{errors.New(msg)}
}

// commandNames lists the commands of cmd that its help shows.
func commandNames(cmd *cobra.Command) []string {
	var names []string
	for _, c := range cmd.Commands() {
		if c.IsAvailableCommand() && c.Name() != "help" {
			names = append(names, c.Name())
		}
	}
	return names
}

// orList writes "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// groupRunE is the run of a command that only holds commands (dlq,
// schedule): a name it does not know, or none, is a usage error rather
// than its help and success, so that "dlq purgee --all" cannot look done.
func groupRunE(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return unknownCommand(cmd, args[0])
	}
	return usagef("%s needs a command: %s", cmdName(cmd), orList(commandNames(cmd)))
}

// noArgs accepts no argument: an argument is a mistyped command, or a
// value that lost its quotes.
func noArgs(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return nil
	case cmd.HasAvailableSubCommands():
		return unknownCommand(cmd, args[0])
	}
	return usagef("%s takes no arguments, got %s (quote a flag's value that has spaces)", cmdName(cmd), quoteAll(args))
}

// upTo accepts at most len(names) arguments, named names (DATA, RECEIVER),
// the first min of them required.
func upTo(min int, names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		switch {
		case len(args) < min:
			return usagef("%s needs %s", cmdName(cmd), strings.Join(names[len(args):min], " and "))
		case len(args) > len(names):
			want, last := strings.Join(names, " and "), names[len(names)-1]
			if len(names) == 1 {
				want = "one " + last
			}
			msg := fmt.Sprintf("%s takes %s, got %d: %s", cmdName(cmd), want, len(args), quoteAll(args))
			if last == "DATA" {
				msg += " (quote DATA that has spaces)"
			}
			return usageError{errors.New(msg)}
		}
		return nil
	}
}

// atLeastOne accepts one or more arguments, each a name (NAME, ID).
func atLeastOne(name string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) == 0 {
			return usagef("%s needs at least one %s", cmdName(cmd), name)
		}
		return nil
	}
}

// cmdName is cmd's path without the program's name: "dlq retry".
func cmdName(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return cmd.Name()
	}
	return strings.TrimPrefix(cmd.CommandPath(), cmd.Root().Name()+" ")
}

func quoteAll(args []string) string {
	q := make([]string, len(args))
	for i, s := range args {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, " ")
}

// helpCommand is "disker help [command]": help of a command it does not
// know is a usage error, as the command itself would be.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		Args:  cobra.ArbitraryArgs,
		RunE: func(_ *cobra.Command, args []string) error {
			target, rest, err := root.Find(args)
			if err != nil {
				return usageError{err}
			}
			if len(rest) > 0 {
				return unknownCommand(target, rest[0])
			}
			return target.Help()
		},
	}
}

// namingVariables adds the environment variable to the first mention of
// each flag in msg whose value came from it: a user who set
// DISKER_CONCURRENCY=0 reads "invalid --concurrency (DISKER_CONCURRENCY) 0".
func (a *app) namingVariables(msg string) string {
	names := make([]string, 0, len(a.fromEnv))
	for name := range a.fromEnv {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v := envName(name)
		if strings.Contains(msg, v) {
			continue
		}
		flag := "--" + name
		for i := 0; ; {
			j := strings.Index(msg[i:], flag)
			if j < 0 {
				break
			}
			end := i + j + len(flag)
			if end == len(msg) || !isFlagChar(msg[end]) {
				msg = msg[:end] + " (" + v + ")" + msg[end:]
				break
			}
			i = end
		}
	}
	return msg
}

func isFlagChar(c byte) bool {
	return c == '-' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}
