package runtime_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
	"github.com/csiactor/csiactor/runtime"
)

const selinuxCtx = "system_u:object_r:container_file_t:s0:c1,c2"

// withSELinux makes the runtime of e see a host with SELinux (its
// HostConfig.SELinuxFile exists) or without (it does not).
func withSELinux(t *testing.T, on bool) func(*runtime.Config) {
	f := filepath.Join(t.TempDir(), "enforce")
	if on {
		if err := os.WriteFile(f, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return func(c *runtime.Config) { c.Host.SELinuxFile = f }
}

func newOptEnv(t *testing.T, cfgs ...func(*runtime.Config)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	for _, f := range cfgs {
		f(&e.cfg)
	}
	e.start()
	return e
}

func publishReq(t *testing.T, p *fakeplugin.Plugin) *csipb.NodePublishVolumeRequest {
	t.Helper()
	r, ok := p.LastRequest("NodePublishVolume").(*csipb.NodePublishVolumeRequest)
	if !ok {
		t.Fatal("no NodePublishVolume request")
	}
	return r
}

// TestRuntime_Claim_Options: read_only and mount_flags reach
// NodePublishVolume (the flags added to the volume's), are persisted and
// shown without the flags, and are part of the claim's identity.
func TestRuntime_Claim_Options(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	spec := volSpec("single-node-writer")
	spec.MountOptions = &runtime.MountOptions{MountFlags: []string{"vol-flag=1"}}
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", spec); err != nil {
		t.Fatal(err)
	}
	req := claimReq("a1", runtime.ModeWrite, "single-node-writer")
	req.ReadOnly, req.MountFlags = true, []string{"password=hunter2"}
	c, err := e.rt.Claim(ctx, "vol-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if !c.ReadOnly || c.MountFlagCount != 1 || c.State != runtime.ClaimPublished {
		t.Errorf("claim = %+v, want published, read_only, 1 mount flag", c)
	}
	pr := publishReq(t, p)
	if !pr.GetReadonly() || !slices.Equal(pr.GetVolumeCapability().GetMount().GetMountFlags(), []string{"vol-flag=1", "password=hunter2"}) {
		t.Errorf("NodePublishVolume readonly=%t flags=%v, want true and the volume's flag then the claim's", pr.GetReadonly(), pr.GetVolumeCapability().GetMount().GetMountFlags())
	}
	if sr, _ := p.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest); !slices.Equal(sr.GetVolumeCapability().GetMount().GetMountFlags(), []string{"vol-flag=1"}) {
		t.Errorf("NodeStageVolume flags = %v, want the volume's only", sr.GetVolumeCapability().GetMount().GetMountFlags())
	}
	v, err := e.rt.Volume(ctx, "vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if js := toJSON(t, v); strings.Contains(js, "hunter2") || !strings.Contains(js, `"mount_flag_count":1`) || !strings.Contains(js, `"read_only":true`) {
		t.Errorf("volume JSON = %s; want read_only, mount_flag_count and no flag", js)
	}
	if s := req.String() + req.GoString() + toJSON(t, req); strings.Contains(s, "hunter2") {
		t.Errorf("a printed claim request shows its mount flag: %s", s)
	}

	// Same request: same claim, no RPC. Other options: a conflict, no RPC.
	calls := p.Calls("NodePublishVolume")
	if c2, err := e.rt.Claim(ctx, "vol-1", req); err != nil || c2.TargetPath != c.TargetPath {
		t.Errorf("the same claim again = %+v, %v", c2, err)
	}
	for name, change := range map[string]func(r *runtime.ClaimRequest){
		"read_only true, not false": func(r *runtime.ClaimRequest) { r.ReadOnly = false },
		"other mount_flags":         func(r *runtime.ClaimRequest) { r.MountFlags = []string{"password=other"} },
	} {
		r := req
		change(&r)
		_, err := e.rt.Claim(ctx, "vol-1", r)
		if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "password=other") {
			t.Errorf("claim with %s: %v; want a conflict naming it and no flag", name, err)
		}
	}
	if n := p.Calls("NodePublishVolume"); n != calls {
		t.Errorf("NodePublishVolume calls %d, want %d: a refused or repeated claim sent an RPC", n, calls)
	}
	bad := req
	bad.Alloc, bad.MountFlags = "a2", []string{""}
	var fe *runtime.FieldError
	if _, err := e.rt.Claim(ctx, "vol-1", bad); !errors.As(err, &fe) || fe.Field != "mount_flags[0]" {
		t.Errorf("empty mount flag: %v, want a field error on mount_flags[0]", err)
	}

	// The record keeps the options, which a resume or repair publishes
	// with (TestAgent_ClaimOptions shows it on real mounts).
	e.stop()
	rec, flags := readClaim(t, e.dataDir, "vol-1", "a1")
	if !rec.ReadOnly || rec.MountFlagCount != 1 || flags != "password=hunter2" {
		t.Errorf("persisted claim = %+v with flags %q, want its options", rec, flags)
	}
	p.Stop()
}

