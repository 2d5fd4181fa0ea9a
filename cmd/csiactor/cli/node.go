package cli

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/runtime"
)

func nodeCommand() *command {
	return &command{
		name:    "node",
		summary: "list the hosts of the agent's cluster, or show one (cluster mode)",
		usage:   "csiactor node list|status|fence [flags] [NODE]",
		subs: []*command{
			clientLeaf(&command{
				name:    "list",
				summary: "list the hosts of the cluster with their status and claims",
				usage:   "csiactor node list [flags]",
				help: `Lists every host that joined the agent's cluster (GET /v1/nodes). STATUS is
up while the host's etcd lease is alive, down once it expired; a down host's
claims stay, and block other writers, until they are released.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantArgs(args); err != nil {
						return err
					}
					ns, err := cl.Nodes(ctx)
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, ns)
					}
					t := newTable(e.stdout, "NODE", "STATUS", "LAST SEEN", "CLAIMS")
					for _, n := range ns {
						t.row(nodeName(n), n.Status, lastSeen(n.LastSeen), fmt.Sprint(n.Claims))
					}
					return t.flush()
				}
			}),
			clientLeaf(&command{
				name:    "status",
				summary: "show one host of the cluster",
				usage:   "csiactor node status [flags] NODE",
				help:    `Shows the host NODE of the agent's cluster (GET /v1/nodes/NODE).`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantID(args, "NODE"); err != nil {
						return err
					}
					n, err := cl.Node(ctx, args[0])
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, n)
					}
					t := newTable(e.stdout)
					t.row("Node", nodeName(n))
					t.row("Status", n.Status)
					t.row("Started", n.StartedAt.Local().Format(time.RFC3339))
					t.row("Last seen", lastSeen(n.LastSeen))
					t.row("Claims", fmt.Sprint(n.Claims))
					return t.flush()
				}
			}),
			clientLeaf(&command{
				name:    "fence",
				summary: "take the claims of a down host away from it",
				usage:   "csiactor node fence [flags] NODE",
				help: `Fences the down host NODE (POST /v1/nodes/NODE/fence): for each of its claims
that went through ControllerPublishVolume, a controller of the volume's plugin
(the agent's, or without a healthy one there, the plugin's controller leader in
the cluster) unpublishes the volume from NODE's node ID; then the claims are
removed from the cluster, so other hosts can claim the volumes. NODE releases
them locally when it is back. Refused while NODE's lease is alive.`,
			}, func(fs *flag.FlagSet) func(context.Context, *env, *api.Client, *clientFlags, []string) error {
				return func(ctx context.Context, e *env, cl *api.Client, cf *clientFlags, args []string) error {
					if err := wantID(args, "NODE"); err != nil {
						return err
					}
					res, err := cl.FenceNode(ctx, args[0])
					if err != nil {
						return err
					}
					if cf.json {
						return printJSON(e.stdout, res)
					}
					if len(res.Claims) == 0 {
						fmt.Fprintf(e.stdout, "Node %s fenced: it held no claims\n", res.Node)
						return nil
					}
					fmt.Fprintf(e.stdout, "Node %s fenced\n\n", res.Node)
					t := newTable(e.stdout, "VOLUME", "ALLOC", "MODE", "CONTROLLER UNPUBLISHED")
					for _, c := range res.Claims {
						t.row(c.Volume, c.Alloc, c.Mode, yesNo(c.ControllerUnpublished))
					}
					return t.flush()
				}
			}),
		},
	}
}

// nodeName is the node's ID, marked when it is the agent's own host.
func nodeName(n runtime.Node) string {
	if n.Self {
		return n.ID + " (this agent)"
	}
	return n.ID
}

// lastSeen is a time as "2026-11-24T20:00:00Z (3s ago)".
func lastSeen(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return fmt.Sprintf("%s (%s ago)", t.Local().Format(time.RFC3339), time.Since(t).Round(time.Second))
}

// hasHosts reports whether the claims come from a cluster (they name their
// host).
func hasHosts(cs []runtime.Claim) bool {
	for _, c := range cs {
		if c.Host != "" {
			return true
		}
	}
	return false
}

// writeHostClaims is writeClaims's table with each claim's host first.
func writeHostClaims(e *env, cs []runtime.Claim) error {
	t := newTable(e.stdout, "HOST", "ALLOC", "MODE", "ACCESS MODE", "ATTACHMENT", "STATE", "TARGET PATH", "LAST ERROR")
	for _, c := range cs {
		t.row(c.Host, c.Alloc, c.Mode, c.AccessMode, c.AttachmentMode, claimState(c), orDash(c.TargetPath), orDash(c.LastError))
	}
	return t.flush()
}
