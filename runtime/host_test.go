package runtime_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

// symlinkEnv is a runtime with the host check on, its boot ID read from a
// file the test writes, and the example plugin served in this process in
// its symlink mode (a published volume is a link at the target path), as
// an attached monolith "example", with one write claim of alloc web1 on a
// created volume data1 holding a file.
type symlinkEnv struct {
	*testEnv
	bootFile   string
	dir        string
	stopPlugin func()
	sock       string
	target     string
}

func newSymlinkEnv(t *testing.T) *symlinkEnv {
	t.Helper()
	dir := shortDir(t, "csiactor-host-")
	s := &symlinkEnv{dir: dir, bootFile: filepath.Join(dir, "boot_id")}
	s.setBoot("boot-1")
	s.sock, s.stopPlugin = servePlugin(dir)
	t.Cleanup(func() { s.stopPlugin() })
	e := &testEnv{t: t, dataDir: filepath.Join(dir, "data")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Host = runtime.HostConfig{BootIDFile: s.bootFile}
	e.start()
	s.testEnv = e
	ctx := context.Background()
	if _, err := e.rt.RegisterAllocation(ctx, "example", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: s.sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	spec := runtime.CreateVolumeSpec{ID: "data1", VolumeSpec: runtime.VolumeSpec{Plugin: "example",
		Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}}
	if _, err := e.rt.CreateVolume(ctx, spec); err != nil {
		t.Fatal(err)
	}
	c, err := e.rt.Claim(ctx, "data1", claimReq("web1", runtime.ModeWrite, "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	s.target = c.TargetPath
	if err := os.WriteFile(filepath.Join(s.target, "hello.txt"), []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *symlinkEnv) setBoot(id string) {
	if err := os.WriteFile(s.bootFile, []byte(id+"\n"), 0o600); err != nil {
		panic(err)
	}
}

// checkData checks that the claim is published with its data visible.
func (s *symlinkEnv) checkData() {
	s.t.Helper()
	v, err := s.rt.Volume(context.Background(), "data1")
	if err != nil || len(v.Claims) != 1 || v.Claims[0].State != runtime.ClaimPublished || v.Claims[0].Condition != "" {
		s.t.Errorf("data1 = %+v, %v; want web1 published", v, err)
	}
	if b, err := os.ReadFile(filepath.Join(s.target, "hello.txt")); err != nil || string(b) != "hello" {
		s.t.Errorf("hello.txt through %s: %q, %v", s.target, b, err)
	}
}

// waitReady polls Ready until it says ok and returns the pending lists it
// saw before.
func (e *testEnv) waitReady() []string {
	e.t.Helper()
	var seen []string
	eventually(e.t, "the runtime ready", func() (bool, error) {
		r, err := e.rt.Ready(context.Background())
		if err != nil {
			return false, err
		}
		seen = append(seen, r.Pending...)
		return r.Status == runtime.ReadyOK, nil
	})
	return seen
}

func (e *testEnv) repairedEvents(alloc string) []runtime.Event {
	e.t.Helper()
	evs, err := e.rt.Events(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	var out []runtime.Event
	for _, ev := range evs {
		if ev.Type == runtime.EventClaimRepaired && ev.Alloc == alloc {
			out = append(out, ev)
		}
	}
	return out
}

// TestRuntime_Start_HostRebooted_RepublishesBeforeReady simulates a reboot
// (the target's link gone, the boot ID changed): once Ready says ok, the
// claim is published again with its data, the event names the reboot and
// the new boot ID is recorded.
func TestRuntime_Start_HostRebooted_RepublishesBeforeReady(t *testing.T) {
	s := newSymlinkEnv(t)
	s.waitReady()
	s.stop()
	if err := os.Remove(s.target); err != nil {
		t.Fatal(err)
	}
	s.setBoot("boot-2")
	s.start()
	s.waitReady()
	s.checkData()
	evs := s.repairedEvents("web1")
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "boot ID changed") {
		t.Errorf("claim-repaired events = %+v, want one naming the reboot", evs)
	}
	s.stop()
	st, err := persistence.Open(filepath.Join(s.dataDir, runtime.StoreFileName), persistence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if id, err := st.BootID(context.Background()); err != nil || id != "boot-2" {
		t.Errorf("stored boot ID = %q, %v; want boot-2", id, err)
	}
}

// TestRuntime_AllocationHealthyAgain_RepairsItsClaims restarts the plugin
// after its link went away: the claim is published again once the
// allocation is healthy again.
func TestRuntime_AllocationHealthyAgain_RepairsItsClaims(t *testing.T) {
	s := newSymlinkEnv(t)
	s.stopPlugin()
	eventually(t, "the allocation unhealthy", func() (bool, error) {
		p, err := s.rt.Plugin(context.Background(), "example")
		return err == nil && p.NodesHealthy == 0, err
	})
	if err := os.Remove(s.target); err != nil {
		t.Fatal(err)
	}
	s.sock, s.stopPlugin = servePlugin(s.dir)
	eventually(t, "the claim repaired", func() (bool, error) {
		return len(s.repairedEvents("web1")) == 1, nil
	})
	s.checkData()
	// A link gone; the staging was never a mount point (symlink mode),
	// so the mount table cannot show it lost: the target is published
	// again.
	if m := s.repairedEvents("web1")[0].Message; !strings.Contains(m, "target path was not mounted") {
		t.Errorf("claim-repaired message %q does not name the target path", m)
	}
}

// TestRuntime_Ready_PendingWhileARepairFails: a fake plugin mounts
// nothing, so after a restart with the mount check on, the claim is
// repaired; while its NodePublishVolume fails, Ready names it with its
// error and the claim shows degraded, never published.
func TestRuntime_Ready_PendingWhileARepairFails(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	e.waitReady()
	e.stop()
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Internal, Message: "disk on fire"})
	e.cfg.Host.SkipMountCheck = false
	e.start()
	var r runtime.Readiness
	eventually(t, "Ready to name the degraded repair", func() (bool, error) {
		var err error
		r, err = e.rt.Ready(ctx)
		return err == nil && len(r.Pending) == 1 && strings.Contains(r.Pending[0], "disk on fire"), err
	})
	// The fake plugin mounts nothing: the target is not mounted, and the
	// staging, never a mount point, is not checked.
	if r.Status != runtime.ReadyStarting || !strings.Contains(r.Pending[0], "volume vol-1: alloc alloc-1 degraded (target path)") {
		t.Errorf("Ready = %+v", r)
	}
	v, err := e.rt.Volume(ctx, "vol-1")
	if err != nil || len(v.Claims) != 1 {
		t.Fatal(v, err)
	}
	if c := v.Claims[0]; c.State == runtime.ClaimPublished || c.Condition != runtime.ClaimDegraded || c.Repair != "target path" || !strings.Contains(c.LastError, "disk on fire") {
		t.Errorf("claim while its repair fails = %+v", c)
	}
	p.ClearFaults()
	e.waitReady()
	if v, _ := e.rt.Volume(ctx, "vol-1"); v.Claims[0].State != runtime.ClaimPublished || v.Claims[0].Condition != "" {
		t.Errorf("claim after the repair = %+v", v.Claims[0])
	}
	// Ready latches: a later repair (a repeated claim finds the target
	// missing; the fake plugin mounts nothing) shows in the claim only.
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Internal, Message: "again"})
	calls := p.Calls("NodePublishVolume")
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	claimed := make(chan error, 1)
	go func() {
		_, err := e.rt.Claim(cctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
		claimed <- err
	}()
	eventually(t, "the repair's NodePublishVolume failed", func() (bool, error) { return p.Calls("NodePublishVolume") > calls, nil })
	if r, err := e.rt.Ready(ctx); err != nil || r.Status != runtime.ReadyOK {
		t.Errorf("Ready during a later repair = %+v, %v; want ok", r, err)
	}
	cancel()
	if err := <-claimed; err == nil {
		t.Error("repeated claim with its target missing and NodePublishVolume failing succeeded, want an error")
	}
	p.ClearFaults()
}
