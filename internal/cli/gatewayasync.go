package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/diskerhq/disker"
	"github.com/diskerhq/disker/internal/httpmsg"
)

// resultsPath is the path under which the gateway serves the results of
// the requests it accepted asynchronously: resultsPath + the message id.
const resultsPath = "/_disker/results/"

// wantsAsync reports whether r asks to be answered at once, its work done
// later: "Prefer: respond-async" (RFC 7240).
func wantsAsync(r *http.Request) bool {
	for _, v := range r.Header.Values("Prefer") {
		for _, p := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(p), "respond-async") {
				return true
			}
		}
	}
	return false
}

// accepted is the body of a 202 answer.
type accepted struct {
	ID        string `json:"id"`
	StatusURL string `json:"status_url"`
}

// sendAsync sends the request's message fire-and-forget, kept for
// g.asyncRetention, and answers 202 Accepted with the status URL of its
// result in Location.
func (g *gateway) sendAsync(ctx context.Context, w http.ResponseWriter, msg disker.Message, opts []disker.SendOption) (int, error) {
	id, err := g.d.Send(ctx, msg, append(opts, disker.WithRetention(g.asyncRetention))...)
	if err != nil {
		return 0, err
	}
	url := resultsPath + id
	w.Header().Set("Location", url)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	_ = json.NewEncoder(w).Encode(accepted{ID: id, StatusURL: url})
	return http.StatusAccepted, nil
}

// asyncResult is the body of a status URL: the result, and once the
// worker answered, its HTTP response.
type asyncResult struct {
	resultView
	Response *asyncResponse `json:"response,omitempty"`
}

// asyncResponse is a worker's HTTP response: its body as text when it is
// UTF-8, else base64 (body_base64).
type asyncResponse struct {
	Status     int         `json:"status"`
	Header     http.Header `json:"header,omitempty"`
	Body       string      `json:"body,omitempty"`
	BodyBase64 bool        `json:"body_base64,omitempty"`
}

// serveResult answers GET resultsPath + id with the retained result of the
// message id as JSON: 200 with it (final or not), 404 when there is none.
func (g *gateway) serveResult(w http.ResponseWriter, r *http.Request) int {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		return g.fail(w, r, http.StatusMethodNotAllowed, "a status URL answers GET", nil)
	}
	id := strings.TrimPrefix(r.URL.Path, resultsPath)
	if !validID(id) {
		return g.fail(w, r, http.StatusNotFound, "no such request", nil)
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	res, err := g.d.Result(ctx, g.receiver, id)
	switch {
	case errors.Is(err, disker.ErrResultNotFound):
		return g.fail(w, r, http.StatusNotFound, "no result for this request: unknown, or its retention passed", nil)
	case errors.Is(err, disker.ErrUnavailable):
		return g.fail(w, r, http.StatusServiceUnavailable, "the message broker cannot be reached", err)
	case err != nil:
		return g.fail(w, r, http.StatusInternalServerError, "the result could not be read", err)
	}
	out := asyncResult{resultView: viewOf(res)}
	if res.Reply != nil {
		if resp, err := httpmsg.DecodeResponse(res.Reply); err == nil {
			out.Reply, out.ReplyBase64 = "", false // given as the response
			out.Response = &asyncResponse{Status: resp.Status, Header: resp.Header}
			out.Response.Body, out.Response.BodyBase64 = textOr64(resp.Body)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(out)
	return http.StatusOK
}
