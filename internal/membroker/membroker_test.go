package membroker

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/broker/brokertest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		b := New(Options{})
		t.Cleanup(func() { checkEmpty(t, b) })
		return b
	})
}

func TestConformanceShared(t *testing.T) {
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		return Shared("conformance")
	})
}

// checkEmpty fails t if b holds queues, replies, timeouts or expiring senders, which a drained
// subtest must not leave behind. Dead letters, locks and workers are
// checked by the suite itself.
func checkEmpty(t *testing.T, b *Broker) {
	t.Helper()
	c := b.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queues) != 0 || len(c.replies) != 0 || len(c.timeouts) != 0 || len(c.dead) != 0 || len(c.senders) != 0 {
		t.Errorf("left behind: %d queues, %d reply streams, %d timeout sets, %d dead-letter lists, %d expiring senders",
			len(c.queues), len(c.replies), len(c.timeouts), len(c.dead), len(c.senders))
	}
}