// readClaim reads alloc's claim on vol from the stopped runtime's store,
// and its mount flags as the volume record keeps them.
func readClaim(t *testing.T, dataDir, vol, alloc string) (persistence.Claim, string) {
	t.Helper()
	st, err := persistence.Open(filepath.Join(dataDir, "state.db"), persistence.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	v, err := st.Volume(context.Background(), vol)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range v.Claims {
		if c.Alloc == alloc {
			return c, v.ClaimMountFlags[alloc]
		}
	}
	t.Fatalf("no claim of %s on %s", alloc, vol)
	return persistence.Claim{}, ""
}

// TestRuntime_Claim_MountGroup: with VOLUME_MOUNT_GROUP the group goes to
// NodeStageVolume and NodePublishVolume; a second claim with another group
// is a conflict naming both, and sends nothing.
func TestRuntime_Claim_MountGroup(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx := context.Background()
	e := newEnv(t)
	cfg := fullPlugin
	cfg.VolumeMountGroup = true
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, cfg)
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("multi-node-multi-writer")); err != nil {
		t.Fatal(err)
	}
	g := int64(4321)
	req := claimReq("a1", runtime.ModeWrite, "multi-node-multi-writer")
	req.MountGroup = &g
	c, err := e.rt.Claim(ctx, "vol-1", req)
	if err != nil {
		t.Fatal(err)
	}
	if c.MountGroup == nil || *c.MountGroup != 4321 {
		t.Errorf("claim = %+v, want mount_group 4321", c)
	}
	if got := publishReq(t, p).GetVolumeCapability().GetMount().GetVolumeMountGroup(); got != "4321" {
		t.Errorf("NodePublishVolume volume_mount_group = %q, want 4321", got)
	}
	if sr, _ := p.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest); sr.GetVolumeCapability().GetMount().GetVolumeMountGroup() != "4321" {
		t.Errorf("NodeStageVolume volume_mount_group = %q, want 4321", sr.GetVolumeCapability().GetMount().GetVolumeMountGroup())
	}
	calls := len(p.History())
	g2 := int64(99)
	r2 := claimReq("a2", runtime.ModeRead, "multi-node-multi-writer")
	r2.MountGroup = &g2
	if _, err := e.rt.Claim(ctx, "vol-1", r2); !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), "mount_group 4321") || !strings.Contains(err.Error(), "mount_group 99") {
		t.Errorf("claim with group 99: %v; want a conflict naming 4321 and 99", err)
	}
	if n := len(p.History()); n != calls {
		t.Errorf("the refused claim sent %d RPCs", n-calls)
	}
	// No group beside one: allowed.
	if _, err := e.rt.Claim(ctx, "vol-1", claimReq("a3", runtime.ModeRead, "multi-node-multi-writer")); err != nil {
		t.Errorf("claim without a group beside one with: %v", err)
	}
	blockReq := claimReq("a4", runtime.ModeRead, "multi-node-multi-writer")
	blockReq.AttachmentMode, blockReq.MountGroup = "block-device", &g
	var fe *runtime.FieldError
	if err := blockReq.Validate(); !errors.As(err, &fe) || fe.Field != "mount_group" {
		t.Errorf("mount_group on a block claim: %v, want a field error on mount_group", err)
	}
	e.stop()
	p.Stop()
}

