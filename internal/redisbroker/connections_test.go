package redisbroker

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/broker"
	"github.com/diskerhq/disker/internal/redistest"
)

// connectionsNamed counts the connections to s named "disker" (the
// broker's; the raw client of the test has no name).
func connectionsNamed(t *testing.T, s *redistest.Server) int {
	t.Helper()
	list, err := rawClient(t, s).Do(ctxT(t), rawClient(t, s).B().ClientList().Build()).ToString()
	if err != nil {
		t.Fatalf("CLIENT LIST: %v", err)
	}
	return strings.Count(list, " name=disker ")
}

// TestLargeBatchesStayOnThePipelinedConnections: heartbeats of a worker
// with thousands of receivers and large send batches, several at once,
// go on the pipelined connections: rueidis's default sends a DoMulti of
// 2,000 commands or more on a connection of its blocking pool, one per
// call in flight, and keeps them open (issue 16: an instance with 10,000
// receivers opened over a hundred connections).
func TestLargeBatchesStayOnThePipelinedConnections(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	b := newBrokerOn(t, s, Config{})
	const receivers, calls = 3000, 6
	info := broker.WorkerInfo{ID: "w1"}
	for i := range receivers {
		info.Receivers = append(info.Receivers, fmt.Sprint("r", i))
	}
	batch := make([]*broker.Envelope, receivers)
	for i := range batch {
		batch[i] = &broker.Envelope{ID: fmt.Sprint("m", i), Receiver: "big", Content: []byte("x")}
	}
	var wg sync.WaitGroup
	for range calls {
		wg.Go(func() {
			if err := b.Heartbeat(ctxT(t), info, time.Minute); err != nil {
				t.Errorf("Heartbeat: %v", err)
			}
		})
		wg.Go(func() {
			if _, err := b.SendBatch(ctxT(t), batch); err != nil {
				t.Errorf("SendBatch: %v", err)
			}
		})
	}
	wg.Wait()
	pipelined := 1 << max(pipelineMultiplex(DefaultMaxConnectionPoolSize, runtime.GOMAXPROCS(0)), 0)
	if n := connectionsNamed(t, s); n > pipelined {
		t.Fatalf("the broker holds %d connections after the batches; want <= %d (its pipelined ones)", n, pipelined)
	}
}
