package redisbroker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/wire"
)

// Kinds of reply stream entry, in field k.
const (
	kindReply   = "rep"
	kindTimeout = "to"
)

// ErrorCodeUndecodable is the ErrorCode of the envelope ReadReplies returns
// for a reply entry whose envelope does not decode: the requester still
// learns that its request was answered, and how it went wrong.
const ErrorCodeUndecodable = "undecodable_reply"

// Reply appends reply to the reply stream of reply.Receiver (the original
// sender), as mode says: ReplyTimed runs one script that accepts it only if
// the request reply.InReplyTo is still pending and its deadline is after
// Redis time (concurrent timed replies share round trips and, per sender,
// script calls: see batcher); ReplyUntimed is a plain XADD. A refused
// reply is broker.ErrLate, and nothing is written. A timed reply whose ctx
// has not ended when it is merged runs to its end.
func (b *Broker) Reply(ctx context.Context, reply *broker.Envelope, mode broker.ReplyMode) error {
	if err := b.checkReply(reply); err != nil {
		return err
	}
	sender := reply.Receiver
	var n int64
	var err error
	switch mode {
	case broker.ReplyUntimed:
		enc := encode(reply)
		res := b.client.Do(ctx, b.client.B().Xadd().Key(b.keys.replies(sender)).Id("*").FieldValue().
			FieldValue("k", kindReply).FieldValue("i", reply.InReplyTo).FieldValue("m", enc.String()).Build())
		enc.release(res.NonRedisError() == nil)
		return b.failIf(ctx, "reply", res.Error())
	case broker.ReplyTimed:
		if err := ctx.Err(); err != nil {
			return b.fail(ctx, "reply", err)
		}
		enc := encode(reply)
		var r replyResult
		tr := timedReply{sender: sender, id: reply.InReplyTo, data: enc.String()}
		if reply.Retention > 0 && reply.Sender != "" && broker.CheckName("receiver", reply.Sender) == nil {
			rec, prefix := b.resultKeys(reply.Sender, reply.InReplyTo)
			if !b.cluster || keyslot.Of(rec[0]) == keyslot.Of(b.keys.timeouts(sender)) {
				tr.rec, tr.prefix, tr.ret = rec, prefix, msString(reply.Retention)
			} else {
				// Recorded by the worker's next step; the script that
				// accepts it keeps a copy (see acceptedCopy).
				tr.prefix, tr.ret = b.keys.acceptedReply(sender, reply.InReplyTo), acceptedTTL(reply.Retention)
			}
		}
		if r, err = b.replies.do(ctx, tr); err == nil {
			n, err = r.accepted, r.err
		}
		enc.release(err == nil)
	default:
		return fmt.Errorf("redisbroker: reply mode %d is not a broker.ReplyMode", mode)
	}
	if err != nil {
		return b.fail(ctx, "reply", err)
	}
	if n == 0 {
		return broker.ErrLate
	}
	return nil
}

func (b *Broker) checkReply(reply *broker.Envelope) error {
	if reply != nil {
		if err := broker.CheckName("Envelope.Receiver", reply.Receiver); err != nil {
			return err
		}
	}
	return b.checkStored(reply)
}

// checkStored checks a reply to be stored for others (an idempotency
// key's), whose receiver each of them sets.
func (b *Broker) checkStored(reply *broker.Envelope) error {
	if err := b.check(); err != nil {
		return err
	}
	if reply == nil {
		return errors.New("redisbroker: reply is nil")
	}
	if err := broker.CheckName("Envelope.InReplyTo", reply.InReplyTo); err != nil {
		return err
	}
	return b.checkSize(reply)
}

// idTime returns the time of a stream entry id, its milliseconds part.
func idTime(id string) (time.Time, bool) {
	ms, _, ok := parseID(id)
	if !ok || ms > math.MaxInt64 {
		return time.Time{}, false
	}
	return time.UnixMilli(int64(ms)), true
}

// timedReply is a reply to a timed request, on its way to the batcher.
type timedReply struct {
	sender, id, data string
	// rec, prefix and ret, when rec is set, are the keys of the record of
	// the request (its receiver is reply.Sender), the prefix of its
	// receiver's records and its retention: an accepted reply is recorded
	// in the same script (see scriptReplyTimed). When rec is nil and
	// prefix is set, prefix is the key of the accepted reply's copy
	// (acceptedCopy), in the sender's slot, and ret how long it lives, ms.
	rec         []string
	prefix, ret string
}

// replyResult is the outcome of a timedReply: accepted is 1, or 0 when late.
type replyResult struct {
	accepted int64
	err      error
}

