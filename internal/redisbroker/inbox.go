package redisbroker

// The inbox: the private reply address of a requester (broker.Inbox). Its
// request is one XADD that carries the deadline; its replies and markers
// are XADD NOMKSTREAM to its reply stream, whose entry ids, Redis time,
// decide the outcome; its one reader reads with XREAD and trims.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
)

// ReplyInbox appends reply to its inbox's reply stream (see appendInbox).
// The entry's id is Redis time: the reply is accepted when it is before
// deadline (or deadline is zero), and otherwise the entry stays, for the
// requester to ignore, and the call returns ErrLate. See broker.Inbox.
//
// A reply with a Retention from a named Sender (the request's receiver)
// is also written to the request's record (field rep, as resFinal with no
// state) when it is accepted: by the same script when the record's keys
// and the inbox's share a slot (always on one server; see
// replyInboxRecorded), else by a second script right after the append
// (recordAccepted), the append keeping a copy until then (acceptedCopy).
// A reply without a Retention is the one XADD.
func (b *Broker) ReplyInbox(ctx context.Context, reply *broker.Envelope, deadline time.Time) error {
	if err := b.checkReply(reply); err != nil {
		return err
	}
	enc := encode(reply)
	at, rec, prefix, err := b.acceptInbox(ctx, reply, enc.String(), deadline)
	late := err == nil && !deadline.IsZero() && !at.Before(deadline)
	if err == nil && !late && rec != nil {
		// The reply is accepted whatever becomes of its record: should
		// this step fail, the worker's FinishResult records it, or the
		// next attempt's StartResult (from the copy).
		b.recordAccepted(ctx, reply, enc.String(), rec, prefix)
	}
	enc.release(err == nil || errors.Is(err, broker.ErrLate))
	if late {
		return broker.ErrLate
	}
	return err
}

// acceptInbox is ReplyInbox's append of reply (encoded as data), with
// its record when the record shares the inbox's slot, or with a copy when
// it has a record in another slot: then it returns that record's keys and
// prefix, for the step that records the reply.
func (b *Broker) acceptInbox(ctx context.Context, reply *broker.Envelope, data string, deadline time.Time) (at time.Time, rec []string, prefix string, err error) {
	inbox := b.inboxReplies.get(reply.Receiver, b.keys.replies)
	rec, prefix, together := b.replyRecord(reply, inbox)
	switch {
	case together:
		at, err = b.replyInboxRecorded(ctx, inbox, reply, data, deadline, rec, prefix)
		return at, nil, "", err
	case rec != nil:
		copyKey := []string{b.keys.acceptedReply(reply.Receiver, reply.InReplyTo)}
		at, err = b.replyInboxRecorded(ctx, inbox, reply, data, deadline, copyKey, acceptedTTL(reply.Retention))
		return at, rec, prefix, err
	}
	_, at, err = b.appendInbox(ctx, "reply", reply.Receiver, kindReply, reply.InReplyTo, data)
	return at, nil, "", err
}

// replyRecord returns the keys of the record of reply's request and
// their prefix (resultKeys) when the reply is to be recorded where its
// inbox accepts it (it has a Retention and a named Sender, the request's
// receiver), else nil; together tells whether they share the slot of the
// inbox's reply stream inbox (always on one server), so that the script
// that accepts the reply can record it.
func (b *Broker) replyRecord(reply *broker.Envelope, inbox string) (rec []string, prefix string, together bool) {
	if reply.Retention <= 0 || reply.Sender == "" || broker.CheckName("receiver", reply.Sender) != nil {
		return nil, "", false
	}
	rec, prefix = b.resultKeys(reply.Sender, reply.InReplyTo)
	return rec, prefix, !b.cluster || keyslot.Of(rec[0]) == keyslot.Of(inbox)
}

