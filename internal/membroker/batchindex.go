package membroker

import (
	"cmp"
	"context"
	"slices"

	"github.com/diskerhq/disker/internal/broker"
)

// indexedBatch is an entry of an index of batches: the batch id and the
// number of its creation, which orders the entries of all receivers.
type indexedBatch struct {
	id  string
	seq uint64
}

// indexBatch adds batch id to the index of its completion's receiver
// (broker.BatchIndex), dropping the oldest past the cap. Callers hold mu.
func (c *core) indexBatch(id string) {
	recv, _, _ := broker.ParseBatchID(id)
	if c.batchIndex == nil {
		c.batchIndex = make(map[string][]indexedBatch)
	}
	c.batchSeq++
	ids := append(c.batchIndex[recv], indexedBatch{id, c.batchSeq})
	if len(ids) > broker.BatchIndexCap {
		ids = slices.Delete(ids, 0, len(ids)-broker.BatchIndexCap)
	}
	c.batchIndex[recv] = ids
}

// ListBatches lists recent batches. See broker.BatchIndex.
func (b *Broker) ListBatches(ctx context.Context, p *broker.ListBatchesParams) (broker.BatchList, error) {
	var out broker.BatchList
	if err := p.Validate(); err != nil {
		return out, err
	}
	if err := b.lock(ctx); err != nil {
		return out, err
	}
	defer b.c.mu.Unlock()
	var found []indexedBatch
	for _, r := range slices.Compact(slices.Sorted(slices.Values(p.Receivers))) {
		ids := b.c.batchIndex[r]
		found = append(found, ids[max(0, len(ids)-p.Max):]...)
	}
	// The latest created first.
	slices.SortFunc(found, func(x, y indexedBatch) int { return cmp.Compare(y.seq, x.seq) })
	now := b.c.now()
	for _, f := range found[:min(len(found), p.Max)] {
		if bt := b.c.batch(f.id, now); bt != nil {
			out.Batches = append(out.Batches, bt.info)
		}
	}
	return out, nil
}
