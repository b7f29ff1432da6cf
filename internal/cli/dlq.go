package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type dlqOptions struct {
	conn     connFlags
	receiver string
	max      int
	json     bool
	all      bool
}

func (a *app) dlqCommand() *cobra.Command {
	o := &dlqOptions{}
	cmd := &cobra.Command{
		Use:   "dlq (list | retry | purge) --receiver NAME",
		Short: "List, retry or purge a receiver's dead letters",
		Long: long(`A message that failed on every one of its attempts (see "disker worker
--max-attempts"), or that could not be decoded, moves to its receiver's
dead-letter stream with the reason. Nothing is dropped silently: look at them
with "dlq list", send them back to the queue with "dlq retry" (their attempts
start again from 1), or delete them with "dlq purge".

retry and purge take dead-letter ids (the ID column of "dlq list"), or --all.
An id that is not a dead letter of the receiver is named on stderr, the
others are handled, and the exit status is 1. A receiver that Redis has never
seen is an error (exit 1), not an empty list: check the name and the
--key-prefix.`),
		Example: `  disker dlq list --receiver web
  disker dlq retry --receiver web 1733000000000-0 1733000000001-0
  disker dlq retry --receiver web --all
  disker dlq purge --receiver web --all`,
		Args: cobra.ArbitraryArgs,
		RunE: groupRunE,
	}
	cmd.PersistentFlags().StringVar(&o.receiver, "receiver", "", "name of the receiver (required)")
	o.conn.register(cmd.PersistentFlags())

	list := &cobra.Command{
		Use:   "list --receiver NAME",
		Short: "List dead letters, oldest first",
		Long: long(`List the receiver's dead letters, oldest first: the dead-letter id, the
message id, the attempts made, when it was dead-lettered, the reason, and the
start of the content. --json prints every field, with the full content
("content", or "content_base64" when it is not UTF-8).`),
		Example: `  disker dlq list --receiver web
  disker dlq list --receiver web --json --max 1000 > dead.json`,
		Args: noArgs,
		RunE: runE(func(cmd *cobra.Command, _ []string) error {
			return a.runDLQList(cmd.Context(), o)
		}),
	}
	list.Flags().IntVar(&o.max, "max", 100, "list at most this many")
	list.Flags().BoolVar(&o.json, "json", false, "print JSON")

	retry := &cobra.Command{
		Use:   "retry --receiver NAME (ID... | --all)",
		Short: "Move dead letters back to the queue",
		Long: long(`Move the dead letters with the given ids (or all of them with --all) back to
the receiver's queue, with their attempts reset. Prints how many moved.
Entries that could not be decoded stay.`),
		Example: `  disker dlq retry --receiver web --all`,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runDLQChange(cmd.Context(), o, args, "retried", (*disker.Disker).RetryDeadLetters)
		}),
	}
	retry.Flags().BoolVar(&o.all, "all", false, "every dead letter of the receiver")

	purge := &cobra.Command{
		Use:   "purge --receiver NAME (ID... | --all)",
		Short: "Delete dead letters",
		Long:  long(`Delete the dead letters with the given ids, or all of them with --all. Prints how many were deleted.`),
		Example: `  disker dlq purge --receiver web 1733000000000-0
  disker dlq purge --receiver web --all`,
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runDLQChange(cmd.Context(), o, args, "purged", (*disker.Disker).PurgeDeadLetters)
		}),
	}
	purge.Flags().BoolVar(&o.all, "all", false, "every dead letter of the receiver")

	cmd.AddCommand(list, retry, purge)
	return cmd
}

// deadLetterJSON is a dead letter as dlq list --json prints it.
type deadLetterJSON struct {
	ID            string            `json:"id"`
	MessageID     string            `json:"message_id,omitempty"`
	Sender        string            `json:"sender,omitempty"`
	Headers       map[string]string `json:"headers,omitempty"`
	FireAndForget bool              `json:"fire_and_forget,omitempty"`
	Attempts      int               `json:"attempts"`
	At            time.Time         `json:"at"`
	Reason        string            `json:"reason"`
	Content       *string           `json:"content,omitempty"`
	ContentBase64 string            `json:"content_base64,omitempty"`
}

