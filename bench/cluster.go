package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/keyslot"
	"github.com/diskerhq/disker/internal/redistest"
)

// The Cluster workloads: the same Disker workload on one redis-server and
// on a private Redis Cluster of clusterMasters masters (no replicas), with
// clusterReceivers receivers chosen so that each master serves the same
// number of them. Producers send to the receivers in turn. Each run reads
// every server's CPU time (INFO cpu) before and after, so that the table
// shows the Redis CPU per message of each master and its share.

const (
	clusterMasters   = 3
	clusterReceivers = 12 // a multiple of clusterMasters
	// clusterHandlers is each receiver's handler concurrency.
	clusterHandlers = 8
)

// redisSetup is a Redis deployment that a Cluster workload runs on: the
// URL Disker connects to and every master, to read its CPU and empty it.
type redisSetup struct {
	name  string
	url   string
	nodes []*redisServer
}

// reset empties every master and resets its command statistics.
func (rs redisSetup) reset() error {
	for _, n := range rs.nodes {
		if err := n.flushAll(); err != nil {
			return err
		}
		if _, err := n.do("CONFIG RESETSTAT", "+OK"); err != nil {
			return err
		}
	}
	return nil
}

// cpu returns the CPU time each master has used.
func (rs redisSetup) cpu() ([]time.Duration, error) {
	out := make([]time.Duration, len(rs.nodes))
	for i, n := range rs.nodes {
		c, err := n.cpu()
		if err != nil {
			return nil, err
		}
		out[i] = c
	}
	return out, nil
}

// ioCalls returns the read and write system calls of every master so
// far, summed; false where one cannot be read.
func (rs redisSetup) ioCalls() (ioCalls, bool) {
	var sum ioCalls
	for _, n := range rs.nodes {
		c, ok := n.ioCalls()
		if !ok {
			return ioCalls{}, false
		}
		sum.reads += c.reads
		sum.writes += c.writes
	}
	return sum, true
}

// startCluster starts a private Cluster of masters masters.
// redistest.MustStartCluster panics when it cannot; that becomes an error.
func startCluster(masters int) (c *redistest.Cluster, stop func(), err error) {
	defer func() {
		if v := recover(); v != nil {
			c, stop, err = nil, nil, fmt.Errorf("bench: %v", v)
		}
	}()
	c, stop = redistest.MustStartCluster(masters)
	return c, stop, nil
}

// spreadReceivers returns n receiver names, n/masters of them on each
// master, where nodeOf gives the master of a slot: a receiver's keys all
// hash by its name.
func spreadReceivers(n, masters int, nodeOf func(slot uint16) int) []string {
	per := make([]int, masters)
	var names []string
	for i := 0; len(names) < n; i++ {
		name := fmt.Sprintf("bench-c%d", i)
		m := nodeOf(keyslot.Of("{" + name + "}"))
		if per[m] < n/masters {
			per[m]++
			names = append(names, name)
		}
	}
	return names
}

// ClusterSuite runs fire-and-forget (8 producers) and request/reply (32
// requesters, 5 s timeout) over 12 receivers, 8 handlers each, on one
// private redis-server and on a private three-master Redis Cluster with 4
// of the receivers on each master, and reports each master's Redis CPU per
// message and its share of the total.
func ClusterSuite(ctx context.Context, o Options) ([]Table, error) {
	nFF, nRR := 100_000, 50_000
	switch {
	case o.Tiny:
		nFF, nRR = 240, 96
	case o.Quick:
		nFF, nRR = 10_000, 5_000
	}
	one, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer one.close()
	c, stop, err := startCluster(clusterMasters)
	if err != nil {
		return nil, err
	}
	defer stop()
	var nodes []*redisServer
	for _, a := range c.Addrs() {
		nodes = append(nodes, &redisServer{addr: a})
	}
	setups := []redisSetup{
		{name: "one redis-server", url: one.url(), nodes: []*redisServer{one}},
		{name: fmt.Sprintf("Cluster, %d masters", clusterMasters), url: c.URL(), nodes: nodes},
	}
	receivers := spreadReceivers(clusterReceivers, clusterMasters, c.NodeOf)

	ff, err := runClusterWorkload(ctx, o, "cluster fire-and-forget", setups, func(ctx context.Context, url string) (sample, error) {
		return ffSpread(ctx, url, nFF, ffProducers, receivers)
	})
	if err != nil {
		return nil, err
	}
	ffMany, err := runClusterWorkload(ctx, o, "cluster fire-and-forget p=256", setups, func(ctx context.Context, url string) (sample, error) {
		return ffSpread(ctx, url, max(nFF, 2*ffManyProducers), ffManyProducers, receivers)
	})
	if err != nil {
		return nil, err
	}
	rr, err := runClusterWorkload(ctx, o, "cluster request/reply r=32", setups, func(ctx context.Context, url string) (sample, error) {
		return rrSpread(ctx, url, nRR, 32, receivers)
	})
	if err != nil {
		return nil, err
	}
	var rows []workRow
	for _, w := range []struct {
		name string
		res  map[string][]sample
	}{{"cluster fire-and-forget", ff}, {"cluster fire-and-forget p=256", ffMany}, {"cluster request/reply r=32", rr}} {
		for _, rs := range setups {
			rows = append(rows, workRow{workload: w.name, name: rs.name, res: w.res[rs.name]})
		}
	}
	work := workTable(rows)
	work.Title = "Disker over one redis-server and over a Redis Cluster: work per message and per round trip, counted"
	return []Table{clusterTable(setups, ff, ffMany, rr, nFF, nRR), work}, nil
}

