package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/diskerhq/disker"
)

type pauseOptions struct {
	conn     connFlags
	receiver string
}

// pauseCommand is "disker pause" (resume false) or "disker resume".
func (a *app) pauseCommand(resume bool) *cobra.Command {
	o := &pauseOptions{}
	cmd := &cobra.Command{
		Use:   "pause (RECEIVER | --receiver NAME)",
		Short: "Pause a receiver on every worker: its messages queue and wait",
		Long: long(`Pause the receiver on every worker that serves it, wherever it runs: within a
second no worker starts one of its messages, and none fetches more. Messages
being handled finish. Messages sent to it still queue, and wait until
"disker resume". The pause is kept in Redis: it holds for workers that start
later, until it is resumed. "disker stats" shows it (PAUSED).`),
		Example: `  disker pause emails
  disker stats --receiver emails
  disker resume emails`,
		Args: upTo(0, "RECEIVER"),
		RunE: runE(func(cmd *cobra.Command, args []string) error {
			return a.runPause(cmd.Context(), o, args, resume)
		}),
	}
	if resume {
		cmd.Use = "resume (RECEIVER | --receiver NAME)"
		cmd.Short = "Resume a paused receiver on every worker"
		cmd.Long = long(`Resume a receiver paused with "disker pause": within a second every worker
that serves it starts its messages again, from where they stopped. Resuming a
receiver that is not paused does nothing.`)
		cmd.Example = `  disker resume emails`
	}
	cmd.Flags().StringVar(&o.receiver, "receiver", "", "name of the receiver (or give it as the argument)")
	o.conn.register(cmd.Flags())
	return cmd
}

func (a *app) runPause(ctx context.Context, o *pauseOptions, args []string, resume bool) error {
	switch {
	case len(args) == 1 && a.fromEnv["receiver"]:
		o.receiver = args[0] // the command line wins over DISKER_RECEIVER
	case len(args) == 1 && o.receiver != "" && args[0] != o.receiver:
		return usagef("RECEIVER %q and --receiver %q disagree: give one of them", args[0], o.receiver)
	case len(args) == 1:
		o.receiver = args[0]
	}
	if o.receiver == "" {
		verb := "pause"
		if resume {
			verb = "resume"
		}
		return usagef("%s needs RECEIVER (or --receiver NAME)", verb)
	}
	if err := checkName("receiver", o.receiver); err != nil {
		return err
	}
	d, err := a.connect(ctx, &o.conn, nil)
	if err != nil {
		return err
	}
	defer closeDisker(d, 5*time.Second)
	op, done := (*disker.Disker).Pause, "paused"
	if resume {
		op, done = (*disker.Disker).Resume, "resumed"
	}
	if err := op(d, ctx, o.receiver); err != nil {
		return err
	}
	fmt.Fprintln(a.stdout, done, o.receiver)
	return nil
}
