// Package wire is the binary encoding of a [broker.Envelope] as the Redis
// broker stores it in a stream entry.
//
// The layout is a version byte followed by the fields in a fixed order:
//
//	version   byte (1)
//	ID        uvarint length, bytes
//	Sender    uvarint length, bytes
//	Receiver  uvarint length, bytes
//	Content   uvarint length, bytes
//	InReplyTo uvarint length, bytes
//	ErrorCode uvarint length, bytes
//	ErrorText uvarint length, bytes
//	flags     byte: bits 0 and 1 are the Route (bit 0: RouteNone, a
//	          fire-and-forget message; bit 1: RouteInbox; neither:
//	          RouteSender; not both), bit 2 says an IdempotencyKey
//	          follows the headers, bit 3 a DedupKey after it, bit 4 a
//	          Retention after them, bit 5 is Stream (only with
//	          RouteInbox); other bits must be 0
//	Timeout   varint (nanoseconds)
//	Headers   uvarint count, then count pairs of (key, value), each a
//	          uvarint length and bytes, keys strictly ascending
//	IdempotencyKey  uvarint length (> 0), bytes; only when flag bit 2
//	          is set, so encodings without it are those of older versions
//	DedupKey  uvarint length (> 0), bytes; only when flag bit 3 is set
//	Retention uvarint (> 0, milliseconds); only when flag bit 4 is set
//
// The encoding is canonical: [Decode] accepts only what [Encode] produces
// (minimal varints, sorted unique header keys, no trailing bytes), so for any
// data that decodes, Encode of the result gives data back.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// Version is the format version written as the first byte.
const Version byte = 1

// MaxSize is the largest encoded envelope Decode accepts: 512 MiB, the
// largest value Redis stores by default (proto-max-bulk-len).
const MaxSize = 512 << 20

// MaxHeaders is the largest number of headers Decode accepts.
const MaxHeaders = 1 << 16

// The bits of the flags byte.
const (
	flagRouteNone  = 1
	flagRouteInbox = 2
	flagIdempotent = 4
	flagDedup      = 8
	flagRetention  = 16
	flagStream     = 32
	flagsKnown     = flagRouteNone | flagRouteInbox | flagIdempotent | flagDedup | flagRetention | flagStream
)

// ErrMalformed is wrapped by every error Decode returns.
var ErrMalformed = errors.New("wire: malformed envelope")

// Encode returns the binary form of env. Header keys are written in
// ascending order.
func Encode(env *broker.Envelope) []byte { return AppendEncode(nil, env) }

