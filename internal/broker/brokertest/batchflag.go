package brokertest

import (
	"testing"

	"github.com/diskerhq/disker/internal/broker"
)

// testBatchCancelledFlag: a dead-lettered child does not make its batch
// read as cancelled, and a cancelled batch counts its dead-lettered
// children as such (the flag and the count are apart).
func testBatchCancelledFlag(t *testing.T, b broker.Broker) {
	for _, cancel := range []bool{false, true} {
		bt := newBatch(t, b, false, false)
		r := name("kids")
		bt.add(r, nil)
		bt.add(r, nil)
		settle(t, b, r, broker.ResultDeadLettered, false)
		if cancel {
			if _, err := b.CancelBatch(ctxT(t), bt.id); err != nil {
				t.Fatal(err)
			}
		}
		info := bt.info()
		if info.Cancelled != cancel || info.Counts.DeadLettered != 1 {
			t.Fatalf("cancelled %v: the batch reads cancelled %v with %d dead-lettered, want %v and 1", cancel, info.Cancelled, info.Counts.DeadLettered, cancel)
		}
		settle(t, b, r, broker.ResultDone, false)
		bt.seal()
		bt.fired(bt.comp)
	}
}
