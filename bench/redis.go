package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// redisServer is a private redis-server on a free loopback port in a
// temporary directory, with persistence off, started by internal/redistest.
type redisServer struct {
	srv  *redistest.Server
	stop func()
	addr string
}

// startRedis starts a redis-server and waits until it answers PING.
// redistest.MustStart panics when it cannot; that becomes an error here.
func startRedis() (s *redisServer, err error) {
	defer func() {
		if v := recover(); v != nil {
			s, err = nil, fmt.Errorf("bench: %v", v)
		}
	}()
	srv, stop := redistest.MustStart()
	return &redisServer{srv: srv, stop: stop, addr: srv.Addr()}, nil
}

// url returns the server's address as a redis:// URL.
func (s *redisServer) url() string { return s.srv.URL() }

// close stops the server and removes its directory.
func (s *redisServer) close() { s.stop() }

// flushAll empties the server between runs.
func (s *redisServer) flushAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", s.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write([]byte("FLUSHALL\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got := strings.TrimSpace(line); got != "+OK" {
		return errors.New("bench: FLUSHALL answered " + got)
	}
	return nil
}