// flushReplies settles replies in one round trip: one reply_timed call per
// sender (in parallel when there are several), each for all of that
// sender's replies, and sets their results in out. It waits for them
// whatever its leader's context (the client bounds their I/O), and its
// commands are its own (keys and arguments copied from replies), so it
// keeps nothing of replies: the batcher reuses them (withOwnItems).
func (b *Broker) flushReplies(_ context.Context, replies []timedReply, out []replyResult) {
	bySender := make(map[string][]int, 1)
	var order []string
	for i, r := range replies {
		if _, ok := bySender[r.sender]; !ok {
			order = append(order, r.sender)
		}
		bySender[r.sender] = append(bySender[r.sender], i)
	}
	settle := func(sender string) {
		idx := bySender[sender]
		args := make([]string, 0, 5*len(idx)+1)
		keys := []string{b.keys.timeouts(sender), b.keys.timedMessages(sender), b.keys.replies(sender)}
		args = append(args, b.maxResults)
		for _, i := range idx {
			r := &replies[i]
			at := "0"
			switch {
			case r.rec != nil:
				at = strconv.Itoa(len(keys) + 1)
				keys = append(keys, r.rec...)
			case r.prefix != "":
				at = strconv.Itoa(-len(keys) - 1)
				keys = append(keys, r.prefix)
			}
			prefix := r.prefix
			if r.rec == nil {
				prefix = ""
			}
			args = append(args, r.id, r.data, at, prefix, r.ret)
		}
		ctx := context.Background()
		res, err := scriptReplyTimed.Exec(ctx, b.client, keys, args).ToArray()
		if err == nil && len(res) != len(idx) {
			err = fmt.Errorf("redisbroker: reply: the script answered %d results for %d replies", len(res), len(idx))
		}
		for j, i := range idx {
			if err != nil {
				out[i].err = b.fail(ctx, "reply", err)
				continue
			}
			out[i].accepted, out[i].err = res[j].AsInt64()
		}
	}
	if len(order) == 1 {
		settle(order[0])
		return
	}
	var wg sync.WaitGroup
	for _, sender := range order {
		wg.Go(func() { settle(sender) })
	}
	wg.Wait()
}

// ExpireTimeouts settles up to max of sender's pending timeouts whose
// deadline passed, with a timeout notice each, in one script.
func (b *Broker) ExpireTimeouts(ctx context.Context, sender string, max int) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if err := broker.CheckName("sender", sender); err != nil {
		return 0, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return 0, err
	}
	n, err := scriptExpire.Exec(ctx, b.client,
		[]string{b.keys.timeouts(sender), b.keys.timedMessages(sender), b.keys.replies(sender)},
		[]string{strconv.Itoa(max)}).AsInt64()
	if err != nil {
		return 0, b.fail(ctx, "expire timeouts", err)
	}
	return int(n), nil
}

// ReadReplies reads up to max entries of sender's reply stream for
// consumer: after a call of this broker failed without an answer from
// Redis, first the entries delivered to consumer that it never returned
// (recoverReplies); then entries whose lease expired, then new ones,
// blocking up to block. An entry without a kind or a request id (written by hand) goes
// to the dead-letter stream of the name; a reply whose envelope does not
// decode is returned with ErrorCode ErrorCodeUndecodable, and a timeout
// notice whose original does not decode with an Env holding only the id.
func (b *Broker) ReadReplies(ctx context.Context, p *broker.ReadRepliesParams) ([]broker.Reply, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	sender := p.Sender
	st := b.replyState(sender)
	c := b.replyCursor(st.keys.stream)
	entries, done, err := b.recoverReplies(ctx, st, c, p)
	if !done {
		entries, err = b.fetch(ctx, st, &broker.FetchParams{Receiver: sender, Consumer: p.Consumer, Max: p.Max, Block: p.Block, Lease: p.Lease})
	}
	if err != nil {
		return nil, err
	}
	out, err := b.replyEntries(ctx, sender, entries)
	if err == nil {
		c.handed(entries)
	}
	return out, err
}

// makeReplyKeys returns the streamKeys of sender's reply stream.
func (b *Broker) makeReplyKeys(sender string) streamKeys {
	return streamKeys{op: "read replies", stream: b.keys.replies(sender), dlq: b.keys.deadLetters(sender), retries: b.keys.replyRetries(sender), holders: b.keys.replyHolders(sender),
		high: b.keys.named(sender, "rqh"), low: b.keys.named(sender, "rql"),
		groups: [3]string{b.keys.replyRetries(sender), b.keys.replyRetries(sender), b.keys.replyRetries(sender)}}
}

// replyEntries turns reply-stream entries into Replies, burying malformed
// ones (see ReadReplies).
func (b *Broker) replyEntries(ctx context.Context, sender string, entries []entry) ([]broker.Reply, error) {
	s := &b.replyState(sender).keys
	out := make([]broker.Reply, 0, len(entries))
	for _, e := range entries {
		id, _ := e.field("i")
		rep := broker.Reply{Ref: e.id, RequestID: id}
		rep.At, _ = idTime(e.id)
		switch k, _ := e.field("k"); k {
		case kindReply:
			rep.Kind = broker.KindReply
		case kindTimeout:
			rep.Kind = broker.KindTimeout
		case kindPartial:
			if part, ok := partialEntry(sender, id, &e); ok && id != "" {
				out = append(out, part)
				continue
			}
		}
		if rep.Kind == 0 || rep.RequestID == "" {
			if err := b.bury(ctx, s, e.id, "malformed reply entry: no kind or request id", e.attempt, true); err != nil {
				return nil, err
			}
			continue
		}
		m, _ := e.field("m")
		env, err := wire.DecodeString(m)
		switch {
		case err == nil:
			rep.Env = env
		case rep.Kind == broker.KindReply:
			rep.Env = broker.Envelope{Receiver: sender, InReplyTo: rep.RequestID,
				ErrorCode: ErrorCodeUndecodable, ErrorText: "redisbroker: the reply does not decode: " + err.Error()}
		default:
			rep.Env = broker.Envelope{ID: rep.RequestID, Sender: sender}
		}
		out = append(out, rep)
	}
	return out, nil
}

