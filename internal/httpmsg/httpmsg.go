// Package httpmsg encodes an HTTP request into the content of a disker
// message, and an HTTP response into the content of its reply, and back.
//
// The encoding is one line of JSON (the head: method, URL, headers; or
// status and headers), a newline, then the body as raw bytes. The head is
// readable with any tool; the body travels unchanged, so binary content costs
// nothing extra. The head's "disker_http" field names the version and kind
// ("request/1" or "response/1"), so content that is not an encoded request is
// told apart at once.
//
// Decoders validate what they read (method token, a URL path that starts with
// "/", header names and values, a status code in 100..999), because the
// content comes from the network and from Redis. Hop-by-hop headers
// (Connection, Transfer-Encoding, ...) never cross the message boundary.
package httpmsg

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// Kinds written in the head's "disker_http" field.
const (
	kindRequest  = "request/1"
	kindResponse = "response/1"
)

// MaxHeadSize bounds the JSON head that a decoder accepts, in bytes.
const MaxHeadSize = 256 << 10

// ErrNotHTTP is returned by the decoders when the content is not an encoded
// HTTP request or response at all (as opposed to a malformed one).
var ErrNotHTTP = errors.New("httpmsg: content is not an encoded HTTP message")

// Request is an HTTP request as it travels in a message.
type Request struct {
	// Method is the HTTP method, such as "GET".
	Method string
	// URL is the request target: a path that starts with "/", with an
	// optional query ("/items?id=7").
	URL string
	// Host is the Host the client asked for; may be empty.
	Host string
	// Header holds the end-to-end headers (hop-by-hop ones are dropped).
	Header http.Header
	// RemoteAddr is the address of the client as the gateway saw it.
	RemoteAddr string
	// Body is the request body.
	Body []byte
}

// Response is an HTTP response as it travels in a reply.
type Response struct {
	// Status is the HTTP status code, 100..999.
	Status int
	// Header holds the end-to-end headers (hop-by-hop ones are dropped).
	Header http.Header
	// Body is the response body.
	Body []byte
}

type requestHead struct {
	Kind       string              `json:"disker_http"`
	Method     string              `json:"method"`
	URL        string              `json:"url"`
	Host       string              `json:"host,omitempty"`
	RemoteAddr string              `json:"remote_addr,omitempty"`
	Header     map[string][]string `json:"header,omitempty"`
}

type responseHead struct {
	Kind   string              `json:"disker_http"`
	Status int                 `json:"status"`
	Header map[string][]string `json:"header,omitempty"`
}

// EncodeRequest returns the message content for r. It validates r as
// DecodeRequest would, so what it encodes always decodes.
func EncodeRequest(r *Request) ([]byte, error) {
	if err := validateRequest(r.Method, r.URL, r.Host, r.Header); err != nil {
		return nil, err
	}
	head := requestHead{
		Kind:       kindRequest,
		Method:     r.Method,
		URL:        r.URL,
		Host:       r.Host,
		RemoteAddr: r.RemoteAddr,
		Header:     endToEnd(r.Header),
	}
	return encode(head, r.Body)
}

// DecodeRequest parses message content made by EncodeRequest. It returns an
// error wrapping ErrNotHTTP for content that is not an encoded request.
func DecodeRequest(content []byte) (*Request, error) {
	var head requestHead
	body, err := decode(content, kindRequest, &head)
	if err != nil {
		return nil, err
	}
	if err := validateRequest(head.Method, head.URL, head.Host, head.Header); err != nil {
		return nil, err
	}
	return &Request{
		Method:     head.Method,
		URL:        head.URL,
		Host:       head.Host,
		RemoteAddr: head.RemoteAddr,
		Header:     endToEnd(head.Header),
		Body:       body,
	}, nil
}

// EncodeResponse returns the reply content for r. It validates r as
// DecodeResponse would.
func EncodeResponse(r *Response) ([]byte, error) {
	if err := validateResponse(r.Status, r.Header); err != nil {
		return nil, err
	}
	return encode(responseHead{Kind: kindResponse, Status: r.Status, Header: endToEnd(r.Header)}, r.Body)
}

// DecodeResponse parses reply content made by EncodeResponse. It returns an
// error wrapping ErrNotHTTP for content that is not an encoded response.
func DecodeResponse(content []byte) (*Response, error) {
	var head responseHead
	body, err := decode(content, kindResponse, &head)
	if err != nil {
		return nil, err
	}
	if err := validateResponse(head.Status, head.Header); err != nil {
		return nil, err
	}
	return &Response{Status: head.Status, Header: endToEnd(head.Header), Body: body}, nil
}

// NewRequest builds the Request for an incoming server request whose body
// has already been read.
func NewRequest(r *http.Request, body []byte) *Request {
	return &Request{
		Method:     r.Method,
		URL:        r.URL.RequestURI(),
		Host:       r.Host,
		Header:     r.Header,
		RemoteAddr: r.RemoteAddr,
		Body:       body,
	}
}