// replyInboxRecorded runs the script reply_inbox: the append of
// appendInbox and, when the reply is accepted, its write to the request's
// record rec (keys of inbox's slot), in one step; or, when rec is the one
// key of a copy (acceptedCopy), the copy's write, to live for prefix ms.
// It returns the entry's time.
func (b *Broker) replyInboxRecorded(ctx context.Context, inbox string, reply *broker.Envelope, data string, deadline time.Time, rec []string, prefix string) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, b.fail(ctx, "reply", err)
	}
	ref, err := scriptReplyInbox.Exec(ctx, b.client, append([]string{inbox}, rec...),
		[]string{reply.InReplyTo, data, deadlineCeil(deadline), prefix, b.maxResults, msString(reply.Retention)}).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return time.Time{}, broker.ErrLate
	case err != nil:
		return time.Time{}, b.fail(ctx, "reply", err)
	}
	at, ok := idTime(ref)
	if !ok {
		return time.Time{}, fmt.Errorf("redisbroker: reply: the script answered the id %q", ref)
	}
	return at, nil
}

// recordInboxReply writes an accepted reply to the request's record rec
// with the script result_reply: the second step of ReplyInbox (and
// ReplyStream) when the record's slot is not the inbox's (see
// recordAccepted).
func (b *Broker) recordInboxReply(ctx context.Context, reply *broker.Envelope, data string, rec []string, prefix string) error {
	err := scriptResultReply.Exec(ctx, b.client, rec,
		[]string{reply.InReplyTo, data, prefix, b.maxResults, msString(reply.Retention)}).Error()
	return b.failIf(ctx, "record reply", err)
}

// deadlineCeil is deadline in unix ms rounded up, so that an entry id's
// milliseconds are below it exactly when the entry's time is before
// deadline; "" for no deadline.
func deadlineCeil(deadline time.Time) string {
	if deadline.IsZero() {
		return ""
	}
	ms := deadline.UnixMilli()
	if deadline.After(time.UnixMilli(ms)) {
		ms++
	}
	return strconv.FormatInt(ms, 10)
}

// GiveUp appends a marker for request id to inbox's reply stream (see
// appendInbox). See broker.Inbox.
func (b *Broker) GiveUp(ctx context.Context, inbox, id string) (broker.Reply, error) {
	if err := b.check(); err != nil {
		return broker.Reply{}, err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return broker.Reply{}, err
	}
	if err := broker.CheckName("id", id); err != nil {
		return broker.Reply{}, err
	}
	ref, at, err := b.appendInbox(ctx, "give up", inbox, kindTimeout, id, "")
	if err != nil {
		return broker.Reply{}, err
	}
	return broker.Reply{Ref: ref, Kind: broker.KindTimeout, RequestID: id, Env: broker.Envelope{ID: id, Sender: inbox}, At: at}, nil
}

// appendInbox appends an entry of kind for request id to inbox's reply
// stream with one XADD NOMKSTREAM (through doInbox), which writes nothing
// once the inbox is gone (broker.ErrLate). It returns the entry's id and its
// time.
func (b *Broker) appendInbox(ctx context.Context, op, inbox, kind, id, data string) (string, time.Time, error) {
	res, err := b.doInbox(ctx, b.client.B().Xadd().Key(b.inboxReplies.get(inbox, b.keys.replies)).Nomkstream().Id("*").FieldValue().
		FieldValue("k", kind).FieldValue("i", id).FieldValue("m", data).Build())
	var ref string
	if err == nil {
		ref, err = res.ToString()
	}
	switch {
	case rueidis.IsRedisNil(err):
		return "", time.Time{}, broker.ErrLate
	case err != nil:
		return "", time.Time{}, b.fail(ctx, op, err)
	}
	at, ok := idTime(ref)
	if !ok {
		return "", time.Time{}, fmt.Errorf("redisbroker: %s: XADD answered the id %q", op, ref)
	}
	return ref, at, nil
}

// doInbox runs cmd, one write of a request from an inbox (its send, its
// reply or a marker), in a round trip shared with the concurrent others:
// under load, n of them cost one write system call and one read instead
// of n of each (see batcher). A write still queued when ctx ends is not
// made, and doInbox returns ctx's error.
func (b *Broker) doInbox(ctx context.Context, cmd rueidis.Completed) (rueidis.RedisResult, error) {
	if err := ctx.Err(); err != nil {
		return rueidis.RedisResult{}, err
	}
	r, err := b.inboxWrites.do(ctx, cmd)
	if err == nil {
		err = r.err
	}
	return r.res, err
}

