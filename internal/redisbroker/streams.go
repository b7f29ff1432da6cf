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
//
// A reply with a Retention from a named Sender (the request's receiver)
// is also written to the request's record (field rep, as resFinal with no
// state) when it is accepted, as ReplyInbox writes one: by the same
// script (stream_reply) when the record's keys and the inbox's share a
// slot (always on one server), else by result_reply right after
// (recordAccepted), stream_reply keeping a copy until then
// (acceptedCopy). A reply without a Retention is the script inbox_stream
// alone.
func (b *Broker) ReplyStream(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	if err := b.checkReply(reply); err != nil {
		return err
	}
	data := rueidis.BinaryString(wire.Encode(reply))
	rec, prefix, err := b.acceptStream(ctx, reply, data, deadline)
	if err == nil && rec != nil {
		// The reply is accepted whatever becomes of its record: should
		// this step fail, the worker's FinishResult records it, or the
		// next attempt's StartResult (from the copy).
		b.recordAccepted(ctx, reply, data, rec, prefix)
	}
	return err
}

// acceptStream is ReplyStream's script: stream_reply with the record when
// it shares the inbox's slot, or with a copy when the record is in another
// slot (then it returns the record's keys and prefix, for the step that
// records the reply), else inbox_stream.
func (b *Broker) acceptStream(ctx context.Context, reply *broker.Envelope, data string, deadline time.Time) (rec []string, prefix string, err error) {
	inbox := b.inboxReplies.get(reply.Receiver, b.keys.replies)
	rec, prefix, together := b.replyRecord(reply, inbox)
	switch {
	case together:
		keys := append([]string{inbox, b.keys.streamState(reply.Receiver, reply.InReplyTo)}, rec...)
		_, err = b.runStream(ctx, "reply", reply.InReplyTo, scriptStreamReply, keys,
			[]string{reply.InReplyTo, streamDeadline(deadline), data, prefix, b.maxResults, msString(reply.Retention)})
		return nil, "", err
	case rec != nil:
		keys := []string{inbox, b.keys.streamState(reply.Receiver, reply.InReplyTo), b.keys.acceptedReply(reply.Receiver, reply.InReplyTo)}
		_, err = b.runStream(ctx, "reply", reply.InReplyTo, scriptStreamReply, keys,
			[]string{reply.InReplyTo, streamDeadline(deadline), data, acceptedTTL(reply.Retention)})
		return rec, prefix, err
	}
	_, err = b.stream(ctx, "reply", reply.Receiver, reply.InReplyTo, "r", deadline, data)
	return nil, "", err
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
	args := append([]string{code, id, streamDeadline(deadline), data}, more...)
	return b.runStream(ctx, op, id, scriptInboxStream,
		[]string{b.inboxReplies.get(inbox, b.keys.replies), b.keys.streamState(inbox, id)}, args)
}

// streamDeadline is deadline as inbox_stream takes it: unix ms rounded up
// (an entry at millisecond m is before the deadline when m is below it),
// "0" for none.
func streamDeadline(deadline time.Time) string {
	if deadline.IsZero() {
		return "0"
	}
	return strconv.FormatInt((deadline.UnixNano()+int64(time.Millisecond)-1)/int64(time.Millisecond), 10)
}

// runStream runs script, inbox_stream or stream_reply, for request id and
// returns the id of the entry it appended, or the error its answer means.
func (b *Broker) runStream(ctx context.Context, op, id string, script *rueidis.Lua, keys, args []string) (string, error) {
	res, err := script.Exec(ctx, b.client, keys, args).ToArray()
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

// luaInboxStream defines inboxStream(K, A), the script inbox_stream on
// keys K and arguments A (see there), which returns its answer.
const luaInboxStream = `
local function inboxStream(K, A)
  local ttl = redis.call('PTTL', K[1])
  if ttl == -2 then
    return {0}
  end
  local op = A[1]
  local st = redis.call('HMGET', K[2], 'd', 'a', 'n')
  if st[1] and op ~= 'g' then
    return {0}
  end
  local n = 0
  if op == 'p' then
    local a, had = tonumber(A[5]), tonumber(st[2] or '0')
    if a < had then
      return {2}
    end
    if a == had then
      n = tonumber(st[3])
    end
    if n >= tonumber(A[6]) then
      return {3}
    end
  end
  local id
  if op == 'p' then
    id = redis.call('XADD', K[1], '*', 'k', 'part', 'i', A[2], 'a', A[5], 'p', A[7], 'm', A[4])
  elseif op == 'r' then
    id = redis.call('XADD', K[1], '*', 'k', 'rep', 'i', A[2], 'm', A[4])
  else
    id = redis.call('XADD', K[1], '*', 'k', 'to', 'i', A[2], 'm', '')
  end
  if A[3] ~= '0' and tonumber(string.match(id, '^(%d+)')) >= tonumber(A[3]) then
    redis.call('XDEL', K[1], id)
    return {0}
  end
  if op == 'p' then
    redis.call('HSET', K[2], 'a', A[5], 'n', n + 1)
  else
    redis.call('HSET', K[2], 'd', 1)
  end
  if ttl > 0 then
    redis.call('PEXPIRE', K[2], ttl)
  end
  return {1, id}
end
`

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
` + luaInboxStream + `
return inboxStream(KEYS, ARGV)
`)

// scriptStreamReply appends the final reply of a streamed request to its
// inbox, settles the request and, when the reply is accepted, records it.
var scriptStreamReply = rueidis.NewLuaScript(`-- stream_reply
-- KEYS[1..2] -> the inbox's reply stream P:{I}:r and the request's stream
--            state P:{I}:s:<id>, as inbox_stream
-- KEYS[3..5] -> the request's record P:{R}:res:<id>, the index P:{R}:res
--            and sizes P:{R}:resn of its receiver (results.go); on a
--            Cluster, in the inbox's slot
-- ARGV[1] -> request id
-- ARGV[2] -> deadline in unix ms ("0": none), as inbox_stream's
-- ARGV[3] -> encoded reply envelope
-- ARGV[4] -> the prefix of the receiver's records P:{R}:res:
-- ARGV[5] -> the cap on the receiver's retained bytes
-- ARGV[6] -> retention ms
-- Or, when the record is in another slot: KEYS[3] -> the copy
-- P:{I}:ra:<id> (acceptedCopy), and ARGV[4] -> how long it lives, ms.
-- inbox_stream's "r"; when it appended the reply (accepted: before the
-- deadline, the request not settled, the inbox there), the reply is
-- recorded (field rep, resFinal with no state), so that the record holds
-- the reply exactly when the requester received it; or its copy is
-- written.
-- Returns inbox_stream's answer.
` + luaNow + luaResult + luaInboxStream + `
local res = inboxStream(KEYS, {'r', ARGV[1], ARGV[2], ARGV[3]})
if res[1] == 1 then
  if #KEYS == 3 then
    redis.call('SET', KEYS[3], ARGV[3], 'PX', ARGV[4])
  else
    resFinal({rec = KEYS[3], idx = KEYS[4], n = KEYS[5], pre = ARGV[4], cap = ARGV[5]}, ARGV[1], '',
      ARGV[6], {'rep', ARGV[3]}, {})
  end
end
return res
`)
