package redisbroker

import (
	"testing"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/broker/brokertest"
)

// TestConformance runs the cross-broker conformance suite, each subtest on
// a fresh key prefix of the shared server.
func TestConformance(t *testing.T) {
	t.Parallel()
	brokertest.Run(t, func(t *testing.T) broker.Broker {
		return newBroker(t)
	})
}