// HTTPRequest returns an outgoing request for r, sent to base (scheme and
// host, and an optional path prefix) with r's path and query appended.
// The Host header of the original request is kept in X-Forwarded-Host.
func (r *Request) HTTPRequest(base *url.URL) (*http.Request, error) {
	target, err := url.Parse(r.URL)
	if err != nil {
		return nil, fmt.Errorf("httpmsg: invalid URL %q: %w", r.URL, err)
	}
	u := *base
	u.Path = strings.TrimSuffix(base.Path, "/") + target.Path
	u.RawPath = ""
	if target.RawPath != "" {
		u.RawPath = strings.TrimSuffix(base.EscapedPath(), "/") + target.RawPath
	}
	u.RawQuery = target.RawQuery
	req, err := http.NewRequest(r.Method, u.String(), bytes.NewReader(r.Body))
	if err != nil {
		return nil, fmt.Errorf("httpmsg: %w", err)
	}
	req.Header = endToEnd(r.Header)
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if r.Host != "" && req.Header.Get("X-Forwarded-Host") == "" {
		req.Header.Set("X-Forwarded-Host", r.Host)
	}
	if len(r.Body) == 0 && r.Method != http.MethodPost && r.Method != http.MethodPut && r.Method != http.MethodPatch {
		req.Body = http.NoBody
	}
	return req, nil
}

func encode(head any, body []byte) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // keep <, > and & as they are: the head stays compact
	if err := enc.Encode(head); err != nil {
		return nil, fmt.Errorf("httpmsg: encode head: %w", err)
	}
	h := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if len(h) > MaxHeadSize {
		return nil, fmt.Errorf("httpmsg: head of %d bytes is over the limit of %d", len(h), MaxHeadSize)
	}
	out := make([]byte, 0, len(h)+1+len(body))
	out = append(out, h...)
	out = append(out, '\n')
	return append(out, body...), nil
}

func decode(content []byte, kind string, head any) ([]byte, error) {
	nl := bytes.IndexByte(content, '\n')
	if nl < 0 || len(content) == 0 || content[0] != '{' {
		return nil, fmt.Errorf("%w (want %s)", ErrNotHTTP, kind)
	}
	if nl > MaxHeadSize {
		return nil, fmt.Errorf("httpmsg: head of %d bytes is over the limit of %d", nl, MaxHeadSize)
	}
	var probe struct {
		Kind string `json:"disker_http"`
	}
	if err := json.Unmarshal(content[:nl], &probe); err != nil || probe.Kind == "" {
		return nil, fmt.Errorf("%w (want %s)", ErrNotHTTP, kind)
	}
	if probe.Kind != kind {
		return nil, fmt.Errorf("%w: found %q, want %q", ErrNotHTTP, probe.Kind, kind)
	}
	if err := json.Unmarshal(content[:nl], head); err != nil {
		return nil, fmt.Errorf("httpmsg: malformed %s head: %w", kind, err)
	}
	return content[nl+1:], nil
}

func validateRequest(method, target, host string, h map[string][]string) error {
	if !isToken(method) {
		return fmt.Errorf("httpmsg: invalid method %q", method)
	}
	if !strings.HasPrefix(target, "/") {
		return fmt.Errorf("httpmsg: invalid URL %q: it must start with /", target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return fmt.Errorf("httpmsg: invalid URL %q: %v", target, err)
	}
	if u.Host != "" || u.Scheme != "" {
		return fmt.Errorf("httpmsg: invalid URL %q: it must be a path, not an absolute URL", target)
	}
	if !validValue(host) {
		return fmt.Errorf("httpmsg: invalid host %q", host)
	}
	return validateHeader(h)
}

func validateResponse(status int, h map[string][]string) error {
	if status < 100 || status > 999 {
		return fmt.Errorf("httpmsg: invalid status %d: it must be in 100..999", status)
	}
	return validateHeader(h)
}

func validateHeader(h map[string][]string) error {
	for k, vs := range h {
		if !isToken(k) {
			return fmt.Errorf("httpmsg: invalid header name %q", k)
		}
		for _, v := range vs {
			if !validValue(v) {
				return fmt.Errorf("httpmsg: invalid value for header %q", k)
			}
		}
	}
	return nil
}

// isToken reports whether s is a non-empty RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// validValue reports whether s may be sent as a header value: no control
// characters other than horizontal tab.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// hopByHop lists the headers that belong to one connection and are never
// forwarded (RFC 9110, section 7.6.1).
var hopByHop = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// endToEnd returns a canonical copy of h without hop-by-hop headers and
// without the headers that the Connection header names.
func endToEnd(h map[string][]string) http.Header {
	if len(h) == 0 {
		return nil
	}
	out := make(http.Header, len(h))
	for k, vs := range h {
		out[http.CanonicalHeaderKey(k)] = append(out[http.CanonicalHeaderKey(k)], vs...)
	}
	for _, v := range out["Connection"] {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				out.Del(name)
			}
		}
	}
	for _, k := range hopByHop {
		out.Del(k)
	}
	if len(out) == 0 {
		return nil
	}
	return out
}
