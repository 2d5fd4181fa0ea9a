package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func snapshotCommand() *command {
	return &command{
		name:    "snapshot",
		summary: "take, list, show and delete snapshots of volumes",
		usage:   "csiactor snapshot create|list|status|delete [flags] [args]",
		subs: []*command{
			snapshotCreateCommand(),
			snapshotListCommand(),
			snapshotStatusCommand(),
			snapshotDeleteCommand(),
		},
	}
}

var snapshotFlagNames = flagNames{
	"id": "ID", "plugin": "-plugin", "source_volume": "-volume",
	"parameters": "-parameter", "secrets": "-secret/-secrets-file",
}

func snapshotCreateCommand() *command {
	return clientLeaf(&command{
		name:    "create",
		summary: "take a snapshot of a volume through its plugin's controller",
		usage:   "csiactor snapshot create -volume VOLUME [flags] ID",
		help: `Takes a snapshot named ID of the registered volume VOLUME through its
plugin's controller (CreateSnapshot; POST /v1/snapshots), which needs the
CREATE_DELETE_SNAPSHOT capability, and returns when the plugin says it is
ready to use. The agent records the snapshot first, so it finishes after an
agent crash or restart; the same command again waits for it or prints it.
-plugin defaults to the volume's plugin.

Restore it into a new volume with ` + "`csiactor volume create -from-snapshot ID ...`" + `.
Secrets are sent to the agent and never shown again; prefer -secrets-file.

Example:
  csiactor snapshot create -volume data1 data1-monday`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		volume := fs.String("volume", "", "the registered `volume` to take a snapshot of (required)")
		plugin := fs.String("plugin", "", "plugin `name` (default: the volume's)")
		params := &kvFlag{}
		secrets := &kvFlag{secret: true}
		fs.Var(params, "parameter", "`KEY=VALUE` parameter for the plugin (repeatable)")
		fs.Var(secrets, "secret", "`KEY=VALUE` secret for the plugin (repeatable; never shown)")
		secretsFile := fs.String("secrets-file", "", "`file` of KEY=VALUE secret lines")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args, "ID"); err != nil {
				return err
			}
			if *volume == "" {
				return usagef("-volume is required")
			}
			if err := secrets.check("secret"); err != nil {
				return err
			}
			spec := runtime.SnapshotSpec{ID: args[0], Plugin: *plugin, SourceVolume: *volume, Parameters: params.m, Secrets: secrets.m}
			if *secretsFile != "" {
				fileSecrets, err := readSecretsFile(*secretsFile)
				if err != nil {
					return err
				}
				if spec.Secrets == nil {
					spec.Secrets = map[string]string{}
				}
				for k, v := range fileSecrets {
					if hasKey(spec.Secrets, k) {
						return usagef("secret %q is given by -secret and in -secrets-file", k)
					}
					spec.Secrets[k] = v
				}
			}
			if spec.Plugin == "" {
				if err := usageFromField(runtime.ValidateID("source_volume", spec.SourceVolume), snapshotFlagNames); err != nil {
					return err
				}
				v, err := cl.Volume(ctx, spec.SourceVolume)
				if err != nil {
					return err
				}
				spec.Plugin = v.Plugin
			}
			if err := usageFromField(spec.Validate(), snapshotFlagNames); err != nil {
				return err
			}
			s, err := cl.CreateSnapshot(ctx, spec)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, s)
			}
			fmt.Fprintf(e.stdout, "Created snapshot %s of volume %s (plugin %s, external ID %s, size %s)\n",
				s.ID, s.SourceVolume, s.Plugin, orDash(s.ExternalID), formatSize(s.SizeBytes))
			return nil
		}
	})
}

func snapshotListCommand() *command {
	return clientLeaf(&command{
		name:    "list",
		summary: "list snapshots",
		usage:   "csiactor snapshot list [flags]",
		help: `Lists the snapshots taken through this agent and, for plugins whose
controller has LIST_SNAPSHOTS, the ones the plugin lists (GET /v1/snapshots).
ID is "-" for a snapshot the plugin has and this agent did not take;
SOURCE VOLUME is the volume's ID here, or the plugin's ID of it in brackets.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		plugin := fs.String("plugin", "", "only snapshots of the plugin `name`")
		volume := fs.String("volume", "", "only snapshots of the volume `id`")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args); err != nil {
				return err
			}
			f := runtime.SnapshotFilter{Plugin: *plugin, Volume: *volume}
			if err := usageFromField(f.Validate(), flagNames{"plugin": "-plugin", "volume": "-volume"}); err != nil {
				return err
			}
			ss, err := cl.Snapshots(ctx, f)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, ss)
			}
			t := newTable(e.stdout, "ID", "PLUGIN", "SOURCE VOLUME", "EXTERNAL ID", "SIZE", "STATE", "CREATED")
			for _, s := range ss {
				src := s.SourceVolume
				if src == "" && s.SourceExternalID != "" {
					src = "(" + s.SourceExternalID + ")"
				}
				state := s.State
				if state == "" {
					state = "ready"
					if !s.ReadyToUse {
						state = "not ready"
					}
				}
				t.row(orDash(s.ID), s.Plugin, orDash(src), orDash(s.ExternalID), formatSize(s.SizeBytes), state, formatWhen(s.CreationTime))
			}
			return t.flush()
		}
	})
}

func formatWhen(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func snapshotStatusCommand() *command {
	return clientLeaf(&command{
		name:    "status",
		summary: "show a snapshot",
		usage:   "csiactor snapshot status [flags] ID",
		help:    `Shows the snapshot ID (GET /v1/snapshots/ID). Secrets are never shown.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			s, err := cl.Snapshot(ctx, args[0])
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, s)
			}
			t := newTable(e.stdout)
			t.row("ID", s.ID)
			t.row("Plugin", s.Plugin)
			t.row("Source volume", fmt.Sprintf("%s (external ID %s)", s.SourceVolume, orDash(s.SourceExternalID)))
			t.row("External ID", orDash(s.ExternalID))
			t.row("State", s.State)
			t.row("Ready to use", yesNo(s.ReadyToUse))
			t.row("Size", formatSize(s.SizeBytes))
			t.row("Created", formatWhen(s.CreationTime))
			t.row("Parameters", formatMap(s.Parameters))
			if s.Restoring > 0 {
				t.row("Restoring", plural(s.Restoring, "volume"))
			}
			if s.LastError != "" {
				t.row("Last error", fmt.Sprintf("%s (%s)", s.LastError, plural(s.Attempts, "attempt")))
			}
			return t.flush()
		}
	})
}

func snapshotDeleteCommand() *command {
	return clientLeaf(&command{
		name:    "delete",
		summary: "delete a snapshot through its plugin's controller",
		usage:   "csiactor snapshot delete [flags] ID",
		help: `Deletes the snapshot ID through its plugin's controller (DeleteSnapshot;
DELETE /v1/snapshots/ID) and forgets it. Refused while a volume is being
restored from it, or while it is being created.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			if err := cl.DeleteSnapshot(ctx, args[0]); err != nil {
				return err
			}
			if !cf.json {
				fmt.Fprintf(e.stdout, "Deleted snapshot %s\n", args[0])
			}
			return nil
		}
	})
}
