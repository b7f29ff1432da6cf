package chaos

import (
	"fmt"
	"net"
	"sync"
)

// proxy forwards TCP connections to Redis and can break them three ways:
// reset every open connection, stall all traffic for a while, or cut (close
// a connection instead of passing an answer on, as redistest.CutProxy does:
// the command ran and its client learns only that the connection broke).
type proxy struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	flow  chan struct{} // closed while traffic flows
	cut   bool
	wg    sync.WaitGroup
}

func startProxy(target string) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("chaos: proxy: %w", err)
	}
	p := &proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, flow: make(chan struct{})}
	close(p.flow)
	p.wg.Go(p.accept)
	return p, nil
}

// URL returns the proxy's redis:// URL.
func (p *proxy) URL() string { return "redis://" + p.ln.Addr().String() + "/0" }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.conns[s] = struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c, false) })
		p.wg.Go(func() { p.pipe(c, s, true) })
	}
}

// pipe copies src to dst until either breaks, holding bytes while the
// traffic is stalled and closing both on an answer while cutting.
func (p *proxy) pipe(dst, src net.Conn, answers bool) {
	defer p.drop(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			flow, cut := p.flow, p.cut
			p.mu.Unlock()
			<-flow
			if cut && answers {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) drop(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

// reset closes every open connection.
func (p *proxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// stall holds all traffic until the returned function is called.
func (p *proxy) stall() (resume func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	flow := make(chan struct{})
	p.flow = flow
	return func() { close(flow) }
}

// setCut turns cutting on or off.
func (p *proxy) setCut(on bool) {
	p.mu.Lock()
	p.cut = on
	p.mu.Unlock()
}

// close stops the proxy and its connections.
func (p *proxy) close() {
	p.ln.Close()
	p.reset()
	p.wg.Wait()
}
