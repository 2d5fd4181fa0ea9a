package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func allocCommand() *command {
	return &command{
		name:    "alloc",
		summary: "list, register and deregister plugin allocations",
		usage:   "csiactor alloc list|register|deregister [flags] [args]",
		subs: []*command{
			clientLeaf(&command{
				name:    "list",
				summary: "list every allocation",
				usage:   "csiactor alloc list [flags]",
				help:    `Lists every plugin allocation (GET /v1/allocations), by plugin and type, newest first.`,
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
			clientLeaf(&command{
				name:    "deregister",
				summary: "deregister an allocation (stopping it if exec-managed)",
				usage:   "csiactor alloc deregister [flags] ID",
				help:    `Deregisters the allocation ID (DELETE /v1/allocations/ID); the agent stops its process if it started it.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args, "ID"); err != nil {
						return err
					}
					if err := checkID("ID", args[0]); err != nil {
						return err
					}
					if err := cl.DeregisterAllocation(ctx, args[0]); err != nil {
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
	head := []string{"ID", "PLUGIN", "TYPE", "HEALTHY", "SINGLETON", "NODE", "SOCKET", "DESCRIPTION"}
	if !withPlugin {
		head = append(head[:1], head[2:]...)
	}
	t := newTable(e.stdout, head...)
	for _, a := range as {
		row := []string{a.ID, a.Plugin, a.Type, yesNo(a.Healthy), yesNo(a.Singleton), orDash(a.NodeID), orDash(a.Socket), orDash(a.HealthDescription)}
		if !withPlugin {
			row = append(row[:1], row[2:]...)
		}
		t.row(row...)
	}
	return t.flush()
}
