package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/registration"
	"github.com/csiactor/csiactor/registration/registrartest"
	"github.com/csiactor/csiactor/runtime"
)

// driverName is the CSI driver the test registrars announce.
const driverName = "example.csi.csiactor.dev"

// newRegEnv returns a runtime (not started) that watches a fresh
// registration directory, and the directory.
func newRegEnv(t *testing.T) (*testEnv, string) {
	t.Helper()
	dir := shortDir(t, "csiactor-regdir-")
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Plugins.RegistrationDir = dir
	return e, dir
}

// csiRegistrar serves a registrar in dir that announces the CSI driver
// driverName at endpoint, as node-driver-registrar does.
func csiRegistrar(t *testing.T, dir, endpoint string, versions ...string) *registrartest.Registrar {
	t.Helper()
	if len(versions) == 0 {
		versions = []string{"1.0.0"}
	}
	return registrartest.Serve(t, filepath.Join(dir, driverName+"-reg.sock"), registration.PluginInfo{
		Type: registration.TypeCSIPlugin, Name: driverName, Endpoint: endpoint, SupportedVersions: versions,
	})
}

// allocation returns the allocation id, and whether there is one.
func (e *testEnv) allocation(id string) (runtime.Allocation, bool) {
	e.t.Helper()
	all, err := e.rt.Allocations(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range all {
		if a.ID == id {
			return a, true
		}
	}
	return runtime.Allocation{}, false
}

// waitDeregistered polls until there is no allocation id.
func (e *testEnv) waitDeregistered(id string) {
	e.t.Helper()
	eventually(e.t, "allocation "+id+" deregistered", func() (bool, error) {
		_, ok := e.allocation(id)
		return !ok, nil
	})
}

// awaitEvents waits until there are at least n recent events of type typ
// (events are recorded as the registry reports them, after the change a
// test may already see), and returns them.
func (e *testEnv) awaitEvents(typ string, n int) []runtime.Event {
	e.t.Helper()
	var evs []runtime.Event
	eventually(e.t, fmt.Sprintf("%d %s event(s)", n, typ), func() (bool, error) {
		evs = e.eventsOf(typ)
		return len(evs) >= n, nil
	})
	return evs
}

// eventsOf returns the recent events of type typ.
func (e *testEnv) eventsOf(typ string) []runtime.Event {
	e.t.Helper()
	evs, err := e.rt.Events(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []runtime.Event
	for _, ev := range evs {
		if ev.Type == typ {
			out = append(out, ev)
		}
	}
	return out
}

// TestRuntime_RegistrationDir_ExamplePlugin deploys the example plugin as
// a kubelet would find it: its node service on a socket, a registrar in
// the registration directory pointing at it. The controller side is the
// cluster's (here, the test calls CreateVolume and ControllerPublishVolume
// on the plugin, as external-provisioner and external-attacher would);
// the agent stages and publishes through the registered node allocation.
// As root, the example plugin bind-mounts, and the mount table shows it.
func TestRuntime_RegistrationDir_ExamplePlugin(t *testing.T) {
	e, dir := newRegEnv(t)
	root := os.Geteuid() == 0
	cfg := csiplugin.Config{NodeID: "node-1"}
	if root {
		cfg.MountMode = csiplugin.MountModeBind
		e.cfg.Host.SkipMountCheck = false
	}
	sock := serveExample(t, shortDir(t, "csiactor-ex-"), cfg)
	e.start()
	ctx := context.Background()

	reg := csiRegistrar(t, dir, sock)
	if st := reg.Status(t, waitLimit); !st.PluginRegistered || st.Error != "" {
		t.Fatalf("registrar told %+v, want registered", st)
	}
	e.waitAllocHealthy(driverName)
	a, _ := e.allocation(driverName)
	if a.Plugin != driverName || a.Type != runtime.TypeNode || a.Socket != sock || a.Source != runtime.SourceRegistration || a.NodeID != "node-1" {
		t.Fatalf("allocation = %+v, want an attached node allocation of %s at %s from the registration directory", a, driverName, sock)
	}
	if evs := e.awaitEvents(runtime.EventAllocationRegistered, 1); len(evs) != 1 || !strings.Contains(evs[0].Message, "from the registration directory") {
		t.Errorf("registered events = %+v", evs)
	}

	// The cluster side: provision the volume and attach it to this node.
	cl, err := csi.Dial(ctx, "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	capability := &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	cv, err := cl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: []*csipb.VolumeCapability{capability}})
	if err != nil {
		t.Fatal(err)
	}
	ext := cv.GetVolume().GetVolumeId()
	if _, err := cl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: ext, NodeId: "node-1", VolumeCapability: capability}); err != nil {
		t.Fatal(err)
	}

	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = driverName, ext
	if _, err := e.rt.RegisterVolume(ctx, "pv1", spec); err != nil {
		t.Fatal(err)
	}
	c, err := e.rt.Claim(ctx, "pv1", claimReq("web", "write", "single-node-writer"))
	if err != nil {
		t.Fatalf("claim through the registered driver: %s", err)
	}
	if c.State != runtime.ClaimPublished {
		t.Fatalf("claim = %+v", c)
	}
	if err := os.WriteFile(filepath.Join(c.TargetPath, "hello.txt"), []byte("hello"), 0o644); err != nil {
		t.Fatalf("write through the target path: %s", err)
	}
	if root && !mountinfo.IsMountPoint(c.TargetPath) {
		t.Errorf("target path %s is not a mount point", c.TargetPath)
	}
	if _, err := e.rt.Release(ctx, "pv1", "web"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("pv1", "web")
	if root && mountinfo.IsMountPoint(c.TargetPath) {
		t.Errorf("target path %s still mounted after the release", c.TargetPath)
	}

	// The registrar goes (its socket with it): so does the allocation.
	reg.Stop()
	e.waitDeregistered(driverName)
	if evs := e.awaitEvents(runtime.EventAllocationDeregistered, 1); len(evs) != 1 || evs[0].Alloc != driverName {
		t.Errorf("deregistered events = %+v", evs)
	}
}

func TestRuntime_RegistrationDir_Refused(t *testing.T) {
	e, dir := newRegEnv(t)
	e.start()
	ctx := context.Background()
	sock := serveExample(t, shortDir(t, "csiactor-ex-"), csiplugin.Config{})

	// A CSI 0.x driver.
	reg := csiRegistrar(t, dir, sock, "0.3.0")
	st := reg.Status(t, waitLimit)
	const oldCSI = `CSI driver "` + driverName + `" supports versions [0.3.0], none of them 1.x; csiactor speaks CSI 1.x`
	if st.PluginRegistered || st.Error != oldCSI {
		t.Fatalf("registrar told %+v, want refused: %s", st, oldCSI)
	}
	// A device plugin.
	dev := registrartest.Serve(t, filepath.Join(dir, "gpu.sock"), registration.PluginInfo{
		Type: registration.TypeDevicePlugin, Name: "vendor.com/gpu", SupportedVersions: []string{"v1beta1"}})
	if st := dev.Status(t, waitLimit); st.PluginRegistered || !strings.Contains(st.Error, `plugin type "DevicePlugin" is not supported`) {
		t.Fatalf("device registrar told %+v", st)
	}
	refusals := e.awaitEvents(runtime.EventRegistrationRefused, 2)
	if len(refusals) != 2 || refusals[0].Plugin != driverName || !strings.Contains(refusals[0].Message, oldCSI) {
		t.Errorf("registration-refused events = %+v", refusals)
	}
	if _, ok := e.allocation(driverName); ok {
		t.Fatal("a refused driver was registered")
	}

	// The driver's socket is an API allocation's already: refused, and
	// the API allocation is left alone.
	reg.Stop()
	if _, err := e.rt.RegisterAllocation(ctx, "manual", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	reg = csiRegistrar(t, dir, sock)
	if st := reg.Status(t, waitLimit); st.PluginRegistered || st.Error != `socket "`+sock+`" is already used by allocation "manual"` {
		t.Fatalf("registrar told %+v", st)
	}
	if a, ok := e.allocation("manual"); !ok || a.Source != "api" {
		t.Errorf("API allocation = %+v, %v", a, ok)
	}
	// An API allocation with the driver's name is not the directory's to
	// take over.
	reg.Stop()
	other := serveExample(t, shortDir(t, "csiactor-ex2-"), csiplugin.Config{})
	if _, err := e.rt.RegisterAllocation(ctx, driverName, runtime.AllocationSpec{Plugin: driverName, Type: runtime.TypeNode, Socket: other}); err != nil {
		t.Fatal(err)
	}
	other2 := serveExample(t, shortDir(t, "csiactor-ex3-"), csiplugin.Config{})
	reg = csiRegistrar(t, dir, other2)
	if st := reg.Status(t, waitLimit); st.PluginRegistered || st.Error != `allocation "`+driverName+`" was registered from the API; deregister it first` {
		t.Fatalf("registrar told %+v", st)
	}
	reg.Stop()
	if a, ok := e.allocation(driverName); !ok || a.Source != "api" || a.Socket != other {
		t.Errorf("API allocation after its name's registrar went = %+v, %v", a, ok)
	}
}

// TestRuntime_RegistrationDir_Restart: a registration socket present at
// start is registered; an agent restarted with it still there keeps the
// same allocation; one restarted after it went deregisters it; one
// restarted without registration_dir deregisters what it registered.
func TestRuntime_RegistrationDir_Restart(t *testing.T) {
	e, dir := newRegEnv(t)
	sock := serveExample(t, shortDir(t, "csiactor-ex-"), csiplugin.Config{})
	reg := csiRegistrar(t, dir, sock)
	e.start()
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("registrar told %+v", st)
	}
	e.waitAllocHealthy(driverName)

	e.stop()
	e.start()
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("after a restart, registrar told %+v", st)
	}
	e.waitAllocHealthy(driverName)
	if evs := e.awaitEvents(runtime.EventAllocationRegistered, 1); len(evs) != 1 || !strings.Contains(evs[0].Message, "restored (seq 1, from the registration directory)") {
		t.Errorf("after a restart, registered events = %+v; want the allocation restored, not registered anew", evs)
	}

	// The registrar goes while no agent runs.
	e.stop()
	reg.Stop()
	e.start()
	e.waitDeregistered(driverName)

	// Registered again, then the agent restarts without the directory.
	reg = csiRegistrar(t, dir, sock)
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("registrar told %+v", st)
	}
	e.waitAllocHealthy(driverName)
	e.stop()
	e.cfg.Plugins.RegistrationDir = ""
	e.start()
	if _, ok := e.allocation(driverName); ok {
		t.Error("an allocation of the registration directory stayed after plugins.registration_dir was unset")
	}
}