// inboxResult is the outcome of one command of a flushInbox.
type inboxResult struct {
	res rueidis.RedisResult
	err error // the flush panicked
}

// flushInbox runs cmds in one round trip, in order, and sets their results
// in out. It returns when the round trip does, or when ctx (its leader's)
// ends first, at Close at the latest; then each result is ctx's error, and
// the commands may still run (see batcher). The client gets a command of
// its own (Do, for one) or a copy of cmds (DoMulti), never cmds, which it
// may read after it answered: the batcher reuses them (withOwnItems).
func (b *Broker) flushInbox(ctx context.Context, cmds []rueidis.Completed, out []inboxResult) {
	if len(cmds) == 1 {
		out[0].res = b.client.Do(ctx, cmds[0])
		return
	}
	for i, r := range b.client.DoMulti(ctx, slices.Clone(cmds)...) {
		out[i].res = r
	}
}

// KeepInbox opens inbox, or renews it: its reply stream, created if
// missing, expires ttl from now (PEXPIRE), in one script.
func (b *Broker) KeepInbox(ctx context.Context, inbox string, ttl time.Duration) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	if err := broker.CheckPositive("ttl", ttl); err != nil {
		return err
	}
	return b.expireInbox(ctx, inbox, ttl)
}

// CloseInbox deletes inbox's state, in one script.
func (b *Broker) CloseInbox(ctx context.Context, inbox string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	b.cursors.Delete(inbox)
	return b.expireInbox(ctx, inbox, 0)
}

// expireInbox runs the script inbox_expire: the inbox's keys expire ttl
// from now, or are deleted for ttl 0.
func (b *Broker) expireInbox(ctx context.Context, inbox string, ttl time.Duration) error {
	err := scriptExpireInbox.Exec(ctx, b.client,
		[]string{b.keys.replies(inbox)}, []string{msString(ttl)}).Error()
	return b.failIf(ctx, "expire inbox", err)
}

// ReadInbox reads the reply stream of an inbox, which one reader of this
// process reads: with XREAD from where its last read ended (a cursor kept
// here), without the consumer group, so that no entry enters a pending
// list and none needs an XACK; AckInbox trims what was read. A read
// whose answer was lost leaves the cursor where it was, so nothing is
// skipped; a process that crashed has nobody left to read its inbox.
func (b *Broker) ReadInbox(ctx context.Context, inbox string, max int, block time.Duration) ([]broker.Reply, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return nil, err
	}
	if err := broker.CheckPositive("max", max); err != nil {
		return nil, err
	}
	r := b.inboxReplies.get(inbox, b.keys.replies)
	cur := b.cursorOf(inbox)
	cursor := cur.get()
	var es []xentry
	var err error
	if block <= 0 {
		es, err = asXReadOf(b.client.Do(ctx, b.client.B().Xread().Count(int64(max)).Streams().Key(r).Id(cursor).Build()), r)
	} else {
		if err := ctx.Err(); err != nil {
			return nil, b.fail(ctx, "read replies", err)
		}
		bctx, release := b.blockingCtx(ctx)
		defer release.release()
		es, err = asXReadOf(b.client.Do(bctx, b.client.B().Xread().Count(int64(max)).Block(ms(block)).Streams().Key(r).Id(cursor).Build()), r)
	}
	switch {
	case rueidis.IsRedisNil(err):
		return nil, nil
	case err != nil:
		return nil, b.fail(ctx, "read replies", err)
	}
	if len(es) == 0 {
		return nil, nil
	}
	cur.set(es[len(es)-1].ID)
	return b.replyEntries(ctx, inbox, appendRead(nil, es, ""))
}

// inboxCursor is where the reads of an inbox are: the id of the last entry
// read, "" before the first. Kept in a value of its own per inbox, so
// that a read that moves it stores nothing in Broker.cursors.
type inboxCursor struct {
	mu sync.Mutex
	id string
}

