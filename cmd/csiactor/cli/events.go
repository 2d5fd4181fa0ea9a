package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func eventsCommand() *command {
	return clientLeaf(&command{
		name:    "events",
		summary: "print the agent's recent events, or follow them",
		usage:   "csiactor events [flags]",
		help: `Prints the agent's recent events (GET /v1/events): plugin allocations
registered, deregistered, changing health or singleton, volumes registered,
claimed, released and freed. With -follow, keeps printing new events until
interrupted. With -json, prints the API's newline-delimited JSON.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		follow := fs.Bool("follow", false, "keep printing new events until interrupted")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args); err != nil {
				return err
			}
			print := eventPrinter(e.stdout, cf.json)
			if !*follow {
				evs, err := cl.Events(ctx)
				if err != nil {
					return err
				}
				for _, ev := range evs {
					if err := print(ev); err != nil {
						return err
					}
				}
				return nil
			}
			err := cl.FollowEvents(ctx, print)
			if errors.Is(err, context.Canceled) && ctx.Err() != nil {
				return nil // interrupted: the normal end of -follow
			}
			return err
		}
	})
}

// eventPrinter returns a function that prints one event per line: the
// API's JSON, or columns of fixed width (so that a followed stream stays
// aligned without buffering), after a header.
func eventPrinter(w io.Writer, asJSON bool) func(runtime.Event) error {
	if asJSON {
		enc := json.NewEncoder(w)
		return func(ev runtime.Event) error { return enc.Encode(ev) }
	}
	const format = "%-20s  %-24s  %-16s  %-16s  %-16s  %s\n"
	header := false
	return func(ev runtime.Event) error {
		if !header {
			header = true
			if _, err := fmt.Fprintf(w, format, "TIME", "TYPE", "PLUGIN", "ALLOC", "VOLUME", "MESSAGE"); err != nil {
				return err
			}
		}
		_, err := fmt.Fprintf(w, format, ev.Time.UTC().Format(time.RFC3339), ev.Type,
			orDash(ev.Plugin), orDash(ev.Alloc), orDash(ev.Volume), ev.Message)
		return err
	}
}