func (a *app) runDLQList(ctx context.Context, o *dlqOptions) error {
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	if o.max < 1 {
		return usagef("invalid --max %d: must be >= 1", o.max)
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	if err := knownReceiver(ctx, d, o.receiver, o.conn.keyPrefix); err != nil {
		return err
	}
	dls, err := d.DeadLetters(ctx, o.receiver, o.max)
	if err != nil {
		return err
	}
	if o.json {
		out := make([]deadLetterJSON, 0, len(dls))
		for _, dl := range dls {
			j := deadLetterJSON{
				ID: dl.ID, MessageID: dl.Message.ID, Sender: dl.Message.Sender, Headers: dl.Message.Headers,
				FireAndForget: !dl.Message.ExpectsReply(), Attempts: dl.Attempts, At: dl.At, Reason: dl.Reason,
			}
			content := dl.Message.Content
			if dl.Message.ID == "" {
				content = dl.Raw
			}
			if utf8.Valid(content) {
				s := string(content)
				j.Content = &s
			} else {
				j.ContentBase64 = base64.StdEncoding.EncodeToString(content)
			}
			out = append(out, j)
		}
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	if len(dls) == 0 {
		fmt.Fprintf(a.stdout, "No dead letters for %s.\n", o.receiver)
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMESSAGE\tATTEMPTS\tAT\tREASON\tCONTENT")
	for _, dl := range dls {
		msgID, content := dl.Message.ID, dl.Message.Content
		if msgID == "" {
			msgID, content = "(undecodable)", dl.Raw
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", dl.ID, msgID, dl.Attempts,
			dl.At.Local().Format(time.DateTime), clip(oneLine(dl.Reason), 60), preview(content, 40))
	}
	return tw.Flush()
}

func (a *app) runDLQChange(ctx context.Context, o *dlqOptions, ids []string, verb string,
	change func(*disker.Disker, context.Context, string, ...string) (int, error)) error {
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	switch {
	case o.all && len(ids) > 0:
		return usagef("give dead-letter ids or --all, not both")
	case !o.all && len(ids) == 0:
		return usagef("give dead-letter ids (see 'disker dlq list') or --all")
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	if err := knownReceiver(ctx, d, o.receiver, o.conn.keyPrefix); err != nil {
		return err
	}
	var unknown []string
	if len(ids) > 0 {
		if ids, unknown, err = splitDeadLetters(ctx, d, o.receiver, ids); err != nil {
			return err
		}
	}
	n := 0
	if !o.all && len(ids) == 0 {
		// No id left: an empty list would mean all of them.
	} else if n, err = change(d, ctx, o.receiver, ids...); err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "%s %d dead letter(s) of %s\n", verb, n, o.receiver)
	if len(unknown) > 0 {
		return fmt.Errorf("%d id(s) are not dead letters of %s (see 'disker dlq list'): %s", len(unknown), o.receiver, strings.Join(unknown, " "))
	}
	return nil
}

// knownReceiver fails when Redis knows nothing of receiver under prefix (no
// live worker serves it, it holds no message or dead letter, it is not
// paused): a typo in the name or the key prefix would otherwise look like
// an empty list or a row of zeros.
func knownReceiver(ctx context.Context, d *disker.Disker, receiver, prefix string) error {
	names, err := d.Receivers(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(names, receiver) {
		return nil
	}
	if st, err := d.Stats(ctx, receiver); err != nil || st.Paused {
		return err
	}
	known := "none"
	if len(names) > 0 {
		known = strings.Join(names[:min(len(names), 10)], ", ")
		if len(names) > 10 {
			known += ", ..."
		}
	}
	return fmt.Errorf("no receiver %q under --key-prefix %q (receivers known: %s)", receiver, prefix, known)
}

// splitDeadLetters splits ids into those of receiver's dead letters and
// the others.
func splitDeadLetters(ctx context.Context, d *disker.Disker, receiver string, ids []string) (known, unknown []string, err error) {
	st, err := d.Stats(ctx, receiver)
	if err != nil {
		return nil, nil, err
	}
	exists := map[string]bool{}
	if st.DeadLetters > 0 {
		dls, err := d.DeadLetters(ctx, receiver, int(st.DeadLetters))
		if err != nil {
			return nil, nil, err
		}
		for _, dl := range dls {
			exists[dl.ID] = true
		}
	}
	for _, id := range ids {
		if exists[id] {
			known = append(known, id)
		} else {
			unknown = append(unknown, id)
		}
	}
	return known, unknown, nil
}

// clip shortens s to n runes with an ellipsis.
func clip(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// preview shows the start of content: quoted text, or a byte count for
// binary content.
func preview(content []byte, n int) string {
	if !utf8.Valid(content) {
		return "(" + strconv.Itoa(len(content)) + " bytes, binary)"
	}
	return strconv.Quote(clip(string(content), n))
}