// AppendEncode appends the binary form of env, as Encode returns it, to b
// and returns the extended buffer: a caller that reuses its buffers
// encodes without allocating.
func AppendEncode(b []byte, env *broker.Envelope) []byte {
	n := 1 + 1 + binary.MaxVarintLen64 + binary.MaxVarintLen32
	for _, s := range [...]string{env.ID, env.Sender, env.Receiver, env.InReplyTo, env.ErrorCode, env.ErrorText, env.IdempotencyKey, env.DedupKey} {
		n += binary.MaxVarintLen32 + len(s)
	}
	n += binary.MaxVarintLen32 + len(env.Content)
	for k, v := range env.Headers {
		n += 2*binary.MaxVarintLen32 + len(k) + len(v)
	}
	b = slices.Grow(b, n)
	b = append(b, Version)
	b = appendString(b, env.ID)
	b = appendString(b, env.Sender)
	b = appendString(b, env.Receiver)
	b = binary.AppendUvarint(b, uint64(len(env.Content)))
	b = append(b, env.Content...)
	b = appendString(b, env.InReplyTo)
	b = appendString(b, env.ErrorCode)
	b = appendString(b, env.ErrorText)
	var flags byte
	switch env.Route {
	case broker.RouteNone:
		flags |= flagRouteNone
	case broker.RouteInbox:
		flags |= flagRouteInbox
	}
	if env.IdempotencyKey != "" {
		flags |= flagIdempotent
	}
	if env.DedupKey != "" {
		flags |= flagDedup
	}
	retention := env.Retention.Milliseconds()
	if retention > 0 {
		flags |= flagRetention
	}
	if env.Stream && env.Route == broker.RouteInbox {
		flags |= flagStream
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, int64(env.Timeout))
	b = binary.AppendUvarint(b, uint64(len(env.Headers)))
	if len(env.Headers) > 0 {
		keys := make([]string, 0, len(env.Headers))
		for k := range env.Headers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			b = appendString(b, k)
			b = appendString(b, env.Headers[k])
		}
	}
	if env.IdempotencyKey != "" {
		b = appendString(b, env.IdempotencyKey)
	}
	if env.DedupKey != "" {
		b = appendString(b, env.DedupKey)
	}
	if retention > 0 {
		b = binary.AppendUvarint(b, uint64(retention))
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Decode parses data written by [Encode]. Content of the result aliases
// data. Empty Content and Headers decode as nil. Any other input gives an
// error wrapping [ErrMalformed]; Decode never panics.
func Decode(data []byte) (broker.Envelope, error) {
	return decode(data)
}

// DecodeString is [Decode] of an encoding held in a string, as a Redis
// client returns a field's value: the strings of the result share s's
// memory, and only Content is copied, so decoding allocates little.
func DecodeString(s string) (broker.Envelope, error) {
	return decode(s)
}

// encoded is what an encoding is held in.
type encoded interface{ ~string | ~[]byte }

func decode[T encoded](data T) (broker.Envelope, error) {
	var env broker.Envelope
	if len(data) == 0 {
		return env, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if len(data) > MaxSize {
		return env, fmt.Errorf("%w: %d bytes, over the limit of %d", ErrMalformed, len(data), MaxSize)
	}
	if data[0] != Version {
		return env, fmt.Errorf("%w: unknown version %d", ErrMalformed, data[0])
	}
	d := decoder[T]{b: data[1:]}
	env.ID = d.str("id")
	env.Sender = d.str("sender")
	env.Receiver = d.str("receiver")
	if c := d.next("content"); len(c) > 0 {
		env.Content = toBytes(c)
	}
	env.InReplyTo = d.str("in_reply_to")
	env.ErrorCode = d.str("error_code")
	env.ErrorText = d.str("error_text")
	flags := d.byte("flags")
	if d.err == nil && flags&^flagsKnown != 0 {
		d.fail("flags", "unknown bits set")
	}
	switch flags & (flagRouteNone | flagRouteInbox) {
	case flagRouteNone:
		env.Route = broker.RouteNone
	case flagRouteInbox:
		env.Route = broker.RouteInbox
	case 0:
		env.Route = broker.RouteSender
	default:
		d.fail("flags", "two routes set")
	}
	if flags&flagStream != 0 {
		if env.Route != broker.RouteInbox {
			d.fail("flags", "stream set without the inbox route")
		}
		env.Stream = true
	}
	env.Timeout = time.Duration(d.varint("timeout"))
	count := d.uvarint("headers")
	if d.err == nil && count > MaxHeaders {
		d.fail("headers", fmt.Sprintf("%d headers, over the limit of %d", count, MaxHeaders))
	}
	if d.err == nil && count > uint64(len(d.b)/2) {
		d.fail("headers", "count larger than the data")
	}
	if d.err == nil && count > 0 {
		env.Headers = make(map[string]string, count)
		prev := ""
		for i := uint64(0); i < count && d.err == nil; i++ {
			k := d.str("header key")
			v := d.str("header value")
			if d.err == nil && i > 0 && k <= prev {
				d.fail("headers", "keys not in strictly ascending order")
			}
			env.Headers[k] = v
			prev = k
		}
	}
	if flags&flagIdempotent != 0 {
		env.IdempotencyKey = d.str("idempotency key")
		if d.err == nil && env.IdempotencyKey == "" {
			d.fail("idempotency key", "empty, with its flag set")
		}
	}
	if flags&flagDedup != 0 {
		env.DedupKey = d.str("dedup key")
		if d.err == nil && env.DedupKey == "" {
			d.fail("dedup key", "empty, with its flag set")
		}
	}
	if flags&flagRetention != 0 {
		ms := d.uvarint("retention")
		if d.err == nil && (ms == 0 || ms > math.MaxInt64/uint64(time.Millisecond)) {
			d.fail("retention", "zero or out of range, with its flag set")
		}
		env.Retention = time.Duration(ms) * time.Millisecond
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("envelope", fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	if d.err != nil {
		return broker.Envelope{}, d.err
	}
	return env, nil
}

// toBytes returns v as a byte slice: v itself when it is one (aliased,
// its capacity cut to its length), a copy when it is a string.
func toBytes[T encoded](v T) []byte {
	if b, ok := any(v).([]byte); ok {
		return b[:len(b):len(b)]
	}
	return []byte(v)
}

type decoder[T encoded] struct {
	b   T
	err error
}

func (d *decoder[T]) fail(field, msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s: %s", ErrMalformed, field, msg)
	}
}

func (d *decoder[T]) uvarint(field string) uint64 {
	if d.err != nil {
		return 0
	}
	// As binary.Uvarint, on either kind of T.
	var v uint64
	var shift uint
	n := 0
	for ; ; n++ {
		if n == len(d.b) || n == binary.MaxVarintLen64 {
			d.fail(field, "bad length")
			return 0
		}
		c := d.b[n]
		if c < 0x80 {
			if n == binary.MaxVarintLen64-1 && c > 1 {
				d.fail(field, "bad length")
				return 0
			}
			v |= uint64(c) << shift
			n++
			break
		}
		v |= uint64(c&0x7f) << shift
		shift += 7
	}
	if n != uvarintLen(v) {
		d.fail(field, "non-minimal varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder[T]) varint(field string) int64 {
	u := d.uvarint(field)
	// Zig-zag, as binary.AppendVarint writes it.
	v := int64(u >> 1)
	if u&1 != 0 {
		v = ^v
	}
	return v
}

func (d *decoder[T]) byte(field string) byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.fail(field, "truncated")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

// next returns the next length-prefixed field, empty when it is or on an
// error.
func (d *decoder[T]) next(field string) T {
	var zero T
	n := d.uvarint(field)
	if d.err != nil {
		return zero
	}
	if n > uint64(len(d.b)) || n > math.MaxInt32 {
		d.fail(field, fmt.Sprintf("length %d beyond the %d bytes left", n, len(d.b)))
		return zero
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

// str returns the next field as a string: a substring of a string T, a
// copy of a []byte T's bytes.
func (d *decoder[T]) str(field string) string {
	return string(d.next(field))
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// IDPrefix returns the first bytes of every encoding of a message whose id
// is id: a broker that finds a message by id compares them with an entry's
// start instead of decoding it.
func IDPrefix(id string) []byte {
	return appendString([]byte{Version}, id)
}
