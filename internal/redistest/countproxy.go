package redistest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
)

// CountProxy forwards TCP connections to a Redis server and counts the
// commands its clients send: what a client makes, where the server's own
// counts (INFO commandstats) also hold the commands its scripts run.
type CountProxy struct {
	ln       net.Listener
	target   string
	commands atomic.Int64
	wg       sync.WaitGroup
}

// StartCountProxy starts a CountProxy to the server at target (host:port)
// on a free loopback port. It stops when tb ends.
func StartCountProxy(tb testing.TB, target string) *CountProxy {
	tb.Helper()
	ln := listenLoopback(tb, "count proxy")
	p := &CountProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

// URL returns the proxy's redis:// URL.
func (p *CountProxy) URL() string { return "redis://" + p.ln.Addr().String() }

// Commands returns how many commands the clients have sent so far.
func (p *CountProxy) Commands() int64 { return p.commands.Load() }

func (p *CountProxy) accept() {
	acceptPairs(p.ln, p.target, func(c, s net.Conn, wg *sync.WaitGroup) {
		wg.Go(func() {
			defer c.Close()
			defer s.Close()
			_, _ = io.Copy(c, s)
		})
		wg.Go(func() {
			defer c.Close()
			defer s.Close()
			_ = p.forward(bufio.NewReader(c), s)
		})
	})
}

// forward passes the commands read from r to w, one RESP array of bulk
// strings at a time, counting them, until r ends or a command does not
// parse.
func (p *CountProxy) forward(r *bufio.Reader, w io.Writer) error {
	for {
		head, err := r.ReadBytes('\n')
		if err != nil {
			return err
		}
		if len(head) < 4 || head[0] != '*' {
			return fmt.Errorf("redistest: count proxy: not a command: %q", head)
		}
		n, err := strconv.Atoi(string(head[1 : len(head)-2]))
		if err != nil {
			return err
		}
		cmd := head
		for range n {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return err
			}
			size, err := strconv.Atoi(string(line[1 : len(line)-2]))
			if err != nil || line[0] != '$' {
				return fmt.Errorf("redistest: count proxy: not a bulk string: %q", line)
			}
			body := make([]byte, size+2)
			if _, err := io.ReadFull(r, body); err != nil {
				return err
			}
			cmd = append(append(cmd, line...), body...)
		}
		p.commands.Add(1)
		if _, err := w.Write(cmd); err != nil {
			return err
		}
	}
}
