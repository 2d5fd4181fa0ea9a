package dockerplugin_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/internal/engines"
	"github.com/csiactor/csiactor/internal/etcdtest"
	"github.com/csiactor/csiactor/internal/hostpath"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// TestCluster_SingleWriterAcrossHosts: in cluster mode the drivers are
// global; a volume mounted for a writer on host A cannot be mounted on
// host B, nor removed there, and B's error names A.
func TestCluster_SingleWriterAcrossHosts(t *testing.T) {
	etcd := etcdtest.Start(t)
	onHost := func(node string) func(*runtime.Config) {
		return func(c *runtime.Config) {
			c.Cluster = &runtime.ClusterConfig{
				NodeID:   node,
				Etcd:     runtime.EtcdConfig{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 2 * time.Second},
				LeaseTTL: 5 * time.Second,
			}
		}
	}
	a := newRigWith(t, onHost("host-a"))
	b := newRigWith(t, onHost("host-b"))
	for _, r := range []*rig{a, b} {
		if got := r.ok("VolumeDriver.Capabilities", struct{}{})["Capabilities"].(map[string]any)["Scope"]; got != "global" {
			t.Errorf("scope = %v, want global in cluster mode", got)
		}
	}
	a.ok("VolumeDriver.Create", map[string]any{"Name": "shared", "Opts": map[string]string{"size": "1GiB"}})
	eventually(t, "the volume listed on host B", func() bool {
		out := b.ok("VolumeDriver.List", struct{}{})
		vs, _ := out["Volumes"].([]any)
		return len(vs) == 1 && vs[0].(map[string]any)["Name"] == "shared"
	})
	a.mount("shared", "m-a")

	status, out := b.call(testDriver, "VolumeDriver.Mount", map[string]string{"Name": "shared", "ID": "m-b"})
	msg, _ := out["Err"].(string)
	if status != http.StatusConflict || !strings.Contains(msg, "host-a") {
		t.Errorf("Mount on host B = %d %q, want 409 naming host-a", status, msg)
	}
	if b.claimed("shared", dockerplugin.AllocFor("m-b")) {
		t.Error("the refused Mount left a claim")
	}
	status, out = b.call(testDriver, "VolumeDriver.Remove", map[string]string{"Name": "shared"})
	if status != http.StatusConflict {
		t.Errorf("Remove on host B while mounted on A = %d %v, want 409", status, out)
	}
	if _, err := a.rt.Volume(context.Background(), "shared"); err != nil {
		t.Fatalf("the volume went: %v", err)
	}
	// Once A's container is gone, B mounts it.
	a.unmount("shared", "m-a")
	a.waitGone("shared", dockerplugin.AllocFor("m-a"))
	eventually(t, "host B sees the claim of host A gone", func() bool { return !b.claimed("shared", dockerplugin.AllocFor("m-a")) })
	mp := b.mount("shared", "m-b")
	if mp == "" {
		t.Fatal("no mount point on host B")
	}
	b.unmount("shared", "m-b")
	b.ok("VolumeDriver.Remove", map[string]string{"Name": "shared"})
	eventually(t, "the volume gone on host A", func() bool {
		_, err := a.rt.Volume(context.Background(), "shared")
		return err != nil
	})
}

