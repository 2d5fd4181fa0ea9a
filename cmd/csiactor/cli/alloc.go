package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func allocCommand() *command {
	return &command{
		name:    "alloc",
		summary: "list, register and deregister plugin allocations; print their logs",
		usage:   "csiactor alloc list|register|deregister|logs [flags] [args]",
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
		summary: "register an attached or exec-managed allocation",
		usage:   "csiactor alloc register [flags] ID [-- COMMAND [ARG...]]",
		help: `Registers the plugin allocation ID (PUT /v1/allocations/ID). Registering the
same definition again is a no-op.

An attached allocation gives -socket: the plugin runs elsewhere and listens
there. An exec-managed allocation gives its command after "--": the agent
starts it with CSI_ENDPOINT=unix://<data_dir>/plugins/ID/csi.sock, replaces
{endpoint} and {socket} in its arguments, and restarts it when it exits.

Examples:
  csiactor alloc register -plugin hostpath -type node -socket /run/hostpath/csi.sock hp-node
  csiactor alloc register -plugin nfs -type monolith -env NFS_SERVER=10.0.0.1 nfs1 -- /usr/bin/nfsplugin --endpoint={endpoint}`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		plugin := fs.String("plugin", "", "plugin `name` (required)")
		typ := fs.String("type", "", "allocation `type`: controller, node or monolith (required)")
		socket := fs.String("socket", "", "`path` of the unix socket of an attached plugin")
		// The environment often carries credentials: never echo a value.
		envs := &kvFlag{secret: true}
		fs.Var(envs, "env", "`KEY=VALUE` in the environment of an exec-managed plugin (repeatable; never shown)")
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
			case *socket == "" && len(command) == 0:
				return usagef("give -socket, or the command after --")
			}
			spec := runtime.AllocationSpec{Plugin: *plugin, Type: *typ, Socket: *socket, Command: command, Env: envs.m}
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
	t := newTable(e.stdout, head...)
	for _, a := range as {
		row := []string{a.ID, a.Plugin, a.Type, orDash(a.Source), yesNo(a.Healthy), yesNo(a.Singleton), orDash(a.NodeID), orDash(a.Socket), orDash(a.HealthDescription)}
		if !withPlugin {
			row = append(row[:1], row[2:]...)
		}
		t.row(row...)
	}
	return t.flush()
}

func allocLogsCommand() *command {
	return clientLeaf(&command{
		name:    "logs",
		summary: "print an exec-managed allocation's plugin output",
		usage:   "csiactor alloc logs [-f] [-tail N] [flags] ID",
		help: `Prints what the plugin of the exec-managed allocation ID wrote to its
stdout and stderr (GET /v1/allocations/ID/logs): stdout lines on stdout,
stderr lines on stderr. The agent keeps the output in rotated files under
<data_dir>/plugins/ID/, written by a log shim that runs beside the plugin,
so lines written while no agent ran are there too.

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
