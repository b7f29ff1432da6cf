package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type cancelOptions struct {
	conn     connFlags
	receiver string
}

func (a *app) cancelCommand() *cobra.Command {
	o := &cancelOptions{}
	cmd := &cobra.Command{
		Use:   "cancel --receiver NAME ID...",
		Short: "Cancel sent messages: deferred, queued or being handled",
		Long: long(`Cancel the messages with the given ids (as "disker send" printed them) sent to
the receiver NAME. A message that is deferred (sent with --delay or --at) or
queued is never delivered. One that a worker is handling is not delivered
again, and its handler's context is cancelled within a second (the command
worker stops its --exec process or its --http request); its reply, if it
had not replied yet, is dropped, and its sender gets a "cancelled" error.

For each id it prints what it found: deferred, queued, in flight, or not
found (handled already, dead-lettered, cancelled before, or never sent to
NAME), in which case nothing changed. The exit status is 0 when every id was
looked up, 2 for a malformed id.`),
		Example: `  disker cancel --receiver reminders 01jf3m4v0c8x2k5q7r9s1t3w5y
  disker cancel --receiver jobs $(cat ids.txt)`,
		Args: atLeastOne("ID"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runCancel(cmd.Context(), o, args)
		}),
	}
	cmd.Flags().StringVar(&o.receiver, "receiver", "", "name of the receiver (required)")
	o.conn.register(cmd.Flags())
	return cmd
}

func (a *app) runCancel(ctx context.Context, o *cancelOptions, ids []string) error {
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	for _, id := range ids {
		if !validID(id) {
			return usagef("invalid message id %q: want 26 characters as \"disker send\" prints them", id)
		}
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	for _, id := range ids {
		res, err := d.Cancel(ctx, o.receiver, id)
		var ve *disker.ValidationError
		switch {
		case errors.As(err, &ve):
			return usagef("%v", err)
		case err != nil:
			return err
		}
		switch res {
		case disker.CancelNotFound:
			fmt.Fprintf(a.stdout, "%s\tnot found: handled already, dead-lettered, cancelled before, or unknown; nothing changed\n", id)
		case disker.CancelInFlight:
			fmt.Fprintf(a.stdout, "%s\tcancelled while in flight: its handler is being cancelled\n", id)
		default:
			fmt.Fprintf(a.stdout, "%s\tcancelled while %s: it will never be delivered\n", id, res)
		}
	}
	return nil
}

// validID reports whether id has the form of a message id: 26 characters
// of Crockford base32, as disker writes them.
func validID(id string) bool {
	if len(id) != 26 {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') || c == 'i' || c == 'l' || c == 'o' || c == 'u' {
			return false
		}
	}
	return id[0] <= '7'
}
