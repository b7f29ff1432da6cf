package main_test

import (
	"bufio"
	"context"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// usageCase is what TestEveryCommandLineMistake knows of one command: a
// valid command line, and what it must not lack.
type usageCase struct {
	// args is a valid command line of the command (after "disker"). With
	// Redis out of reach it ends with exit 1 at the connection, or does
	// its work without Redis (version, demo pool, help).
	args []string
	// required lists the parts of args that may not be left out, each
	// with a word its error must say.
	required []requiredPart
	// extra are arguments that make one too many ("frob" when nil); none
	// for a command that takes any number of arguments (ids, names).
	extra []string
	open  bool
	// envUnused names the flags whose variable the valid command line
	// leaves unused, with why: the command line says the same otherwise,
	// or the flag means something only with another one.
	envUnused map[string]string
}

type requiredPart struct {
	drop []string // consecutive args of usageCase.args
	says string
}

// validID is a message id of the right form.
const validID = "01m90mn0vjmssp1xq3hqf9yp02"

// usageCases holds every command that "disker --help" lists, its
// commands' commands included ("" is disker itself).
var usageCases = map[string]usageCase{
	"":          {args: nil},
	"help":      {args: []string{"help"}},
	"version":   {args: []string{"version"}},
	"demo":      {args: []string{"demo", "--messages", "1"}},
	"demo pool": {args: []string{"demo", "pool", "--job", "1ms"}},
	"dashboard": {args: []string{"dashboard", "--listen", "127.0.0.1:0"}},
	"stats":     {args: []string{"stats"}},
	"schedules": {args: []string{"schedules"}},
	"dlq":       {args: []string{"dlq"}}, // a group: exit 2 on its own, tested below
	"dlq list":  {args: []string{"dlq", "list", "--receiver", "r"}, required: []requiredPart{{[]string{"--receiver", "r"}, "--receiver"}}},
	"dlq retry": {args: []string{"dlq", "retry", "--receiver", "r", "--all"}, open: true, required: []requiredPart{{[]string{"--receiver", "r"}, "--receiver"}, {[]string{"--all"}, "--all"}}},
	"dlq purge": {args: []string{"dlq", "purge", "--receiver", "r", "--all"}, open: true, required: []requiredPart{{[]string{"--receiver", "r"}, "--receiver"}, {[]string{"--all"}, "--all"}}},
	"schedule":  {args: []string{"schedule"}},
	"schedule add": {args: []string{"schedule", "add", "s", "--receiver", "r", "--every", "1m"}, extra: []string{"data", "frob"}, required: []requiredPart{
		{[]string{"s"}, "NAME"}, {[]string{"--receiver", "r"}, "--receiver"}, {[]string{"--every", "1m"}, "--every or --cron"}},
		envUnused: map[string]string{"tz": "--tz goes with --cron, not --every", "cron": "--every is on the command line"}},
	"schedule list":   {args: []string{"schedule", "list"}},
	"schedule remove": {args: []string{"schedule", "remove", "s"}, open: true, required: []requiredPart{{[]string{"s"}, "NAME"}}},
	"cancel":          {args: []string{"cancel", "--receiver", "r", validID}, open: true, required: []requiredPart{{[]string{"--receiver", "r"}, "--receiver"}, {[]string{validID}, "ID"}}},
	"result":          {args: []string{"result", "r", validID}, required: []requiredPart{{[]string{validID}, "ID"}}},
	"batch":           {args: []string{"batch", "r/" + validID}, required: []requiredPart{{[]string{"r/" + validID}, "ID"}}},
	"pause":           {args: []string{"pause", "r"}, required: []requiredPart{{[]string{"r"}, "RECEIVER"}}, envUnused: map[string]string{"receiver": "RECEIVER is on the command line"}},
	"resume":          {args: []string{"resume", "r"}, required: []requiredPart{{[]string{"r"}, "RECEIVER"}}, envUnused: map[string]string{"receiver": "RECEIVER is on the command line"}},
	"send": {args: []string{"send", "--to", "r", "hi"}, required: []requiredPart{
		{[]string{"--to", "r"}, "--to"}, {[]string{"hi"}, "DATA"}},
		envUnused: map[string]string{"receiver": "--to is on the command line", "file": "DATA is on the command line"}},
	"worker": {args: []string{"worker", "--receiver", "r", "--exec", "cat"}, required: []requiredPart{
		{[]string{"--receiver", "r"}, "--receiver"}, {[]string{"--exec", "cat"}, "--exec or --http"}}},
	"gateway": {args: []string{"gateway", "--receiver", "r", "--listen", "127.0.0.1:0"}, required: []requiredPart{{[]string{"--receiver", "r"}, "--receiver"}}},
}

// badText holds, for each flag that takes text, a value it refuses in the
// valid command lines above; freeText the flags any text suits.
var (
	badText = map[string]string{
		"log-format": "xml", "log-level": "loud", "redis-url": "localhost:6379", "key-prefix": "",
		"tls-ca": "ca.pem", "tls-cert": "c.pem", "tls-key": "k.pem", "tls-server-name": "redis.example",
		"receiver": "bad name", "to": "bad name", "from": "_inbox", "exec": "'unterminated", "http": "ftp://x",
		"exec-env": "HOME", "admin": "notaport", "listen": "nope", "priority": "urgent", "at": "tomorrow",
		"header": "novalue", "file": "missing.jsonl", "dedup-key": "", "idempotency-key": "", "group": "", "missed": "all",
		"tz": "Mars/Olympus", "cron": "0 25 * * *", "basic-auth": "nocolon", "basic-auth-file": "missing",
		"token-file": "missing",
	}
	freeText = map[string]string{
		"token": "any text is a token",
	}
)

// goWords are the words of Go or of a library that an error must not say
// to a user.
var goWords = regexp.MustCompile(`Config\.|Message\.|Schedule\.|strconv\.|listen tcp|dial tcp|invalid argument|" flag|arg\(s\)|json: |time: |<nil>|%!|\*[a-z]+\.[A-Z]|\bnil\b`)

// helpFlag is one flag of a --help: its name and the word of its type
// (none for a bool).
type helpFlag struct{ name, typ string }

var (
	helpFlagLine = regexp.MustCompile(`^\s+(?:-[a-z], )?--([a-z0-9-]+)(?: ([a-zA-Z]+))?\s{2,}`)
	helpCmdLine  = regexp.MustCompile(`^  ([a-z]+)\s{2,}`)
)

// readHelp runs "disker ARGS --help" and returns its commands and flags
// (global ones included).
func readHelp(t *testing.T, e *env, args []string) (cmds []string, flags []helpFlag) {
	t.Helper()
	out, errOut, code := e.run("", append(slices.Clone(args), "--help")...)
	if code != 0 {
		t.Fatalf("disker %v --help: exit %d %s", args, code, errOut)
	}
	section := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, " ") {
			section = line
			continue
		}
		switch section {
		case "Available Commands:":
			if m := helpCmdLine.FindStringSubmatch(line); m != nil {
				cmds = append(cmds, m[1])
			}
		case "Flags:", "Global Flags:":
			if m := helpFlagLine.FindStringSubmatch(line); m != nil && m[1] != "help" {
				flags = append(flags, helpFlag{m[1], m[2]})
			}
		}
	}
	return cmds, flags
}