// TestRuntime_RegistrationDir_NewEndpoint: a driver registered again with
// another endpoint (its registrar redeployed) replaces its allocation.
func TestRuntime_RegistrationDir_NewEndpoint(t *testing.T) {
	e, dir := newRegEnv(t)
	e.start()
	first := serveExample(t, shortDir(t, "csiactor-ex-"), csiplugin.Config{})
	reg := csiRegistrar(t, dir, first)
	reg.Status(t, waitLimit)
	e.waitAllocHealthy(driverName)
	second := serveExample(t, shortDir(t, "csiactor-ex2-"), csiplugin.Config{})
	reg.Stop()
	// The new registrar comes before the old socket's removal is handled,
	// or after: the allocation follows it.
	reg = csiRegistrar(t, dir, second)
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("registrar told %+v", st)
	}
	eventually(t, "allocation on the new endpoint", func() (bool, error) {
		a, ok := e.allocation(driverName)
		return ok && a.Socket == second && a.Healthy, nil
	})
}

func TestConfig_RegistrationDir_Bad(t *testing.T) {
	dir := shortDir(t, "csiactor-regcfg-")
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ value, want string }{
		{"plugins_registry", `line 2: plugins.registration_dir: "plugins_registry" is not an absolute path`},
		{dir + "/missing", "line 2: plugins.registration_dir: " + dir + "/missing does not exist; create it, or point at the kubelet's registration directory"},
		{file, "line 2: plugins.registration_dir: " + file + " is not a directory"},
		{dir + "/./", `line 2: plugins.registration_dir: "` + dir + `/./" is not a clean path; write "` + dir + `"`},
	} {
		_, err := runtime.ParseConfig([]byte("plugins:\n  registration_dir: " + tc.value + "\n"))
		if err == nil || err.Error() != tc.want || !errors.Is(err, runtime.ErrInvalid) {
			t.Errorf("registration_dir %q: error %v, want %q", tc.value, err, tc.want)
		}
	}
	cfg, err := runtime.ParseConfig([]byte("plugins:\n  registration_dir: " + dir + "\n"))
	if err != nil || cfg.Plugins.RegistrationDir != dir {
		t.Errorf("a directory: %+v, %v", cfg.Plugins, err)
	}
	// runtime.New checks it too (an embedder's Config).
	c := testConfig(shortDir(t, "csiactor-rt-"))
	c.Plugins.RegistrationDir = file
	if _, err := runtime.New(c, runtime.Options{}); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Errorf("New with a file as registration_dir: %v", err)
	}
}
