package claim

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"github.com/csiactor/csiactor/internal/mountprobe/mountprobetest"
)

// probed is a BrokenView: view, with the paths of broken dead (their
// cause), as the volume manager's probed view is.
type probed struct {
	view
	broken map[string]string
}

func (v probed) Mounted(p string) bool  { return v.broken[p] == "" && v.view.Mounted(p) }
func (v probed) Broken(p string) string { return v.broken[p] }

// TestCheckHost_Broken: a mount point in the mount table but dead is
// repaired as a missing one, with the same RPCs, and the repair names the
// cause, which BrokenCause reads back.
func TestCheckHost_Broken(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	asOf, now := t0.Add(time.Second), t0.Add(2*time.Second)
	all := view{mounted: []string{"/s", "/t/a", "/t/b"}}
	lost := func(why string) string { return StateLost + "/" + why }
	for _, tt := range []struct {
		name     string
		broken   map[string]string
		want     map[string]string
		causes   map[string]string // by alloc: BrokenCause of its repair
		wantRPCs []string
	}{{
		name:     "target dead",
		broken:   map[string]string{"/t/b": mountprobe.CauseENOTCONN},
		want:     map[string]string{"a": "published/", "b": lost("target path broken (ENOTCONN)"), "c": "staged/", "d": "reserved/"},
		causes:   map[string]string{"a": "", "b": "ENOTCONN", "c": "", "d": ""},
		wantRPCs: []string{"b:NodeUnpublishVolume", "b:NodePublishVolume"},
	}, {
		name:   "staging dead",
		broken: map[string]string{"/s": mountprobe.CauseTimeout},
		want: map[string]string{"a": lost("staging path broken (timeout)"), "b": lost("staging path broken (timeout)"),
			"c": lost("staging path broken (timeout)"), "d": "reserved/"},
		causes: map[string]string{"a": "timeout", "b": "timeout", "c": "timeout", "d": ""},
		wantRPCs: []string{"a:NodeUnpublishVolume", "b:NodeUnpublishVolume", "c:NodeUnpublishVolume",
			"a:NodeUnstageVolume", "b:NodeStageVolume", "c:NodePublishVolume", "a:NodePublishVolume", "b:NodePublishVolume"},
	}, {
		name:   "staging and a target dead",
		broken: map[string]string{"/s": mountprobe.CauseEIO, "/t/a": mountprobe.CauseEIO},
		want: map[string]string{"a": lost("staging path and target path broken (EIO)"), "b": lost("staging path broken (EIO)"),
			"c": lost("staging path broken (EIO)"), "d": "reserved/"},
		causes: map[string]string{"a": "EIO", "b": "EIO", "c": "EIO", "d": ""},
		wantRPCs: []string{"a:NodeUnpublishVolume", "b:NodeUnpublishVolume", "c:NodeUnpublishVolume",
			"a:NodeUnstageVolume", "b:NodeStageVolume", "c:NodePublishVolume", "a:NodePublishVolume", "b:NodePublishVolume"},
	}} {
		t.Run(tt.name, func(t *testing.T) {
			v := hostVolume(t0)
			repaired, changed := CheckHost(v, probed{view: all, broken: tt.broken}, false, asOf, now)
			if !changed || len(repaired) == 0 {
				t.Fatalf("CheckHost = %v, %t; want claims sent back", repaired, changed)
			}
			if got := states(v); !maps.Equal(got, tt.want) {
				t.Errorf("claims = %v, want %v", got, tt.want)
			}
			causes := map[string]string{}
			for _, c := range v.Claims {
				causes[c.Alloc] = BrokenCause(c.Repair)
			}
			if !maps.Equal(causes, tt.causes) {
				t.Errorf("BrokenCause by alloc = %v, want %v", causes, tt.causes)
			}
			if got := replay(t, v, repaired, now); !slices.Equal(got, tt.wantRPCs) {
				t.Errorf("repair RPCs:\n got %q\nwant %q", got, tt.wantRPCs)
			}
		})
	}
}

func TestBrokenCause(t *testing.T) {
	for repair, want := range map[string]string{
		"":                              "",
		RepairTarget:                    "",
		RepairBootID:                    "",
		"target path broken (ENOTCONN)": "ENOTCONN",
		"staging path broken (timeout)": "timeout",
		"staging path and target path broken (ESTALE)": "ESTALE",
		"target path broken (":                         "",
	} {
		if got := BrokenCause(repair); got != want {
			t.Errorf("BrokenCause(%q) = %q, want %q", repair, got, want)
		}
	}
}

// TestRunner_Run_UnmountsDeadMount: a NodeUnpublishVolume or
// NodeUnstageVolume that the plugin fails on a mount the probe finds dead
// is helped: the agent unmounts the path itself (a real mount here) and
// sends the call again, which succeeds; Result.Unmounted names the cause.
// A failure on a mount that answers is left to the plugin: nothing is
// unmounted.
func TestRunner_Run_UnmountsDeadMount(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount")
	}
	for _, tt := range []struct {
		name, method string
		step         func(dir string) Step
	}{
		{"unpublish", "NodeUnpublishVolume", func(dir string) Step {
			return Step{Method: NodeUnpublish, Plugin: "p", Volume: "v", Alloc: "a", ExternalID: "v", TargetPath: filepath.Join(dir, "target")}
		}},
		{"unstage", "NodeUnstageVolume", func(dir string) Step {
			return Step{Method: NodeUnstage, Plugin: "p", Volume: "v", Alloc: "a", ExternalID: "v", StagingPath: filepath.Join(dir, "staging")}
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			plugin, plugins := dialFake(t, fakeplugin.Config{StageUnstage: true})
			dir := t.TempDir()
			s := tt.step(dir)
			path := s.TargetPath + s.StagingPath
			stat := mountprobetest.New()
			probe := mountprobe.New(mountprobe.Config{Timeout: time.Minute, Stat: stat.Stat})
			r := NewRunner(plugins, RunnerConfig{MountProbe: probe})
			mount := func() {
				t.Helper()
				if err := os.MkdirAll(path, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := syscall.Mount("tmpfs", path, "tmpfs", 0, "size=1m"); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = syscall.Unmount(path, syscall.MNT_DETACH) })
			}
			ctx := context.Background()

			// The mount answers: the plugin's failure stands.
			mount()
			plugin.SetFault(tt.method, fakeplugin.Fault{Code: codes.Internal, Message: "cannot unmount", Times: 1})
			if res := r.Run(ctx, s); res.OK() || res.Unmounted != "" || !mountinfo.IsMountPoint(path) {
				t.Errorf("failure on a live mount: %+v, mounted %t; want the failure, nothing unmounted", res, mountinfo.IsMountPoint(path))
			}

			// Dead: unmounted by the agent, the call sent again.
			stat.Set(path, syscall.ENOTCONN)
			before := plugin.Calls(tt.method)
			plugin.SetFault(tt.method, fakeplugin.Fault{Code: codes.Internal, Message: "cannot unmount", Times: 1})
			res := r.Run(ctx, s)
			if !res.OK() || res.Unmounted != mountprobe.CauseENOTCONN {
				t.Errorf("failure on a dead mount: %+v; want success after the agent's unmount, Unmounted ENOTCONN", res)
			}
			if mountinfo.IsMountPoint(path) {
				t.Errorf("%s is still mounted", path)
			}
			if n := plugin.Calls(tt.method) - before; n != 2 {
				t.Errorf("%s sent %d times, want 2 (failed, then again after the unmount)", tt.method, n)
			}
			if code := csi.Code(res.Err); code != codes.OK {
				t.Errorf("result error %v", res.Err)
			}
		})
	}
}
