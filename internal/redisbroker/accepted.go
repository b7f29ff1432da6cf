package redisbroker

// Accepted replies across slots. On a Redis Cluster whose slots part a
// retained message's record (its receiver's slot) from where its reply is
// accepted (the sender's pending timeouts for a timed Send, the inbox of
// a Request), no one script both accepts the reply and records it. The
// script that accepts it then also writes a copy of it, P:{S}:ra:<id>, in
// the accepting slot; the step that records the reply on the record (the
// worker's FinishResult, result_reply right after an inbox append)
// deletes the copy once the record holds it. A worker that dies between
// the two leaves the copy: the next attempt's StartResult records it, and
// Result reads it for a record that holds no reply, whose field ro (written
// by StartResult) names the copy's slot. On one server there is no copy:
// the script that accepts a reply records it.

import (
	"context"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/keyslot"
)

// acceptedFor is how long a copy of an accepted reply lives beyond its
// message's retention: time for a redelivery to record it, or for its
// record to be read, when its worker died before recording it.
const acceptedFor = time.Hour

// acceptedTTL is how long the copy of a reply with retention ret lives, in
// ms, as the scripts take it.
func acceptedTTL(ret time.Duration) string { return msString(ret + acceptedFor) }

// acceptedCopy returns the key of the copy of a reply to owner (a sender,
// or an inbox) accepted for message id of receiver, when the record of the
// message and owner's reply stream are in different slots; "" when they
// share one (always on one server), where there is no copy.
func (b *Broker) acceptedCopy(receiver, owner, id string) string {
	if !b.cluster || owner == "" || keyslot.Of(b.keys.result(receiver, id)) == keyslot.Of(b.keys.replies(owner)) {
		return ""
	}
	return b.keys.acceptedReply(owner, id)
}

// recordAccepted records reply, accepted in another slot than its
// record's, on the record rec (result_reply), then deletes its copy. A
// failure leaves the copy, for the worker's FinishResult or the next
// attempt's StartResult to record.
func (b *Broker) recordAccepted(ctx context.Context, reply *broker.Envelope, data string, rec []string, prefix string) {
	if b.recordInboxReply(ctx, reply, data, rec, prefix) == nil {
		b.dropAccepted(ctx, b.keys.acceptedReply(reply.Receiver, reply.InReplyTo))
	}
}

// dropAccepted deletes the copy key of an accepted reply that its record
// holds now. A failure leaves it to expire.
func (b *Broker) dropAccepted(ctx context.Context, key string) {
	if key != "" {
		_ = b.client.Do(ctx, b.client.B().Del().Key(key).Build()).Error()
	}
}

// takeAccepted records on p's record the copy of a reply an earlier
// attempt had accepted and not recorded (its worker died, or its steps
// failed), and deletes the copy: the step of StartResult for a later
// attempt whose record and reply stream are in different slots. With no
// copy, it does nothing.
func (b *Broker) takeAccepted(ctx context.Context, p *broker.StartResultParams, copyKey string) error {
	data, err := b.acceptedReply(ctx, copyKey)
	if err != nil || data == "" {
		return err
	}
	rec, prefix := b.resultKeys(p.Receiver, p.ID)
	err = scriptResultReply.Exec(ctx, b.client, rec, []string{p.ID, data, prefix, b.maxResults, retentionArg(p.Retention)}).Error()
	if err != nil {
		return err
	}
	b.dropAccepted(ctx, copyKey)
	return nil
}

// acceptedReply reads the copy of an accepted reply at copyKey: the
// encoded reply, or "" when there is no copy.
func (b *Broker) acceptedReply(ctx context.Context, copyKey string) (string, error) {
	data, err := b.client.Do(ctx, b.client.B().Get().Key(copyKey).Build()).ToString()
	if rueidis.IsRedisNil(err) {
		return "", nil
	}
	return data, err
}

// readAccepted sets, in the records hs of receiver's ids (nil: none), the
// reply of each that holds none and names where a copy of an accepted
// reply would be (field ro): the copy, when there is one; when there is
// none, the record's reply read again, which a worker may have recorded
// (then deleted the copy) since the first read. The reply its sender
// received is then what its record says. Should a read fail, the records
// stay as they are.
func (b *Broker) readAccepted(ctx context.Context, receiver string, ids []string, hs []map[string]string) {
	var at []int
	var cmds rueidis.Commands
	for i, h := range hs {
		if h == nil || h["rep"] != "" || h["ro"] == "" || broker.CheckName("ro", h["ro"]) != nil {
			continue
		}
		at = append(at, i)
		cmds = append(cmds, b.client.B().Get().Key(b.keys.acceptedReply(h["ro"], ids[i])).Build())
	}
	if len(cmds) == 0 {
		return
	}
	copies := b.client.DoMulti(ctx, cmds...)
	var again []int
	cmds = nil
	for j, r := range copies {
		if data, err := r.ToString(); err == nil {
			hs[at[j]]["rep"] = data
		} else if rueidis.IsRedisNil(err) {
			again = append(again, at[j])
			cmds = append(cmds, b.client.B().Hget().Key(b.keys.result(receiver, ids[at[j]])).Field("rep").Build())
		}
	}
	if len(cmds) == 0 {
		return
	}
	for j, r := range b.client.DoMulti(ctx, cmds...) {
		if data, err := r.ToString(); err == nil {
			hs[again[j]]["rep"] = data
		}
	}
}