// cursorOf returns the cursor of inbox, made at the first call.
func (b *Broker) cursorOf(inbox string) *inboxCursor {
	if v, ok := b.cursors.Load(inbox); ok {
		return v.(*inboxCursor)
	}
	v, _ := b.cursors.LoadOrStore(inbox, new(inboxCursor))
	return v.(*inboxCursor)
}

// get returns the id to read after: the last read, or "0-0".
func (c *inboxCursor) get() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.id == "" {
		return "0-0"
	}
	return c.id
}

func (c *inboxCursor) set(id string) {
	c.mu.Lock()
	c.id = id
	c.mu.Unlock()
}

// AckInbox trims inbox's reply stream: its one reader reads in order and
// acknowledges what it handed on, so every entry up to the newest ref has
// been read. It trims below the id that follows it.
func (b *Broker) AckInbox(ctx context.Context, inbox string, refs ...string) error {
	if err := b.check(); err != nil {
		return err
	}
	if err := broker.CheckName("inbox", inbox); err != nil {
		return err
	}
	var ms, seq uint64
	found := false
	for _, ref := range refs {
		m, s, ok := parseID(ref)
		if ok && (!found || m > ms || m == ms && s > seq) {
			ms, seq, found = m, s, true
		}
	}
	if !found {
		return nil
	}
	next := strconv.FormatUint(ms, 10) + "-" + strconv.FormatUint(seq+1, 10)
	err := b.client.Do(ctx, b.client.B().Xtrim().Key(b.keys.replies(inbox)).Minid().Threshold(next).Build()).Error()
	return b.failIf(ctx, "ack inbox", err)
}

// scriptExpireInbox bounds the life of an inbox's state.
var scriptExpireInbox = rueidis.NewLuaScript(`-- inbox_expire
-- KEYS[1] -> the inbox's reply stream P:{I}:r
-- ARGV[1] -> ttl in ms; "0" deletes the stream now
-- With a ttl, creates the reply stream (with a group "g", the way to create
-- an empty stream) if missing, which opens the inbox, and sets it to
-- expire ttl from now.
-- Returns 1.
if ARGV[1] == '0' then
  redis.call('DEL', KEYS[1])
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], 'g', '0', 'MKSTREAM')
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
`)

// scriptReplyInbox appends a reply to an inbox and records it when it is
// accepted.
var scriptReplyInbox = rueidis.NewLuaScript(`-- reply_inbox
-- KEYS[1] -> the inbox's reply stream P:{I}:r
-- KEYS[2..4] -> the request's record P:{R}:res:<id>, the index P:{R}:res
--            and sizes P:{R}:resn of its receiver (results.go); on a
--            Cluster, in the inbox's slot
-- ARGV[1] -> request id
-- ARGV[2] -> encoded reply envelope
-- ARGV[3] -> the request's deadline, unix ms rounded up, or "" for none
-- ARGV[4] -> the prefix of the receiver's records P:{R}:res:
-- ARGV[5] -> the cap on the receiver's retained bytes
-- ARGV[6] -> retention ms
-- Or, when the record is in another slot: KEYS[2] -> the copy
-- P:{I}:ra:<id> (acceptedCopy), and ARGV[4] -> how long it lives, ms.
-- XADD NOMKSTREAM of the reply (k=rep, i=id, m=envelope), as appendInbox;
-- when the entry's time is before the deadline (the reply is accepted),
-- the reply is recorded (field rep, resFinal with no state), so that the
-- record holds the reply exactly when the requester received it; or its
-- copy is written.
-- Returns the entry id, or nil when the inbox is gone (nothing written).
` + luaNow + luaResult + `
local ref = redis.call('XADD', KEYS[1], 'NOMKSTREAM', '*', 'k', 'rep', 'i', ARGV[1], 'm', ARGV[2])
if not ref then return false end
local ms = tonumber(string.match(ref, '^(%d+)-'))
if ARGV[3] == '' or ms < tonumber(ARGV[3]) then
  if #KEYS == 2 then
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[4])
  else
    resFinal({rec = KEYS[2], idx = KEYS[3], n = KEYS[4], pre = ARGV[4], cap = ARGV[5]}, ARGV[1], '',
      ARGV[6], {'rep', ARGV[2]}, {})
  end
end
return ref
`)
