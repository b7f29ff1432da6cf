package broker

import (
	"context"
	"fmt"
)

// BatchIndexCap is the most batches a receiver's index of recent batches
// keeps (BatchIndex): creating one more drops the oldest created from the
// index, not the batch.
const BatchIndexCap = 1000

// BatchIndexLife is how long a receiver's index of recent batches lives
// after the last batch was created: the longest a batch may live
// (MaxRetention after its completion, PendingRetention after its last
// change before).
const BatchIndexLife = MaxRetention + PendingRetention

// BatchIndex lists recent batches. Creating a batch (Batches.CreateBatch)
// adds its id to the index of its completion's receiver, in the same
// step; the index keeps the BatchIndexCap latest created. Nothing else
// writes it: a batch whose retention passed stays in the index until
// newer ones push it out, and a list leaves it out.
type BatchIndex interface {
	// ListBatches returns up to max batches whose completion goes to one
	// of receivers, the latest created first, among the BatchIndexCap
	// latest created of each. An index entry that does not read as a
	// batch (written by a foreign client) is left out of Batches and
	// said in Unreadable.
	ListBatches(ctx context.Context, p *ListBatchesParams) (BatchList, error)
}

// ListBatchesParams are the arguments of BatchIndex.ListBatches.
type ListBatchesParams struct {
	// Receivers are the completions' receivers whose batches are listed.
	Receivers []string
	// Max is the most batches listed: 1..BatchIndexCap.
	Max int
}

// Validate returns an error naming the first field that is not valid.
func (p *ListBatchesParams) Validate() error {
	if len(p.Receivers) == 0 {
		return empty("ListBatchesParams.Receivers")
	}
	for i, r := range p.Receivers {
		if err := CheckName(fmt.Sprintf("ListBatchesParams.Receivers[%d]", i), r); err != nil {
			return err
		}
	}
	if p.Max < 1 || p.Max > BatchIndexCap {
		return fmt.Errorf("broker: ListBatchesParams.Max %d: want 1..%d", p.Max, BatchIndexCap)
	}
	return nil
}

// BatchList is what ListBatches found.
type BatchList struct {
	// Batches are the batches read, the latest created first.
	Batches []BatchInfo
	// Unreadable says, one line each, the index entries left out because
	// they do not read as a batch.
	Unreadable []string
}