// TestRuntime_Claim_SELinux: on a host with SELinux the context is the
// context="..." mount flag of NodeStageVolume and NodePublishVolume, and a
// claim with another context is a conflict naming both; on a host
// without, the claim is invalid, says so, and sends nothing.
func TestRuntime_Claim_SELinux(t *testing.T) {
	defer leakcheck.Check(t)()
	ctx := context.Background()
	t.Run("with SELinux", func(t *testing.T) {
		e := newOptEnv(t, withSELinux(t, true))
		p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
		if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("multi-node-multi-writer")); err != nil {
			t.Fatal(err)
		}
		req := claimReq("a1", runtime.ModeWrite, "multi-node-multi-writer")
		req.SELinuxContext = selinuxCtx
		c, err := e.rt.Claim(ctx, "vol-1", req)
		if err != nil {
			t.Fatal(err)
		}
		if c.SELinuxContext != selinuxCtx {
			t.Errorf("claim = %+v, want its context", c)
		}
		want := `context="` + selinuxCtx + `"`
		if f := publishReq(t, p).GetVolumeCapability().GetMount().GetMountFlags(); !slices.Equal(f, []string{want}) {
			t.Errorf("NodePublishVolume flags = %v, want [%s]", f, want)
		}
		if sr, _ := p.LastRequest("NodeStageVolume").(*csipb.NodeStageVolumeRequest); !slices.Equal(sr.GetVolumeCapability().GetMount().GetMountFlags(), []string{want}) {
			t.Errorf("NodeStageVolume flags = %v, want [%s]", sr.GetVolumeCapability().GetMount().GetMountFlags(), want)
		}
		calls := len(p.History())
		for _, other := range []string{"system_u:object_r:other_t:s0", ""} {
			r := claimReq("a2", runtime.ModeWrite, "multi-node-multi-writer")
			r.SELinuxContext = other
			_, err := e.rt.Claim(ctx, "vol-1", r)
			wantOther := `"` + other + `"`
			if other == "" {
				wantOther = "none"
			}
			if !errors.Is(err, runtime.ErrConflict) || !strings.Contains(err.Error(), `"`+selinuxCtx+`"`) || !strings.Contains(err.Error(), "asks for "+wantOther) {
				t.Errorf("claim with context %q: %v; want a conflict naming both", other, err)
			}
		}
		if n := len(p.History()); n != calls {
			t.Errorf("the refused claims sent %d RPCs", n-calls)
		}
		bad := claimReq("a3", runtime.ModeWrite, "multi-node-multi-writer")
		bad.SELinuxContext = `x:y:z" ,foo`
		var fe *runtime.FieldError
		if _, err := e.rt.Claim(ctx, "vol-1", bad); !errors.As(err, &fe) || fe.Field != "selinux_context" {
			t.Errorf("malformed context: %v, want a field error on selinux_context", err)
		}
		e.stop()
		p.Stop()
	})
	t.Run("without SELinux", func(t *testing.T) {
		e := newOptEnv(t, withSELinux(t, false))
		p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
		if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("multi-node-multi-writer")); err != nil {
			t.Fatal(err)
		}
		calls := len(p.History())
		req := claimReq("a1", runtime.ModeWrite, "multi-node-multi-writer")
		req.SELinuxContext = selinuxCtx
		_, err := e.rt.Claim(ctx, "vol-1", req)
		var fe *runtime.FieldError
		if !errors.Is(err, runtime.ErrInvalid) || !errors.As(err, &fe) || fe.Field != "selinux_context" || !strings.Contains(err.Error(), "no SELinux") {
			t.Errorf("claim with a context: %v; want invalid, saying the host has no SELinux", err)
		}
		if n := len(p.History()); n != calls {
			t.Errorf("the refused claim sent %d RPCs", n-calls)
		}
		if v, err := e.rt.Volume(ctx, "vol-1"); err != nil || len(v.Claims) != 0 {
			t.Errorf("volume after the refusal = %+v, %v; want no claim", v, err)
		}
		e.stop()
		p.Stop()
	})
}
