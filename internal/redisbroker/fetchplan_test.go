package redisbroker

import (
	"testing"
	"time"
)

// TestPlanFetch walks planFetch's branches. A missing group (NOGROUP) is
// the caller's to handle, after a read: TestRedisRestartWithoutData and
// TestQueueDeletedUnderTheBroker cover it.
func TestPlanFetch(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	const (
		every = 100 * time.Millisecond
		lease = 10 * time.Second // under idleReclaimMax
		block = 5 * time.Second
	)
	in := fetchInputs{now: now, block: block, lease: lease, every: every}
	noBlock := in
	noBlock.block = 0
	// watched: a queue of a broker whose heartbeat's ttl is under the
	// lease; watchedLate: over it.
	watched, watchedLate := in, in
	watched.watched, watchedLate.watched = 3*time.Second, 2*lease
	// between: a busy stream between two reclaims, nothing sent for later.
	between := streamSnapshot{reclaimAt: at(50 * time.Millisecond), nextDue: noneDue}
	with := func(f func(*streamSnapshot)) streamSnapshot {
		s := between
		f(&s)
		return s
	}
	tests := []struct {
		name string
		s    streamSnapshot
		in   fetchInputs
		want fetchPlan
	}{
		{"busy stream between reclaims: a read, then a wait", between, in,
			fetchPlan{read: true, wait: true}},
		{"busy stream between reclaims, no block: a read", between, noBlock,
			fetchPlan{read: true}},
		{"busy stream, reclaim due: the script, next in every", with(func(s *streamSnapshot) { s.reclaimAt = at(0) }), in,
			fetchPlan{script: true, reclaim: true, claim: at(every), wait: true}},
		{"quiet stream, reclaim due: the script, next in a lease", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = at(-time.Second), true }), in,
			fetchPlan{script: true, reclaim: true, claim: at(lease), wait: true}},
		{"quiet stream, short lease: next in every", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = at(0), true }), fetchInputs{now: now, block: block, lease: time.Millisecond, every: every},
			fetchPlan{script: true, reclaim: true, claim: at(every), wait: true}},
		{"quiet stream, long lease: next in idleReclaimMax", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = at(0), true }), fetchInputs{now: now, block: block, lease: time.Hour, every: every},
			fetchPlan{script: true, reclaim: true, claim: at(idleReclaimMax), wait: true}},
		{"quiet watched queue, reclaim time passed: no script", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet, s.drained, s.idle = at(-time.Minute), true, true, true }), watched,
			fetchPlan{direct: true, directBlock: block, wait: true}},
		{"quiet watched queue, forced: the script", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = 0, true }), watched,
			fetchPlan{script: true, reclaim: true, claim: at(lease), wait: true}},
		{"quiet watched queue, lease changed: the script", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet, s.leaseChanged = at(-time.Minute), true, true }), watched,
			fetchPlan{script: true, reclaim: true, wait: true}},
		{"quiet queue watched less often than its lease: by time", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = at(-time.Second), true }), watchedLate,
			fetchPlan{script: true, reclaim: true, claim: at(lease), wait: true}},
		{"busy watched queue, reclaim due: the script", with(func(s *streamSnapshot) { s.reclaimAt = at(0) }), watched,
			fetchPlan{script: true, reclaim: true, claim: at(every), wait: true}},
		{"quiet stream between reclaims: a read", with(func(s *streamSnapshot) { s.reclaimAt, s.quiet = at(10*time.Second), true }), in,
			fetchPlan{read: true, wait: true}},
		{"forced reclaim", with(func(s *streamSnapshot) { s.reclaimAt = 0 }), in,
			fetchPlan{script: true, reclaim: true, claim: at(every), wait: true}},
		{"reclaim due taken by another fetch", with(func(s *streamSnapshot) { s.reclaimAt = reclaimTaken }), in,
			fetchPlan{read: true, wait: true}},
		{"lease changed: the script reclaims, nothing claimed", with(func(s *streamSnapshot) { s.leaseChanged = true }), in,
			fetchPlan{script: true, reclaim: true, wait: true}},
		{"lease changed, reclaim due: claimed", with(func(s *streamSnapshot) { s.leaseChanged, s.reclaimAt = true, 0 }), in,
			fetchPlan{script: true, reclaim: true, claim: at(every), wait: true}},
		{"high level holds entries: the script, no reclaim", with(func(s *streamSnapshot) { s.levels = 1 }), in,
			fetchPlan{script: true, levels: 1, wait: true}},
		{"both levels hold entries, drained and idle: still the script", with(func(s *streamSnapshot) { s.levels, s.drained, s.idle = 3, true, true }), in,
			fetchPlan{script: true, levels: 3, wait: true}},
		{"levels, reclaim due", with(func(s *streamSnapshot) { s.levels, s.reclaimAt = 2, 0 }), noBlock,
			fetchPlan{script: true, reclaim: true, claim: at(every), levels: 2}},
		{"message for later due: the script queues it", with(func(s *streamSnapshot) { s.nextDue = at(0) }), in,
			fetchPlan{script: true, wait: true}},
		{"wake entry read (forceSchedule)", with(func(s *streamSnapshot) { s.nextDue, s.drained = 0, true }), in,
			fetchPlan{script: true, wait: true}},
		{"drained stream: a direct read, then a read", with(func(s *streamSnapshot) { s.drained = true }), in,
			fetchPlan{direct: true, directBlock: block, read: true, wait: true}},
		{"drained stream, no block: a read", with(func(s *streamSnapshot) { s.drained = true }), noBlock,
			fetchPlan{read: true}},
		{"idle stream: a direct read, else the wait", with(func(s *streamSnapshot) { s.drained, s.idle = true, true }), in,
			fetchPlan{direct: true, directBlock: block, wait: true}},
		{"idle stream, no block: a read", with(func(s *streamSnapshot) { s.drained, s.idle = true, true }), noBlock,
			fetchPlan{read: true}},
		{"drained, message for later due soon: no direct read", with(func(s *streamSnapshot) { s.drained, s.nextDue = true, at(50*time.Millisecond) }), in,
			fetchPlan{read: true, wait: true}},
		{"idle, message for later due soon: straight to the wait", with(func(s *streamSnapshot) { s.drained, s.idle, s.nextDue = true, true, at(50*time.Millisecond) }), in,
			fetchPlan{wait: true}},
		{"drained, message for later due within the block", with(func(s *streamSnapshot) { s.drained, s.nextDue = true, at(time.Second) }), in,
			fetchPlan{direct: true, directBlock: time.Second - redisTimerSlack, read: true, wait: true}},
		{"drained, message for later due beyond the block", with(func(s *streamSnapshot) { s.drained, s.nextDue = true, at(time.Minute) }), in,
			fetchPlan{direct: true, directBlock: block, read: true, wait: true}},
		{"not due, not drained: the due time changes nothing", with(func(s *streamSnapshot) { s.nextDue = at(50 * time.Millisecond) }), in,
			fetchPlan{read: true, wait: true}},
	}
	for _, tt := range tests {
		if got := planFetch(tt.s, tt.in); got != tt.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tt.name, got, tt.want)
		}
	}
}

