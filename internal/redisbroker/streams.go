package redisbroker

// Streamed requests (broker.Streams): partial replies in an inbox's reply
// stream before the final outcome, each appended, and the outcome
// settled, by one script on the inbox's stream and the request's state.

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// kindPartial is the kind of a partial reply entry, in field k; field a is
// its attempt and field p its broker.PartKind.
const kindPartial = "part"

// The answers of the script inbox_stream, in its first element.
const (
	streamLate     = 0
	streamAppended = 1
	streamStale    = 2
	streamCapped   = 3
)

// Partial appends a partial reply to a streamed request (see
// broker.Streams), in one script.
func (b *Broker) Partial(ctx context.Context, p *broker.PartialParams) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := p.Validate(); err != nil {
		return err
	}
	if len(p.Data) > b.maxSize {
		return fmt.Errorf("redisbroker: partial of %d bytes is over the limit of %d", len(p.Data), b.maxSize)
	}
	kind := p.Kind
	if kind == 0 {
		kind = broker.PartData
	}
	_, err := b.stream(ctx, "partial", p.Inbox, p.RequestID, "p", p.Deadline, rueidis.BinaryString(p.Data),
		strconv.Itoa(p.Attempt), strconv.Itoa(p.Max), strconv.Itoa(int(kind)))
	return err
}

// ReplyStream appends the final reply to a streamed request and settles
// it (see broker.Streams), in one script.
func (b *Broker) ReplyStream(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	if err := b.checkReply(reply); err != nil {
		return err
	}
	_, err := b.stream(ctx, "reply", reply.Receiver, reply.InReplyTo, "r", deadline, rueidis.BinaryString(wire.Encode(reply)))
	return err
}

// GiveUpStream appends the marker of a streamed request and settles it
// (see broker.Streams), in one script.
func (b *Broker) GiveUpStream(ctx context.Context, inbox, id string) (broker.Reply, error) {
	if err := b.check(); err != nil {
		return broker.Reply{}, err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return broker.Reply{}, err
	}
	if err := broker.CheckName("id", id); err != nil {
		return broker.Reply{}, err
	}
	ref, err := b.stream(ctx, "give up", inbox, id, "g", time.Time{}, "")
	if err != nil {
		return broker.Reply{}, err
	}
	at, ok := idTime(ref)
	if !ok {
		return broker.Reply{}, fmt.Errorf("redisbroker: give up: the script answered the id %q", ref)
	}
	return broker.Reply{Ref: ref, Kind: broker.KindTimeout, RequestID: id, Env: broker.Envelope{ID: id, Sender: inbox}, At: at}, nil
}

// stream runs the script inbox_stream's op for request id of inbox and
// returns the id of the entry it appended.
func (b *Broker) stream(ctx context.Context, op, inbox, id, code string, deadline time.Time, data string, more ...string) (string, error) {
	dl := "0"
	if !deadline.IsZero() {
		// An entry at millisecond m is before the deadline when m is below
		// the deadline rounded up to the millisecond.
		dl = strconv.FormatInt((deadline.UnixNano()+int64(time.Millisecond)-1)/int64(time.Millisecond), 10)
	}
	args := append([]string{code, id, dl, data}, more...)
	res, err := scriptInboxStream.Exec(ctx, b.client,
		[]string{b.inboxReplies.get(inbox, b.keys.replies), b.keys.streamState(inbox, id)}, args).ToArray()
	if err != nil {
		return "", b.fail(ctx, op, err)
	}
	if len(res) == 0 {
		return "", fmt.Errorf("redisbroker: %s: the script answered nothing", op)
	}
	n, err := res[0].AsInt64()
	if err != nil {
		return "", fmt.Errorf("redisbroker: %s: %w", op, err)
	}
	switch n {
	case streamLate:
		return "", broker.ErrLate
	case streamStale:
		return "", fmt.Errorf("redisbroker: %s: a later attempt streams request %s: %w", op, id, broker.ErrLeaseLost)
	case streamCapped:
		return "", broker.ErrPartialCap
	case streamAppended:
		if len(res) == 2 {
			return res[1].ToString()
		}
	}
	return "", fmt.Errorf("redisbroker: %s: the script answered %d", op, n)
}

