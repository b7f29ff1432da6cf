package cli

// The gateway's server-sent events: a request that accepts
// text/event-stream gets its worker's partial replies as they come, then
// the final one, with the handler's progress between (see docs/streams.md).

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/httpmsg"
)

// wantsEvents reports whether r accepts text/event-stream: then the
// gateway answers with server-sent events (serveEvents).
func wantsEvents(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == "text/event-stream" {
				return true
			}
		}
	}
	return false
}

// serveEvents answers r with server-sent events: msg is sent with
// RequestStream, and each partial reply becomes an event "partial" (id
// ATTEMPT.N), each progress of the handler (Message.Progress) an event
// "progress" (no id), each restart of a redelivered message an event "restart"
// (data: its attempt), and the final outcome one event "reply" (the body
// of the worker's HTTP response, or the reply as it is when it is not
// one) or "error" (the text the gateway would answer without events; an
// HTTP response of status 400 or more is one too). The response is 200
// once the first event is ready; a request that fails before that gets
// the status it would get without events. It returns the status sent.
func (g *gateway) serveEvents(ctx context.Context, w http.ResponseWriter, r *http.Request, msg disker.Message, opts []disker.SendOption, reqID string) int {
	rc := http.NewResponseController(w)
	started, n := false, 0
	for part, err := range g.d.RequestStream(ctx, msg, opts...) {
		if err != nil && r.Context().Err() != nil {
			g.log.Debug("client gone before the reply", "path", r.URL.Path)
			return 499
		}
		if err != nil && !started {
			code, text, cause := g.failure(err, reqID)
			return g.fail(w, r, code, text, cause)
		}
		if !started {
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache")
			h.Set("X-Accel-Buffering", "no") // no proxy buffering
			w.WriteHeader(http.StatusOK)
			started = true
		}
		var buf bytes.Buffer
		switch {
		case err != nil:
			code, text, cause := g.failure(err, reqID)
			g.logFailure(r, code, text, cause)
			writeEvent(&buf, "error", "", []byte(strconv.Itoa(code)+" "+text))
		case part.Reply != nil:
			writeFinal(&buf, part.Reply.Content)
		default:
			if part.Restart {
				n = 0
				writeEvent(&buf, "restart", "", []byte(strconv.Itoa(part.Attempt)))
			}
			if part.Progress {
				writeEvent(&buf, "progress", "", part.Content)
			} else {
				n++
				writeEvent(&buf, "partial", fmt.Sprintf("%d.%d", part.Attempt, n), part.Content)
			}
		}
		if _, werr := w.Write(buf.Bytes()); werr != nil {
			return 499 // the client went away: leaving the loop gives the request up
		}
		if ferr := rc.Flush(); ferr != nil {
			return 499
		}
	}
	return http.StatusOK
}

// writeFinal writes the event of a final reply: "reply" with the body of
// the worker's HTTP response, or "error" with its status and body when
// the status is 400 or more; "reply" with content itself when it is not
// an HTTP response.
func writeFinal(buf *bytes.Buffer, content []byte) {
	resp, err := httpmsg.DecodeResponse(content)
	switch {
	case err != nil:
		writeEvent(buf, "reply", "", content)
	case resp.Status >= 400:
		writeEvent(buf, "error", "", append([]byte(strconv.Itoa(resp.Status)+" "), resp.Body...))
	default:
		writeEvent(buf, "reply", "", resp.Body)
	}
}

// writeEvent writes one server-sent event: its name, its id if any, and
// data, one "data:" line per line of it (a final line break ends the last
// line; data without one is one line).
func writeEvent(buf *bytes.Buffer, event, id string, data []byte) {
	buf.WriteString("event: " + event + "\n")
	if id != "" {
		buf.WriteString("id: " + id + "\n")
	}
	data = bytes.TrimSuffix(data, []byte("\n"))
	for line := range bytes.SplitSeq(data, []byte("\n")) {
		buf.WriteString("data: ")
		buf.Write(bytes.TrimSuffix(line, []byte("\r")))
		buf.WriteByte('\n')
	}
	buf.WriteByte('\n')
}

// logFailure logs a request that failed with code (its status, or the
// one it would have had when its events began) for text, and err if any:
// at warn for 5xx, info for the others.
func (g *gateway) logFailure(r *http.Request, code int, text string, err error) {
	attrs := []any{"status", code, "method", r.Method, "path", r.URL.Path, "reason", text}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	level := slog.LevelWarn
	if code < 500 {
		level = slog.LevelInfo
	}
	g.log.Log(r.Context(), level, "request failed", attrs...)
}