// runClusterWorkload runs the workload on every setup, round robin, and
// adds each master's CPU time to the samples.
func runClusterWorkload(ctx context.Context, o Options, workload string, setups []redisSetup,
	run func(ctx context.Context, url string) (sample, error)) (map[string][]sample, error) {
	var impls []impl
	for _, rs := range setups {
		impls = append(impls, impl{name: rs.name, run: func(ctx context.Context) (sample, error) {
			if err := rs.reset(); err != nil {
				return sample{}, err
			}
			r0, err := rs.cpu()
			if err != nil {
				return sample{}, err
			}
			sio0, sioOK0 := rs.ioCalls()
			cio0, cioOK0 := readIOCalls("self")
			g0 := readGoCounters()
			p0 := processCPU()
			s, err := run(ctx, rs.url)
			if err != nil {
				return s, err
			}
			p1 := processCPU()
			g1 := readGoCounters()
			cio1, cioOK1 := readIOCalls("self")
			sio1, sioOK1 := rs.ioCalls()
			r1, err := rs.cpu()
			if err != nil {
				return s, err
			}
			s.clientCPU = p1 - p0
			s.work.goCounts = g1.sub(g0)
			s.work.clientIO, s.work.clientIOOK = cio1.sub(cio0), cioOK0 && cioOK1
			s.work.serverIO, s.work.serverIOOK = sio1.sub(sio0), sioOK0 && sioOK1
			s.nodeCPU = make([]time.Duration, len(r1))
			s.nodeCmd = make([]time.Duration, len(r1))
			for i, n := range rs.nodes {
				s.nodeCPU[i] = r1[i] - r0[i]
				s.serverCPU += s.nodeCPU[i]
				if s.nodeCmd[i], err = n.commandTime(); err != nil {
					return s, err
				}
				c, err := n.commandCount()
				if err != nil {
					return s, err
				}
				s.work.commands += c
			}
			if o.CommandStats {
				var parts []string
				for _, n := range rs.nodes {
					st, err := n.commandStats(s.ops)
					if err != nil {
						return s, err
					}
					parts = append(parts, st)
				}
				o.progressf("  %s / %s: redis commands per op: %s", workload, rs.name, strings.Join(parts, " | "))
			}
			return s, nil
		}})
	}
	return runAlternating(ctx, o, workload, impls)
}

// ffSpread is fire-and-forget from the given number of producers that send
// to the receivers in turn, each served by clusterHandlers handlers of one
// worker.
func ffSpread(ctx context.Context, url string, n, producers int, receivers []string) (smp sample, err error) {
	dispatcher, worker, err := newDiskerPairAt(url)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(worker, dispatcher); err == nil {
			err = cerr
		}
	}()
	cd, h := countingHandler(n)
	for _, r := range receivers {
		if err := worker.Handle(r, h, disker.WithConcurrency(clusterHandlers)); err != nil {
			return sample{}, err
		}
	}
	var seq atomic.Int64
	errc := make(chan error, 1)
	return timedRun(ctx, n, cd, errc, func(ctx context.Context) *sync.WaitGroup {
		return produceBy(ctx, producers, n, errc, func(ctx context.Context) error {
			r := receivers[int(seq.Add(1))%len(receivers)]
			_, err := dispatcher.Send(ctx, disker.Message{Receiver: r, Content: payload})
			return err
		})
	})
}

