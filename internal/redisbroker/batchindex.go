package redisbroker

// The index of recent batches (broker.BatchIndex): the sorted set
// P:{C}:bts of the batches whose completion goes to receiver C, member
// the batch id, score its creation time (unix µs, Redis time), which
// orders the batches as Redis created them (ties, if any, by id). The batch
// creation script adds to it (luaBatchIndex) in the same step as the
// batch; nothing else writes it.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/broker"
)

// batchIndex is the index of the batches whose completion goes to
// receiver.
func (k keys) batchIndex(receiver string) string { return k.named(receiver, "bts") }

// luaBatchIndex defines batchIndex(idx, id, cap, life): it adds batch id
// to the index idx at the time of the script (µs), drops the oldest entries past the
// cap, and lets the index expire life ms after this creation.
var luaBatchIndex = `
local function batchIndex(idx, id, cap, life)
  redis.call('ZADD', idx, tonumber(tm[1]) * 1000000 + tonumber(tm[2]), id)
  redis.call('ZREMRANGEBYRANK', idx, 0, -tonumber(cap) - 1)
  redis.call('PEXPIRE', idx, life)
end
`

// batchIndexArgs are the arguments of batchIndex after the index: the
// batch id, the cap and the life.
func batchIndexArgs(id string) []string {
	return []string{id, strconv.Itoa(broker.BatchIndexCap), msString(broker.BatchIndexLife)}
}

// indexed is an index entry: a batch id and its creation time.
type indexed struct {
	id string
	at float64
}

// ListBatches reads the indexes of p.Receivers in one round trip (a
// ZRANGE ... REV each; on a Cluster, one per node, in parallel), then the
// latest p.Max batches among them in another (an HGETALL each).
func (b *Broker) ListBatches(ctx context.Context, p *broker.ListBatchesParams) (broker.BatchList, error) {
	var out broker.BatchList
	if err := b.check(); err != nil {
		return out, err
	}
	if err := p.Validate(); err != nil {
		return out, err
	}
	cmds := make(rueidis.Commands, len(p.Receivers))
	for i, r := range p.Receivers {
		cmds[i] = b.client.B().Zrange().Key(b.keys.batchIndex(r)).Min("0").Max(strconv.Itoa(p.Max - 1)).Rev().Withscores().Build()
	}
	var found []indexed
	for i, res := range b.client.DoMulti(ctx, cmds...) {
		zs, err := res.AsZScores()
		if err != nil {
			if isWrongType(err) {
				out.Unreadable = append(out.Unreadable, fmt.Sprintf("the batch index of receiver %s is not a sorted set", p.Receivers[i]))
				continue
			}
			return broker.BatchList{}, b.fail(ctx, "list batches", err)
		}
		for _, z := range zs {
			if r, _, ok := broker.ParseBatchID(z.Member); !ok || r != p.Receivers[i] {
				out.Unreadable = append(out.Unreadable, fmt.Sprintf("the batch index of receiver %s holds %q, not a batch id of its", p.Receivers[i], z.Member))
				continue
			}
			found = append(found, indexed{z.Member, z.Score})
		}
	}
	slices.SortFunc(found, func(a, b indexed) int { return cmp.Or(cmp.Compare(b.at, a.at), cmp.Compare(b.id, a.id)) })
	found = found[:min(len(found), p.Max)]
	if len(found) == 0 {
		return out, nil
	}
	cmds = make(rueidis.Commands, len(found))
	for i, f := range found {
		cmds[i] = b.client.B().Hgetall().Key(b.keys.batch(f.id)).Build()
	}
	for i, res := range b.client.DoMulti(ctx, cmds...) {
		h, err := res.AsStrMap()
		switch {
		case isWrongType(err):
			out.Unreadable = append(out.Unreadable, fmt.Sprintf("batch %s is not a hash", found[i].id))
		case err != nil:
			return broker.BatchList{}, b.fail(ctx, "list batches", err)
		case len(h) == 0:
			// Gone: its retention passed.
		case batchStates[h["st"]] == 0:
			out.Unreadable = append(out.Unreadable, fmt.Sprintf("batch %s has the state %q", found[i].id, h["st"]))
		default:
			out.Batches = append(out.Batches, decodeBatch(found[i].id, h))
		}
	}
	return out, nil
}

// isWrongType reports whether err is Redis's WRONGTYPE error: a key of
// another type than the command's.
func isWrongType(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}
