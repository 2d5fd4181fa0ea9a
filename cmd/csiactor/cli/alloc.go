package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func allocCommand() *command {
	return &command{
		name:    "alloc",
		summary: "list, show, register and deregister plugin allocations; print their logs",
		usage:   "csiactor alloc list|status|register|deregister|logs [flags] [args]",
		subs: []*command{
			clientLeaf(&command{
				name:    "list",
				summary: "list every allocation",
				usage:   "csiactor alloc list [flags]",
				help: `Lists every plugin allocation (GET /v1/allocations), by plugin and type, newest
first. SOURCE says where each was registered: config (the config file),
api (the API or the CLI) or registration (a CSI driver announced in
plugins.registration_dir, deregistered when its registration socket goes).`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args); err != nil {
						return err
					}
					as, err := cl.Allocations(ctx)
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, as)
					}
					return writeAllocations(e, as, true)
				}
			}),
			allocStatusCommand(),
			allocRegisterCommand(),
			allocLogsCommand(),
			clientLeaf(&command{
				name:    "deregister",
				summary: "deregister an allocation (stopping it if exec-managed)",
				usage:   "csiactor alloc deregister [flags] ID",
				help: `Deregisters the allocation ID (DELETE /v1/allocations/ID); the agent stops its process if it started it.

Refused while it is the last healthy node (or controller) allocation of its
plugin and claims need it: claims published or being published, past
claims being released. The error names them. -force deregisters it anyway
(?force=true): those claims wait for a healthy allocation of the plugin,
and the event allocation-force-deregistered names them.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				force := fs.Bool("force", false, "deregister even while claims depend on the allocation")
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantID(args, "ID"); err != nil {
						return err
					}
					deregister := cl.DeregisterAllocation
					if *force {
						deregister = cl.ForceDeregisterAllocation
					}
					if err := deregister(ctx, args[0]); err != nil {
						return err
					}
					if !cf.json {
						fmt.Fprintf(e.stdout, "Deregistered allocation %s\n", args[0])
					}
					return nil
				}
			}),
		},
	}
}

func allocRegisterCommand() *command {
	return clientLeaf(&command{
		name:    "register",
		summary: "register an attached, exec-managed or image allocation",
		usage:   "csiactor alloc register [flags] ID [-- COMMAND [ARG...] | -- ARG...]",
		help: `Registers the plugin allocation ID (PUT /v1/allocations/ID). Registering the
same definition again is a no-op.

An attached allocation gives -socket: the plugin runs elsewhere and listens
there. An exec-managed allocation gives its command after "--": the agent
starts it with CSI_ENDPOINT=unix://<data_dir>/plugins/ID/csi.sock, replaces
{endpoint} and {socket} in its arguments, and restarts it when it exits.

An image allocation gives -image: the agent runs the plugin in a container
of that image through the engine's API socket (-engine docker, the default,
or podman), with the arguments after "--" ({endpoint} and {socket} replaced
as in a command), CSI_ENDPOINT and -env in its environment, /dev, the
plugin's socket directory and <data_dir>/volumes (rshared) bound into it,
and SYS_ADMIN added for node and monolith plugins unless -cap says which
capabilities to add (-cap none: none). -pull never refuses an image the
engine does not hold.

Examples:
  csiactor alloc register -plugin hostpath -type node -socket /run/hostpath/csi.sock hp-node
  csiactor alloc register -plugin nfs -type monolith -env NFS_SERVER=10.0.0.1 nfs1 -- /usr/bin/nfsplugin --endpoint={endpoint}
  csiactor alloc register -plugin hostpath.csi.k8s.io -type monolith -image registry.k8s.io/sig-storage/hostpathplugin:v1.17.0 -mount /var/lib/hostpath:/csi-data-dir hp1 -- --endpoint={endpoint} --nodeid=node-1`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		plugin := fs.String("plugin", "", "plugin `name` (required)")
		typ := fs.String("type", "", "allocation `type`: controller, node or monolith (required)")
		socket := fs.String("socket", "", "`path` of the unix socket of an attached plugin")
		// The environment often carries credentials: never echo a value.
		envs := &kvFlag{secret: true}
		fs.Var(envs, "env", "`KEY=VALUE` in the environment of an exec-managed or image plugin (repeatable; never shown)")
		im := imageFlags(fs)
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			var command []string
			for i, a := range args {
				if a == "--" {
					args, command = args[:i], args[i+1:]
					break
				}
			}
			if err := wantArgs(args, "ID"); err != nil {
				return err
			}
			if err := envs.check("env"); err != nil {
				return err
			}
			switch {
			case *plugin == "":
				return usagef("-plugin is required")
			case *typ == "":
				return usagef("-type is required")
			case *socket == "" && len(command) == 0 && !im.given(fs):
				return usagef("give -socket, -image, or the command after --")
			}
			spec := runtime.AllocationSpec{Plugin: *plugin, Type: *typ, Socket: *socket, Command: command, Env: envs.m}
			if im.given(fs) {
				image, err := im.build(fs, command, envs.m)
				if err != nil {
					return err
				}
				spec.Image, spec.Command, spec.Env = image, nil, nil
			}
			if err := checkID("ID", args[0]); err != nil {
				return err
			}
			if err := usageFromField(spec.Validate(), allocFlagNames); err != nil {
				return err
			}
			a, err := cl.RegisterAllocation(ctx, args[0], spec)
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, a)
			}
			if a.Image != "" {
				fmt.Fprintf(e.stdout, "Registered allocation %s (%s %s) at %s, image %s on %s\n", a.ID, a.Plugin, a.Type, a.Socket, a.Image, a.Engine)
				return nil
			}
			fmt.Fprintf(e.stdout, "Registered allocation %s (%s %s) at %s\n", a.ID, a.Plugin, a.Type, a.Socket)
			return nil
		}
	})
}

func writeAllocations(e *env, as []runtime.Allocation, withPlugin bool) error {
	head := []string{"ID", "PLUGIN", "TYPE", "SOURCE", "HEALTHY", "SINGLETON", "NODE", "SOCKET", "DESCRIPTION"}
	if !withPlugin {
		head = append(head[:1], head[2:]...)
	}
	// Image allocations add their engine, image, digest and container.
	images := slices.ContainsFunc(as, func(a runtime.Allocation) bool { return a.Image != "" })
	if images {
		head = slices.Insert(head, len(head)-1, "ENGINE", "IMAGE", "DIGEST", "CONTAINER")
	}
	t := newTable(e.stdout, head...)
	for _, a := range as {
		row := []string{a.ID, a.Plugin, a.Type, orDash(a.Source), yesNo(a.Healthy), yesNo(a.Singleton), orDash(a.NodeID), orDash(a.Socket), orDash(a.HealthDescription)}
		if !withPlugin {
			row = append(row[:1], row[2:]...)
		}
		if images {
			row = slices.Insert(row, len(row)-1, orDash(a.Engine), orDash(a.Image), orDash(shortDigest(a.ImageDigest)), orDash(shortID(a.ContainerID)))
		}
		t.row(row...)
	}
	return t.flush()
}

// shortDigest is an image digest ("sha256:<64 hex>") cut to its first 12
// hex digits, as docker images prints it.
func shortDigest(d string) string {
	alg, hex, ok := strings.Cut(d, ":")
	if !ok {
		return shortID(d)
	}
	return alg + ":" + shortID(hex)
}

// shortID is a container ID cut to 12 characters, as docker ps prints it.
func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// writeAllocation prints one allocation, a field a line.
func writeAllocation(e *env, a runtime.Allocation) error {
	t := newTable(e.stdout)
	t.row("ID:", a.ID)
	t.row("Plugin:", a.Plugin)
	t.row("Type:", a.Type)
	t.row("Source:", orDash(a.Source))
	t.row("Healthy:", yesNo(a.Healthy))
	t.row("Description:", orDash(a.HealthDescription))
	t.row("Singleton:", yesNo(a.Singleton))
	t.row("Node:", orDash(a.NodeID))
	t.row("Socket:", orDash(a.Socket))
	switch {
	case a.Image != "":
		t.row("Image:", a.Image)
		t.row("Engine:", orDash(a.Engine))
		t.row("Digest:", orDash(a.ImageDigest))
		t.row("Container:", orDash(a.ContainerID))
	case len(a.Command) > 0:
		t.row("Command:", strings.Join(a.Command, " "))
		pid := "-"
		if a.PID > 0 {
			pid = strconv.Itoa(a.PID)
		}
		t.row("PID:", pid)
	}
	return t.flush()
}

func allocStatusCommand() *command {
	return clientLeaf(&command{
		name:    "status",
		summary: "show one allocation",
		usage:   "csiactor alloc status [flags] ID",
		help: `Shows the allocation ID, a field a line: its plugin, type, health, socket,
and how it runs: the command and PID of an exec-managed plugin; the image,
engine, image digest and container ID of an image allocation. -json prints
the allocation as GET /v1/allocations lists it.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			as, err := cl.Allocations(ctx)
			if err != nil {
				return err
			}
			i := slices.IndexFunc(as, func(a runtime.Allocation) bool { return a.ID == args[0] })
			if i < 0 {
				return fmt.Errorf("allocation %q is not registered", args[0])
			}
			if cf.json {
				return printJSON(e.stdout, as[i])
			}
			return writeAllocation(e, as[i])
		}
	})
}