// AckReplies deletes entries of sender's reply stream.
func (b *Broker) AckReplies(ctx context.Context, sender string, refs ...string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("sender", sender); err != nil {
		return err
	}
	stream := b.keys.replies(sender)
	if err := b.ack(ctx, "ack replies", stream, b.keys.replyRetries(sender), refs); err != nil {
		return err
	}
	b.replyCursor(stream).deleted(refs)
	return nil
}

// scriptReplyTimed settles timed requests of one sender with their replies.
var scriptReplyTimed = rueidis.NewLuaScript(`-- reply_timed
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- KEYS[3] -> the sender's reply stream P:{S}:r
-- KEYS[4..] -> for each request with a record: its record P:{R}:res:<id>,
--            the index P:{R}:res and sizes P:{R}:resn of its receiver
--            (results.go); on a Cluster, only those in the sender's slot
-- ARGV[1] -> the cap on a receiver's retained bytes
-- ARGV[2..] -> groups of five: request id, encoded reply envelope, the
--            index in KEYS of its record's keys or "0" for none, the
--            prefix of its receiver's records, its retention ms; or minus
--            the index in KEYS of the key of its copy P:{S}:ra:<id>
--            (acceptedCopy), unused, how long the copy lives in ms
-- Accepts each reply only if its request is pending and Redis time is before
-- its deadline, and only the first of two replies to one request; the
-- timeout monitor (expire) is the only other remover. An accepted reply
-- with a record is recorded there (field rep, resFinal), so that the
-- record holds the reply exactly when the sender received it; one with a
-- copy gets its copy.
-- Returns one number per group: 1 when accepted, 0 when late.
` + luaNow + luaResult + `
local ids = {}
for i = 2, #ARGV, 5 do
  ids[#ids + 1] = ARGV[i]
end
local deadlines = redis.call('ZMSCORE', KEYS[1], unpack(ids))
local out, won, seen = {}, {}, {}
for i, id in ipairs(ids) do
  local d = deadlines[i]
  if d and not seen[id] and now < tonumber(d) then
    seen[id] = true
    won[#won + 1] = id
    out[i] = 1
  else
    out[i] = 0
  end
end
if #won > 0 then
  redis.call('ZREM', KEYS[1], unpack(won))
  redis.call('HDEL', KEYS[2], unpack(won))
  for i, id in ipairs(ids) do
    if out[i] == 1 then
      local a = 5 * i - 3
      redis.call('XADD', KEYS[3], '*', 'k', 'rep', 'i', id, 'm', ARGV[a + 1])
      local k = tonumber(ARGV[a + 2])
      if k < 0 then
        redis.call('SET', KEYS[-k], ARGV[a + 1], 'PX', ARGV[a + 4])
      elseif k > 0 then
        resFinal({rec = KEYS[k], idx = KEYS[k + 1], n = KEYS[k + 2], pre = ARGV[a + 3], cap = ARGV[1]}, id, '',
          ARGV[a + 4], {'rep', ARGV[a + 1]}, {})
      end
    end
  end
end
return out
`)

// scriptExpire turns expired pending timeouts into timeout notices.
var scriptExpire = rueidis.NewLuaScript(`-- expire
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- KEYS[3] -> the sender's reply stream P:{S}:r
-- ARGV[1] -> max notices
-- Settles up to ARGV[1] requests whose deadline <= Redis time: removes them
-- and appends a timeout notice (k=to, i=id, m=original envelope) for each.
-- Returns how many it settled.
` + luaNow + `
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', nowStr, 'LIMIT', 0, tonumber(ARGV[1]))
for _, id in ipairs(ids) do
  local orig = redis.call('HGET', KEYS[2], id) or ''
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('XADD', KEYS[3], '*', 'k', 'to', 'i', id, 'm', orig)
end
return #ids
`)

// scriptCancel withdraws a pending timeout without a notice
// (sendTimedSplit's undo).
var scriptCancel = rueidis.NewLuaScript(`-- cancel
-- KEYS[1] -> the sender's pending timeouts P:{S}:t
-- KEYS[2] -> the sender's timed messages P:{S}:tm
-- ARGV[1] -> request id
-- Returns 1 when the request was pending (now settled), 0 when it was not.
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('ZREM', KEYS[1], ARGV[1])
`)
