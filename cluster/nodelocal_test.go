package cluster_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// hostpathAgent is an agent of a test cluster whose plugin is its own
// hostpath driver (node-local storage), an exec-managed monolith that
// the agent stops when it stops.
type hostpathAgent struct {
	*agent
	stateDir string
}

func startHostpathAgent(t *testing.T, node, endpoint, bin string) *hostpathAgent {
	t.Helper()
	return startHostpathAgentWith(t, node, clusterConfig(t, node, endpoint), bin)
}

// startHostpathAgentWith is startHostpathAgent with cfg (no cluster for a
// local agent).
func startHostpathAgentWith(t *testing.T, node string, cfg runtime.Config, bin string) *hostpathAgent {
	t.Helper()
	cfg.Plugins.StopOnAgentExit = true
	cfg.Host.SkipMountCheck = false // real mounts: the mount table is checked
	a := &hostpathAgent{agent: &agent{t: t, node: node, cfg: cfg}, stateDir: shortDir(t, "csiactor-hp-")}
	a.start()
	if _, err := a.rt.RegisterAllocation(context.Background(), "hostpath-"+node, runtime.AllocationSpec{
		Plugin: hostpath.PluginName, Type: runtime.TypeMonolith, Command: hostpath.Command(bin, node, a.stateDir),
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.rt.WaitHealthy(ctx, hostpath.PluginName, runtime.TypeMonolith); err != nil {
		t.Fatal(err)
	}
	return a
}

// settled checks that a's driver (state.json) and mount table hold
// exactly what want owns.
func (a *hostpathAgent) settled(what string, want hostpath.Want) {
	a.t.Helper()
	if d := hostpath.Diff(a.stateDir, a.cfg.DataDir, want); len(d) > 0 {
		a.t.Errorf("%s: %s's driver and mount table disagree with its claims:\n  %s", what, a.node, strings.Join(d, "\n  "))
	}
}

// hostpathCluster starts an etcd server and two agents on it, na and nb,
// each with its own hostpath driver, and creates volume vol (single-node
// writer, 1 MiB) on na. It returns the agents, the created volume and its
// capabilities. It skips t where the driver is not available.
func hostpathCluster(t *testing.T, vol string) (srv *etcdtest.Server, a, b *hostpathAgent, created runtime.Volume, caps []runtime.Capability) {
	t.Helper()
	bin := hostpath.Binary(t)
	t.Cleanup(leakcheck.Check(t)) // last: after the agents and the server stopped
	srv = etcdtest.Start(t)
	a = startHostpathAgent(t, "na", srv.Endpoint(), bin)
	b = startHostpathAgent(t, "nb", srv.Endpoint(), bin)
	caps = []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}
	created, err := a.rt.CreateVolume(context.Background(), runtime.CreateVolumeSpec{ID: vol, CapacityBytes: 1 << 20,
		VolumeSpec: runtime.VolumeSpec{Plugin: hostpath.PluginName, Capabilities: caps}})
	if err != nil {
		t.Fatal(err)
	}
	return srv, a, b, created, caps
}

// TestCluster_NodeLocalStorage: two agents share one etcd, each with its
// own hostpath driver, which knows only the volumes created through it. A
// volume created on one host is listed and shown on the other at once,
// whatever that host's driver knows; its updates (definition, capacity)
// reach the other host; it can be claimed where it lives, and a claim on
// the other host is refused before any RPC, naming the volume's topology
// and the host's. Each driver and mount table end with what the claims
// own.
func TestCluster_NodeLocalStorage(t *testing.T) {
	const vol, am = "local-disk", "single-node-writer"
	_, a, b, created, caps := hostpathCluster(t, vol)
	ctx := context.Background()
	topoA := map[string]string{"topology.hostpath.csi/node": "na"}
	if len(created.AccessibleTopology) != 1 || !maps.Equal(created.AccessibleTopology[0], topoA) {
		t.Fatalf("created volume's accessible topology = %v, want [%v]", created.AccessibleTopology, topoA)
	}

	// Visible on B, though B's driver does not know it.
	b.waitVolume(vol)
	vb, err := b.rt.Volume(ctx, vol)
	if err != nil {
		t.Fatal(err)
	}
	if vb.ExternalID != created.ExternalID || vb.CapacityBytes != created.CapacityBytes ||
		len(vb.AccessibleTopology) != 1 || !maps.Equal(vb.AccessibleTopology[0], topoA) {
		t.Errorf("volume on nb = external_id %q capacity %d topology %v; want %q, %d, [%v] as on na",
			vb.ExternalID, vb.CapacityBytes, vb.AccessibleTopology, created.ExternalID, created.CapacityBytes, topoA)
	}
	addrB := serveAPI(t, b.rt)
	cl, err := api.NewClient(addrB)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if vs, err := cl.Volumes(ctx, runtime.VolumeFilter{}); err != nil || len(vs) != 1 || vs[0].ID != vol {
		t.Errorf("GET /v1/volumes on nb = %+v, %v; want %s", vs, err, vol)
	}
	if out := runCLI(t, "volume", "list", "-address", addrB); !strings.Contains(out, vol) {
		t.Errorf("volume list on nb lacks %s:\n%s", vol, out)
	}
	if out := runCLI(t, "volume", "status", "-address", addrB, vol); !strings.Contains(out, created.ExternalID) {
		t.Errorf("volume status on nb lacks the external ID %s:\n%s", created.ExternalID, out)
	}

	// An update on A reaches B: the definition, then the capacity.
	update := runtime.VolumeSpec{Plugin: hostpath.PluginName, ExternalID: created.ExternalID, Capabilities: caps,
		Context: created.Context, Parameters: map[string]string{"label": "v2"}}
	if _, err := a.rt.RegisterVolume(ctx, vol, update); err != nil {
		t.Fatalf("update on na: %v", err)
	}
	eventually(t, "the update on nb", func() (bool, error) {
		v, err := cl.Volume(ctx, vol)
		return v.Parameters["label"] == "v2", err
	})
	expanded, err := a.rt.ExpandVolume(ctx, vol, runtime.ExpandRequest{CapacityBytes: 2 << 20})
	if err != nil {
		t.Fatalf("expand on na: %v", err)
	}
	eventually(t, "the expansion on nb", func() (bool, error) {
		v, err := b.rt.Volume(ctx, vol)
		return v.CapacityBytes == expanded.CapacityBytes, err
	})

	// A claim where the volume lives works.
	c, err := a.rt.Claim(ctx, vol, claimReq("app-a", "write", am))
	if err != nil {
		t.Fatalf("claim on na: %v", err)
	}
	var want hostpath.Want
	capability := csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}
	want.Add(created.ExternalID, []persistence.Claim{{State: c.State, TargetPath: c.TargetPath, ControllerRequired: true,
		StagingPath: claim.StagingPath(a.cfg.DataDir, hostpath.PluginName, vol, claim.Usage(claim.ModeWrite, capability))}})
	a.settled("claimed on na", want)
	b.settled("claimed on na", hostpath.Want{})

	// While it is claimed, no host changes what the claim depends on;
	// the refusal names the claim and its host.
	update.Parameters = map[string]string{"label": "v3"}
	_, err = b.rt.RegisterVolume(ctx, vol, update)
	if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), `alloc "app-a" on host "na"`) ||
		!strings.Contains(err.Error(), "parameters") {
		t.Errorf("update on nb while na holds a claim = %v, want ErrConflict naming the claim, its host and parameters", err)
	}

	// A claim on B is refused before any RPC, naming both topologies.
	_, err = b.rt.Claim(ctx, vol, claimReq("app-b", "write", am))
	if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), "{topology.hostpath.csi/node=na}") ||
		!strings.Contains(err.Error(), "{topology.hostpath.csi/node=nb}") {
		t.Fatalf("claim on nb = %v, want ErrConflict naming the volume's topology (na) and nb's", err)
	}
	t.Log(err)
	b.settled("claim refused on nb", hostpath.Want{})

	if _, err := a.rt.Release(ctx, vol, "app-a"); err != nil {
		t.Fatal(err)
	}
	a.waitFreed(vol, "app-a")
	a.settled("released on na", hostpath.Want{})
	b.settled("released on na", hostpath.Want{})

	// Deleted from A (through its driver): gone everywhere.
	if err := a.rt.DeleteVolume(ctx, vol, true); err != nil {
		t.Fatal(err)
	}
	eventually(t, "volume gone on nb", func() (bool, error) {
		_, err := b.rt.Volume(ctx, vol)
		return errors.Is(err, runtime.ErrNotFound), nil
	})
}

