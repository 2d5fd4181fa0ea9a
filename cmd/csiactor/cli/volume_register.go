package cli

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

// volumeSpecFlags are the flags of volume register and volume create.
type volumeSpecFlags struct {
	plugin      string
	caps        listFlag
	fsType      string
	mountFlags  listFlag
	params      kvFlag
	context     kvFlag
	secrets     kvFlag
	secretsFile string
	secretsFrom string
}

const volumeSpecHelp = `
Capabilities are ACCESS_MODE[:ATTACHMENT_MODE], the attachment mode
file-system unless given: access modes single-node-reader-only,
single-node-writer, single-node-single-writer, single-node-multi-writer,
multi-node-reader-only, multi-node-single-writer, multi-node-multi-writer;
attachment modes file-system and block-device.

Secrets and mount flags are sent to the agent and never shown again. A
-secret on the command line is visible to other users in the process list;
prefer -secrets-file, a file of KEY=VALUE lines (# starts a comment).
-secrets-from PATH instead has the agent read the secrets at each RPC from
PATH on its own host (a JSON or YAML map, a directory with one file per
key, or $CREDENTIALS_DIRECTORY/NAME): only the path is stored.`

func addVolumeSpecFlags(fs *flag.FlagSet) *volumeSpecFlags {
	f := &volumeSpecFlags{secrets: kvFlag{secret: true}}
	fs.StringVar(&f.plugin, "plugin", "", "plugin `name` (required)")
	fs.Var(&f.caps, "capability", "`ACCESS_MODE[:ATTACHMENT_MODE]` the volume supports (repeatable; at least one)")
	fs.StringVar(&f.fsType, "fs-type", "", "file-system `type` to mount with, like ext4")
	fs.Var(&f.mountFlags, "mount-flag", "mount `flag`, like noatime (repeatable; never shown)")
	fs.Var(&f.params, "parameter", "`KEY=VALUE` parameter for the plugin (repeatable)")
	fs.Var(&f.context, "context", "`KEY=VALUE` volume context for the plugin (repeatable)")
	fs.Var(&f.secrets, "secret", "`KEY=VALUE` secret for the plugin (repeatable; never shown)")
	fs.StringVar(&f.secretsFile, "secrets-file", "", "`file` of KEY=VALUE secret lines")
	fs.StringVar(&f.secretsFrom, "secrets-from", "", "`path` on the agent's host the secrets are read from at each RPC (not with -secret)")
	return f
}

func (f *volumeSpecFlags) spec() (runtime.VolumeSpec, error) {
	if f.plugin == "" {
		return runtime.VolumeSpec{}, usagef("-plugin is required")
	}
	if len(f.caps) == 0 {
		return runtime.VolumeSpec{}, usagef("give at least one -capability, like -capability single-node-writer")
	}
	if err := f.secrets.check("secret"); err != nil {
		return runtime.VolumeSpec{}, err
	}
	s := runtime.VolumeSpec{Plugin: f.plugin, Parameters: f.params.m, Context: f.context.m, Secrets: f.secrets.m}
	if f.secretsFrom != "" {
		s.SecretsFrom = &runtime.SecretsFrom{File: f.secretsFrom}
	}
	for _, c := range f.caps {
		access, attach, ok := strings.Cut(c, ":")
		if !ok {
			attach = "file-system"
		}
		s.Capabilities = append(s.Capabilities, runtime.Capability{AccessMode: access, AttachmentMode: attach})
	}
	if f.fsType != "" || len(f.mountFlags) > 0 {
		s.MountOptions = &runtime.MountOptions{FSType: f.fsType, MountFlags: f.mountFlags}
	}
	if f.secretsFile != "" {
		fileSecrets, err := readSecretsFile(f.secretsFile)
		if err != nil {
			return runtime.VolumeSpec{}, err
		}
		if s.Secrets == nil {
			s.Secrets = map[string]string{}
		}
		for k, v := range fileSecrets {
			if hasKey(s.Secrets, k) {
				return runtime.VolumeSpec{}, usagef("secret %q is given by -secret and in -secrets-file", k)
			}
			s.Secrets[k] = v
		}
	}
	return s, nil
}

// readSecretsFile reads KEY=VALUE lines; errors name the line, never a
// value.
func readSecretsFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("secrets file: %w", err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok || k == "":
			return nil, fmt.Errorf("secrets file %s: line %d: want KEY=VALUE", path, n)
		case hasKey(out, k):
			return nil, fmt.Errorf("secrets file %s: line %d: key %q given twice", path, n, k)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("secrets file %s: %w", path, err)
	}
	return out, nil
}