// TestCluster_Engines_HostpathDriver is the cluster case with the real
// engines and the hostpath driver: two hosts, each an agent with its own
// hostpath driver and dockerd. A volume created with `docker volume
// create` on host A and used by a container there is listed by host B's
// dockerd, and B's `docker run` with it fails with an error naming host A
// (before any RPC: B's driver does not know A's node-local volume), as
// does B's `docker volume rm`. Both dockerds read the one plugin
// directory of this machine, so each host's driver has a name of its own.
func TestCluster_Engines_HostpathDriver(t *testing.T) {
	engines.Require(t)
	bin := hostpath.Binary(t)
	etcd := etcdtest.Start(t)
	suffix := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()%1e9)
	type host struct {
		rig    *rig
		driver string
		dk     *engines.Docker
		state  string
	}
	start := func(node string) *host {
		h := &host{driver: "csicl-" + node + "-" + suffix, state: shortDir(t, "csiactor-hp-")}
		h.dk = engines.StartDocker(t, engines.DockerOptions{})
		h.rig = newRigWith(t, func(c *runtime.Config) {
			c.Cluster = &runtime.ClusterConfig{
				NodeID:   node,
				Etcd:     runtime.EtcdConfig{Endpoints: []string{etcd.Endpoint()}, DialTimeout: 2 * time.Second},
				LeaseTTL: 5 * time.Second,
			}
			c.Host.SkipMountCheck = false
			c.Plugins.StopOnAgentExit = true
			c.Docker.PluginDir = runtime.DefaultDockerPluginDir
			c.Docker.Drivers = []runtime.DockerDriver{{Name: h.driver, Plugin: hostpath.PluginName}}
			c.Docker.Engines = []string{h.dk.Socket()}
			c.Docker.UnmountGrace = time.Nanosecond
		})
		// Closed before the agent stops, so that its containers'
		// Unmounts reach it.
		t.Cleanup(h.dk.Close)
		if _, err := h.rig.rt.RegisterAllocation(context.Background(), "hostpath-"+node, runtime.AllocationSpec{
			Plugin: hostpath.PluginName, Type: runtime.TypeMonolith, Command: hostpath.Command(bin, node, h.state),
		}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		if err := h.rig.rt.WaitHealthy(ctx, hostpath.PluginName, runtime.TypeMonolith); err != nil {
			t.Fatal(err)
		}
		return h
	}
	a, b := start("host-a"), start("host-b")
	ctx := context.Background()

	// A volume created on host A is node-local (its topology is host
	// A's): host B lists it, and its docker run says why it cannot have it.
	const local = "cllocal"
	a.dk.MustRun("volume", "create", "-d", a.driver, "-o", "size=1MiB", local)
	if out := b.dk.MustRun("volume", "ls", "-q", "-f", "driver="+b.driver); !strings.Contains(out, local) {
		t.Errorf("host B's dockerd does not list %s: %q", local, out)
	}
	if out, err := b.dk.Run("run", "--rm", "--network", "none", "--volume-driver", b.driver, "-v", local+":/data", engines.Image, "true"); err == nil || !strings.Contains(err.Error(), "topology") {
		t.Errorf("docker run of host A's node-local volume on host B = %q, %v; want a refusal naming the topology", out, err)
	}
	ext := a.rig.volume(local).ExternalID
	a.dk.MustRun("volume", "rm", local)
	// Its twin, registered with -o external-id, has no topology: host B
	// may use it, once no container on host A does.
	created, err := a.rig.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "clsrc", CapacityBytes: 1 << 20, VolumeSpec: runtime.VolumeSpec{
		Plugin: hostpath.PluginName, Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.rig.rt.DeleteVolume(ctx, "clsrc", false); err != nil { // deregistered, kept by the driver
		t.Fatal(err)
	}
	if created.ExternalID == ext {
		t.Fatalf("the deleted volume's ID came back: %s", ext)
	}
	const vol = "clvol"
	a.dk.MustRun("volume", "create", "-d", a.driver, "-o", "external-id="+created.ExternalID, vol)
	a.dk.MustRun("run", "-d", "--name", "c1", "--network", "none", "-v", vol+":/data", engines.Image, "sh", "-c", "echo on-a > /data/f; "+engines.Idle)
	eventually(t, "the container's claim published on host A", func() bool {
		v := a.rig.volume(vol)
		return len(v.Claims) == 1 && v.Claims[0].State == runtime.ClaimPublished
	})
	claim := a.rig.volume(vol).Claims[0]
	out, err := b.dk.Run("run", "--rm", "--network", "none", "--volume-driver", b.driver, "-v", vol+":/data", engines.Image, "cat", "/data/f")
	if err == nil || !strings.Contains(err.Error(), `host "host-a"`) || !strings.Contains(err.Error(), claim.Alloc) {
		t.Errorf("docker run on host B = %q, %v; want a refusal naming host-a and %s", out, err, claim.Alloc)
	}
	if _, err := b.dk.Run("volume", "rm", vol); err == nil {
		t.Error("docker volume rm on host B succeeded while the volume is mounted on host A")
	}
	a.rig.volume(vol) // still there
	if st, err := hostpath.ReadState(b.state); err != nil || len(st.Volumes) != 0 {
		t.Errorf("host B's driver was asked for a volume: %+v, %v", st, err)
	}
	var want hostpath.Want
	want.Add(created.ExternalID, []persistence.Claim{{State: claim.State, TargetPath: claim.TargetPath,
		StagingPath: hostpathStaging(t, a.state, created.ExternalID), ControllerRequired: true}})
	if d := hostpath.Diff(a.state, a.rig.cfg.DataDir, want); len(d) > 0 {
		t.Errorf("host A's driver and mount table disagree with its claim:\n  %s", strings.Join(d, "\n  "))
	}

	// On host A: the container's data, then its end, then the volume's.
	if out := a.dk.MustRun("exec", "c1", "cat", "/data/f"); out != "on-a\n" {
		t.Errorf("the container on host A reads %q", out)
	}
	a.dk.MustRun("rm", "-f", "c1")
	eventually(t, "the claim gone on host A", func() bool { return !a.rig.claimed(vol, claim.Alloc) })
	a.dk.MustRun("volume", "rm", vol)
	eventually(t, "the volume gone on host B", func() bool {
		_, err := b.rig.rt.Volume(context.Background(), vol)
		return errors.Is(err, runtime.ErrNotFound)
	})
	if d := hostpath.Diff(a.state, a.rig.cfg.DataDir, hostpath.Want{}); len(d) > 0 {
		t.Errorf("host A's driver and mount table disagree with its claims (none):\n  %s", strings.Join(d, "\n  "))
	}
}

// hostpathStaging is the staging path the driver in stateDir records for
// its volume ext.
func hostpathStaging(t *testing.T, stateDir, ext string) string {
	t.Helper()
	st, err := hostpath.ReadState(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range st.Volumes {
		if v.VolID == ext && len(v.Staged) == 1 {
			return v.Staged[0]
		}
	}
	t.Fatalf("the driver records no staging of %s: %+v", ext, st)
	return ""
}
