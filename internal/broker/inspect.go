package broker

import "context"

// Inspect answers what a dashboard asks in bulk or by message: the stats of
// many receivers at once, the fate of one message, and dead letters page by
// page.
type Inspect interface {
	// StatsMany returns the stats of each receiver, in the order given, in
	// one round trip (one per Cluster node that holds some of them).
	StatsMany(ctx context.Context, receivers []string) ([]ReceiverStats, error)
}
