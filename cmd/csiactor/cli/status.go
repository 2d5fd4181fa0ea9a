package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func statusCommand() *command {
	return clientLeaf(&command{
		name:    "status",
		summary: "show whether the agent is up, with its plugins and volumes",
		usage:   "csiactor status [flags]",
		help: `Checks the agent's health and readiness, then lists its plugins and counts
its volumes and claims. Ready is "no" while the agent is starting: allocations
not fingerprinted yet, claims the host was missing not published again yet
(they are listed). With -json: {"status", "address", "ready", "plugins",
"volumes", "claims", "past_claims"}, ready as GET /v1/ready returns it, plugins
as GET /v1/plugins returns them.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args); err != nil {
				return err
			}
			if err := cl.Health(ctx); err != nil {
				return err
			}
			ready, err := cl.Ready(ctx)
			if err != nil {
				return err
			}
			ps, err := cl.Plugins(ctx)
			if err != nil {
				return err
			}
			vs, err := cl.Volumes(ctx, runtime.VolumeFilter{})
			if err != nil {
				return err
			}
			claims, past := 0, 0
			for _, v := range vs {
				claims += len(v.Claims)
				past += len(v.PastClaims)
			}
			if cf.json {
				return printJSON(e.stdout, struct {
					Status     string            `json:"status"`
					Address    string            `json:"address"`
					Ready      runtime.Readiness `json:"ready"`
					Plugins    []runtime.Plugin  `json:"plugins"`
					Volumes    int               `json:"volumes"`
					Claims     int               `json:"claims"`
					PastClaims int               `json:"past_claims"`
				}{"ok", cl.Address(), ready, ps, len(vs), claims, past})
			}
			healthy := 0
			for _, p := range ps {
				if pluginHealthy(p) {
					healthy++
				}
			}
			t := newTable(e.stdout)
			t.row("Agent", "ok at "+cl.Address())
			t.row("Ready", readyText(ready))
			t.row("Plugins", fmt.Sprintf("%d (%d healthy)", len(ps), healthy))
			t.row("Volumes", fmt.Sprintf("%d (%s, %d being released)", len(vs), plural(claims, "claim"), past))
			if err := t.flush(); err != nil {
				return err
			}
			if len(ps) > 0 {
				fmt.Fprintln(e.stdout)
				return writePlugins(e, ps)
			}
			return nil
		}
	})
}

// pluginHealthy reports whether p has a healthy allocation of every type it
// expects.
func pluginHealthy(p runtime.Plugin) bool {
	return (p.ControllersExpected == 0 || p.ControllersHealthy > 0) && (p.NodesExpected == 0 || p.NodesHealthy > 0)
}

// readyText is "yes", or "no (pending: …)" with what is pending.
func readyText(r runtime.Readiness) string {
	if r.Status == runtime.ReadyOK {
		return "yes"
	}
	if len(r.Pending) == 0 {
		return "no (" + r.Status + ")"
	}
	return "no (pending: " + strings.Join(r.Pending, "; ") + ")"
}
