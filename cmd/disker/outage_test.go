package main_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/diskerhq/disker/internal/redistest"
)

// TestGatewayTimeoutDuringOutage: with gateway --timeout 2s, a request in
// flight when Redis is paused (CLIENT PAUSE: sockets open, no answers) or
// killed gets its 504 by its timeout plus at most a second, not when Redis
// answers again; so does each of the requests that arrive, one a second,
// during the pause or while Redis refuses connections. No worker serves
// the receiver, so the request waits.
func TestGatewayTimeoutDuringOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	for _, fault := range []string{"pause", "kill"} {
		t.Run(fault, func(t *testing.T) {
			t.Parallel()
			srv := redistest.Start(t)
			e := newEnv(t)
			e.redisURL = srv.URL()
			_, url := e.startGateway("--receiver", "web", "--timeout", "2s")
			if code, _ := get(t, url+"/warm-up"); code != http.StatusGatewayTimeout {
				t.Fatalf("a request with no worker: %d, want 504", code)
			}
			type result struct {
				code int
				took time.Duration
			}
			res := make(chan result, 1)
			start := time.Now()
			go func() {
				resp, err := http.Get(url + "/in-flight")
				if err != nil {
					res <- result{-1, time.Since(start)}
					return
				}
				resp.Body.Close()
				res <- result{resp.StatusCode, time.Since(start)}
			}()
			c := redisClient(t, srv)
			waitFor(t, 10*time.Second, "the request to be queued", func() bool {
				n, err := c.Do(context.Background(), c.B().Xlen().Key(e.prefix+":{web}:q").Build()).AsInt64()
				return err == nil && n >= 2 // the warm-up's, and this one's
			})
			switch fault {
			case "pause":
				pauseRedis(t, c, 20*time.Second)
			case "kill":
				srv.Kill()
			}
			var r result
			select {
			case r = <-res:
			case <-time.After(time.Minute):
				t.Fatal("no answer within a minute")
			}
			// The bound: --timeout, the second the issue allows, and a second
			// of slack for a loaded machine; the pause lasts 20s.
			if r.code != http.StatusGatewayTimeout && r.code != http.StatusServiceUnavailable {
				t.Fatalf("a request in flight during a Redis %s: %d, want 504 (or 503)", fault, r.code)
			}
			if r.took > 4*time.Second {
				t.Fatalf("a request in flight during a Redis %s was answered after %v, want by --timeout 2s + 1s (and slack)", fault, r.took)
			}
			// Requests that arrive during the fault: each by --timeout + 1s,
			// the bound of issue 26.
			during := driveRequests(&http.Client{Timeout: time.Minute}, url, 6, time.Second)
			checkAnswered(t, "during a Redis "+fault, during, 3*time.Second, http.StatusGatewayTimeout, http.StatusServiceUnavailable)
			if fault == "pause" {
				srv.Kill() // so that the gateway's stop does not wait for the pause
			}
		})
	}
}

// TestSendDuringPause: "disker send" to a Redis paused (CLIENT PAUSE) fails
// saying what is true: the server accepts connections and does not answer
// PING, so it may be paused or overloaded; not that it may be a TLS port
// (a TLS port closes the connection: TestTLSRedis).
func TestSendDuringPause(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	e := newEnv(t)
	e.redisURL = srv.URL()
	pauseRedis(t, redisClient(t, srv), time.Minute)
	defer srv.Kill() // so that nothing waits for the pause
	_, errOut, code := e.run("", "send", "--to", "jobs", "hello")
	said := withoutLogs(errOut)
	if code != 1 || !strings.Contains(said, "did not answer PING within 1s: the server may be paused (CLIENT PAUSE) or overloaded") {
		t.Errorf("send to a paused Redis: exit %d, %q; want 1, and that it did not answer PING and may be paused", code, said)
	}
	if strings.Contains(said, "TLS") {
		t.Errorf("send to a paused Redis suggests TLS: %q", said)
	}
}

// redisClient returns a client of srv that closes when the test ends.
func redisClient(t *testing.T, srv *redistest.Server) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// pauseRedis pauses the server of c for d (CLIENT PAUSE ALL: sockets stay
// open, no command is answered).
func pauseRedis(t *testing.T, c rueidis.Client, d time.Duration) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().Arbitrary("CLIENT", "PAUSE").Args(strconv.FormatInt(d.Milliseconds(), 10), "ALL").Build()).Error(); err != nil {
		t.Fatal(err)
	}
}