// rrSpread is request/reply from r requesters of one instance that ask
// the receivers in turn, each served by clusterHandlers echo handlers.
func rrSpread(ctx context.Context, url string, n, r int, receivers []string) (smp sample, err error) {
	requester, worker, err := newDiskerPairAt(url)
	if err != nil {
		return sample{}, err
	}
	defer func() {
		if cerr := closeDiskers(worker, requester); err == nil {
			err = cerr
		}
	}()
	echo := disker.HandlerFunc(func(_ context.Context, m *disker.Message) ([]byte, error) {
		return m.Content, nil
	})
	for _, rc := range receivers {
		if err := worker.Handle(rc, echo, disker.WithConcurrency(clusterHandlers)); err != nil {
			return sample{}, err
		}
	}
	var seq atomic.Int64
	return runRequests(ctx, n, r, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, rrTimeout)
		defer cancel()
		rc := receivers[int(seq.Add(1))%len(receivers)]
		reply, err := requester.Request(ctx, disker.Message{Receiver: rc, Content: payload})
		if err != nil {
			return err
		}
		if string(reply.Content) != string(payload) {
			return fmt.Errorf("bench: wrong reply %q", reply.Content)
		}
		return nil
	})
}

// clusterTable renders the Cluster workloads: per setup, throughput, the
// Redis CPU per operation of all masters and of each, each master's share,
// and the rate at which the busiest master would use one core.
func clusterTable(setups []redisSetup, ff, ffMany, rr map[string][]sample, nFF, nRR int) Table {
	t := Table{
		Title: fmt.Sprintf("Disker over one redis-server and over a %d-master Redis Cluster: %d receivers, %d handlers each",
			clusterMasters, clusterReceivers, clusterHandlers),
		Notes: []string{fmt.Sprintf("Fire-and-forget: %d producers send %s no-op messages to the receivers in turn "+
			"(p=256: %d producers, one message per call, denser traffic for each master). "+
			"Request/reply: 32 requesters of one instance send %s requests with a 5 s timeout to the receivers in turn; "+
			"the replies all go to that instance's inbox, which lives on one master. On the Cluster, %d receivers live on "+
			"each master. Redis CPU is each server's used_cpu_user + used_cpu_sys (INFO cpu) over the run; \"per master\" "+
			"lists the masters in slot order; \"in commands\" is the part of it spent running commands (the usec of INFO "+
			"commandstats), the rest being the event loop and the reads and writes on the connections; \"share\" is "+
			"each master's part of the Redis CPU (1/%d each if the load spreads evenly). \"Redis-bound rate\" is the "+
			"rate at which the busiest master would use one core whole: "+
			"with each master on a machine of its own, the most the Redis side carries, a bound and not a measured "+
			"throughput. On one machine all the servers and the Go side share its CPUs, so throughput does not grow "+
			"with masters here.", ffProducers, thousands(int64(nFF)), ffManyProducers, thousands(int64(nRR)),
			clusterReceivers/clusterMasters, clusterMasters)},
		Header: []string{"workload", "Redis", "ops/s, median (min–max)", "redis CPU µs/op, all", "per master µs/op",
			"in commands, per master µs/op", "share per master", "Redis-bound rate, ops/s", "Go CPU µs/op"},
	}
	for _, w := range []struct {
		name string
		res  map[string][]sample
	}{{"fire-and-forget", ff}, {"fire-and-forget p=256", ffMany}, {"request/reply r=32", rr}} {
		for _, rs := range setups {
			ss := w.res[rs.name]
			var per, cmd, share []string
			busiest := 0.0
			total := series(ss, serverCPUPerOp).med
			for i := range rs.nodes {
				v := series(ss, func(s sample) float64 { return float64(s.nodeCPU[i]) / 1e3 / float64(s.ops) }).med
				sh := series(ss, func(s sample) float64 { return float64(s.nodeCPU[i]) / float64(s.serverCPU) }).med
				c := series(ss, func(s sample) float64 { return float64(s.nodeCmd[i]) / 1e3 / float64(s.ops) }).med
				per = append(per, fmtNum(v))
				cmd = append(cmd, fmtNum(c))
				share = append(share, fmt.Sprintf("%.2f", sh))
				busiest = max(busiest, v)
			}
			t.Rows = append(t.Rows, []string{w.name, rs.name, fmtStat(series(ss, opsPerSec)), fmtNum(total),
				strings.Join(per, " / "), strings.Join(cmd, " / "), strings.Join(share, " / "), fmtNum(1e6 / busiest),
				fmtNum(series(ss, clientCPUPerOp).med)})
		}
	}
	return t
}
