package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type batchOptions struct {
	conn connFlags
	json bool
}

func (a *app) batchCommand() *cobra.Command {
	o := &batchOptions{}
	cmd := &cobra.Command{
		Use:   "batch ID",
		Short: "Show a batch's state and its children's counts",
		Long: long(`Show batch ID (as Batch.ID gave it: the completion receiver, a slash, a
unique part): its state (open, sealed, completed), whether it was
cancelled, its children and how many of them succeeded, failed, were
dead-lettered, cancelled, expired or timed out, and which message its
completion queued.

The exit status is 0 when the batch was found, 1 when there is none (never
created, or its retention after its completion passed), 2 for a malformed
id.`),
		Example: `  disker batch album-ready/01jf3m4v0c8x2k5q7r9s1t3w5y
  disker batch album-ready/01jf3m4v0c8x2k5q7r9s1t3w5y --json`,
		Args: upTo(1, "ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runBatch(cmd.Context(), o, args[0])
		}),
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print the batch as one JSON object")
	o.conn.register(cmd.Flags())
	return cmd
}

// batchView is a batch as the command prints it.
type batchView struct {
	ID               string `json:"id"`
	State            string `json:"state"`
	OnlyIfAllSucceed bool   `json:"only_if_all_succeed"`
	Cancelled        bool   `json:"cancelled"`
	Children         int    `json:"children"`
	Settled          int    `json:"settled"`
	Succeeded        int    `json:"succeeded"`
	Failed           int    `json:"failed"`
	DeadLettered     int    `json:"dead_lettered"`
	Cancels          int    `json:"cancelled_children"`
	Expired          int    `json:"expired"`
	TimedOut         int    `json:"timed_out"`
	Sent             string `json:"sent"`
	Created          string `json:"created"`
	Completed        string `json:"completed,omitempty"`
}

func (a *app) runBatch(ctx context.Context, o *batchOptions, id string) error {
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	b, err := d.Batch(ctx, id)
	var ve *disker.ValidationError
	switch {
	case errors.As(err, &ve):
		return usagef("invalid batch id %q: want RECEIVER/UNIQUE as Batch.ID gives it", id)
	case errors.Is(err, disker.ErrBatchNotFound):
		return fmt.Errorf("no batch %s: never created, or its retention passed", id)
	case err != nil:
		return err
	}
	v := batchView{ID: b.ID, State: b.State.String(), OnlyIfAllSucceed: b.OnlyIfAllSucceed, Cancelled: b.Cancelled,
		Children: b.Children, Settled: b.Settled, Succeeded: b.Succeeded, Failed: b.Failed, DeadLettered: b.DeadLettered,
		Cancels: b.Cancels, Expired: b.Expired, TimedOut: b.TimedOut, Sent: "none", Created: b.Created.UTC().Format(time.RFC3339Nano)}
	switch {
	case b.CompletionSent:
		v.Sent = "completion"
	case b.FailureSent:
		v.Sent = "failure"
	}
	if !b.Completed.IsZero() {
		v.Completed = b.Completed.UTC().Format(time.RFC3339Nano)
	}
	if o.json {
		return json.NewEncoder(a.stdout).Encode(v)
	}
	fmt.Fprintf(a.stdout, "id\t%s\nstate\t%s\ncancelled\t%v\nonly_if_all_succeed\t%v\nchildren\t%d\nsettled\t%d\n",
		v.ID, v.State, v.Cancelled, v.OnlyIfAllSucceed, v.Children, v.Settled)
	fmt.Fprintf(a.stdout, "succeeded\t%d\nfailed\t%d\ndead_lettered\t%d\ncancelled_children\t%d\nexpired\t%d\ntimed_out\t%d\nsent\t%s\ncreated\t%s\n",
		v.Succeeded, v.Failed, v.DeadLettered, v.Cancels, v.Expired, v.TimedOut, v.Sent, v.Created)
	if v.Completed != "" {
		fmt.Fprintf(a.stdout, "completed\t%s\n", v.Completed)
	}
	return nil
}