// partialEntry returns the partial reply of entry e, of inbox's request
// id, with its attempt and kind; ok false when they are missing.
func partialEntry(inbox, id string, e *entry) (broker.Reply, bool) {
	a, _ := e.field("a")
	p, _ := e.field("p")
	m, _ := e.field("m")
	attempt, err1 := strconv.Atoi(a)
	kind, err2 := strconv.Atoi(p)
	if err1 != nil || err2 != nil || attempt <= 0 || kind <= 0 {
		return broker.Reply{}, false
	}
	rep := broker.Reply{Ref: e.id, Kind: broker.KindPartial, RequestID: id, Attempt: attempt, Part: broker.PartKind(kind),
		Env: broker.Envelope{Receiver: inbox, InReplyTo: id}}
	if m != "" {
		rep.Env.Content = []byte(m)
	}
	rep.At, _ = idTime(e.id)
	return rep, true
}

// scriptInboxStream appends an entry of a streamed request to its inbox.
var scriptInboxStream = rueidis.NewLuaScript(`-- inbox_stream
-- KEYS[1] -> the inbox's reply stream P:{I}:r
-- KEYS[2] -> the request's stream state P:{I}:s:<id>, a hash: a (the
--            highest attempt that sent partials), n (how many it sent),
--            d (1 once settled)
-- ARGV[1] -> "p" a partial, "r" the final reply, "g" the marker
-- ARGV[2] -> request id
-- ARGV[3] -> deadline in unix ms ("0": none); the entry must be before it
-- ARGV[4] -> the partial's data, or the encoded reply envelope
-- ARGV[5] -> p: attempt; ARGV[6] -> p: max partials per attempt;
-- ARGV[7] -> p: part kind
-- Nothing is written when the inbox has gone, and only a marker once the
-- request is settled; "r" and "g" settle it. The state expires with the
-- inbox's stream.
-- Returns {1, entry id} when appended; {0} late (inbox gone, settled, or
-- deadline passed); {2} a later attempt sent partials; {3} over the cap.
local ttl = redis.call('PTTL', KEYS[1])
if ttl == -2 then
  return {0}
end
local op = ARGV[1]
local st = redis.call('HMGET', KEYS[2], 'd', 'a', 'n')
if st[1] and op ~= 'g' then
  return {0}
end
local n = 0
if op == 'p' then
  local a, had = tonumber(ARGV[5]), tonumber(st[2] or '0')
  if a < had then
    return {2}
  end
  if a == had then
    n = tonumber(st[3])
  end
  if n >= tonumber(ARGV[6]) then
    return {3}
  end
end
local id
if op == 'p' then
  id = redis.call('XADD', KEYS[1], '*', 'k', 'part', 'i', ARGV[2], 'a', ARGV[5], 'p', ARGV[7], 'm', ARGV[4])
elseif op == 'r' then
  id = redis.call('XADD', KEYS[1], '*', 'k', 'rep', 'i', ARGV[2], 'm', ARGV[4])
else
  id = redis.call('XADD', KEYS[1], '*', 'k', 'to', 'i', ARGV[2], 'm', '')
end
if ARGV[3] ~= '0' and tonumber(string.match(id, '^(%d+)')) >= tonumber(ARGV[3]) then
  redis.call('XDEL', KEYS[1], id)
  return {0}
end
if op == 'p' then
  redis.call('HSET', KEYS[2], 'a', ARGV[5], 'n', n + 1)
else
  redis.call('HSET', KEYS[2], 'd', 1)
end
if ttl > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
return {1, id}
`)
