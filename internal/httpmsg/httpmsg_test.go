package httpmsg

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestRequestRoundTrip(t *testing.T) {
	t.Parallel()
	binary := make([]byte, 512<<10)
	for i := range binary {
		binary[i] = byte(i * 7)
	}
	tests := []struct {
		name string
		req  Request
	}{
		{"get", Request{Method: "GET", URL: "/items?id=7&x=%20y", Host: "example.com"}},
		{"binary body", Request{Method: "POST", URL: "/upload", Header: http.Header{"Content-Type": {"application/octet-stream"}}, Body: binary}},
		{"newlines in body", Request{Method: "PUT", URL: "/a", Body: []byte("line 1\nline 2\n\n{\"x\":1}\n")}},
		{"multi-valued header", Request{Method: "GET", URL: "/", Header: http.Header{"X-A": {"1", "2"}, "Cookie": {"a=b; c=d"}}, RemoteAddr: "10.0.0.1:5000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			content, err := EncodeRequest(&tt.req)
			if err != nil {
				t.Fatalf("EncodeRequest: %v", err)
			}
			got, err := DecodeRequest(content)
			if err != nil {
				t.Fatalf("DecodeRequest: %v", err)
			}
			if got.Method != tt.req.Method || got.URL != tt.req.URL || got.Host != tt.req.Host || got.RemoteAddr != tt.req.RemoteAddr {
				t.Fatalf("got %+v, want %+v", got, tt.req)
			}
			if !bytes.Equal(got.Body, tt.req.Body) {
				t.Fatalf("body differs: got %d bytes, want %d", len(got.Body), len(tt.req.Body))
			}
			if !reflect.DeepEqual(got.Header, tt.req.Header) {
				t.Fatalf("header = %v, want %v", got.Header, tt.req.Header)
			}
		})
	}
}

func TestResponseRoundTrip(t *testing.T) {
	t.Parallel()
	want := Response{Status: 418, Header: http.Header{"Content-Type": {"image/png"}, "Set-Cookie": {"a=1", "b=2"}}, Body: []byte{0, 1, 2, '\n', 0xff, 0xfe}}
	content, err := EncodeResponse(&want)
	if err != nil {
		t.Fatalf("EncodeResponse: %v", err)
	}
	got, err := DecodeResponse(content)
	if err != nil {
		t.Fatalf("DecodeResponse: %v", err)
	}
	if got.Status != want.Status || !bytes.Equal(got.Body, want.Body) || !reflect.DeepEqual(got.Header, want.Header) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestHopByHopHeadersAreDropped(t *testing.T) {
	t.Parallel()
	content, err := EncodeResponse(&Response{Status: 200, Header: http.Header{
		"Connection":        {"keep-alive, X-Private"},
		"X-Private":         {"secret"},
		"Transfer-Encoding": {"chunked"},
		"Keep-Alive":        {"timeout=5"},
		"X-Kept":            {"yes"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeResponse(content)
	if err != nil {
		t.Fatal(err)
	}
	want := http.Header{"X-Kept": {"yes"}}
	if !reflect.DeepEqual(got.Header, want) {
		t.Fatalf("header = %v, want %v", got.Header, want)
	}
}

func TestDecodeRejects(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		notHTTP bool
	}{
		{"empty", "", true},
		{"plain text", "hello world", true},
		{"json without newline", `{"disker_http":"request/1"}`, true},
		{"other json", "{\"a\":1}\nbody", true},
		{"response given to request decoder", "{\"disker_http\":\"response/1\",\"status\":200}\n", true},
		{"bad method", "{\"disker_http\":\"request/1\",\"method\":\"GE T\",\"url\":\"/\"}\n", false},
		{"absolute url", "{\"disker_http\":\"request/1\",\"method\":\"GET\",\"url\":\"http://evil/\"}\n", false},
		{"relative url", "{\"disker_http\":\"request/1\",\"method\":\"GET\",\"url\":\"x\"}\n", false},
		{"header injection", "{\"disker_http\":\"request/1\",\"method\":\"GET\",\"url\":\"/\",\"header\":{\"X\":[\"a\\r\\nB: c\"]}}\n", false},
		{"bad header name", "{\"disker_http\":\"request/1\",\"method\":\"GET\",\"url\":\"/\",\"header\":{\"X Y\":[\"a\"]}}\n", false},
		{"wrong type", "{\"disker_http\":\"request/1\",\"method\":7,\"url\":\"/\"}\n", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := DecodeRequest([]byte(tt.content))
			if err == nil {
				t.Fatalf("DecodeRequest(%q) succeeded", tt.content)
			}
			if errors.Is(err, ErrNotHTTP) != tt.notHTTP {
				t.Fatalf("errors.Is(%v, ErrNotHTTP) = %v, want %v", err, !tt.notHTTP, tt.notHTTP)
			}
			if !strings.HasPrefix(err.Error(), "httpmsg: ") {
				t.Fatalf("error %q lacks the package prefix", err)
			}
		})
	}
	for _, status := range []string{"0", "99", "1000", "-1"} {
		_, err := DecodeResponse([]byte("{\"disker_http\":\"response/1\",\"status\":" + status + "}\n"))
		if err == nil {
			t.Fatalf("status %s accepted", status)
		}
	}
}

func TestEncodeValidates(t *testing.T) {
	t.Parallel()
	if _, err := EncodeRequest(&Request{Method: "GET", URL: "no-slash"}); err == nil {
		t.Fatal("EncodeRequest accepted a URL without a leading slash")
	}
	if _, err := EncodeResponse(&Response{Status: 42}); err == nil {
		t.Fatal("EncodeResponse accepted status 42")
	}
}

// TestForwarding sends a decoded request to a real HTTP server and checks
// what arrives: path prefix, query, escaped path, headers and body.
func TestForwarding(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, uri, host, fwdHost, ct string
		body                           []byte
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := new(bytes.Buffer)
		_, _ = b.ReadFrom(r.Body)
		got <- seen{r.Method, r.RequestURI, r.Host, r.Header.Get("X-Forwarded-Host"), r.Header.Get("Content-Type"), b.Bytes()}
	}))
	defer srv.Close()

	in := httptest.NewRequest("POST", "http://front.example/a%2Fb/c?q=1&q=2", strings.NewReader("payload"))
	in.Header.Set("Content-Type", "text/plain")
	in.Header.Set("Connection", "close")
	content, err := EncodeRequest(NewRequest(in, []byte("payload")))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := DecodeRequest(content)
	if err != nil {
		t.Fatal(err)
	}
	base, _ := url.Parse(srv.URL + "/api/")
	out, err := dec.HTTPRequest(base)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := srv.Client().Do(out)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := <-got
	want := seen{"POST", "/api/a%2Fb/c?q=1&q=2", strings.TrimPrefix(srv.URL, "http://"), "front.example", "text/plain", []byte("payload")}
	if s.method != want.method || s.uri != want.uri || s.host != want.host || s.fwdHost != want.fwdHost || s.ct != want.ct || !bytes.Equal(s.body, want.body) {
		t.Fatalf("server saw %+v, want %+v", s, want)
	}
}