// badValues returns the values of type typ that a flag of it refuses: a
// value that is not of the type, and one of it that is out of bounds.
func badValues(typ string) []string {
	switch typ {
	case "int", "float":
		return []string{"abc", "-1"}
	case "duration":
		return []string{"soon", "-1s"}
	case "size":
		return []string{"lots", "0"}
	case "":
		return []string{"maybe"} // a bool
	}
	return nil
}

// TestEveryCommandLineMistake walks every command and command of a
// command that "disker --help" lists, and gives each an unknown command
// or an argument too many, an unknown flag, a command line without each
// of its required parts, and each of its flags (and their variables) a
// bad value. Each must end with exit 2 and one line on stderr that names
// the flag, variable or argument as the user gave it, in no words of Go
// or of a library, with the --help to read; and before any use of Redis
// (Redis is out of reach here: reaching it would be exit 1).
func TestEveryCommandLineMistake(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.redisURL = "redis://127.0.0.1:1/0" // nothing there
	dir := t.TempDir()

	// The commands, as the help shows them.
	type command struct {
		path  string
		flags []helpFlag
	}
	var commands []command
	var walk func(path []string)
	walk = func(path []string) {
		cmds, flags := readHelp(t, e, path)
		commands = append(commands, command{strings.Join(path, " "), flags})
		for _, c := range cmds {
			if len(path) == 0 && c == "help" {
				commands = append(commands, command{"help", nil})
				continue
			}
			walk(append(slices.Clone(path), c))
		}
	}
	walk(nil)
	var seen []string
	for _, c := range commands {
		seen = append(seen, c.path)
		if _, ok := usageCases[c.path]; !ok {
			t.Errorf("the command %q has no case in usageCases: add its valid command line", c.path)
		}
		for _, f := range c.flags {
			if f.typ == "string" || f.typ == "stringArray" {
				if _, bad := badText[f.name]; !bad && freeText[f.name] == "" {
					t.Errorf("disker %s --%s takes text: give it a bad value in badText, or say in freeText why any text suits it", c.path, f.name)
				}
			}
		}
	}
	for path := range usageCases {
		if !slices.Contains(seen, path) {
			t.Errorf("usageCases has %q, which the help does not list", path)
		}
	}
	if t.Failed() {
		return
	}

	// check runs a mistaken command line and checks its answer.
	check := func(t *testing.T, what string, args, env []string, says string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(e.environ(), env...)
		cmd.Dir = dir
		var out, errOut strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errOut
		_ = cmd.Run()
		code := cmd.ProcessState.ExitCode()
		said := errOut.String()
		line := strings.TrimSuffix(said, "\n")
		switch {
		case code != 2:
			t.Errorf("%s: disker %q %v: exit %d, want 2; stderr %q", what, args, env, code, said)
		case strings.Count(said, "\n") != 1 || !strings.HasPrefix(said, "disker: "):
			t.Errorf("%s: disker %q %v: stderr %q, want one line that starts with \"disker: \"", what, args, env, said)
		case !strings.Contains(line, says):
			t.Errorf("%s: disker %q %v: %q does not name %s", what, args, env, line, says)
		case goWords.MatchString(line):
			t.Errorf("%s: disker %q %v: %q speaks Go (%s)", what, args, env, line, goWords.FindString(line))
		case !regexp.MustCompile(`\(see 'disker[a-z ]* --help'\)$`).MatchString(line):
			t.Errorf("%s: disker %q %v: %q gives no --help to read", what, args, env, line)
		case out.Len() > 0:
			t.Errorf("%s: disker %q %v: wrote %q on stdout", what, args, env, out.String())
		}
	}

	for _, c := range commands {
		uc := usageCases[c.path]
		t.Run(strings.ReplaceAll("disker "+c.path, " ", "_"), func(t *testing.T) {
			t.Parallel()
			group := c.path == "dlq" || c.path == "schedule"
			if group {
				check(t, "no command", uc.args, nil, "needs a command")
			}
			if !uc.open {
				extra := uc.extra
				if extra == nil {
					extra = []string{"frob"}
				}
				check(t, "an unknown command or an argument too many", slices.Concat(uc.args, extra), nil, `"frob"`)
			}
			check(t, "an unknown flag", append(slices.Clone(uc.args), "--frob"), nil, "--frob")
			for _, r := range uc.required {
				i := indexOf(uc.args, r.drop)
				if i < 0 {
					t.Fatalf("%v is not in %v", r.drop, uc.args)
				}
				args := slices.Concat(uc.args[:i], uc.args[i+len(r.drop):])
				check(t, "without "+strings.Join(r.drop, " "), args, nil, r.says)
			}
			for _, f := range c.flags {
				values := badValues(f.typ)
				if v, ok := badText[f.name]; ok {
					values = []string{v}
				}
				if group {
					// A group runs nothing, so it reads no value: only
					// one that does not parse is its mistake.
					values = badValues(f.typ)
					if len(values) > 0 {
						values = values[:1]
					}
				}
				for _, v := range values {
					check(t, "a bad value", append(slices.Clone(uc.args), "--"+f.name+"="+v), nil, "--"+f.name)
				}
				if len(values) == 0 || uc.envUnused[f.name] != "" {
					continue
				}
				// The variable, with the flag left out of the command line
				// (which would win).
				args := slices.Clone(uc.args)
				if i := slices.Index(args, "--"+f.name); i >= 0 {
					n := 2
					if f.typ == "" {
						n = 1
					}
					args = slices.Delete(args, i, i+n)
				}
				v := "DISKER_" + strings.ToUpper(strings.ReplaceAll(f.name, "-", "_"))
				check(t, "a bad variable", args, []string{v + "=" + values[0]}, v)
			}
		})
	}
}

// indexOf returns where sub starts in s, or -1.
func indexOf(s, sub []string) int {
	for i := range s {
		if len(s)-i >= len(sub) && slices.Equal(s[i:i+len(sub)], sub) {
			return i
		}
	}
	return -1
}

// TestValidCommandLines: the valid command lines of TestEveryCommandLineMistake
// are valid: each ends at the connection to Redis (out of reach) with exit
// 1, or does its work; so that the mistakes there are refused for what
// they are.
func TestValidCommandLines(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.redisURL = "redis://127.0.0.1:1/0"
	for path, uc := range usageCases {
		if path == "dlq" || path == "schedule" {
			continue
		}
		_, errOut, code := e.run("", uc.args...)
		want := 1
		if path == "" || path == "help" || path == "version" || path == "demo pool" {
			want = 0
		}
		if code != want || want == 1 && !strings.Contains(errOut, "nothing answers at 127.0.0.1:1") {
			t.Errorf("disker %q: exit %d, stderr %q; want %d", uc.args, code, errOut, want)
		}
	}
}
