package redisbroker

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/wire"
)

// Cancel cancels message p.ID of p.Receiver with one script,
// cancel_message: a scheduled message is unscheduled; otherwise the queue
// is read from p.Since for the message's entry, which is deleted (and, if
// a consumer held it, acknowledged and marked in P:{R}:x for its holder).
// See broker.Cancels.
func (b *Broker) Cancel(ctx context.Context, p *broker.CancelParams) (broker.Cancelled, error) {
	if err := b.check(); err != nil {
		return broker.Cancelled{}, err
	}
	if err := p.Validate(); err != nil {
		return broker.Cancelled{}, err
	}
	start := "-"
	if !p.Since.IsZero() {
		start = strconv.FormatInt(max(p.Since.UnixMilli(), 0), 10)
	}
	r := p.Receiver
	v, err := scriptCancelMessage.Exec(ctx, b.client,
		[]string{b.keys.scheduled(r), b.keys.scheduledMessages(r), b.keys.queue(r), b.keys.delayed(r), b.keys.cancelMarks(r),
			b.keys.queueAt(r, broker.PriorityHigh), b.keys.queueAt(r, broker.PriorityLow)},
		[]string{p.ID, string(wire.IDPrefix(p.ID)), start, strconv.Itoa(p.MaxScan), msString(broker.MarkRetention)}).ToArray()
	if err != nil {
		return broker.Cancelled{}, b.fail(ctx, "cancel", err)
	}
	if len(v) != 3 {
		return broker.Cancelled{}, fmt.Errorf("redisbroker: cancel: script answered %d values", len(v))
	}
	state, _ := v[0].AsInt64()
	if state == 0 {
		return broker.Cancelled{State: broker.CancelNotFound}, nil
	}
	m, _ := v[1].ToString()
	d, _ := v[2].ToString()
	c := broker.Cancelled{State: broker.CancelState(state)}
	// An envelope that does not decode was cancelled all the same; the
	// caller gets what could be read of it.
	c.Env, _ = wire.DecodeString(m)
	if d != "" {
		c.Deadline, _ = unixMS(d)
	}
	return c, nil
}

// CancelMarks reads the marks of Cancel for receiver since since:
// ZRANGEBYSCORE P:{R}:x since +inf WITHSCORES. See broker.Cancels.
func (b *Broker) CancelMarks(ctx context.Context, receiver string, since time.Time) ([]string, time.Time, error) {
	if err := b.check(); err != nil {
		return nil, time.Time{}, err
	}
	if err := broker.CheckName("receiver", receiver); err != nil {
		return nil, time.Time{}, err
	}
	min := "-inf"
	if !since.IsZero() {
		min = strconv.FormatInt(since.UnixMilli(), 10)
	}
	zs, err := b.client.Do(ctx, b.client.B().Zrangebyscore().Key(b.keys.cancelMarks(receiver)).Min(min).Max("+inf").
		Withscores().Build()).AsZScores()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return nil, time.Time{}, nil
		}
		return nil, time.Time{}, b.fail(ctx, "cancel marks", err)
	}
	var latest time.Time
	ids := make([]string, 0, len(zs))
	for _, z := range zs {
		ids = append(ids, z.Member)
		if t := time.UnixMilli(int64(z.Score)); t.After(latest) {
			latest = t
		}
	}
	return ids, latest, nil
}
