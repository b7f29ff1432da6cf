package redistest

import (
	"net"
	"sync"
	"testing"
)

// StallProxy forwards TCP connections to a Redis server and can break them
// the ways a network does. While it stalls (Stall, until Resume), it holds
// every byte either way: it accepts connections and keeps every socket
// open, and delivers nothing, neither to the server nor back (what a
// partition does to a connection, or a server whose host froze). Reset
// closes every open connection with a TCP reset.
type StallProxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	flow  chan struct{} // closed while traffic flows
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

// StartStallProxy starts a StallProxy to the server at target (host:port) on
// a free loopback port, passing everything on. It stops when tb ends.
func StartStallProxy(tb testing.TB, target string) *StallProxy {
	tb.Helper()
	ln := listenLoopback(tb, "stall proxy")
	p := &StallProxy{ln: ln, target: target, flow: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.flow)
	p.wg.Go(p.accept)
	tb.Cleanup(p.stop)
	return p
}

// URL returns the proxy's redis:// URL.
func (p *StallProxy) URL() string { return "redis://" + p.ln.Addr().String() }

// Stall holds all traffic, of open connections and of those accepted from
// now on, until Resume. It does nothing while stalled already.
func (p *StallProxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flow:
		p.flow = make(chan struct{})
	default:
	}
}

// Resume delivers what was held and lets traffic flow again. It does
// nothing while traffic flows.
func (p *StallProxy) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.flow:
	default:
		close(p.flow)
	}
}

// Reset closes every open connection with a TCP reset, both the client's
// and the proxy's to the server. The proxy accepts new ones.
func (p *StallProxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, not an orderly close
		}
		c.Close()
		delete(p.conns, c)
	}
}

func (p *StallProxy) stop() {
	p.ln.Close()
	p.Resume() // so that forwarders holding bytes find their sockets closed
	p.wg.Wait()
}

func (p *StallProxy) accept() {
	acceptPairs(p.ln, p.target, func(c, s net.Conn, wg *sync.WaitGroup) {
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[s] = struct{}{}
		p.mu.Unlock()
		wg.Go(func() { p.forward(s, c) })
		wg.Go(func() { p.forward(c, s) })
	})
}

// forward copies src to dst until either breaks, holding what it read
// while the traffic is stalled. Once it ends, it closes both.
func (p *StallProxy) forward(dst, src net.Conn) {
	defer p.drop(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			flow := p.flow
			p.mu.Unlock()
			<-flow
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// drop closes conns and forgets them.
func (p *StallProxy) drop(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}
