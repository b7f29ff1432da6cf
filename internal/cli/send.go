package cli

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type sendOptions struct {
	conn          connFlags
	to            string
	receiver      string
	needWorker    bool
	from          string
	timeout       time.Duration
	fireAndForget bool
	wait          bool
	file          string
	concurrency   int
	headers       []string
	maxMsgSize    byteSize
	dedupKey      string
	dedupTTL      time.Duration
	idemKey       string
	group         string
	// dedupSet, dedupTTLSet, idemSet and groupSet say the flags were
	// given (an empty key given is an error, not no key).
	dedupSet, dedupTTLSet, idemSet, groupSet bool
	priority                                 string
	delay                                    time.Duration
	at                                       string
	expiry                                   time.Duration
	retention                                time.Duration
	// common are the options of every message: --priority, --delay,
	// --at and --expiry.
	common []disker.SendOption
}

func (a *app) sendCommand() *cobra.Command {
	o := &sendOptions{maxMsgSize: disker.DefaultMaxMessageSize}
	cmd := &cobra.Command{
		Use:   "send --to NAME [flags] (DATA | @FILE | -)",
		Short: "Send a message, or many from a JSON Lines file",
		Long: long(`Send one message to the receiver NAME. Its content is DATA as given, the
contents of FILE with @FILE, or standard input with -.

What happens to the reply:
  --wait             wait for it and print its content on stdout (exit 1 if it
                     times out after --timeout or the message fails)
  --from SENDER      it goes to SENDER's reply stream, for a program that
                     handles SENDER's replies
  --fire-and-forget  there is none (the default when neither --wait nor --from
                     is given)
Without --wait, send prints the message id once Redis has accepted it.

--delay 10m or --at 2026-12-24T18:00:00Z defers the message: it is
delivered to no worker before that time by Redis's clock, counts as
deferred in "disker stats", and can be cancelled with "disker cancel". A
time that has passed delivers it now. --timeout counts from the delivery, and
so does --expiry, after which a message that no worker started is dropped.

--group KEY puts the message in the receiver's group KEY: the messages of
one key are handled one at a time (or --group-concurrency at a time, as the
workers say), in the order they were sent, while other keys run in
parallel. --dedup-key sends the message only if no other with the key went
to the receiver within --dedup-ttl; --idempotency-key makes sends with the
key one send (with --wait, one run of the handler and one reply).

The flags combine: a message can be deferred, urgent, keyed, deduplicated,
timed and expiring at once. A combination that cannot mean anything is a
usage error that says why.

With --wait, when no live worker serves NAME, send says so on stderr at once
and waits all the same (a worker may start); --require-worker makes it fail
at once instead. A reply printed to a terminal ends with a newline.

With --file, every line of the file (- for stdin) is one message, as a JSON
object:
  {"content": "text"}                         content as text
  {"content": {"any": "json"}}                content as that JSON, compact
  {"content_base64": "AAEC"}                  binary content
  {"headers": {"k": "v"}, "to": "other", "timeout": "5s"}   optional
  {"group": "k", "dedup_key": "k", "idempotency_key": "k"}  optional keys
A line's "group" wins over --group; its "dedup_key" and "idempotency_key"
are its own (the flags are the key of one message, not of a file). With
group keys, the lines are sent in the order of the file.
A progress bar shows on stderr when it is a terminal. With --wait, each
result is printed on stdout as one JSON line: {"line":N,"reply":"..."}
({"reply_base64":...} for a reply that is not UTF-8), {"line":N,"error":"..."},
or {"line":N,"duplicate_of":"ID"} for a line whose "dedup_key" was taken; up
to --concurrency messages are in flight at once.`),
		Example: `  disker send --to upper --wait hello
  disker send --to jobs --fire-and-forget '{"job": 42}'
  disker send --to thumbs --wait --timeout 30s @photo.jpg > thumb.png
  echo hi | disker send --to upper --wait -
  disker send --to reminders --delay 10m 'call back'
  disker send --to greetings --at 2026-12-24T18:00:00Z 'merry christmas'
  disker send --to jobs --file jobs.jsonl
  disker send --to jobs --priority high '{"job": 1}'
  disker send --to orders --group customer-7 --delay 1m '{"order": 12}'
  disker send --to upper --wait --concurrency 16 --file requests.jsonl > replies.jsonl`,
		Args: upTo(0, "DATA"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			o.dedupSet, o.dedupTTLSet = cmd.Flags().Changed("dedup-key"), cmd.Flags().Changed("dedup-ttl")
			o.idemSet, o.groupSet = cmd.Flags().Changed("idempotency-key"), cmd.Flags().Changed("group")
			return a.runSend(cmd.Context(), o, args)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&o.to, "to", "", "name of the receiver (required; or --receiver)")
	fs.StringVar(&o.receiver, "receiver", "", "the same as --to, as the other commands name it")
	fs.BoolVar(&o.needWorker, "require-worker", false, "with --wait, fail at once when no live worker serves the receiver")
	fs.StringVar(&o.from, "from", "", "sender name: the reply goes to this name's reply stream")
	fs.DurationVar(&o.timeout, "timeout", 0, "the message's timeout; with --wait, how long to wait (default 30s with --wait, else none)")
	fs.BoolVar(&o.fireAndForget, "fire-and-forget", false, "expect no reply")
	fs.BoolVar(&o.wait, "wait", false, "wait for the reply and print it")
	fs.StringVar(&o.file, "file", "", "send every line of this JSON Lines file (- for stdin) as a message")
	fs.IntVar(&o.concurrency, "concurrency", 8, "with --file, how many requests (with --wait) or batches of 100 messages (without) to have in flight at once")
	fs.StringArrayVar(&o.headers, "header", nil, "message header KEY=VALUE (repeatable)")
	fs.Var(&o.maxMsgSize, "max-message-size", "largest content accepted")
	fs.StringVar(&o.dedupKey, "dedup-key", "", `send only if no message with this key went to the receiver within --dedup-ttl (not with --file: give each line its "dedup_key")`)
	fs.DurationVar(&o.dedupTTL, "dedup-ttl", time.Hour, "with --dedup-key (or the lines' keys of --file), how long after the first send another with the key is a duplicate")
	fs.StringVar(&o.idemKey, "idempotency-key", "", `sends with this key within 24h are one send: one message, and with --wait one run of the handler and its reply (not with --file: give each line its "idempotency_key")`)
	fs.StringVar(&o.group, "group", "", `the messages' group key: the messages of one key are handled one at a time, in the order sent (a line's "group" wins)`)
	fs.StringVar(&o.priority, "priority", "normal", "the messages' priority: high, normal or low (a worker takes every waiting message of a higher level first)")
	fs.DurationVar(&o.delay, "delay", 0, "send for later: deliver after this delay (Redis time)")
	fs.StringVar(&o.at, "at", "", "send for later: deliver at this time, RFC 3339 (Redis time)")
	fs.DurationVar(&o.expiry, "expiry", 0, "drop the message if no worker started it within this long of its delivery (0: never)")
	fs.DurationVar(&o.retention, "retention", 0, `keep the message's result this long after its outcome, for "disker result" (0: none; at most 720h)`)
	o.conn.register(fs)
	needs(cmd, "concurrency", "file")
	needs(cmd, "require-worker", "wait")
	needs(cmd, "timeout", "wait", "from") // a fire-and-forget message has no timeout
	needs(cmd, "dedup-ttl", "dedup-key", "file")
	return cmd
}

// commonOptions checks the flags that set an option of every message
// (--priority, --delay, --at, --expiry, --retention) and sets o.common. Each flag's value
// is checked here, before Redis is reached; whether the options go
// together is the library's to say when the message is sent.
func (o *sendOptions) commonOptions() error {
	prio, err := parsePriority(o.priority)
	if err != nil {
		return err
	}
	o.common = []disker.SendOption{disker.WithPriority(prio)}
	switch {
	case o.delay < 0:
		return usagef("invalid --delay %v: must be >= 0", o.delay)
	case o.delay > 0 && o.delay < time.Millisecond:
		return usagef("invalid --delay %v: must be at least 1ms", o.delay)
	case o.delay > disker.MaxDelay:
		return usagef("invalid --delay %v: over the limit of %v", o.delay, disker.MaxDelay)
	case o.delay > 0:
		o.common = append(o.common, disker.WithDelay(o.delay))
	}
	if o.at != "" {
		t, err := time.Parse(time.RFC3339Nano, o.at)
		if err != nil {
			return usagef("invalid --at %q: want an RFC 3339 time such as 2026-12-24T18:00:00Z", o.at)
		}
		if t.Year() > 9999 || t.Year() < 1970 {
			return usagef("invalid --at %q: out of range (years 1970 to 9999)", o.at)
		}
		o.common = append(o.common, disker.WithDeliverAt(t))
	}
	switch {
	case o.expiry < 0 || o.expiry > 0 && o.expiry < time.Millisecond:
		return usagef("invalid --expiry %v: must be at least 1ms (0: none)", o.expiry)
	case o.expiry > disker.MaxDelay:
		return usagef("invalid --expiry %v: over the limit of %v", o.expiry, disker.MaxDelay)
	case o.expiry > 0:
		o.common = append(o.common, disker.WithExpiry(o.expiry))
	}
	switch {
	case o.retention < 0 || o.retention > 0 && o.retention < time.Millisecond || o.retention > disker.MaxRetention:
		return usagef("invalid --retention %v: must be from 1ms to %v (0: none)", o.retention, disker.MaxRetention)
	case o.retention > 0:
		o.common = append(o.common, disker.WithRetention(o.retention))
	}
	return nil
}

// outgoing is one message to send.
type outgoing struct {
	line    int
	to      string
	content []byte
	headers map[string]string
	timeout time.Duration
	// The message's keys: "" for none.
	group, dedupKey, idemKey string
}

// options returns the send options of m: those of every message, then
// its own.
func (o *sendOptions) options(m *outgoing) []disker.SendOption {
	opts := append(slices.Clip(o.common), disker.WithTimeout(m.timeout))
	if m.group != "" {
		opts = append(opts, disker.WithGroup(m.group))
	}
	if m.dedupKey != "" {
		opts = append(opts, disker.WithDedupKey(m.dedupKey, o.dedupTTL))
	}
	if m.idemKey != "" {
		opts = append(opts, disker.WithIdempotencyKey(m.idemKey))
	}
	return opts
}

// parsePriority reads a --priority value: high, normal, low, or 1, 0, -1.
func parsePriority(v string) (disker.Priority, error) {
	switch strings.ToLower(v) {
	case "high", "1", "+1":
		return disker.PriorityHigh, nil
	case "normal", "0", "":
		return disker.PriorityNormal, nil
	case "low", "-1":
		return disker.PriorityLow, nil
	}
	return 0, usagef("invalid --priority %q: want high, normal or low", v)
}

func (a *app) runSend(ctx context.Context, o *sendOptions, args []string) error {
	// A name on the command line wins over DISKER_RECEIVER or DISKER_TO,
	// which may be there for another command.
	switch {
	case a.fromEnv["receiver"] && a.given("to"):
		o.receiver = ""
	case a.fromEnv["to"] && a.given("receiver"):
		o.to = ""
	}
	switch {
	case o.receiver != "" && o.to != "" && o.receiver != o.to:
		return usagef("--to %q and --receiver %q disagree: give one of them", o.to, o.receiver)
	case o.receiver != "":
		o.to = o.receiver
	}
	if err := checkName("to", o.to); err != nil {
		return err
	}
	modes := 0
	for _, on := range []bool{o.wait, o.fireAndForget, o.from != ""} {
		if on {
			modes++
		}
	}
	if modes > 1 {
		// One reply goes to one place.
		return usagef("--wait, --from and --fire-and-forget exclude each other")
	}
	if o.from != "" {
		if err := checkName("from", o.from); err != nil {
			return err
		}
	}
	switch {
	case o.timeout < 0 || o.timeout > 0 && o.timeout < time.Millisecond:
		return usagef("invalid --timeout %v: must be at least 1ms", o.timeout)
	case o.concurrency < 1:
		return usagef("invalid --concurrency %d: must be >= 1", o.concurrency)
	case o.file != "" && len(args) > 0:
		return usagef("give either --file or DATA, not both")
	case o.file == "" && len(args) == 0:
		return usagef("nothing to send: give DATA, @FILE, - or --file")
	}
	if err := o.checkKeys(); err != nil {
		return err
	}
	if err := o.commonOptions(); err != nil {
		return err
	}
	if o.wait && o.timeout == 0 {
		o.timeout = 30 * time.Second
	}
	if o.maxMsgSize < 1 || o.maxMsgSize > disker.MaxMessageSizeLimit {
		return usagef("invalid --max-message-size %v: must be in 1..%d bytes", &o.maxMsgSize, disker.MaxMessageSizeLimit)
	}
	headers := map[string]string{}
	for _, h := range o.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return usagef("invalid --header %q: want KEY=VALUE", h)
		}
		headers[k] = v
	}
	var msgs []outgoing
	if o.file != "" {
		var err error
		if msgs, err = a.readJSONL(o.file, o); err != nil {
			return err
		}
	} else {
		content, err := a.readData(args[0])
		if err != nil {
			return err
		}
		msgs = []outgoing{{to: o.to, content: content, timeout: o.timeout, group: o.group, dedupKey: o.dedupKey, idemKey: o.idemKey}}
	}
	for i, m := range msgs {
		// Checked here rather than refused by Send once connected.
		if n := len(m.content); n > int(o.maxMsgSize) {
			if o.file != "" {
				return usagef("%s:%d: the content is %d bytes, over --max-message-size %v", o.file, m.line, n, &o.maxMsgSize)
			}
			return usagef("the content is %d bytes, over --max-message-size %v", n, &o.maxMsgSize)
		}
		for k, v := range headers {
			if msgs[i].headers == nil {
				msgs[i].headers = map[string]string{}
			}
			if _, ok := msgs[i].headers[k]; !ok {
				msgs[i].headers[k] = v
			}
		}
	}
	d, err := a.connect(ctx, &o.conn, func(c *disker.Config) { c.MaxMessageSize = int(o.maxMsgSize) })
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	if o.file == "" {
		return a.sendOne(ctx, d, o, msgs[0])
	}
	return a.sendMany(ctx, d, o, msgs)
}