// TestPlanWait walks planWait's branches: how long a fetch that found
// nothing blocks in Redis, or waits in the client.
func TestPlanWait(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	at := func(d time.Duration) int64 { return now.Add(d).UnixNano() }
	const block = 5 * time.Second
	edge := redisTimerSlack + minDueBlock
	tests := []struct {
		name    string
		nextDue int64
		block   time.Duration
		want    fetchWait
	}{
		{"nothing sent for later", noneDue, block, fetchWait{block: block}},
		{"due beyond the block", at(time.Minute), block, fetchWait{block: block}},
		{"due just beyond the block and the slack", at(block + redisTimerSlack), block, fetchWait{block: block}},
		{"due within the block: ends the slack before", at(time.Second), block, fetchWait{block: time.Second - redisTimerSlack}},
		{"due just past the edge: blocks the least", at(edge + time.Nanosecond), block, fetchWait{block: minDueBlock + time.Nanosecond}},
		{"due at the edge: waits in the client", at(edge), block, fetchWait{block: block, sleep: edge}},
		{"due soon", at(50 * time.Millisecond), block, fetchWait{block: block, sleep: 50 * time.Millisecond}},
		{"due soon, shorter block", at(50 * time.Millisecond), 10 * time.Millisecond, fetchWait{block: 10 * time.Millisecond, sleep: 10 * time.Millisecond}},
		{"due now", at(0), block, fetchWait{block: block, sleep: minDueBlock}},
		{"due in the past (forceSchedule)", 0, block, fetchWait{block: block, sleep: minDueBlock}},
	}
	for _, tt := range tests {
		if got := planWait(tt.nextDue, now, tt.block); got != tt.want {
			t.Errorf("%s: planWait = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