func volumeRegisterCommand() *command {
	return clientLeaf(&command{
		name:    "register",
		summary: "register an existing volume of a plugin",
		usage:   "csiactor volume register [flags] ID | -f FILE",
		help: `Registers the existing volume known to its plugin as -external-id under the
ID (PUT /v1/volumes/ID). Registering the same definition again is a no-op.
` + volumeSpecHelp + `

-f FILE registers every volume of FILE instead (- reads stdin): a JSON or
YAML list of API bodies, each a register's with its id and external_id
(or a create's, without external_id), or the same list under volumes:.
They are sent through POST /v1/volumes/batch, 1000 per request; one line
per volume says registered, created or refused (and why). It exits 1 if any
was refused. Entries are counted from 0 in errors.

Example:
  csiactor volume register -plugin hostpath -external-id vol-7f3a \
    -capability single-node-writer -fs-type ext4 -mount-flag noatime data1
  csiactor volume register -f volumes.yaml`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		sf := addVolumeSpecFlags(fs)
		externalID := fs.String("external-id", "", "the plugin's `id` of the volume (required)")
		file := fs.String("f", "", "register the volumes of `FILE` (JSON or YAML; - for stdin) in bulk")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if *file != "" {
				var other []string
				fs.Visit(func(f *flag.Flag) {
					if f.Name != "f" && volumeFlag(f.Name) {
						other = append(other, "-"+f.Name)
					}
				})
				if len(args) > 0 || len(other) > 0 {
					return usagef("-f takes the volumes from the file: give no ID and no volume flags (got %s)", strings.Join(append(other, args...), " "))
				}
				return registerFromFile(ctx, e, cl, cf, *file)
			}
			spec, err := sf.registerSpec(args, *externalID)
			if err != nil {
				return err
			}
			v, err := cl.RegisterVolume(ctx, args[0], spec)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "Registered volume %s (plugin %s, external ID %s)\n", v.ID, v.Plugin, v.ExternalID)
			return nil
		}
	})
}

func volumeCreateCommand() *command {
	return clientLeaf(&command{
		name:    "create",
		summary: "create a volume through its plugin's controller",
		usage:   "csiactor volume create [flags] ID",
		help: `Creates a volume through the plugin's controller (CreateVolume, named ID) and
registers it as ID (POST /v1/volumes).
` + volumeSpecHelp + `

Sizes take decimal (k, M, G, T) or binary (Ki, Mi, Gi, Ti) units, with or
without a trailing B: 1GiB, 500M, 4096.

-topology (repeatable) says where the volume must be reachable from, one
topology's segments each ("zone=a,rack=r1"); without it, a plugin with
VOLUME_ACCESSIBILITY_CONSTRAINTS is asked for this host's node topology.
` + "`volume status`" + ` shows where the plugin placed it.

-clone-of SOURCE creates a copy of the registered volume SOURCE (the
plugin needs CLONE_VOLUME); -from-snapshot ID restores the snapshot ID
taken with ` + "`csiactor snapshot create`" + ` (CREATE_DELETE_SNAPSHOT). Both
must be of the same plugin; give one or the other.

Example:
  csiactor volume create -plugin hostpath -capacity 1GiB -capability single-node-writer data2`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		sf := addVolumeSpecFlags(fs)
		capacity := fs.String("capacity", "", "requested `size`, like 1GiB (default: the plugin's choice)")
		cloneOf := fs.String("clone-of", "", "create as a copy of the registered volume `source`")
		fromSnapshot := fs.String("from-snapshot", "", "create from (restore) the snapshot `id`")
		var topologies []map[string]string
		fs.Func("topology", "where the volume must be reachable from, `k=v,...` (repeatable)", func(s string) error {
			t, err := runtime.ParseTopology(s)
			if err != nil {
				return err
			}
			topologies = append(topologies, t)
			return nil
		})
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args, "ID"); err != nil {
				return err
			}
			spec, err := sf.spec()
			if err != nil {
				return err
			}
			var size int64
			if *capacity != "" {
				if size, err = parseSize(*capacity); err != nil {
					return usagef("-capacity %s", err.Error())
				}
			}
			cs := runtime.CreateVolumeSpec{ID: args[0], VolumeSpec: spec, CapacityBytes: size, Topology: topologies}
			if *cloneOf != "" || *fromSnapshot != "" {
				cs.ContentSource = &runtime.ContentSource{Volume: *cloneOf, Snapshot: *fromSnapshot}
			}
			if err := usageFromField(cs.Validate(), volumeFlagNames); err != nil {
				return err
			}
			v, err := waitNotice(ctx, e, cl, cs.ID, "", func() (runtime.Volume, error) { return cl.CreateVolume(ctx, cs) })
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "Created volume %s (plugin %s, external ID %s, capacity %s)\n", v.ID, v.Plugin, v.ExternalID, formatSize(v.CapacityBytes))
			return nil
		}
	})
}

// registerSpec checks the one ID argument of volume register and volume
// update and returns the volume definition their flags give, with
// externalID (-external-id, required).
func (f *volumeSpecFlags) registerSpec(args []string, externalID string) (runtime.VolumeSpec, error) {
	if err := wantArgs(args, "ID"); err != nil {
		return runtime.VolumeSpec{}, err
	}
	spec, err := f.spec()
	if err != nil {
		return runtime.VolumeSpec{}, err
	}
	if externalID == "" {
		return runtime.VolumeSpec{}, usagef("-external-id is required")
	}
	spec.ExternalID = externalID
	if err := checkID("ID", args[0]); err != nil {
		return runtime.VolumeSpec{}, err
	}
	if err := usageFromField(spec.Validate(), volumeFlagNames); err != nil {
		return runtime.VolumeSpec{}, err
	}
	return spec, nil
}