// checkKeys checks the keys of --dedup-key, --idempotency-key and --group,
// and --dedup-ttl.
func (o *sendOptions) checkKeys() error {
	switch {
	case o.dedupSet && o.file != "":
		return usagef(`--dedup-key does not go with --file: it is the key of one message; give each line its own "dedup_key"`)
	case o.idemSet && o.file != "":
		return usagef(`--idempotency-key does not go with --file: it is the key of one message; give each line its own "idempotency_key"`)
	case (o.dedupSet || o.dedupTTLSet) && o.dedupTTL < time.Millisecond:
		return usagef("invalid --dedup-ttl %v: must be at least 1ms", o.dedupTTL)
	}
	for _, k := range []struct {
		flag, key string
		set       bool
	}{{"dedup-key", o.dedupKey, o.dedupSet}, {"idempotency-key", o.idemKey, o.idemSet}, {"group", o.group, o.groupSet}} {
		if why := keyProblem(k.key); k.set && why != "" {
			return usagef("invalid --%s: %s", k.flag, why)
		}
	}
	return nil
}

// keyProblem says what is wrong with a key of a message (a dedup,
// idempotency or group key): "" when nothing is.
func keyProblem(key string) string {
	switch {
	case key == "":
		return "must not be empty"
	case len(key) > disker.MaxKeyLen:
		return fmt.Sprintf("%d bytes, over the limit of %d", len(key), disker.MaxKeyLen)
	}
	return ""
}

