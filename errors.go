package disker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/pool"
)

// Errors returned by Disker. Check them with errors.Is.
var (
	// ErrLate is returned by Reply when the request it answers has already
	// been settled: it timed out, or (for a message sent with Send) was
	// answered; or when it came from Request and the requesting instance
	// has gone with its inbox. The reply was dropped. A reply to a Request
	// that was already answered, or whose ctx was cancelled before its
	// deadline, is dropped without ErrLate (see Disker.Reply).
	ErrLate = broker.ErrLate
	// ErrTimeout is returned by Request when no reply came before the
	// context's deadline. Such an error also matches the context's error
	// (context.DeadlineExceeded) with errors.Is.
	ErrTimeout = errors.New("disker: request timed out")
	// ErrOutcomeUnknown is returned by Request when its context ended and
	// the broker did not answer within RequestGrace to settle it (Redis
	// down, paused or cut off), or its answer could not be read by then (a
	// process too busy): a worker's reply may have been accepted
	// before the deadline all the same, and this Request will not return
	// it. Such an error also matches ErrUnavailable and the context's
	// error, but not ErrTimeout: no timeout was decided.
	ErrOutcomeUnknown = errors.New("disker: the request's outcome is unknown: the broker did not answer in time to settle it")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("disker: closed")
	// ErrFireAndForget is returned by Reply for a fire-and-forget message:
	// nobody waits for its reply.
	ErrFireAndForget = errors.New("disker: message is fire-and-forget: no reply expected")
	// ErrDuplicate is matched by a *DuplicateError, the error of a send
	// WithDedupKey when a message was sent with the same key within its
	// ttl: nothing was queued.
	ErrDuplicate = errors.New("disker: duplicate message")
	// ErrAlreadyRegistered is returned by Handle, OnReply and OnTimeout
	// when this instance already has a handler of that kind for the name.
	ErrAlreadyRegistered = errors.New("disker: handler already registered")
	// ErrUnavailable wraps errors from a broker that cannot be reached (Redis
	// down or unreachable).
	ErrUnavailable = broker.ErrUnavailable
	// ErrLeaseLost is the cause (context.Cause) of a handler's context
	// ending because the delivery's lease was lost: another worker may have
	// the message now. What the handler does after that is discarded.
	ErrLeaseLost = broker.ErrLeaseLost
	// ErrNotHandled is returned by Unhandle, RemoveTimeoutHandler and
	// RemoveReplyHandler when nothing is registered for the name.
	ErrNotHandled = errors.New("disker: no handler registered")
)

// DuplicateError is Send's error when a message was sent WithDedupKey
// with the same key to the same receiver less than its ttl ago: nothing was
// queued, and Send returned ID, the id of that first message, beside it.
// It matches ErrDuplicate with errors.Is.
type DuplicateError struct {
	// ID is the id of the message sent with the key first.
	ID string
	// Receiver and Key are the receiver and the dedup key.
	Receiver, Key string
}

// Error says which message the send duplicates.
func (e *DuplicateError) Error() string {
	return fmt.Sprintf("disker: duplicate: message %s was sent to %s with dedup key %q within its ttl", e.ID, e.Receiver, e.Key)
}

// Is reports whether target is ErrDuplicate.
func (e *DuplicateError) Is(target error) bool { return target == ErrDuplicate }

// BatchError is SendBatch's error when some messages were not sent: Errs[i]
// is why msgs[i] was not sent, nil for those sent. errors.Is and errors.As
// look at each failure (for instance errors.Is(err, ErrUnavailable)).
type BatchError = broker.BatchError

// PanicError is a panic recovered from a handler, turned into an error. It
// keeps the panic value and the stack. A handler that panics is treated as
// one that returned this error: the message is retried, then dead-lettered
// with the stack in its reason.
type PanicError = pool.PanicError

// ValidationError reports bad input: a malformed name, content over the size
// limit, a nil handler, a bad option or Config field. Field names the field
// at fault, such as "Message.Receiver" or "Config.MaxConnectionPoolSize".
type ValidationError struct {
	// Field is the name of the field or argument at fault.
	Field string
	// Reason says what is wrong with it.
	Reason string
}

