package redisbroker

import (
	"strings"
	"sync"
	"sync/atomic"
)

// keys builds every Redis key the broker uses. All keys of one receiver or
// sender carry its name as a hash tag, so that Redis Cluster keeps them in
// one slot and a script may touch them together.
type keys struct {
	prefix string // e.g. "disker"
}

func (k keys) named(name, suffix string) string {
	return k.prefix + ":{" + name + "}:" + suffix
}

// queue is the receiver's queue stream (consumer group "g").
func (k keys) queue(receiver string) string { return k.named(receiver, "q") }

// queueAt is the receiver's queue stream of priority level prio: the
// normal level is queue itself, so that a receiver that never uses
// priorities has the one stream it always had.
func (k keys) queueAt(receiver string, prio int) string {
	switch {
	case prio > 0:
		return k.named(receiver, "qh")
	case prio < 0:
		return k.named(receiver, "ql")
	}
	return k.queue(receiver)
}

// deadLetters is the receiver's dead-letter stream.
func (k keys) deadLetters(receiver string) string { return k.named(receiver, "dlq") }

// retries is the zset of receiver's retries: deliveries waiting out a
// retry delay longer than their lease: member ref (entry id, prefixed
// "h"/"l" at the high and low levels), score due time in unix ms.
func (k keys) retries(receiver string) string { return k.named(receiver, "retries") }

// deferred is the zset of receiver's deferred messages, sent for later:
// member message id, score due time in unix ms.
func (k keys) deferred(receiver string) string { return k.named(receiver, "deferred") }

// deferredMessages is the hash of receiver's deferred messages: message
// id to "<level><deadline ms or empty>:<encoded envelope>", level "h", "l"
// or empty for the normal level.
func (k keys) deferredMessages(receiver string) string { return k.named(receiver, "deferred:m") }

// debounce is a debounce key of receiver (SendParams.DebounceKey): a hash
// of the message deferred by the key's run and the run's first send.
func (k keys) debounce(receiver, key string) string { return k.named(receiver, "db:"+key) }

// expired is the count of receiver's messages dropped unstarted because
// their expiry or deadline had passed (Queue.Drop): a counter that stays.
func (k keys) expired(receiver string) string { return k.named(receiver, "expired") }

// cancelMarks is the zset of receiver's messages cancelled while in
// flight: member message id, score the time of the mark in unix ms.
func (k keys) cancelMarks(receiver string) string { return k.named(receiver, "x") }

// holders is the hash of the holders of receiver's deliveries: "l:<consumer>"
// is the lease (ms) the consumer took them with, at its last fetch or
// extension, and "a:<consumer>" the time (unix ms, Redis time) until which
// its heartbeat vouches for it.
func (k keys) holders(receiver string) string { return k.named(receiver, "hold") }

// replyHolders is holders of the reply stream of sender.
func (k keys) replyHolders(sender string) string { return k.named(sender, "rhold") }

// timeouts is the zset of the pending timeouts of sender's messages:
// member message id, score deadline in unix ms.
func (k keys) timeouts(sender string) string { return k.named(sender, "t") }

// timedMessages is the hash of sender's pending timed messages: message id
// to encoded envelope, for the timeout notice.
func (k keys) timedMessages(sender string) string { return k.named(sender, "tm") }

// replies is the sender's reply stream (consumer group "g").
func (k keys) replies(sender string) string { return k.named(sender, "r") }

// streamState is the hash of the state of streamed request id from inbox
// (see broker.Streams): "a" the highest attempt that sent partials, "n"
// how many it sent, "d" 1 once the request is settled. In the inbox's
// slot; it expires with the inbox's reply stream.
func (k keys) streamState(inbox, id string) string { return k.named(inbox, "s:"+id) }

// replyRetries is the retries zset of the reply stream. Replies are never
// retried, so it stays empty; the fetch script needs a key of the right slot.
func (k keys) replyRetries(sender string) string { return k.named(sender, "rretries") }

// lock is the exclusive lock of receiver: a string holding the owner.
func (k keys) lock(receiver string) string { return k.named(receiver, "lock") }

// dedup is the dedup key key of receiver: a string holding the id of the
// message sent with it, expiring at the end of its window.
func (k keys) dedup(receiver, key string) string { return k.named(receiver, "dd:"+key) }

// paused is receiver's pause flag: a string that exists while it is paused.
func (k keys) paused(receiver string) string { return k.named(receiver, "paused") }

// pauseEpoch is the pause epoch of the namespace (broker.Pauses.PauseEpoch):
// a string that every Pause and Resume sets to a new random value. It has
// a slot of its own: it is read and written alone.
func (k keys) pauseEpoch() string { return k.prefix + ":{pause}:epoch" }

