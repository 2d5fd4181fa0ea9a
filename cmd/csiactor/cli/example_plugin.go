package cli

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/sirupsen/logrus"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/runtime"
)

// examplePluginCommand is the hidden command that runs the example CSI
// plugin, so that `csiactor agent -dev` can exec this same binary as its
// plugin.
func examplePluginCommand() *command {
	return &command{
		name:    "example-plugin",
		summary: "run the example CSI plugin",
		hidden:  true,
		usage:   "csiactor example-plugin -state-dir DIR [-endpoint unix:///path/csi.sock] [flags]",
		help: `Runs the example CSI plugin (a monolith: identity, controller and node
services; volumes are directories under -state-dir) until interrupted. The
endpoint defaults to $CSI_ENDPOINT, which the agent sets for exec-managed
allocations.`,
		setup: func(fs *flag.FlagSet, e *env) func(context.Context, []string) error {
			endpoint := fs.String("endpoint", "", "`endpoint` to serve: unix:///path/csi.sock (default $CSI_ENDPOINT)")
			stateDir := fs.String("state-dir", "", "`dir` for the volumes and the state file (required)")
			sharedDir := fs.String("shared-dir", "", "`dir` holding the volumes and the state instead of -state-dir, shared with every instance given it (storage several hosts reach; each instance its own -state-dir and -node-id)")
			nodeID := fs.String("node-id", "", "node `id` to report (default the hostname)")
			name := fs.String("name", "", "plugin `name` (default "+csiplugin.DefaultName+")")
			mountMode := fs.String("mount-mode", "", "`mode` of staging and publishing: auto, bind or symlink (default auto: bind as root, else symlink)")
			maxVolumes := fs.Int64("max-volumes", 0, "most volumes published to the node at once (its max_volumes_per_node); 0 means no limit")
			maxAttached := fs.Int64("max-attached", 0, "most volumes the storage lets be controller-published at once, not reported to the agent (ResourceExhausted beyond it; for tests); 0 means no limit")
			loseMounts := fs.Bool("lose-mounts-on-start", false, "on start, undo every staging and publication the state records, keeping the records (as FUSE mounts die with their plugin; for tests of the agent's repair)")
			noStats := fs.Bool("no-volume-stats", false, "report neither a volume's usage nor its condition: no GET_VOLUME_STATS and no GET_VOLUME_HEALTH (for tests of a plugin without them)")
			useFUSE := fs.Bool("fuse", false, "stage each volume through FUSE served by this process, so that its mounts die with it as a FUSE driver's do (needs root and /dev/fuse)")
			fuseFailDeadUnmount := fs.Bool("fuse-fail-dead-unmount", false, "with -fuse: fail NodeUnpublishVolume and NodeUnstageVolume on a dead FUSE mount instead of unmounting it (for tests of the agent's own unmount)")
			logLevel := fs.String("log-level", "info", "log `level`: trace, debug, info, warn or error")
			logFormat := fs.String("log-format", "text", "log `format`: text or json")
			return func(ctx context.Context, args []string) error {
				if err := wantArgs(args); err != nil {
					return err
				}
				if *endpoint == "" {
					*endpoint = e.getenv("CSI_ENDPOINT")
				}
				switch {
				case *endpoint == "":
					return usagef("give -endpoint or set CSI_ENDPOINT")
				case *stateDir == "":
					return usagef("-state-dir is required")
				case *logFormat != "text" && *logFormat != "json":
					return usagef("-log-format %q: want text or json", *logFormat)
				}
				cfg := runtime.Config{Log: runtime.LogConfig{Level: *logLevel, Format: *logFormat}}
				logger, err := e.newLogger(cfg)
				if err != nil {
					return usagef("-log-level %q: want trace, debug, info, warn or error", *logLevel)
				}
				if err := os.MkdirAll(*stateDir, 0o700); err != nil {
					return fmt.Errorf("state dir: %w", err)
				}
				return csiplugin.Run(ctx, csiplugin.Config{
					Endpoint:            *endpoint,
					StateDir:            *stateDir,
					SharedDir:           *sharedDir,
					NodeID:              *nodeID,
					Name:                *name,
					MaxVolumesPerNode:   *maxVolumes,
					MaxAttached:         *maxAttached,
					MountMode:           csiplugin.MountMode(*mountMode),
					LoseMountsOnStart:   *loseMounts,
					NoVolumeStats:       *noStats,
					FUSE:                *useFUSE,
					FUSEFailDeadUnmount: *fuseFailDeadUnmount,
					Logger:              logrus.NewEntry(logger).WithField("plugin", "example"),
				})
			}
		},
	}
}
