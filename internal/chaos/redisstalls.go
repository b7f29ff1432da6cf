package chaos

// Redis stalls: spans in which a Redis server answered late although no
// fault touched it. The standalone server fsyncs its append-only file
// before it answers the commands that wrote (appendfsync always), and a
// busy disk can hold that fsync, and with it every client, for a second
// or more; a fork for a rewrite of the file, or a long script, holds the
// server too. The processes of the run then wait for Redis: a token or a
// slot granted before such a stall is used after it, a lease runs out
// while its renewal waits. The harness pings each server straight (not
// through the proxy) every redisProbeEvery on a connection of its own
// (watchRedis) and records each answer later than minRedisStall
// (KindRedisStall, from when the PING was sent to when its answer came).
// Like the host stalls, only the features' timing-bounded checks take
// them into account (checkfeatures.go); the core invariants never do.

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"time"
)

// KindRedisStall is the kind of the record of a Redis stall: a PING to
// the server Target sent at T was answered at End.
const KindRedisStall = "redis_stall"

// Bounds of the Redis probe.
const (
	// redisProbeEvery is the period of the probe's PINGs.
	redisProbeEvery = 50 * time.Millisecond
	// minRedisStall is the least lateness of an answer that the probe
	// records.
	minRedisStall = 100 * time.Millisecond
)

// watchRedis records in rec, until ctx ends, each PING to one of the
// servers that addrs names (asked again at each round: a failover moves
// the master) answered minRedisStall or more after it was sent. A PING
// that fails (the server is down, or its connection was cut) records
// nothing: the harness injected that fault and records it as such.
func watchRedis(ctx context.Context, rec *Recorder, addrs func() []string) {
	conns := map[string]*probeConn{}
	defer func() {
		for _, c := range conns {
			c.conn.Close()
		}
	}()
	every(ctx, redisProbeEvery, func() {
		for _, addr := range addrs() {
			c := conns[addr]
			if c == nil {
				conn, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					continue
				}
				c = &probeConn{conn: conn, r: bufio.NewReader(conn)}
				conns[addr] = c
			}
			sent, err := c.ping()
			if err != nil {
				c.conn.Close()
				delete(conns, addr)
				continue
			}
			if now := time.Now(); now.Sub(sent) >= minRedisStall {
				rec.Record(Event{T: sent.UnixNano(), End: now.UnixNano(), Kind: KindRedisStall, Target: addr})
			}
		}
	})
}

// probeConn is the probe's connection to one server.
type probeConn struct {
	conn net.Conn
	r    *bufio.Reader
}

// ping sends a PING and reads its answer, within 30 s; it returns when
// it was sent.
func (c *probeConn) ping() (time.Time, error) {
	sent := time.Now()
	_ = c.conn.SetDeadline(sent.Add(30 * time.Second))
	if _, err := c.conn.Write([]byte("PING\r\n")); err != nil {
		return sent, err
	}
	line, err := c.r.ReadString('\n')
	if err == nil && line != "+PONG\r\n" {
		err = fmt.Errorf("chaos: the Redis probe's PING was answered %q", line)
	}
	return sent, err
}

// redisStalls returns the Redis stalls of a history: the late answers
// the probe recorded with no fault of Redis or of the connections to it
// under way (those the fault explains), less what the harness's own
// scheduling delays covered of them (the probe ran late, not Redis),
// when that leaves less than minRedisStall.
func redisStalls(events []Event, fi faultIndex, harnessDelays []hostStall) []hostStall {
	var stalls []hostStall
	for _, e := range events {
		if e.Kind != KindRedisStall || e.End <= e.T || fi.redisFaultSpan(e.T, e.End) {
			continue
		}
		if time.Duration(e.End-e.T)-stalledWithin(harnessDelays, e.T, e.End) < minRedisStall {
			continue
		}
		stalls = append(stalls, hostStall{e.T, e.End})
	}
	return stalls
}
