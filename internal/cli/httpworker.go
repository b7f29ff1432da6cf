package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/httpmsg"
)

// httpHandler forwards each message, an HTTP request encoded by httpmsg, to
// a local HTTP service and replies with its response.
type httpHandler struct {
	base    *url.URL
	client  *http.Client
	maxBody int64
	stream  bool // --stream: the body's chunks are partial replies to a streaming caller
}

func newHTTPHandler(base *url.URL, concurrency int, maxBody int64) *httpHandler {
	tr := &http.Transport{
		Proxy:                 nil, // the service is local: never through a proxy
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          concurrency,
		MaxIdleConnsPerHost:   concurrency,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bodies through as the service sent them
		ResponseHeaderTimeout: 0,    // the message's deadline bounds the wait
	}
	return &httpHandler{
		base: base,
		client: &http.Client{
			Transport: tr,
			// A proxy passes redirects on to the client.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		maxBody: maxBody,
	}
}

func (h *httpHandler) Handle(ctx context.Context, msg *disker.Message) ([]byte, error) {
	in, err := httpmsg.DecodeRequest(msg.Content)
	if err != nil {
		return nil, disker.NoRetry(err)
	}
	req, err := in.HTTPRequest(h.base)
	if err != nil {
		return nil, disker.NoRetry(err)
	}
	req = req.WithContext(ctx)
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		if prior := req.Header.Values("X-Forwarded-For"); len(prior) > 0 {
			req.Header.Set("X-Forwarded-For", strings.Join(prior, ", ")+", "+ip)
		} else {
			req.Header.Set("X-Forwarded-For", ip)
		}
	}
	req.Header.Set("X-Disker-Message-Id", msg.ID)
	req.Header.Set("X-Disker-Attempt", strconv.Itoa(msg.Attempt))
	resp, err := h.client.Do(req)
	if err != nil {
		// The service is down or slow: an error, retried up to --max-attempts.
		return nil, fmt.Errorf("forward to %s: %w", h.base.Redacted(), unwrapURLError(err))
	}
	defer resp.Body.Close()
	if h.stream && msg.Streamed() {
		return h.streamBody(ctx, msg, resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, h.maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("read response from %s: %w", h.base.Redacted(), unwrapURLError(err))
	}
	out := &httpmsg.Response{Status: resp.StatusCode, Header: resp.Header, Body: body}
	if int64(len(body)) > h.maxBody {
		out = &httpmsg.Response{
			Status: http.StatusBadGateway,
			Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
			Body:   fmt.Appendf(nil, "disker worker: the service's response body is over --max-body (%d bytes)\n", h.maxBody),
		}
	}
	content, err := httpmsg.EncodeResponse(out)
	if err != nil {
		return nil, disker.NoRetry(err)
	}
	return content, nil
}

// streamChunk is the most bytes of the response body one partial reply
// carries.
const streamChunk = 32 << 10

// streamBody sends resp's body to msg's streaming caller as partial
// replies, each what one read of the body gave (a chunk as the service
// flushed it, up to streamChunk bytes), and returns the final reply: the
// response's status and headers, with an empty body. A body over
// --max-body ends the stream with a 502 response.
func (h *httpHandler) streamBody(ctx context.Context, msg *disker.Message, resp *http.Response) ([]byte, error) {
	out := &httpmsg.Response{Status: resp.StatusCode, Header: resp.Header}
	buf := make([]byte, streamChunk)
	var total int64
	for {
		n, rerr := resp.Body.Read(buf)
		if total += int64(n); total > h.maxBody {
			out = &httpmsg.Response{
				Status: http.StatusBadGateway,
				Header: http.Header{"Content-Type": {"text/plain; charset=utf-8"}},
				Body:   fmt.Appendf(nil, "disker worker: the service's response body is over --max-body (%d bytes)\n", h.maxBody),
			}
			break
		}
		if n > 0 {
			switch err := msg.Partial(ctx, buf[:n]); {
			case errors.Is(err, disker.ErrLate):
				return nil, nil // the caller has its outcome, or has gone
			case err != nil:
				return nil, err
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("read response from %s: %w", h.base.Redacted(), unwrapURLError(rerr))
		}
	}
	content, err := httpmsg.EncodeResponse(out)
	if err != nil {
		return nil, disker.NoRetry(err)
	}
	return content, nil
}

// unwrapURLError drops the *url.Error wrapper, whose text repeats the
// method and URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