// TestCluster_LegacyCreatedDefinitionCompleted: a created volume shared
// before definitions carried what the plugin said of it (its context,
// capacity and accessible topology) is completed by the host that created
// it, so that neither that host's record loses them nor the other hosts'
// lack them.
func TestCluster_LegacyCreatedDefinitionCompleted(t *testing.T) {
	const vol = "legacy"
	srv, a, b, created, _ := hostpathCluster(t, vol)
	ctx := context.Background()
	b.waitVolume(vol)
	// The form an earlier agent wrote: the spec the caller gave, with the
	// plugin's external ID only.
	legacy := `{"id":"` + vol + `","spec":{"plugin":"` + hostpath.PluginName + `","external_id":"` + created.ExternalID +
		`","capabilities":[{"access_mode":"single-node-writer","attachment_mode":"file-system"}]}}`
	cli := directClient(t, srv.Endpoint())
	if _, err := cli.Put(ctx, runtime.DefaultClusterPrefix+"/volumes/"+vol, legacy); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the definition completed in etcd", func() (bool, error) {
		resp, err := cli.Get(ctx, runtime.DefaultClusterPrefix+"/volumes/"+vol)
		if err != nil || len(resp.Kvs) == 0 {
			return false, err
		}
		def := string(resp.Kvs[0].Value)
		return strings.Contains(def, `"created":true`) && strings.Contains(def, `"topology.hostpath.csi/node":"na"`), nil
	})
	for _, h := range []*hostpathAgent{a, b} {
		eventually(t, "the completed definition on "+h.node, func() (bool, error) {
			v, err := h.rt.Volume(ctx, vol)
			return len(v.AccessibleTopology) == 1 && v.AccessibleTopology[0]["topology.hostpath.csi/node"] == "na" &&
				v.CapacityBytes == created.CapacityBytes, err
		})
	}
}
