package volume

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// modifyPlugin modifies volumes and accepts the mutable parameters iops
// and throughput.
var modifyPlugin = fakeplugin.Config{
	ControllerPublish: true, CreateDelete: true, StageUnstage: true,
	ControllerModify: true, AcceptedMutableParameters: []string{"iops", "throughput"},
}

func (e *env) createModifiable(ctx context.Context) {
	e.t.Helper()
	if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
		Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
		e.t.Fatal(err)
	}
}

func TestManager_Modify_MergesAndShows(t *testing.T) {
	var events []Event
	e := newEnv(t, modifyPlugin, withConfig(func(c *Config) { c.OnEvent = func(ev Event) { events = append(events, ev) } }))
	ctx := ctxT(t)
	e.createModifiable(ctx)
	// Claimed: a modification does not wait for the claims.
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Modify(ctx, "vol1", map[string]string{"iops": "3000"}); err != nil {
		t.Fatalf("Modify: %s", err)
	}
	v, err := e.m.Modify(ctx, "vol1", map[string]string{"throughput": "125"})
	if err != nil {
		t.Fatalf("second Modify: %s", err)
	}
	want := map[string]string{"iops": "3000", "throughput": "125"}
	if !maps.Equal(v.MutableParameters, want) || len(v.Modifying) != 0 {
		t.Errorf("modified volume = mutable %v, modifying %v; want %v and none", v.MutableParameters, v.Modifying, want)
	}
	if got := e.plugin.Volumes()["vol-vol1"].MutableParameters; !maps.Equal(got, want) {
		t.Errorf("plugin's mutable parameters = %v, want %v", got, want)
	}
	stored, err := e.store.Volume(ctx, "vol1")
	if err != nil || !maps.Equal(stored.MutableParameters, want) || len(stored.Modifying) != 0 {
		t.Errorf("stored = mutable %v, modifying %v, %v", stored.MutableParameters, stored.Modifying, err)
	}
	if g, err := e.m.Get(ctx, "vol1"); err != nil || !maps.Equal(g.MutableParameters, want) {
		t.Errorf("Get = %v, %v", g.MutableParameters, err)
	}
	// Parameters the volume has already: no RPC.
	calls := e.plugin.Calls("ControllerModifyVolume")
	if _, err := e.m.Modify(ctx, "vol1", map[string]string{"iops": "3000"}); err != nil || e.plugin.Calls("ControllerModifyVolume") != calls {
		t.Errorf("repeated Modify = %v (%d calls)", err, e.plugin.Calls("ControllerModifyVolume")-calls)
	}
	var got []string
	for _, ev := range events {
		if strings.HasPrefix(ev.Type, "volume-modif") {
			got = append(got, ev.Type+": "+ev.Message)
		}
	}
	wantEv := []string{
		"volume-modifying: modifying mutable parameters iops", "volume-modified: modified mutable parameters iops",
		"volume-modifying: modifying mutable parameters throughput", "volume-modified: modified mutable parameters throughput",
	}
	if strings.Join(got, "|") != strings.Join(wantEv, "|") {
		t.Errorf("events = %q, want %q", got, wantEv)
	}
}

func TestManager_Modify_RefusalsChangeNothing(t *testing.T) {
	ctx := ctxT(t)
	tests := []struct {
		name   string
		plugin fakeplugin.Config
		id     string
		params map[string]string
		want   error
		msg    string
		calls  int
	}{
		{"empty", modifyPlugin, "vol1", map[string]string{}, ErrInvalid, "mutable_parameters is empty", 0},
		{"empty name", modifyPlugin, "vol1", map[string]string{"": "1"}, ErrInvalid, "a parameter name is empty", 0},
		{"no capability", fullPlugin, "vol1", map[string]string{"iops": "1"}, ErrInvalid, "MODIFY_VOLUME", 0},
		{"unknown volume", modifyPlugin, "nope", map[string]string{"iops": "1"}, ErrNotFound, `volume "nope"`, 0},
		{"refused parameter", modifyPlugin, "vol1", map[string]string{"iops": "1", "color": "blue"}, ErrPluginCall, `mutable parameter "color" is not supported`, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.plugin)
			e.createModifiable(ctx)
			before, _ := e.store.Volume(ctx, "vol1")
			_, err := e.m.Modify(ctx, tt.id, tt.params)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Modify = %v, want %v naming %q", err, tt.want, tt.msg)
			}
			if tt.want == ErrPluginCall && csi.Code(err) != codes.InvalidArgument {
				t.Errorf("refusal code = %s, want InvalidArgument", csi.Code(err))
			}
			after, _ := e.store.Volume(ctx, "vol1")
			if len(after.MutableParameters)+len(after.Modifying) != 0 || e.plugin.Calls("ControllerModifyVolume") != tt.calls {
				t.Errorf("after the refusal: mutable %v, modifying %v, %d calls (want %d)",
					after.MutableParameters, after.Modifying, e.plugin.Calls("ControllerModifyVolume"), tt.calls)
			}
			if tt.calls == 0 && after.Revision != before.Revision {
				t.Errorf("a refused modification wrote the record: revision %d → %d", before.Revision, after.Revision)
			}
			if got := e.plugin.Volumes()["vol-vol1"].MutableParameters; len(got) != 0 {
				t.Errorf("plugin's mutable parameters = %v, want none", got)
			}
		})
	}
}

