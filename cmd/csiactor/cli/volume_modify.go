package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func volumeModifyCommand() *command {
	return clientLeaf(&command{
		name:    "modify",
		summary: "change a volume's mutable parameters through its plugin",
		usage:   "csiactor volume modify -param KEY=VALUE [-param ...] [flags] ID",
		help: `Changes the mutable parameters of the volume ID through its plugin's
controller (ControllerModifyVolume; the plugin needs the MODIFY_VOLUME
capability) (POST /v1/volumes/ID/modify). Parameters not named keep their
values. Returns when the plugin applied them and prints the volume's
mutable parameters. A parameter the plugin does not accept is refused,
naming it. The agent records the modification first, so it finishes after
an agent crash or restart; the same command again waits for it.

Example:
  csiactor volume modify -param iops=3000 -param throughput=125 data1`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		var params kvFlag
		fs.Var(&params, "param", "`KEY=VALUE` mutable parameter to set (repeatable; at least one)")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			if len(params.m) == 0 {
				return usagef("-param is required")
			}
			v, err := waitNotice(ctx, e, cl, args[0], "", func() (runtime.Volume, error) {
				return cl.ModifyVolume(ctx, args[0], runtime.ModifyRequest{MutableParameters: params.m})
			})
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "Modified volume %s: mutable parameters %s\n", v.ID, formatMap(v.MutableParameters))
			return nil
		}
	})
}
