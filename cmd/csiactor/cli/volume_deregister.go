package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
)

func volumeDeregisterCommand() *command {
	return clientLeaf(&command{
		name:    "deregister",
		summary: "forget a volume, leaving it and its data with the plugin",
		usage:   "csiactor volume deregister [flags] ID",
		help: `Deregisters the volume ID (DELETE /v1/volumes/ID): the agent forgets it; the
plugin keeps the volume and its data ("volume delete" destroys them). Fails
while the volume has claims or past claims still being released.

With -force, a volume whose past claims cannot be freed (their teardown
fails forever) is forgotten anyway, their teardown stopped
(DELETE /v1/volumes/ID?force=true); the event volume-force-deregistered
names each past claim and what it may leave (target mount, staging,
controller attachment). Current claims still have to be released first
("volume release -force" for a stuck one).`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		force := fs.Bool("force", false, "forget the volume even with past claims that are not freed")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			var err error
			if *force {
				err = cl.ForceDeregisterVolume(ctx, args[0])
			} else {
				err = cl.DeleteVolume(ctx, args[0], false)
			}
			if err != nil {
				return err
			}
			if !cf.json {
				fmt.Fprintf(e.stdout, "Deregistered volume %s\n", args[0])
			}
			return nil
		}
	})
}

func volumeDeleteCommand() *command {
	return clientLeaf(&command{
		name:    "delete",
		summary: "delete a volume and its data through the controller, then forget it",
		usage:   "csiactor volume delete [flags] ID",
		help: `Deletes the volume ID through the plugin's controller (DeleteVolume),
destroying its data, then deregisters it (DELETE /v1/volumes/ID?delete=true).
Fails while the volume has claims or past claims still being released. To
forget a volume without deleting it, use "volume deregister".`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		purge := fs.Bool("purge", false, "removed: volume delete always deletes through the controller now")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if *purge {
				return usagef("-purge was removed: 'volume delete' now always deletes the volume through the controller; to forget a volume without deleting it, use 'csiactor volume deregister ID'")
			}
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			if err := cl.DeleteVolume(ctx, args[0], true); err != nil {
				return err
			}
			if !cf.json {
				fmt.Fprintf(e.stdout, "Deleted volume %s\n", args[0])
			}
			return nil
		}
	})
}