func TestManager_Modify_RetriesTransientFailures(t *testing.T) {
	e := newEnv(t, modifyPlugin)
	ctx := ctxT(t)
	e.createModifiable(ctx)
	e.plugin.SetFault("ControllerModifyVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	v, err := e.m.Modify(ctx, "vol1", map[string]string{"iops": "5"})
	if err != nil || v.MutableParameters["iops"] != "5" || e.plugin.Calls("ControllerModifyVolume") != 2 {
		t.Fatalf("Modify after one Unavailable = %v, %v (%d calls); want retried and done", v.MutableParameters, err, e.plugin.Calls("ControllerModifyVolume"))
	}
}

// modifyCrashPoints are the persisted points of a modification.
var modifyCrashPoints = []string{"persist:modify", "persisted:modify", "persist:modified", "persisted:modified"}

func TestManager_Crash_ModificationResumes(t *testing.T) {
	for _, point := range modifyCrashPoints {
		t.Run(point, func(t *testing.T) {
			c := &crash{point: point}
			e := newEnv(t, modifyPlugin, withHook(c.hook))
			ctx := ctxT(t)
			e.createModifiable(ctx)
			// The crash loses the answer; Modify sends the request again
			// to the restarted actor, which resumed (or never recorded)
			// the modification.
			v, err := e.m.Modify(ctx, "vol1", map[string]string{"iops": "7"})
			if err != nil || v.MutableParameters["iops"] != "7" {
				t.Fatalf("Modify = %v, %v", v.MutableParameters, err)
			}
			if c.fired.Load() == 0 {
				t.Fatalf("crash point %s never reached", point)
			}
			waitFor(t, "modification done", func() bool {
				s, err := e.store.Volume(ctx, "vol1")
				return err == nil && len(s.Modifying) == 0 && s.MutableParameters["iops"] == "7"
			})
			if got := e.plugin.Volumes()["vol-vol1"].MutableParameters["iops"]; got != "7" {
				t.Errorf("plugin's iops = %q", got)
			}
		})
	}
}

func TestManager_Restart_ResumesModification(t *testing.T) {
	e := newEnv(t, modifyPlugin)
	ctx := ctxT(t)
	e.createModifiable(ctx)
	// The plugin hangs: the modification is recorded, its RPC never
	// answers before the manager shuts down.
	e.plugin.SetFault("ControllerModifyVolume", fakeplugin.Fault{Hang: true, Times: 1})
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := e.m.Modify(short, "vol1", map[string]string{"iops": "9"}); done <- err }()
	waitFor(t, "modification recorded", func() bool {
		s, err := e.store.Volume(ctx, "vol1")
		return err == nil && s.Modifying["iops"] == "9" && e.plugin.Calls("ControllerModifyVolume") == 1
	})
	// Another modification meanwhile is a conflict naming the one in
	// progress.
	if _, err := e.m.Modify(ctx, "vol1", map[string]string{"iops": "10"}); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "iops") {
		t.Errorf("concurrent Modify = %v, want ErrConflict naming iops", err)
	}
	cancel()
	<-done
	e.restart()
	waitFor(t, "modification resumed after restart", func() bool {
		s, err := e.store.Volume(ctx, "vol1")
		got, gerr := e.m.Get(ctx, "vol1")
		return err == nil && len(s.Modifying) == 0 && s.MutableParameters["iops"] == "9" &&
			gerr == nil && got.MutableParameters["iops"] == "9"
	})
	if got := e.plugin.Volumes()["vol-vol1"].MutableParameters["iops"]; got != "9" {
		t.Errorf("plugin's iops = %q", got)
	}
}
