package cli

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func volumeCommand() *command {
	return &command{
		name:    "volume",
		summary: "list, show, register, update, create, deregister, delete, expand, modify, claim and release volumes",
		usage:   "csiactor volume list|status|register|update|create|deregister|delete|expand|modify|claim|release [flags] [args]",
		subs: []*command{
			volumeListCommand(),
			volumeStatusCommand(),
			volumeRegisterCommand(),
			volumeUpdateCommand(),
			volumeCreateCommand(),
			volumeDeregisterCommand(),
			volumeDeleteCommand(),
			volumeExpandCommand(),
			volumeModifyCommand(),
			volumeClaimCommand(),
			volumeReleaseCommand(),
		},
	}
}

func volumeListCommand() *command {
	return clientLeaf(&command{
		name:    "list",
		summary: "list volumes",
		usage:   "csiactor volume list [flags]",
		help: `Lists the volumes (GET /v1/volumes), optionally only those of one plugin or claimed on one node.
CLAIMS counts this host's claims; with -all-hosts, in cluster mode, every host's.
It asks for -per-page volumes at a time (per_page and next_token) and
follows the pages to the last.

With -external -plugin P, lists instead the volumes the plugin's controller
has (ListVolumes; GET /v1/plugins/P/volumes, every page), registered here
or not: REGISTERED AS is the volume ID here, "-" for a volume this agent
does not know. With -json, prints every page's volumes as one JSON array.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		plugin := fs.String("plugin", "", "only volumes of the plugin `name`")
		node := fs.String("node", "", "only volumes claimed on the node `id`")
		allHosts := fs.Bool("all-hosts", false, "in cluster mode, show the claims of every host (one etcd read)")
		external := fs.Bool("external", false, "list the plugin's own volumes (needs -plugin)")
		perPage := fs.Int("per-page", defaultVolumesPerPage, "ask the agent for `n` volumes at a time (1 to 1000)")
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantArgs(args); err != nil {
				return err
			}
			if *external {
				return listExternal(ctx, e, cl, cf, *plugin, *node)
			}
			f := runtime.VolumeFilter{Plugin: *plugin, Node: *node, AllHosts: *allHosts}
			if err := usageFromField(f.Validate(), flagNames{"plugin": "-plugin", "node": "-node"}); err != nil {
				return err
			}
			if err := usageFromField(runtime.ValidatePage(*perPage, ""), flagNames{"per_page": "-per-page"}); err != nil {
				return err
			}
			vs := []runtime.Volume{}
			for token := ""; ; {
				page, next, err := cl.VolumesPage(ctx, f, *perPage, token)
				if err != nil {
					return err
				}
				vs = append(vs, page...)
				if next == "" {
					break
				}
				token = next
			}
			if cf.json {
				return printJSON(e.stdout, vs)
			}
			cols := []string{"ID", "PLUGIN", "EXTERNAL ID", "CAPACITY", "CLAIMS", "PAST CLAIMS"}
			// The EPHEMERAL column (the phase of each ephemeral volume)
			// shows only when there is one.
			eph := slices.ContainsFunc(vs, func(v runtime.Volume) bool { return v.Ephemeral })
			if eph {
				cols = append(cols, "EPHEMERAL")
			}
			t := newTable(e.stdout, cols...)
			for _, v := range vs {
				row := []string{v.ID, v.Plugin, orDash(v.ExternalID), formatSize(v.CapacityBytes),
					fmt.Sprint(len(v.Claims)), fmt.Sprint(len(v.PastClaims))}
				if eph {
					row = append(row, orDash(v.EphemeralPhase))
				}
				t.row(row...)
			}
			return t.flush()
		}
	})
}

// defaultVolumesPerPage is volume list's -per-page.
const defaultVolumesPerPage = 500

func volumeStatusCommand() *command {
	return clientLeaf(&command{
		name:    "status",
		summary: "show a volume with its claims and past claims",
		usage:   "csiactor volume status [flags] ID",
		help: `Shows the volume ID (GET /v1/volumes/ID). While it has a published claim, it shows
how full it is and its condition, as its plugin last reported them
(every volumes.stats_interval). Secrets and mount flags are never shown.`,
	}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
		return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
			if err := wantID(args, "ID"); err != nil {
				return err
			}
			v, err := cl.Volume(ctx, args[0])
			if err != nil {
				return err
			}
			if cf.json {
				return printJSON(e.stdout, v)
			}
			caps := make([]string, len(v.Capabilities))
			for i, c := range v.Capabilities {
				caps[i] = c.AccessMode + "/" + c.AttachmentMode
			}
			mount := "-"
			if o := v.MountOptions; o != nil {
				mount = fmt.Sprintf("fs_type=%s, %s (not shown)", orDash(o.FSType), plural(o.MountFlagCount, "mount flag"))
			}
			t := newTable(e.stdout)
			t.row("ID", v.ID)
			t.row("Plugin", v.Plugin)
			t.row("External ID", orDash(v.ExternalID))
			t.row("Capacity", formatSize(v.CapacityBytes))
			if v.Ephemeral {
				t.row("Ephemeral", v.EphemeralPhase+" (deleted through the controller once its last claim is freed)")
			}
			if len(v.AccessibleTopology) > 0 {
				ts := make([]string, len(v.AccessibleTopology))
				for i, tp := range v.AccessibleTopology {
					ts[i] = formatMap(tp)
				}
				t.row("Topology", strings.Join(ts, " or "))
			}
			if x := v.Expansion; x != nil {
				t.row("Expanding", fmt.Sprintf("to %s (%s)", formatSize(x.CapacityBytes), x.Step))
			}
			usageRows(t, v)
			t.row("Capabilities", strings.Join(caps, ", "))
			t.row("Mount options", mount)
			t.row("Parameters", formatMap(v.Parameters))
			t.row("Context", formatMap(v.Context))
			if v.SecretsFrom != nil {
				t.row("Secrets from", v.SecretsFrom.File)
			}
			if len(v.MutableParameters) > 0 {
				t.row("Mutable parameters", formatMap(v.MutableParameters))
			}
			if len(v.Modifying) > 0 {
				t.row("Modifying", formatMap(v.Modifying))
			}
			if err := t.flush(); err != nil {
				return err
			}
			if err := writeClaims(e, "Claims", v.Claims); err != nil {
				return err
			}
			return writeClaims(e, "Past claims", v.PastClaims)
		}
	})
}

func writeClaims(e *env, title string, cs []runtime.Claim) error {
	if len(cs) == 0 {
		fmt.Fprintf(e.stdout, "\n%s: none\n", title)
		return nil
	}
	fmt.Fprintf(e.stdout, "\n%s\n", title)
	if hasHosts(cs) {
		return writeHostClaims(e, cs)
	}
	t := newTable(e.stdout, "ALLOC", "MODE", "ACCESS MODE", "ATTACHMENT", "STATE", "TARGET PATH", "LAST ERROR")
	for _, c := range cs {
		t.row(c.Alloc, c.Mode, c.AccessMode, c.AttachmentMode, claimState(c), orDash(c.TargetPath), orDash(c.LastError))
	}
	return t.flush()
}

// claimState is a claim's state, with its condition: "reserved (degraded:
// target path)" while it is repaired, "taken (stalled)" when it has not
// moved for volumes.stall_after.
func claimState(c runtime.Claim) string {
	switch {
	case c.Condition == "":
		return c.State
	case c.Repair == "":
		return c.State + " (" + c.Condition + ")"
	}
	return c.State + " (" + c.Condition + ": " + c.Repair + ")"
}

func formatMap(m map[string]string) string {
	if len(m) == 0 {
		return "-"
	}
	kv := make([]string, 0, len(m))
	for k, v := range m {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	return strings.Join(kv, ", ")
}

// listExternal prints every volume plugin's controller lists, page by page.
func listExternal(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, plugin, node string) error {
	switch {
	case plugin == "":
		return usagef("-external needs -plugin")
	case node != "":
		return usagef("-external lists a plugin's volumes; -node does not apply")
	}
	if err := checkID("-plugin", plugin); err != nil {
		return err
	}
	all := []runtime.ExternalVolume{}
	q := runtime.ExternalVolumesQuery{}
	for {
		page, err := cl.ListExternalVolumes(ctx, plugin, q)
		if err != nil {
			return err
		}
		all = append(all, page.Volumes...)
		if page.NextToken == "" {
			break
		}
		q.StartingToken = page.NextToken
	}
	if cf.json {
		return printJSON(e.stdout, all)
	}
	t := newTable(e.stdout, "EXTERNAL ID", "CAPACITY", "REGISTERED AS", "PUBLISHED TO")
	for _, v := range all {
		t.row(v.ExternalID, formatSize(v.CapacityBytes), orDash(v.RegisteredAs), orDash(strings.Join(v.PublishedNodeIDs, ", ")))
	}
	return t.flush()
}
