package redisbroker

import (
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// encoding is an envelope encoded (wire) into a buffer of encodings, to go
// into one command as a string that shares the buffer's memory. Its
// sender releases it once Redis answered that command.
type encoding struct{ buf *[]byte }

// encodings are buffers of encoded envelopes, reused once Redis answered
// the command that carried one.
var encodings = sync.Pool{New: func() any { return new([]byte) }}

// maxPooledEncoding is the largest buffer kept for reuse: a large message
// leaves its buffer to the collector.
const maxPooledEncoding = 64 << 10

// encode returns env encoded.
func encode(env *broker.Envelope) encoding {
	bp := encodings.Get().(*[]byte)
	*bp = wire.AppendEncode((*bp)[:0], env)
	return encoding{bp}
}

// String returns the encoding as a string that shares its buffer: valid
// until release.
func (e encoding) String() string { return rueidis.BinaryString(*e.buf) }

// encodeWithMS returns env encoded, as data, and t in unix ms, as msOf
// writes it, in the same buffer: both strings are valid until release.
func encodeWithMS(env *broker.Envelope, t time.Time) (e encoding, data, ms string) {
	e = encode(env)
	if t.IsZero() {
		return e, e.String(), ""
	}
	n := len(*e.buf)
	*e.buf = strconv.AppendInt(*e.buf, t.UnixMilli(), 10)
	b := *e.buf
	return e, rueidis.BinaryString(b[:n]), rueidis.BinaryString(b[n:])
}

// release gives the buffer back for reuse when answered: Redis answered the
// command that carried it, so the client has written it and reads it no
// more. After any other outcome (the call's context ended first, the
// connection broke) the client may still write the command, and the
// buffer is left to the collector.
func (e encoding) release(answered bool) {
	if !answered || cap(*e.buf) > maxPooledEncoding {
		return
	}
	encodings.Put(e.buf)
}
