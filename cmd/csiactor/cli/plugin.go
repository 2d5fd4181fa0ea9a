package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func pluginCommand() *command {
	return &command{
		name:    "plugin",
		summary: "list plugins, or show one",
		usage:   "csiactor plugin list|status [flags] [NAME]",
		subs: []*command{
			clientLeaf(&command{
				name:    "list",
				summary: "list the plugins with their healthy and expected allocations",
				usage:   "csiactor plugin list [flags]",
				help:    `Lists every plugin (GET /v1/plugins). CONTROLLERS and NODES are healthy/expected.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args); err != nil {
						return err
					}
					ps, err := cl.Plugins(ctx)
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, ps)
					}
					return writePlugins(e, ps)
				}
			}),
			clientLeaf(&command{
				name:    "status",
				summary: "show one plugin and its allocations",
				usage:   "csiactor plugin status [flags] NAME",
				help:    `Shows the plugin NAME (GET /v1/plugins/NAME) and each of its allocations.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args, "NAME"); err != nil {
						return err
					}
					if err := checkID("NAME", args[0]); err != nil {
						return err
					}
					p, err := cl.Plugin(ctx, args[0])
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, p)
					}
					t := newTable(e.stdout)
					t.row("Name", p.Name)
					t.row("Provider", orDash(p.Provider))
					t.row("Version", orDash(p.Version))
					t.row("Controller required", yesNo(p.ControllerRequired))
					t.row("Controllers", fmt.Sprintf("%d/%d healthy", p.ControllersHealthy, p.ControllersExpected))
					t.row("Nodes", fmt.Sprintf("%d/%d healthy", p.NodesHealthy, p.NodesExpected))
					if err := t.flush(); err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, "\nAllocations")
					return writeAllocations(e, p.Allocations, false)
				}
			}),
		},
	}
}

func writePlugins(e *env, ps []runtime.Plugin) error {
	t := newTable(e.stdout, "NAME", "PROVIDER", "VERSION", "CONTROLLERS", "NODES", "CONTROLLER REQUIRED")
	for _, p := range ps {
		t.row(p.Name, orDash(p.Provider), orDash(p.Version),
			fmt.Sprintf("%d/%d", p.ControllersHealthy, p.ControllersExpected),
			fmt.Sprintf("%d/%d", p.NodesHealthy, p.NodesExpected),
			yesNo(p.ControllerRequired))
	}
	return t.flush()
}
