package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker"
)

// splitArgs splits a command line into words the way a POSIX shell does for
// quoting only: blanks separate words, 'single quotes' keep everything,
// "double quotes" keep everything but \" \\ \$ \` and a backslash newline,
// and a backslash outside quotes keeps the next character. There is no
// expansion of variables, globs or anything else.
func splitArgs(s string) ([]string, error) {
	var (
		words  []string
		cur    strings.Builder
		inWord bool
	)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '\\':
			inWord = true
			if i+1 >= len(s) {
				return nil, errors.New("trailing backslash")
			}
			i++
			if s[i] != '\n' {
				cur.WriteByte(s[i])
			}
		case c == '\'':
			inWord = true
			end := strings.IndexByte(s[i+1:], '\'')
			if end < 0 {
				return nil, errors.New("unterminated single quote")
			}
			cur.WriteString(s[i+1 : i+1+end])
			i += end + 1
		case c == '"':
			inWord = true
			closed := false
			for i++; i < len(s); i++ {
				if s[i] == '"' {
					closed = true
					break
				}
				if s[i] == '\\' && i+1 < len(s) && strings.IndexByte("\"\\$`\n", s[i+1]) >= 0 {
					i++
					if s[i] != '\n' {
						cur.WriteByte(s[i])
					}
					continue
				}
				cur.WriteByte(s[i])
			}
			if !closed {
				return nil, errors.New("unterminated double quote")
			}
		default:
			inWord = true
			cur.WriteByte(c)
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// execHandler runs a command for each message: the content on its stdin,
// its stdout as the reply.
type execHandler struct {
	argv     []string
	timeout  time.Duration // per message; 0: none beyond the message's deadline
	maxReply int           // bytes of stdout accepted
	env      []string      // the command's environment, without the message's variables
	stream   bool          // --stream: stdout's lines are partial replies to a streaming caller
}

// childEnv returns environ without Disker's own variables (DISKER_*: the
// Redis URL and its password among them), except those named in keep. A
// command that handles untrusted content gets no credentials by default.
func childEnv(environ, keep []string) []string {
	var out []string
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, EnvPrefix) && !slices.Contains(keep, name) {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// stderrTail is how much of a failed command's stderr goes in its error.
const stderrTail = 2048

func (h *execHandler) Handle(ctx context.Context, msg *disker.Message) ([]byte, error) {
	if h.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, h.timeout, errExecTimeout)
		defer cancel()
	}
	var lines *lineSender
	if h.stream && msg.Streamed() {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		lines = &lineSender{ctx: ctx, msg: msg, max: h.maxReply, kill: cancel}
	}
	cmd := exec.CommandContext(ctx, h.argv[0], h.argv[1:]...)
	cmd.Stdin = bytes.NewReader(msg.Content)
	stdout := &limitedBuffer{max: h.maxReply}
	stderr := &tailBuffer{max: stderrTail}
	cmd.Stdout = stdout
	if lines != nil {
		cmd.Stdout = lines
	}
	cmd.Stderr = stderr
	cmd.Env = append(slices.Clip(h.env),
		"DISKER_MESSAGE_ID="+msg.ID,
		"DISKER_RECEIVER="+msg.Receiver,
		"DISKER_SENDER="+msg.Sender,
		"DISKER_ATTEMPT="+strconv.Itoa(msg.Attempt),
	)
	setProcessGroup(cmd)
	cmd.WaitDelay = 2 * time.Second
	err := cmd.Run()
	if lines != nil {
		if err == nil {
			lines.end()
		}
		if lines.err != nil {
			return lines.result(h.argv[0])
		}
	}
	if stdout.over {
		return nil, disker.NoRetry(fmt.Errorf("%s: reply over %d bytes (the message size limit)", h.argv[0], h.maxReply))
	}
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			if errors.Is(cause, errExecTimeout) {
				return nil, fmt.Errorf("%s: killed after --exec-timeout %v%s", h.argv[0], h.timeout, stderr.suffix())
			}
			return nil, fmt.Errorf("%s: killed: %v%s", h.argv[0], cause, stderr.suffix())
		}
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return nil, fmt.Errorf("%s: %v%s", h.argv[0], ee.ProcessState, stderr.suffix())
		}
		return nil, fmt.Errorf("%s: %w", h.argv[0], err)
	}
	out := stdout.buf.Bytes()
	if out == nil {
		out = []byte{}
	}
	return out, nil
}

var errExecTimeout = errors.New("exec timeout")

// lineSender sends what a command writes to its stdout to a streaming
// caller, one partial reply per line (without its line break). A partial
// that fails stops the command (kill).
type lineSender struct {
	ctx  context.Context
	msg  *disker.Message
	max  int // bytes of a line
	kill context.CancelCauseFunc
	line []byte // the line being written
	err  error  // the first failure; nothing is sent after it
}

// errLineFailed is the cause of the end of a command whose line could not
// be sent.
var errLineFailed = errors.New("a partial reply failed")

func (s *lineSender) Write(p []byte) (int, error) {
	n := len(p)
	for s.err == nil && len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			s.line = append(s.line, p...)
			s.check()
			break
		}
		s.line = append(s.line, p[:i]...)
		p = p[i+1:]
		s.send()
	}
	if s.err != nil {
		return 0, s.err
	}
	return n, nil
}

// check fails the stream when the line is over the limit.
func (s *lineSender) check() {
	if len(s.line) > s.max {
		s.fail(disker.NoRetry(fmt.Errorf("a line of stdout is over %d bytes (the message size limit)", s.max)))
	}
}

// send sends the line as a partial reply.
func (s *lineSender) send() {
	if s.check(); s.err != nil {
		return
	}
	if err := s.msg.Partial(s.ctx, s.line); err != nil {
		s.fail(err)
	}
	s.line = s.line[:0]
}

// end sends the last line, if the output did not end with a line break.
func (s *lineSender) end() {
	if s.err == nil && len(s.line) > 0 {
		s.send()
	}
}

func (s *lineSender) fail(err error) {
	s.err = err
	s.kill(errLineFailed)
}

// result is the handler's outcome after a failure of the stream: none
// when the caller has its outcome already or has gone (ErrLate: the
// final reply would be refused too), else the error.
func (s *lineSender) result(name string) ([]byte, error) {
	if errors.Is(s.err, disker.ErrLate) {
		return nil, nil
	}
	return nil, fmt.Errorf("%s: %w", name, s.err)
}

// limitedBuffer keeps up to max bytes and notes whether more came.
type limitedBuffer struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	if room := b.max - b.buf.Len(); len(p) > room {
		b.over = true
		if room > 0 {
			b.buf.Write(p[:room])
		}
		return len(p), nil
	}
	return b.buf.Write(p)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	buf []byte
	max int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.max {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.max:]...)
	}
	return len(p), nil
}

// suffix returns ": <stderr tail>" or "" when stderr was empty.
func (b *tailBuffer) suffix() string {
	s := strings.TrimSpace(string(b.buf))
	if s == "" {
		return ""
	}
	return ": stderr: " + s
}
