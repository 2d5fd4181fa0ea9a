package cli

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func pluginCommand() *command {
	return &command{
		name:    "plugin",
		summary: "list plugins, show one, ask one's capacity, or call it",
		usage:   "csiactor plugin list|status|capacity|call [flags] [NAME]",
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
				help: `Shows the plugin NAME (GET /v1/plugins/NAME) and each of its allocations,
then what each fingerprinted allocation announced: its plugin, controller
and node capabilities by their CSI names, and its node's topology and
max_volumes_per_node ("-": none).`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantID(args, "NAME"); err != nil {
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
					if p.ProxySocket != "" {
						t.row("CSI proxy", p.ProxySocket)
					}
					if p.ProxyError != "" {
						t.row("CSI proxy", "none: "+p.ProxyError)
					}
					if err := t.flush(); err != nil {
						return err
					}
					fmt.Fprintln(e.stdout, "\nAllocations")
					if err := writeAllocations(e, p.Allocations, false); err != nil {
						return err
					}
					return writeCapabilities(e, p.Allocations)
				}
			}),
			pluginCapacityCommand(),
			pluginCallCommand(),
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

// writeCapabilities prints, for each allocation fingerprinted since the
// agent started, what its plugin announced.
func writeCapabilities(e *env, as []runtime.Allocation) error {
	for _, a := range as {
		c := a.Capabilities
		if c == nil {
			continue
		}
		fmt.Fprintf(e.stdout, "\nCapabilities of %s\n", a.ID)
		t := newTable(e.stdout)
		t.row("Plugin", orDash(strings.Join(c.Plugin, ", ")))
		if a.Type != runtime.TypeNode {
			t.row("Controller", orDash(strings.Join(c.Controller, ", ")))
		}
		if a.Type != runtime.TypeController {
			t.row("Node", orDash(strings.Join(c.Node, ", ")))
			t.row("Topology", orDash(formatMap(c.Topology)))
			limit := "-"
			if c.MaxVolumesPerNode > 0 {
				limit = strconv.FormatInt(c.MaxVolumesPerNode, 10)
			}
			t.row("Max volumes per node", limit)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return nil
}

func pluginCapacityCommand() *command {
	return clientLeaf(&command{
		name:    "capacity",
		summary: "ask a plugin's controller how much it can provision",
		usage:   "csiactor plugin capacity [-topology k=v,...] [flags] NAME",
		help: `Asks the controller of the plugin NAME how much storage it can still
provision (GetCapacity; GET /v1/plugins/NAME/capacity), in the topology
-topology gives ("zone=a,rack=r1"), or over the whole plugin. Fails when
the controller has no GET_CAPACITY capability.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		topology := fs.String("topology", "", "topology `segments` to ask about, like zone=a,rack=r1")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "NAME"); err != nil {
				return err
			}
			topo, err := runtime.ParseTopology(*topology)
			if err := usageFromField(err, flagNames{"topology": "-topology"}); err != nil {
				return err
			}
			c, err := cl.PluginCapacity(ctx, args[0], runtime.CapacityQuery{Topology: topo})
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, c)
			}
			size := func(p *int64) string {
				if p == nil {
					return "-"
				}
				return formatSize(*p)
			}
			t := newTable(e.stdout)
			t.row("Plugin", c.Plugin)
			t.row("Controller", c.Alloc)
			t.row("Topology", formatMap(c.Topology))
			t.row("Available", formatSize(c.AvailableCapacityBytes))
			t.row("Maximum volume size", size(c.MaximumVolumeSizeBytes))
			t.row("Minimum volume size", size(c.MinimumVolumeSizeBytes))
			return t.flush()
		}
	})
}
