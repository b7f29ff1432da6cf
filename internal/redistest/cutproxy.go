package redistest

import (
	"bytes"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// CutProxy forwards TCP connections to a Redis server. While it cuts (see
// SetCut), a connection that gets anything back from the server is closed
// instead of passing it on: the command ran, and all its client learns is a
// broken connection. It shows what a client does when a write went through
// but its answer was lost.
type CutProxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	wg     sync.WaitGroup

	mu     sync.Mutex
	tokens []string // see CutAnswerWith
}

// StartCutProxy starts a CutProxy to the server at target (host:port) on a
// free loopback port, passing everything on until SetCut(true). It stops
// when tb ends.
func StartCutProxy(tb testing.TB, target string) *CutProxy {
	tb.Helper()
	ln := listenLoopback(tb, "cut proxy")
	p := &CutProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	tb.Cleanup(func() {
		ln.Close()
		p.wg.Wait()
	})
	return p
}

// URL returns the proxy's redis:// URL.
func (p *CutProxy) URL() string { return "redis://" + p.ln.Addr().String() }

// SetCut turns cutting on or off.
func (p *CutProxy) SetCut(on bool) { p.cut.Store(on) }

// CutAnswerWith closes, once, the connection of the first answer that
// holds token (within one read of the server's bytes) instead of passing
// it on: the command ran, and its client learns only that the connection
// broke. Later answers with token pass.
func (p *CutProxy) CutAnswerWith(token string) {
	p.mu.Lock()
	p.tokens = append(p.tokens, token)
	p.mu.Unlock()
}

// cutToken reports whether b holds an armed token, and disarms it.
func (p *CutProxy) cutToken(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, tok := range p.tokens {
		if bytes.Contains(b, []byte(tok)) {
			p.tokens = append(p.tokens[:i], p.tokens[i+1:]...)
			return true
		}
	}
	return false
}

func (p *CutProxy) accept() {
	acceptPairs(p.ln, p.target, func(c, s net.Conn, wg *sync.WaitGroup) {
		wg.Go(func() { p.forward(c, s) })
	})
}

// forward passes c's bytes to s and s's back to c, until either closes or
// an answer comes while cutting.
func (p *CutProxy) forward(c, s net.Conn) {
	defer c.Close()
	defer s.Close()
	go func() {
		_, _ = io.Copy(s, c) // ends when either side closes
		s.Close()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if p.cut.Load() || p.cutToken(buf[:n]) {
				return
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