// readData returns the content named by arg: DATA, @FILE or - (stdin).
func (a *app) readData(arg string) ([]byte, error) {
	switch {
	case arg == "-":
		b, err := io.ReadAll(a.stdin)
		if err != nil {
			return nil, fmt.Errorf("read stdin: %w", err)
		}
		return b, nil
	case strings.HasPrefix(arg, "@"):
		b, err := os.ReadFile(arg[1:])
		if err != nil {
			return nil, usagef("invalid DATA %q: %v", arg, fileError(err))
		}
		return b, nil
	default:
		return []byte(arg), nil
	}
}

// readJSONL parses a JSON Lines file of messages.
func (a *app) readJSONL(path string, o *sendOptions) ([]outgoing, error) {
	var r io.Reader = a.stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, usagef("invalid --file %q: %v", path, fileError(err))
		}
		defer f.Close()
		r = f
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), int(o.maxMsgSize)*2+(64<<10))
	var out []outgoing
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var rec struct {
			Content       json.RawMessage   `json:"content"`
			ContentBase64 *string           `json:"content_base64"`
			Headers       map[string]string `json:"headers"`
			To            string            `json:"to"`
			Timeout       string            `json:"timeout"`
			Group         *string           `json:"group"`
			DedupKey      *string           `json:"dedup_key"`
			IdemKey       *string           `json:"idempotency_key"`
		}
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, usagef("%s:%d: not a message object: %s", path, n, jsonReason(err))
		}
		m := outgoing{line: n, to: o.to, headers: rec.Headers, timeout: o.timeout, group: o.group}
		switch {
		case rec.ContentBase64 != nil && rec.Content != nil:
			return nil, usagef("%s:%d: give content or content_base64, not both", path, n)
		case rec.ContentBase64 != nil:
			b, err := base64.StdEncoding.DecodeString(*rec.ContentBase64)
			if err != nil {
				return nil, usagef("%s:%d: content_base64: %v", path, n, err)
			}
			m.content = b
		case rec.Content != nil:
			var s string
			if err := json.Unmarshal(rec.Content, &s); err == nil {
				m.content = []byte(s)
			} else {
				m.content = compactJSON(rec.Content)
			}
		default:
			return nil, usagef("%s:%d: no content or content_base64", path, n)
		}
		if rec.To != "" {
			if err := checkName("to", rec.To); err != nil {
				return nil, usagef("%s:%d: %v", path, n, err)
			}
			m.to = rec.To
		}
		if rec.Timeout != "" {
			t, err := time.ParseDuration(rec.Timeout)
			if err != nil || t < 0 || t > 0 && t < time.Millisecond {
				return nil, usagef("%s:%d: invalid timeout %q: want a duration of at least 1ms, such as \"5s\"", path, n, rec.Timeout)
			}
			m.timeout = t
			if t > 0 && !o.wait && o.from == "" {
				return nil, usagef("%s:%d: a timeout needs --wait or --from: a fire-and-forget message has no timeout", path, n)
			}
		}
		for _, k := range []struct {
			field string
			key   *string
			set   *string
		}{{"group", rec.Group, &m.group}, {"dedup_key", rec.DedupKey, &m.dedupKey}, {"idempotency_key", rec.IdemKey, &m.idemKey}} {
			if k.key == nil {
				continue
			}
			if why := keyProblem(*k.key); why != "" {
				return nil, usagef("%s:%d: invalid %s: %s", path, n, k.field, why)
			}
			*k.set = *k.key
		}
		if o.wait && m.timeout == 0 {
			m.timeout = 30 * time.Second
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, usagef("%s: %v", path, err)
	}
	if len(out) == 0 {
		return nil, usagef("%s: no messages", path)
	}
	return out, nil
}