// Error returns "disker: invalid Field: Reason".
func (e *ValidationError) Error() string {
	return "disker: invalid " + e.Field + ": " + e.Reason
}

func invalid(field, format string, args ...any) error {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Codes of a RemoteError.
const (
	// CodeDeadLetter is the code of the error reply sent to a waiting sender
	// when its message was moved to the dead-letter stream.
	CodeDeadLetter = "dead_letter"
	// CodeCancelled is the code of the error reply sent to a waiting sender
	// when its message was cancelled (Cancel) before its handler replied.
	// A RemoteError with it matches ErrCancelled. It is also the code in
	// the retained result of a chain's step never sent because a step
	// before it did not succeed (WithThen), and of a batch's completion
	// never sent that is another batch's child.
	CodeCancelled = "cancelled"
	// CodeExpired is the code of the error reply sent to a waiting sender
	// when its message expired (WithExpiry) before any worker started it.
	// A RemoteError with it matches ErrExpired.
	CodeExpired = "expired"
	// CodeReplyTooLarge is the code of the error in the retained result of
	// a chain's step whose reply was to go on to the next step (WithThen)
	// but is over the broker's cap on a receiver's retained bytes
	// (Config.MaxResultBytes): the step counts as failed, and the chain
	// stops.
	CodeReplyTooLarge = broker.CodeReplyTooLarge
)

// ErrExpired matches the RemoteError (CodeExpired) that the sender of a
// message gets when the message expired (WithExpiry, WithExpireAt) before
// any worker started it.
var ErrExpired = errors.New("disker: message expired before it started")

// ErrCancelled is the cause of a handler's context (context.Cause) when
// its message was cancelled with Cancel, or by a Request whose context was
// cancelled; and matches the RemoteError (CodeCancelled) that its sender
// gets instead of a reply.
var ErrCancelled = errors.New("disker: message cancelled")

// RemoteError is an error that travelled back in a reply: the receiver could
// not handle the message. Request returns it; OnReply handlers see it in
// Message.Error.
type RemoteError struct {
	// Code classifies the error; CodeDeadLetter when the message was
	// dead-lettered.
	Code string
	// Text is the error's text as the receiver saw it.
	Text string
	// MessageID is the id of the message the error answers, when Request
	// returns it (for quoting it to a client that cannot see the logs).
	MessageID string
}

// Error returns "disker: remote error (Code): Text".
func (e *RemoteError) Error() string {
	return "disker: remote error (" + e.Code + "): " + e.Text
}

// Is reports whether target is ErrCancelled and e says that the message
// was cancelled (CodeCancelled), or target is ErrExpired and e says that it
// expired (CodeExpired).
func (e *RemoteError) Is(target error) bool {
	return e != nil && (target == ErrCancelled && e.Code == CodeCancelled || target == ErrExpired && e.Code == CodeExpired)
}

type noRetryError struct{ err error }

func (e noRetryError) Error() string { return e.err.Error() }
func (e noRetryError) Unwrap() error { return e.err }

// NoRetry marks a handler error as final: the message is moved to the
// dead-letter stream at once instead of being retried. NoRetry(nil) returns
// nil.
func NoRetry(err error) error {
	if err == nil {
		return nil
	}
	return noRetryError{err}
}

func isNoRetry(err error) bool {
	var n noRetryError
	return errors.As(err, &n)
}

// timeoutErr builds the error Request returns on a timeout: it matches both
// ErrTimeout and the context's error.
func timeoutErr(id string, ctxErr error) error {
	if ctxErr == nil {
		ctxErr = context.DeadlineExceeded
	}
	return fmt.Errorf("%w: request %s: %w", ErrTimeout, id, ctxErr)
}

// wrapBroker gives a broker error the package prefix if it lacks one, and
// turns the broker's ErrClosed into ErrClosed.
func wrapBroker(op string, err error) error {
	if errors.Is(err, broker.ErrClosed) {
		return ErrClosed
	}
	if strings.HasPrefix(err.Error(), "disker: ") {
		return err
	}
	return &opError{op: op, err: err}
}

type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return "disker: " + e.op + ": " + e.err.Error() }

func (e *opError) Unwrap() error { return e.err }
