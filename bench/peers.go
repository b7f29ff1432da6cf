package bench

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
)

// The peers a user would pick instead of Disker run beside it in the
// Disker suite's fire-and-forget and request/reply workloads: BullMQ (node,
// on the workload's redis-server), NATS JetStream and NATS request/reply
// (a nats-server embedded in this program, run as a child process of it),
// River (on a private PostgreSQL). A peer that needs something missing on
// the machine does not run, and one whose run fails is left out: its table
// says why.

// Names of the peers' rows.
const (
	nameBullMQ        = "BullMQ (node)"
	nameJetStreamMem  = "NATS JetStream, memory storage"
	nameJetStreamFile = "NATS JetStream, file storage"
	nameNATSRequest   = "NATS request/reply (core NATS)"
	nameRiver         = "River (PostgreSQL)"
)

// errNotRun marks a row that could not run on this machine: something it
// needs is missing. The harness goes on without the row.
var errNotRun = errors.New("not run")

// peers holds the servers of the peers that run on servers of their own,
// each started on first use and stopped by close, and why a peer's rows
// did not run.
type peers struct {
	o Options

	nats    *natsServer
	natsErr error
	pg      *pgServer
	pgErr   error

	// notRun maps a row's name to why it has no figures: "not run: ..." or
	// "failed in <workload>: ...", each reason once.
	notRun map[string][]string
}

func newPeers(o Options) *peers { return &peers{o: o, notRun: map[string][]string{}} }

// close stops the servers that were started.
func (p *peers) close() {
	if p == nil {
		return
	}
	if p.nats != nil {
		p.nats.close()
		p.nats = nil
	}
	if p.pg != nil {
		p.pg.close()
		p.pg = nil
	}
}

// missing records that row cannot run, prints why, and returns the error
// that tells runAlternating to go on without it.
func (p *peers) missing(row string, why error) error {
	return p.leaveOut(row, "not run: "+why.Error())
}

// failed records that a run of row failed in workload, prints why, and
// returns the error that tells runAlternating to go on without the row:
// its figures are missing, like those of a row that cannot run.
func (p *peers) failed(row, workload string, why error) error {
	return p.leaveOut(row, fmt.Sprintf("failed in %s: %v", workload, why))
}

// leaveOut records why row has no figures (each reason once: a row that
// failed in two workloads has both), prints it, and returns the error that
// tells runAlternating to go on without it.
func (p *peers) leaveOut(row, why string) error {
	if !slices.Contains(p.notRun[row], why) {
		p.notRun[row] = append(p.notRun[row], why)
		if p.o.Progress != nil {
			fmt.Fprintf(p.o.Progress, "  %s: %s\n", row, why)
		} else {
			fmt.Fprintf(os.Stderr, "bench: %s: %s\n", row, why)
		}
	}
	return fmt.Errorf("%w: %s", errNotRun, why)
}

// natsServer returns the suite's nats-server, starting it on first use.
func (p *peers) natsServer() (*natsServer, error) {
	if p.nats == nil && p.natsErr == nil {
		p.nats, p.natsErr = startNATS()
	}
	return p.nats, p.natsErr
}

// notes returns a note for each of rows that did not run, saying why.
func (p *peers) notes(rows ...string) []string {
	if p == nil {
		return nil
	}
	var out []string
	for _, r := range rows {
		if why, ok := p.notRun[r]; ok {
			out = append(out, fmt.Sprintf("%s: %s.", r, strings.TrimSuffix(strings.Join(why, "; "), ".")))
		}
	}
	return out
}
