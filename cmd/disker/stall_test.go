package main_test

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/diskerhq/disker/internal/redistest"
)

// TestGatewayTimeoutDuringStall: a worker and a gateway with --timeout 2s
// reach Redis through a proxy that then holds every byte for 40s (it
// accepts connections and keeps every socket open, and delivers nothing),
// while a request arrives every second; then resets every connection a few
// times. Every request is answered by --timeout + 1s (the bound of issue
// 26): 504 or 503 while Redis cannot answer, whatever the stall's length.
// Once the traffic flows again, requests get the worker's 200.
func TestGatewayTimeoutDuringStall(t *testing.T) {
	if testing.Short() {
		t.Skip("a failure-injection test: runs without -short")
	}
	t.Parallel()
	srv := redistest.Start(t)
	proxy := redistest.StartStallProxy(t, srv.Addr())
	e := newEnv(t)
	e.redisURL = proxy.URL()
	svc := newService(t)
	e.startWorker("--receiver", "web", "--http", svc.srv.URL)
	const timeout = 2 * time.Second
	_, url := e.startGateway("--receiver", "web", "--timeout", timeout.String())
	if code, body := get(t, url+"/echo"); code != http.StatusOK {
		t.Fatalf("before the stall: %d %q", code, body)
	}
	client := &http.Client{Timeout: time.Minute}
	bound := timeout + time.Second

	proxy.Stall()
	stall := driveRequests(client, url, 40, time.Second)
	proxy.Resume()
	checkAnswered(t, "during a 40s stall", stall, bound, http.StatusGatewayTimeout, http.StatusServiceUnavailable)
	waitFor(t, 30*time.Second, "200 again after the stall", func() bool {
		code, _ := get(t, url+"/echo")
		return code == http.StatusOK
	})

	resets := make(chan struct{})
	go func() {
		defer close(resets)
		for range 5 {
			time.Sleep(time.Second)
			proxy.Reset()
		}
	}()
	reset := driveRequests(client, url, 6, time.Second)
	<-resets
	// A request whose connection was reset may be answered by the worker
	// all the same once it is sent again, or not in time.
	checkAnswered(t, "while connections are reset", reset, bound, http.StatusOK, http.StatusGatewayTimeout, http.StatusServiceUnavailable)
	waitFor(t, 30*time.Second, "200 again after the resets", func() bool {
		code, _ := get(t, url+"/echo")
		return code == http.StatusOK
	})
}

// answer is the outcome of one request of driveRequests.
type answer struct {
	sent time.Duration // since the first request was sent
	code int           // -1: no response (err says why)
	took time.Duration
	err  error
}

// driveRequests sends n GETs of url/echo, one every interval, each on its
// own goroutine, and returns their answers once all came.
func driveRequests(c *http.Client, url string, n int, interval time.Duration) []answer {
	out := make([]answer, n)
	var wg sync.WaitGroup
	start := time.Now()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			<-tick.C
		}
		wg.Go(func() {
			a := answer{sent: time.Since(start), code: -1}
			t0 := time.Now()
			resp, err := c.Get(fmt.Sprintf("%s/echo?i=%d", url, i))
			a.took, a.err = time.Since(t0), err
			if err == nil {
				a.code = resp.StatusCode
				resp.Body.Close()
			}
			out[i] = a
		})
	}
	wg.Wait()
	return out
}

// checkAnswered fails t for each answer that took longer than bound or
// whose status is not one of codes.
func checkAnswered(t *testing.T, what string, answers []answer, bound time.Duration, codes ...int) {
	t.Helper()
	worst := time.Duration(0)
	for i, a := range answers {
		worst = max(worst, a.took)
		switch {
		case a.code < 0:
			t.Errorf("%s: request %d (sent at +%v): no response: %v", what, i, a.sent.Round(time.Millisecond), a.err)
		case a.took > bound:
			t.Errorf("%s: request %d (sent at +%v): %d after %v, want an answer by %v", what, i, a.sent.Round(time.Millisecond), a.code, a.took.Round(time.Millisecond), bound)
		case !slices.Contains(codes, a.code):
			t.Errorf("%s: request %d (sent at +%v): status %d, want one of %v", what, i, a.sent.Round(time.Millisecond), a.code, codes)
		}
	}
	t.Logf("%s: %d requests, the slowest answered in %v", what, len(answers), worst.Round(time.Millisecond))
}
