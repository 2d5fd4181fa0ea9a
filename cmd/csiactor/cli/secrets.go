package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
)

func secretsCommand() *command {
	return &command{
		name:    "secrets",
		summary: "manage the secrets the agent keeps at rest",
		usage:   "csiactor secrets reseal [flags]",
		subs: []*command{
			clientLeaf(&command{
				name:    "reseal",
				summary: "seal every stored secret again with the current key",
				usage:   "csiactor secrets reseal [flags]",
				help: `Seals every volume and snapshot secret the agent stores again with its
secrets.key_file (POST /v1/secrets/reseal): the values sealed with one of
secrets.previous_key_files, and those stored in clear before a key was set.
It rewrites this host's state.db and, in cluster mode, the volume
definitions in etcd, and prints how many values it sealed again.

To rotate the key: make a new key file on every host, set it as
secrets.key_file and the old one under secrets.previous_key_files, restart
the agents, then run this command on every host (in cluster mode, the first
run reseals etcd too). After that, drop previous_key_files and restart.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args); err != nil {
						return err
					}
					res, err := cl.ResealSecrets(ctx)
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, res)
					}
					fmt.Fprintf(e.stdout, "Resealed %d values in state.db and %d in etcd with key %s\n", res.Store, res.Cluster, res.KeyID)
					return nil
				}
			}),
		},
	}
}