func allocLogsCommand() *command {
	return clientLeaf(&command{
		name:    "logs",
		summary: "print an exec-managed or image allocation's plugin output",
		usage:   "csiactor alloc logs [-f] [-tail N] [flags] ID",
		help: `Prints what the plugin of the exec-managed or image allocation ID wrote
to its stdout and stderr (GET /v1/allocations/ID/logs): stdout lines on
stdout, stderr lines on stderr. The agent keeps the output in rotated files
under <data_dir>/plugins/ID/, written by a log shim that runs beside the
plugin (for an image allocation, copied from the engine's log of its
container), so lines written while no agent ran are there too.

-tail N prints only the last N lines first (default: every kept line); -f
keeps printing new lines until interrupted or the allocation is
deregistered. With -json, prints the API's newline-delimited JSON (time,
stream, line). An attached allocation has no logs: its plugin runs outside
the agent.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		follow := fs.Bool("f", false, "keep printing new lines until interrupted")
		fs.BoolVar(follow, "follow", false, "same as -f")
		tail := fs.Int("tail", -1, "print only the last `N` lines first (default: all)")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			set := false
			fs.Visit(func(f *flag.Flag) { set = set || f.Name == "tail" })
			if set && *tail < 0 {
				return usagef("-tail %d: want 0 or more lines", *tail)
			}
			enc := json.NewEncoder(e.stdout)
			print := func(l runtime.LogLine) error {
				if cf.json {
					return enc.Encode(l)
				}
				w := e.stdout
				if l.Stream == "stderr" {
					w = e.stderr
				}
				_, err := fmt.Fprintln(w, l.Line)
				return err
			}
			err := cl.AllocationLogs(ctx, args[0], runtime.LogsQuery{Tail: *tail, Follow: *follow}, print)
			switch {
			case *follow && errors.Is(err, context.Canceled) && ctx.Err() != nil:
				return nil // interrupted: the normal end of -f
			case *follow && errors.Is(err, api.ErrStreamEnded):
				return nil // deregistered, or the agent stopped
			}
			return err
		}
	})
}
