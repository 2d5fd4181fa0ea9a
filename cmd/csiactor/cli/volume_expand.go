package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func volumeExpandCommand() *command {
	return clientLeaf(&command{
		name:    "expand",
		summary: "grow a volume through its plugin",
		usage:   "csiactor volume expand -capacity SIZE [flags] ID",
		help: `Grows the volume ID to at least SIZE (POST /v1/volumes/ID/expand):
ControllerExpandVolume when the plugin's controller can, then
NodeExpandVolume on every published claim's path when the plugin says the
node must grow the file system too. Returns when the expansion is done and
prints the new capacity. Volumes never shrink: a SIZE below the volume's
capacity is refused. A plugin that expands only offline refuses while the
volume is claimed. The agent records the expansion first, so it finishes
after an agent crash or restart; the same command again waits for it.

Example:
  csiactor volume expand -capacity 20GiB data1`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		capacity := fs.String("capacity", "", "the new `size`, like 20GiB (required)")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			if *capacity == "" {
				return usagef("-capacity is required")
			}
			size, err := parseSize(*capacity)
			if err != nil {
				return usagef("-capacity %s", err.Error())
			}
			if size <= 0 {
				return usagef("-capacity must be positive")
			}
			v, err := waitNotice(ctx, e, cl, args[0], "", func() (runtime.Volume, error) {
				return cl.ExpandVolume(ctx, args[0], runtime.ExpandRequest{CapacityBytes: size})
			})
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "Expanded volume %s to %s\n", v.ID, formatSize(v.CapacityBytes))
			return nil
		}
	})
}
