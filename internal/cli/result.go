package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type resultOptions struct {
	conn connFlags
	wait bool
	json bool
}

func (a *app) resultCommand() *cobra.Command {
	o := &resultOptions{}
	cmd := &cobra.Command{
		Use:   "result RECEIVER ID",
		Short: "Show what became of a message sent with a retention",
		Long: long(`Show the retained result of message ID (as "disker send" printed it), sent
to RECEIVER with --retention (or handled by a worker whose receiver keeps
results by default): its state (queued, running, succeeded, failed,
dead_lettered, timed_out, cancelled, expired), attempts, times, the worker
that ran it, the reply its sender received or its error, and its latest
progress.

With --wait it waits until the outcome is final (or the command's
--timeout of the connection ends). The exit status is 0 when a result was
found, 1 when there is none (sent without a retention, its retention
passed, or unknown), 2 for a malformed id.`),
		Example: `  disker send --to thumbnails --retention 24h @cat.jpg
  disker result thumbnails 01jf3m4v0c8x2k5q7r9s1t3w5y --wait
  disker result thumbnails 01jf3m4v0c8x2k5q7r9s1t3w5y --json`,
		Args: upTo(2, "RECEIVER", "ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runResult(cmd.Context(), o, args[0], args[1])
		}),
	}
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until the outcome is final")
	cmd.Flags().BoolVar(&o.json, "json", false, "print the result as one JSON object")
	o.conn.register(cmd.Flags())
	return cmd
}

func (a *app) runResult(ctx context.Context, o *resultOptions, receiver, id string) error {
	if err := checkName("receiver", receiver); err != nil {
		return err
	}
	if !validID(id) {
		return usagef("invalid message id %q: want 26 characters as \"disker send\" prints them", id)
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	get := d.Result
	if o.wait {
		get = d.WaitResult
	}
	r, err := get(ctx, receiver, id)
	if errors.Is(err, disker.ErrResultNotFound) {
		return fmt.Errorf("no result for message %s of %s: sent without a retention, its retention passed, or unknown", id, receiver)
	}
	if err != nil {
		return err
	}
	j := viewOf(r)
	if o.json {
		return json.NewEncoder(a.stdout).Encode(j)
	}
	fmt.Fprintf(a.stdout, "id\t%s\nreceiver\t%s\nstate\t%s\nfinal\t%v\nattempts\t%d\n", j.ID, j.Receiver, j.State, j.Final, j.Attempts)
	for _, f := range [][2]string{{"worker", j.Worker}, {"sent", j.SentAt}, {"started", j.StartedAt}, {"finished", j.FinishedAt},
		{"deadline", j.Deadline}, {"expires", j.ExpiresAt}, {"reply", j.Reply}, {"error_code", j.ErrorCode}, {"error", j.Error}, {"progress", j.Progress}} {
		if f[1] != "" {
			fmt.Fprintf(a.stdout, "%s\t%s\n", f[0], f[1])
		}
	}
	return nil
}

// resultView is a retained result as the command line, the gateway and
// the dashboard show it: times in RFC 3339 (empty when not known), the
// reply and the progress as text when they are UTF-8, else base64 (with
// reply_base64 or progress_base64 set).
type resultView struct {
	ID             string `json:"id"`
	Receiver       string `json:"receiver"`
	State          string `json:"state"`
	Final          bool   `json:"final"`
	Attempts       int    `json:"attempts"`
	Worker         string `json:"worker,omitempty"`
	SentAt         string `json:"sent_at,omitempty"`
	StartedAt      string `json:"started_at,omitempty"`
	FinishedAt     string `json:"finished_at,omitempty"`
	Deadline       string `json:"deadline,omitempty"`
	ExpiresAt      string `json:"expires_at,omitempty"`
	Reply          string `json:"reply,omitempty"`
	ReplyBase64    bool   `json:"reply_base64,omitempty"`
	ErrorCode      string `json:"error_code,omitempty"`
	Error          string `json:"error,omitempty"`
	Progress       string `json:"progress,omitempty"`
	ProgressBase64 bool   `json:"progress_base64,omitempty"`
}

// viewOf returns r as the command line, the gateway and the dashboard
// show it.
func viewOf(r *disker.Result) resultView {
	at := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	v := resultView{ID: r.ID, Receiver: r.Receiver, State: r.State.String(), Final: r.State.Final(), Attempts: r.Attempts,
		Worker: r.Worker, SentAt: at(r.SentAt), StartedAt: at(r.StartedAt), FinishedAt: at(r.FinishedAt),
		Deadline: at(r.Deadline), ExpiresAt: at(r.ExpiresAt)}
	v.Reply, v.ReplyBase64 = textOr64(r.Reply)
	v.Progress, v.ProgressBase64 = textOr64(r.Progress)
	if r.Err != nil {
		v.ErrorCode, v.Error = r.Err.Code, r.Err.Text
	}
	return v
}

// textOr64 returns b as text when it is UTF-8, else in base64 (true).
func textOr64(b []byte) (string, bool) {
	if utf8.Valid(b) {
		return string(b), false
	}
	out, _ := json.Marshal(b) // a JSON string of the base64
	return string(out[1 : len(out)-1]), true
}
