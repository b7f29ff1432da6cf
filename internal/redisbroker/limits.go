package redisbroker

import (
	"context"
	"strconv"
	"time"

	"github.com/diskerhq/disker/internal/broker"
)

// TakeTokens takes tokens from p.Receiver's bucket with one script
// (tokens), on Redis time. See broker.Limits.
func (b *Broker) TakeTokens(ctx context.Context, p *broker.TokensParams) (int, time.Duration, error) {
	if err := b.check(); err != nil {
		return 0, 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	res, err := scriptTokens.Exec(ctx, b.client, []string{b.keys.rate(p.Receiver)},
		[]string{strconv.FormatFloat(p.Rate, 'g', -1, 64), strconv.Itoa(p.Burst), strconv.Itoa(p.Want)}).AsIntSlice()
	if err != nil {
		return 0, 0, b.fail(ctx, "take tokens", err)
	}
	if len(res) != 2 {
		return 0, 0, b.fail(ctx, "take tokens", errMalformed("tokens"))
	}
	return int(res[0]), time.Duration(res[1]) * time.Millisecond, nil
}

// Slots changes p.Holder's share of p.Receiver's global concurrency slots
// with one script (slots), on Redis time. See broker.Limits.
func (b *Broker) Slots(ctx context.Context, p *broker.SlotsParams) (int, error) {
	if err := b.check(); err != nil {
		return 0, err
	}
	if err := p.Validate(); err != nil {
		return 0, err
	}
	n, err := scriptSlots.Exec(ctx, b.client, []string{b.keys.slots(p.Receiver), b.keys.slotCounts(p.Receiver)},
		[]string{p.Holder, strconv.Itoa(p.Delta), strconv.Itoa(p.Limit), msString(p.Lease)}).AsInt64()
	if err != nil {
		return 0, b.fail(ctx, "slots", err)
	}
	return int(n), nil
}

type errMalformed string

func (e errMalformed) Error() string {
	return "the " + string(e) + " script answered a malformed reply"
}
