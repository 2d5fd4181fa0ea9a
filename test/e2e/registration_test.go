package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
	"github.com/csiactor/csiactor/registration"
	"github.com/csiactor/csiactor/registration/registrartest"
	"github.com/csiactor/csiactor/runtime"
)

// TestAgent_RegistrationDir runs a CSI driver as a Kubernetes node would:
// the example plugin as its own process, a registrar beside it (here in
// the test, serving the kubelet's registration API as node-driver-registrar
// does) in the directory plugins.registration_dir names. The agent
// registers it, a volume is claimed and published through it, the agent
// restarts and keeps it, and it goes with its registrar.
func TestAgent_RegistrationDir(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test")
	}
	h := newHost(t)
	regDir := filepath.Join(h.base, "reg")
	pluginDir := filepath.Join(h.base, "drv")
	for _, d := range []string{regDir, pluginDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.pluginsExtra = "  registration_dir: " + regDir + "\n"
	h.writeConfig("")

	sock := filepath.Join(pluginDir, "csi.sock")
	plugin := exec.Command(h.bin, "example-plugin", "-endpoint", "unix://"+sock, "-state-dir", h.stateDir, "-node-id", "e2e-node")
	plugin.Env = cleanEnv()
	plugin.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if _, err := testbin.Start(t, plugin, nil); err != nil {
		t.Fatal(err)
	}
	const driver = "example.csi.csiactor.dev"
	info := registration.PluginInfo{Type: registration.TypeCSIPlugin, Name: driver, Endpoint: sock, SupportedVersions: []string{"1.0.0"}}
	regSock := filepath.Join(regDir, driver+"-reg.sock")
	reg := registrartest.Serve(t, regSock, info)

	a := h.startAgent()
	if st := reg.Status(t, readyDeadline); !st.PluginRegistered {
		t.Fatalf("registrar told %+v", st)
	}
	allocs := func() []runtime.Allocation {
		var as []runtime.Allocation
		if err := json.Unmarshal([]byte(h.ok("alloc", "list", "-json")), &as); err != nil {
			t.Fatal(err)
		}
		return as
	}
	h.eventually("the driver's allocation healthy", readyDeadline, func() (bool, string) {
		as := allocs()
		return len(as) == 1 && as[0].ID == driver && as[0].Healthy, h.ok("alloc", "list")
	})
	if out := h.ok("alloc", "list"); !strings.Contains(out, "SOURCE") || !strings.Contains(out, " node  registration ") {
		t.Errorf("alloc list:\n%s", out)
	}

	// The cluster's side: provision, and attach to this node.
	ctx := context.Background()
	cl, err := csi.Dial(ctx, "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	capability := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	cv, err := cl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-e2e", VolumeCapabilities: []*csipb.VolumeCapability{capability}})
	if err != nil {
		t.Fatal(err)
	}
	ext := cv.GetVolume().GetVolumeId()
	if _, err := cl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: ext, NodeId: "e2e-node", VolumeCapability: capability}); err != nil {
		t.Fatal(err)
	}
	h.ok("volume", "register", "-plugin", driver, "-external-id", ext, "-capability", "single-node-writer", "pv1")
	target := strings.TrimSpace(h.ok("volume", "claim", "-alloc", "web", "-mode", "write", "-access-mode", "single-node-writer", "pv1"))
	if err := os.WriteFile(filepath.Join(target, "hello.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatalf("write through the target path: %v", err)
	}
	if isRoot() && !mountinfo.IsMountPoint(target) {
		t.Errorf("target %s is not a mount point", target)
	}

	// A restart with the registrar still there keeps the allocation and
	// the claim.
	a.signal(syscall.SIGTERM)
	a.wait(shutdownDeadline)
	a.checkNoRace()
	a = h.startAgent()
	if st := reg.Status(t, readyDeadline); !st.PluginRegistered {
		t.Fatalf("after a restart, registrar told %+v", st)
	}
	h.eventually("the driver's allocation healthy again", readyDeadline, func() (bool, string) {
		as := allocs()
		return len(as) == 1 && as[0].ID == driver && as[0].Healthy && as[0].Source == runtime.SourceRegistration, h.ok("alloc", "list")
	})
	if c, ok := claimOf(h.volume("pv1"), "web"); !ok || c.State != runtime.ClaimPublished || c.TargetPath != target {
		t.Errorf("after a restart, claim = %+v, %v", c, ok)
	}
	h.ok("volume", "release", "-alloc", "web", "pv1")
	h.eventually("the claim freed", settleDeadline, func() (bool, string) {
		v := h.volume("pv1")
		return len(v.Claims)+len(v.PastClaims) == 0, describe(v)
	})

	// The registrar exits: its socket goes, and the allocation with it.
	reg.Stop()
	h.eventually("the driver's allocation deregistered", readyDeadline, func() (bool, string) {
		return len(allocs()) == 0, h.ok("alloc", "list")
	})
	if !hasEvent(h.events(), runtime.EventAllocationDeregistered, driver, "") {
		t.Error("no allocation-deregistered event")
	}
	a.signal(syscall.SIGTERM)
	a.wait(shutdownDeadline)
	a.checkNoRace()
}