// idempotency is the idempotency key key of receiver: a hash of the first
// request's id ("id"), the stored reply ("rep", once settled) and the
// waiters ("w:<request id>" -> "<deadline ms>:<inbox>"), expiring at the
// end of its window.
func (k keys) idempotency(receiver, key string) string { return k.named(receiver, "idem:"+key) }

// rate is receiver's token bucket (rate limit): a hash with "t" (tokens,
// a decimal) and "at" (when they were counted, unix ms, Redis time).
func (k keys) rate(receiver string) string { return k.named(receiver, "rate") }

// slots is the zset of the holders of receiver's global concurrency slots:
// member holder, score the end of its lease (unix ms, Redis time).
func (k keys) slots(receiver string) string { return k.named(receiver, "slots") }

// slotCounts is the hash of how many slots each holder of slots holds.
func (k keys) slotCounts(receiver string) string { return k.named(receiver, "slotn") }

// result is the record of message id of receiver (broker.Results): a
// hash, expiring at the end of its retention.
func (k keys) result(receiver, id string) string { return k.named(receiver, "res:"+id) }

// resultIndex is the zset of receiver's final records: member message id,
// score the end of its retention (unix ms).
func (k keys) resultIndex(receiver string) string { return k.named(receiver, "res") }

// resultSizes is the hash of the sizes of receiver's final records:
// message id to bytes, and "#" to their sum.
func (k keys) resultSizes(receiver string) string { return k.named(receiver, "resn") }

// acceptedReply is a copy of the reply accepted for message id, kept in
// the slot of owner (its sender, or its Request's inbox) where the reply
// was accepted, when that slot is not the one of the message's record: a
// string, written by the script that accepts the reply and deleted once
// the record holds it (see results.go, acceptedCopy).
func (k keys) acceptedReply(owner, id string) string { return k.named(owner, "ra:"+id) }

// workers is the zset of live worker ids, scored by expiry in unix ms.
func (k keys) workers() string { return k.prefix + ":{workers}:ids" }

// worker is the hash of one worker: "info" (JSON) and "seen" (unix ms),
// expiring with the worker's heartbeat ttl.
func (k keys) worker(id string) string { return k.prefix + ":{workers}:w:" + id }

// reclaimEpoch is a counter of the events after which a quiet stream
// (see idleReclaimMax) should run the fetch script at its next fetch: a
// worker left the registry (its heartbeat lapsed, and a heartbeat dropped
// it; or it deregistered) or came back to it, or a message was queued at a
// priority level other than normal. Every heartbeat reads it (see
// Broker.Heartbeat).
func (k keys) reclaimEpoch() string { return k.prefix + ":{workers}:reclaim" }

// departed is the zset of the workers that left the registry (their
// heartbeat lapsed, or they deregistered): member worker id, score when it
// left (unix ms). Every heartbeat reads it and forgets the departures older
// than departedFor; the fetch script reclaims at once what a departed
// worker holds.
func (k keys) departed() string { return k.prefix + ":{workers}:departed" }

// pattern returns a SCAN pattern matching the keys named(*, suffix).
func (k keys) pattern(suffix string) string {
	return globEscape(k.prefix) + ":{*}:" + globEscape(suffix)
}

// name returns the name in key, made by named(name, suffix), or false.
func (k keys) name(key, suffix string) (string, bool) {
	head, tail := k.prefix+":{", "}:"+suffix
	if len(key) < len(head)+len(tail) || !strings.HasPrefix(key, head) || !strings.HasSuffix(key, tail) {
		return "", false
	}
	return key[len(head) : len(key)-len(tail)], true
}

func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// nameCache keeps what is made from names (keys), up to nameCacheMax
// names: what a broker uses again and again for the same few names (the
// receivers it sends to, the inboxes it replies to or reads) is made once.
// Past nameCacheMax names, a name not kept has its value made at each
// call. The zero value is ready to use; the values are shared, read only.
type nameCache[V any] struct {
	n    atomic.Int64
	vals sync.Map // name -> V
}

// nameCacheMax is how many names a nameCache keeps.
const nameCacheMax = 4096

// get returns the value of name, made by build when it is not kept.
func (c *nameCache[V]) get(name string, build func(string) V) V {
	if v, ok := c.vals.Load(name); ok {
		return v.(V)
	}
	v := build(name)
	if c.n.Load() < nameCacheMax {
		if kept, loaded := c.vals.LoadOrStore(name, v); loaded {
			return kept.(V)
		}
		c.n.Add(1)
	}
	return v
}