// jsonReason says what is wrong with a line of JSON in the words of the
// format, not of the decoder ("cannot unmarshal string into Go struct
// field").
func jsonReason(err error) string {
	var ute *json.UnmarshalTypeError
	if errors.As(err, &ute) {
		want := "a string"
		if ute.Type.Kind() == reflect.Map {
			want = "an object of strings"
		}
		return fmt.Sprintf("%q: a JSON %s where %s belongs", ute.Field, ute.Value, want)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

func compactJSON(raw json.RawMessage) []byte {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	var v any
	if json.Unmarshal(raw, &v) != nil || enc.Encode(v) != nil {
		return raw
	}
	return []byte(strings.TrimSuffix(b.String(), "\n"))
}

// sendOne sends one message as o says and prints the id or the reply.
func (a *app) sendOne(ctx context.Context, d *disker.Disker, o *sendOptions, m outgoing) error {
	var dup *disker.DuplicateError
	if o.wait {
		if err := a.checkWorkers(ctx, d, m.to, o.needWorker); err != nil {
			return err
		}
		reply, err := a.request(ctx, d, o, m)
		if errors.As(err, &dup) {
			a.notSent(dup, "; there is no reply to wait for")
			return nil
		}
		if err != nil {
			return err
		}
		if len(reply) > 0 && reply[len(reply)-1] != '\n' && isTerminal(a.stdout) {
			// The shell's prompt would follow the reply on its last line.
			reply = append(reply, '\n')
		}
		_, err = a.stdout.Write(reply)
		return err
	}
	id, err := d.Send(ctx, asyncMessage(o, m), o.options(&m)...)
	if errors.As(err, &dup) {
		// Not a failure: the message the key stands for is queued.
		a.notSent(dup, "")
		fmt.Fprintln(a.stdout, id)
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, id)
	return nil
}

// notSent says on stderr that a send was a duplicate, and more.
func (a *app) notSent(dup *disker.DuplicateError, more string) {
	fmt.Fprintf(a.stderr, "disker: not sent: a duplicate of message %s (--dedup-key %q, within --dedup-ttl)%s\n", dup.ID, dup.Key, more)
}

// checkWorkers says on stderr, at once, when no live worker serves
// receiver, and fails when need is set. A failure to look is not an error:
// the request itself will tell.
func (a *app) checkWorkers(ctx context.Context, d *disker.Disker, receiver string, need bool) error {
	ws, err := d.Workers(ctx)
	if err != nil || slices.ContainsFunc(ws, func(w disker.WorkerInfo) bool { return slices.Contains(w.Receivers, receiver) }) {
		return nil
	}
	if need {
		return fmt.Errorf("no live worker serves %q (--require-worker); start one with: disker worker --receiver %s", receiver, receiver)
	}
	fmt.Fprintf(a.stderr, "disker: no live worker serves %q now; waiting for a reply all the same (--require-worker fails at once instead)\n", receiver)
	return nil
}

// request sends m as a request, with extra options after m's, and
// returns the content of its reply.
func (a *app) request(ctx context.Context, d *disker.Disker, o *sendOptions, m outgoing, extra ...disker.SendOption) ([]byte, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The timeout counts from the delivery (--delay, --at).
	reply, err := d.Request(rctx, disker.Message{Receiver: m.to, Content: m.content, Headers: m.headers}, append(o.options(&m), extra...)...)
	var re *disker.RemoteError
	switch {
	case err == nil:
	case errors.Is(err, disker.ErrTimeout), errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return nil, fmt.Errorf("no reply from %q within %v", m.to, m.timeout)
	case errors.As(err, &re) && re.Code == disker.CodeDeadLetter:
		return nil, fmt.Errorf("the message failed on every attempt and went to the dead letters of %q: %s (see 'disker dlq list --receiver %s')", m.to, re.Text, m.to)
	case errors.As(err, &re) && re.Code == disker.CodeCancelled:
		return nil, fmt.Errorf("the message was cancelled (disker cancel) before a worker of %q answered", m.to)
	case errors.As(err, &re) && re.Code == disker.CodeExpired:
		return nil, fmt.Errorf("the message expired: no worker of %q started it within --expiry %v of its delivery", m.to, o.expiry)
	case errors.As(err, &re):
		return nil, fmt.Errorf("a worker of %q answered with an error (%s): %s", m.to, re.Code, re.Text)
	default:
		return nil, err
	}
	return reply.Content, nil
}

// asyncMessage is the message of m sent without waiting for a reply: from
// --from, or fire-and-forget without it.
func asyncMessage(o *sendOptions, m outgoing) disker.Message {
	return disker.Message{
		Receiver: m.to,
		Sender:   o.from,
		Content:  m.content,
		Headers:  m.headers,
	}
}

// sendBatchSize is how many lines of a --file without --wait go in one
// SendEach.
const sendBatchSize = 100

// sendAsyncBatch sends ms, in order, with one SendEach, and returns the
// error of each: nil for a message sent, a *disker.DuplicateError for a
// duplicate.
func (a *app) sendAsyncBatch(ctx context.Context, d *disker.Disker, o *sendOptions, ms []outgoing) []error {
	out := make([]disker.Outgoing, len(ms))
	for i := range ms {
		out[i] = disker.Outgoing{Message: asyncMessage(o, ms[i]), Options: o.options(&ms[i])}
	}
	errs := make([]error, len(ms))
	_, err := d.SendEach(ctx, out)
	var be *disker.BatchError
	switch {
	case err == nil:
	case errors.As(err, &be):
		copy(errs, be.Errs)
	default:
		for i := range errs {
			errs[i] = err
		}
	}
	return errs
}

// closedChan is a channel closed from the start.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// sendJob is one batch of sendMany (one message with --wait).
type sendJob struct {
	batch []outgoing
	// turn is closed once the job before it is sent, when the order of
	// the sends counts; sent is closed once this one is.
	turn <-chan struct{}
	sent chan struct{}
}

// sendMany sends msgs with up to o.concurrency in flight, a progress bar on
// a terminal, and (with --wait) one JSON line per result on stdout. When a
// message has a group key, they are sent in the order of the file, so that
// a key's messages are handled in that order: each batch (each request,
// with --wait) is sent once the one before it was, while the replies of
// the requests before it are still awaited. A combination of flags that
// the library refuses stops the sends: it is the same for every line.
func (a *app) sendMany(ctx context.Context, d *disker.Disker, o *sendOptions, msgs []outgoing) error {
	if o.wait {
		var checked []string
		for _, m := range msgs {
			if slices.Contains(checked, m.to) {
				continue
			}
			checked = append(checked, m.to)
			if err := a.checkWorkers(ctx, d, m.to, o.needWorker); err != nil {
				return err
			}
		}
	}
	ordered := slices.ContainsFunc(msgs, func(m outgoing) bool { return m.group != "" })
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	bar := newProgress(a.stderr, len(msgs))
	defer bar.finish()
	var (
		mu          sync.Mutex
		failed, dup int
		first       error
		refused     error // a *disker.ValidationError: the flags do not go together
		enc         = json.NewEncoder(a.stdout)
	)
	type result struct {
		Line  int     `json:"line"`
		Reply *string `json:"reply,omitempty"`
		// ReplyBase64 holds a reply that is not valid UTF-8.
		ReplyBase64 string `json:"reply_base64,omitempty"`
		// DuplicateOf is the message a line with a "dedup_key" duplicates.
		DuplicateOf string `json:"duplicate_of,omitempty"`
		Error       string `json:"error,omitempty"`
	}
	// Without --wait, each worker sends sendBatchSize lines at a time.
	size := 1
	if !o.wait {
		size = sendBatchSize
	}
	work := make(chan sendJob)
	var wg sync.WaitGroup
	for range min(o.concurrency, (len(msgs)+size-1)/size) {
		wg.Go(func() {
			for job := range work {
				select {
				case <-job.turn:
				case <-sctx.Done():
				}
				batch := job.batch
				var errs []error
				var replies [][]byte
				if o.wait {
					errs, replies = make([]error, len(batch)), make([][]byte, len(batch))
					var once sync.Once
					sent := func(string) { once.Do(func() { close(job.sent) }) }
					for i, m := range batch {
						replies[i], errs[i] = a.request(sctx, d, o, m, disker.WithOnSent(sent))
					}
					sent("") // not sent at all
				} else {
					errs = a.sendAsyncBatch(sctx, d, o, batch)
					close(job.sent)
				}
				mu.Lock()
				for i, m := range batch {
					res := result{Line: m.line}
					var de *disker.DuplicateError
					var ve *disker.ValidationError
					switch err := errs[i]; {
					case errors.As(err, &ve):
						if refused == nil {
							refused = err
							stop()
						}
						continue
					case errors.As(err, &de):
						res.DuplicateOf = de.ID
						dup++
					case err != nil:
						res.Error = oneLine(err.Error())
						failed++
						if first == nil {
							first = fmt.Errorf("line %d: %w", m.line, err)
						}
					case o.wait && utf8.Valid(replies[i]):
						s := string(replies[i])
						res.Reply = &s
					case o.wait:
						res.ReplyBase64 = base64.StdEncoding.EncodeToString(replies[i])
					}
					if o.wait {
						_ = enc.Encode(res)
					}
				}
				mu.Unlock()
				bar.add(len(batch))
			}
		})
	}
	turn := (<-chan struct{})(closedChan)
loop:
	for batch := range slices.Chunk(msgs, size) {
		job := sendJob{batch: batch, turn: closedChan, sent: make(chan struct{})}
		if ordered {
			job.turn, turn = turn, job.sent
		}
		select {
		case work <- job:
		case <-sctx.Done():
			break loop
		}
	}
	close(work)
	wg.Wait()
	bar.finish()
	switch {
	case refused != nil:
		return refused
	case ctx.Err() != nil:
		return fmt.Errorf("interrupted: %d of %d messages done", bar.done(), len(msgs))
	}
	if !o.wait {
		line := fmt.Sprintf("sent %d of %d messages to %s", len(msgs)-failed-dup, len(msgs), o.to)
		if dup > 0 {
			line += fmt.Sprintf("; not sent, as duplicates (their \"dedup_key\" was taken within --dedup-ttl): %d", dup)
		}
		fmt.Fprintln(a.stderr, line)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d messages failed; first: %w", failed, len(msgs), first)
	}
	return nil
}
