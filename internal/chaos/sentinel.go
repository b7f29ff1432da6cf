package chaos

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/diskerhq/disker/internal/redistest"
)

// runTB lends redistest's Sentinel helpers, written for tests, the few
// testing.TB methods they use (Helper, TempDir, Cleanup, Fatalf) outside a
// test. Any other method would panic on the nil embedded interface.
type runTB struct {
	testing.TB
	dir      string
	cleanups []func()
}

func (t *runTB) Helper()          {}
func (t *runTB) TempDir() string  { return t.dir }
func (t *runTB) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }
func (t *runTB) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf(format, args...))
}

// sentinelBackend is a master, a replica and a sentinel.
type sentinelBackend struct {
	tb *runTB
	s  *redistest.Sentinel
}

func startSentinelBackend(dir string) (sb *sentinelBackend, err error) {
	tb := &runTB{dir: filepath.Join(dir, "sentinel")}
	if err := os.MkdirAll(tb.dir, 0o755); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("chaos: sentinel: %v", v)
		}
	}()
	return &sentinelBackend{tb: tb, s: redistest.StartSentinel(tb)}, nil
}

// failover fails the master over to the replica and waits for the sentinel
// to be back to a master and a replica. It returns an error when that did
// not happen within redistest.SentinelTimeout.
func (sb *sentinelBackend) failover() (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("chaos: %v", v)
		}
	}()
	sb.s.Failover(sb.tb)
	return nil
}

// master returns the current master's address, or none when the sentinel
// does not answer.
func (sb *sentinelBackend) master() []string {
	addr, err := sb.s.MasterAddr()
	if err != nil {
		return nil
	}
	return []string{addr}
}

func (sb *sentinelBackend) stop() {
	for i := len(sb.tb.cleanups) - 1; i >= 0; i-- {
		sb.tb.cleanups[i]()
	}
}
