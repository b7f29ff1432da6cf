package main_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestGatewayContentLength: a response of 1 KiB, 64 KiB or 8 MiB that the
// service sends with a Content-Length reaches the client through a worker
// and the gateway with that Content-Length, not chunked (net/http sets a
// length itself only for a body that fits its first buffer), as Go's HTTP
// client and curl see it; HEAD keeps the service's length, 204 has none.
func TestGatewayContentLength(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the test uses curl as a client: %v", err)
	}
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/none" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.Itoa(n))
		if r.Method != http.MethodHead {
			_, _ = w.Write(bytes.Repeat([]byte("x"), n))
		}
	}))
	t.Cleanup(svc.Close)
	e := newEnv(t)
	e.startWorker("--receiver", "files", "--http", svc.URL, "--max-body", "9MiB")
	_, url := e.startGateway("--receiver", "files", "--timeout", "30s")

	for _, n := range []int{1 << 10, 64 << 10, 8 << 20} {
		resp, err := http.Get(url + "/file?n=" + strconv.Itoa(n))
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(body) != n {
			t.Fatalf("GET a body of %d bytes: %d, %d bytes read, %v", n, resp.StatusCode, len(body), err)
		}
		if resp.ContentLength != int64(n) || len(resp.TransferEncoding) > 0 {
			t.Errorf("GET a body of %d bytes: Content-Length %d, Transfer-Encoding %v; want %d and none",
				n, resp.ContentLength, resp.TransferEncoding, n)
		}
		out, err := exec.Command("curl", "-sS", "-D-", "-o", "/dev/null", url+"/file?n="+strconv.Itoa(n)).Output()
		if err != nil {
			t.Fatalf("curl: %v", err)
		}
		head := strings.ToLower(string(out))
		if !strings.Contains(head, "content-length: "+strconv.Itoa(n)+"\r\n") || strings.Contains(head, "transfer-encoding") {
			t.Errorf("curl -D- of a body of %d bytes got the headers:\n%s", n, out)
		}
	}

	resp, err := http.Head(url + "/file?n=100000")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ContentLength != 100000 {
		t.Errorf("HEAD: Content-Length %d, want the service's 100000", resp.ContentLength)
	}
	resp, err = http.Get(url + "/none")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Content-Length") != "" {
		t.Errorf("204: %d with Content-Length %q, want 204 with none", resp.StatusCode, resp.Header.Get("Content-Length"))
	}
}
