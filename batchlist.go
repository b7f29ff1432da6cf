package disker

import (
	"context"
	"fmt"

	"github.com/diskerhq/disker/internal/broker"
)

// BatchIndexCap is the most batches ListBatches finds for one receiver:
// the broker keeps, per receiver of a completion, the ids of the batches
// created latest, up to this cap; creating one more drops the oldest
// from the index (the batch itself stays for its retention).
const BatchIndexCap = broker.BatchIndexCap

// BatchList is what ListBatches found.
type BatchList struct {
	// Batches are the batches found, the latest created first.
	Batches []*BatchInfo
	// Unreadable says, one line each, the entries of the index that were
	// left out because they do not read as a batch (written by a foreign
	// client).
	Unreadable []string
}

// ListBatches returns up to max of the latest created batches whose
// completion goes to one of receivers (1 to BatchIndexCap), with their
// states and counts as Batch returns them. A batch whose retention passed
// is left out. On Redis it reads the receivers' indexes in one round trip
// and the batches in another, whatever the number of receivers.
func (d *Disker) ListBatches(ctx context.Context, receivers []string, max int) (*BatchList, error) {
	if len(receivers) == 0 {
		return nil, invalid("receivers", "must name at least one receiver")
	}
	for i, r := range receivers {
		if err := checkName(fmt.Sprintf("receivers[%d]", i), r); err != nil {
			return nil, err
		}
	}
	if max < 1 || max > BatchIndexCap {
		return nil, invalid("max", "must be from 1 to %d (BatchIndexCap), got %d", BatchIndexCap, max)
	}
	l, err := call(d, "list batches", func() (broker.BatchList, error) {
		return d.b.ListBatches(ctx, &broker.ListBatchesParams{Receivers: receivers, Max: max})
	})
	if err != nil {
		return nil, err
	}
	out := &BatchList{Batches: make([]*BatchInfo, len(l.Batches)), Unreadable: l.Unreadable}
	for i := range l.Batches {
		out.Batches[i] = batchInfoOf(&l.Batches[i])
	}
	return out, nil
}
