package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// BeginIdempotent starts an idempotent request: one script, idem_begin,
// in the receiver's slot (the idempotency key carries the receiver's hash
// tag). The request's deadline is computed as SendRequest computes it,
// from this client's estimate of Redis time, and recorded with the waiter.
func (b *Broker) BeginIdempotent(ctx context.Context, p *broker.BeginIdempotentParams) (time.Time, *broker.Envelope, error) {
	if err := p.Validate(); err != nil {
		return time.Time{}, nil, err
	}
	if err := b.check(); err != nil {
		return time.Time{}, nil, err
	}
	env := p.Env
	if err := broker.CheckSend(env, b.maxSize); err != nil {
		return time.Time{}, nil, fmt.Errorf("redisbroker: %w", err)
	}
	env.FromInbox = true
	env.IdempotencyKey = p.Key
	var deadline time.Time
	if env.Timeout > 0 {
		now, err := b.estimateNow(ctx)
		if err != nil {
			return time.Time{}, nil, err
		}
		deadline = now.Add(env.Timeout).Truncate(time.Millisecond)
	}
	waiter := "0:" + env.Sender
	if !deadline.IsZero() {
		waiter = strconv.FormatInt(deadline.UnixMilli(), 10) + ":" + env.Sender
	}
	defer b.leveled(ctx, env)
	data := rueidis.BinaryString(wire.Encode(env))
	keys := []string{b.keys.queueAt(env.Receiver, env.Priority), b.keys.idempotency(env.Receiver, p.Key)}
	rep, err := scriptIdemBegin.Exec(ctx, b.client, keys, []string{data, env.ID, waiter, msString(p.TTL)}).ToString()
	if err != nil {
		if !mayHaveRun(err) {
			deadline = time.Time{}
		}
		return deadline, nil, b.fail(ctx, "send", err) // see broker.Inbox.SendRequest
	}
	if rep == "" {
		return deadline, nil, nil
	}
	stored, err := wire.DecodeString(rep)
	if err != nil {
		return deadline, nil, fmt.Errorf("redisbroker: the stored reply of idempotency key %q: %w", p.Key, err)
	}
	return deadline, &stored, nil
}

// SettleIdempotent stores reply as the reply of receiver's key unless one
// is stored (script idem_settle), and returns the stored one and the
// waiters.
func (b *Broker) SettleIdempotent(ctx context.Context, receiver, key string, reply *broker.Envelope) (broker.Envelope, []broker.IdempotentWaiter, bool, error) {
	if err := broker.CheckName("receiver", receiver); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := broker.CheckName("key", key); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := b.check(); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	if err := b.checkReply(reply); err != nil {
		return broker.Envelope{}, nil, false, err
	}
	data := rueidis.BinaryString(wire.Encode(reply))
	v, err := scriptIdemSettle.Exec(ctx, b.client, []string{b.keys.idempotency(receiver, key)}, []string{data}).ToArray()
	if err != nil {
		return broker.Envelope{}, nil, false, b.fail(ctx, "reply", err)
	}
	if len(v) == 0 {
		return broker.Envelope{}, nil, false, nil
	}
	raw, err := v[0].ToString()
	if err != nil {
		return broker.Envelope{}, nil, false, fmt.Errorf("redisbroker: idem_settle: %w", err)
	}
	stored, err := wire.DecodeString(raw)
	if err != nil {
		return broker.Envelope{}, nil, false, fmt.Errorf("redisbroker: the stored reply of idempotency key %q: %w", key, err)
	}
	waiters := make([]broker.IdempotentWaiter, 0, (len(v)-1)/2)
	for i := 1; i+1 < len(v); i += 2 {
		id, _ := v[i].ToString()
		w, _ := v[i+1].ToString()
		ms, inbox, ok := strings.Cut(w, ":")
		if !ok || id == "" || inbox == "" {
			continue // not written by idem_begin
		}
		wt := broker.IdempotentWaiter{Inbox: inbox, RequestID: id}
		if n, err := strconv.ParseInt(ms, 10, 64); err == nil && n > 0 {
			wt.Deadline = time.UnixMilli(n)
		}
		waiters = append(waiters, wt)
	}
	return stored, waiters, true, nil
}
