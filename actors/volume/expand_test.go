package volume

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// expandPlugin expands online on the controller, then on the node.
var expandPlugin = fakeplugin.Config{
	ControllerPublish: true, CreateDelete: true, StageUnstage: true,
	ControllerExpand: true, NodeExpand: true, NodeExpansionRequired: true,
}

const gib = int64(1) << 30

func TestManager_Expand_ControllerThenNodeOnPublishedClaim(t *testing.T) {
	var events []Event
	e := newEnv(t, expandPlugin, withConfig(func(c *Config) { c.OnEvent = func(ev Event) { events = append(events, ev) } }))
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
		Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
		t.Fatal(err)
	}
	c, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Expand(ctx, "vol1", 2*gib)
	if err != nil {
		t.Fatalf("Expand: %s", err)
	}
	if v.CapacityBytes != 2*gib || v.Expansion != nil {
		t.Errorf("expanded volume = capacity %d, expansion %+v; want %d and none", v.CapacityBytes, v.Expansion, 2*gib)
	}
	if got := e.plugin.Volumes()["vol-vol1"].CapacityBytes; got != 2*gib {
		t.Errorf("plugin's capacity = %d, want %d", got, 2*gib)
	}
	if got := e.plugin.NodeExpanded()[c.TargetPath]; got != 2*gib {
		t.Errorf("NodeExpandVolume at %s = %d, want %d (calls %v)", c.TargetPath, got, 2*gib, e.plugin.NodeExpanded())
	}
	stored, err := e.store.Volume(ctx, "vol1")
	if err != nil || stored.CapacityBytes != 2*gib || stored.Expansion != nil {
		t.Errorf("stored = capacity %d, expansion %+v, %v", stored.CapacityBytes, stored.Expansion, err)
	}
	// The same capacity again is done already: no RPC.
	calls := e.plugin.Calls("ControllerExpandVolume")
	if v, err := e.m.Expand(ctx, "vol1", 2*gib); err != nil || v.CapacityBytes != 2*gib || e.plugin.Calls("ControllerExpandVolume") != calls {
		t.Errorf("repeated Expand = %d, %v (%d calls)", v.CapacityBytes, err, e.plugin.Calls("ControllerExpandVolume")-calls)
	}
	var types []string
	for _, ev := range events {
		if ev.Type == EventVolumeExpanding || ev.Type == EventVolumeExpanded {
			types = append(types, ev.Type+": "+ev.Message)
		}
	}
	want := []string{
		"volume-expanding: expanding from 1073741824 to 2147483648 bytes",
		"volume-expanded: expanded to 2147483648 bytes",
	}
	if len(types) != len(want) || types[0] != want[0] || types[1] != want[1] {
		t.Errorf("events = %q, want %q", types, want)
	}
}

func TestManager_Expand_NodeOnlyPlugin(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{StageUnstage: true, NodeExpand: true})
	e.register("vol1")
	ctx := ctxT(t)
	c, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil {
		t.Fatal(err)
	}
	v, err := e.m.Expand(ctx, "vol1", 3*gib)
	if err != nil || v.CapacityBytes != 3*gib {
		t.Fatalf("Expand = %d, %v", v.CapacityBytes, err)
	}
	if e.plugin.NodeExpanded()[c.TargetPath] != 3*gib || e.plugin.Calls("ControllerExpandVolume") != 0 {
		t.Errorf("node expansions %v, controller calls %d", e.plugin.NodeExpanded(), e.plugin.Calls("ControllerExpandVolume"))
	}
}

func TestManager_Expand_BadRequestsChangeNothing(t *testing.T) {
	ctx := ctxT(t)
	create := func(e *env) {
		t.Helper()
		if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: 2 * gib,
			Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name     string
		plugin   fakeplugin.Config
		claimed  bool
		capacity int64
		want     error
		msg      string
	}{
		{"shrink", expandPlugin, false, gib, ErrInvalid, `capacity_bytes 1073741824 is less than volume "vol1"'s 2147483648 bytes`},
		{"zero", expandPlugin, false, 0, ErrInvalid, "capacity_bytes must be positive"},
		{"no capability", fullPlugin, false, 3 * gib, ErrInvalid, "has no EXPAND_VOLUME capability"},
		{"offline while claimed", func() fakeplugin.Config { c := expandPlugin; c.OfflineExpansion = true; return c }(),
			true, 3 * gib, ErrConflict, "expands volumes only offline (EXPANSION_OFFLINE)"},
		{"unknown volume", expandPlugin, false, 3 * gib, ErrNotFound, `volume "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.plugin)
			create(e)
			if tt.claimed {
				if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
					t.Fatal(err)
				}
			}
			id := "vol1"
			if tt.want == ErrNotFound {
				id = "nope"
			}
			before, _ := e.store.Volume(ctx, "vol1")
			_, err := e.m.Expand(ctx, id, tt.capacity)
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("Expand = %v, want %v naming %q", err, tt.want, tt.msg)
			}
			after, _ := e.store.Volume(ctx, "vol1")
			if after.Revision != before.Revision || e.plugin.Calls("ControllerExpandVolume")+e.plugin.Calls("NodeExpandVolume") != 0 {
				t.Errorf("a refused expansion changed something: revision %d → %d, %d expand calls",
					before.Revision, after.Revision, e.plugin.Calls("ControllerExpandVolume")+e.plugin.Calls("NodeExpandVolume"))
			}
		})
	}
}

func TestManager_Expand_Classified(t *testing.T) {
	ctx := ctxT(t)
	tests := []struct {
		code  codes.Code
		final bool
	}{
		{codes.Unavailable, false}, {codes.DeadlineExceeded, false}, {codes.Aborted, false},
		{codes.ResourceExhausted, false}, {codes.FailedPrecondition, false},
		{codes.OutOfRange, true}, {codes.InvalidArgument, true}, {codes.NotFound, true}, {codes.Internal, true},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			e := newEnv(t, expandPlugin)
			if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
				Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
				t.Fatal(err)
			}
			e.plugin.SetFault("ControllerExpandVolume", fakeplugin.Fault{Code: tt.code, Times: 1})
			v, err := e.m.Expand(ctx, "vol1", 2*gib)
			stored, serr := e.store.Volume(ctx, "vol1")
			if serr != nil {
				t.Fatal(serr)
			}
			if tt.final {
				if !errors.Is(err, ErrPluginCall) || csi.Code(err) != tt.code {
					t.Fatalf("Expand = %v, want ErrPluginCall with %s", err, tt.code)
				}
				if stored.CapacityBytes != gib || stored.Expansion != nil || e.plugin.Calls("ControllerExpandVolume") != 1 {
					t.Errorf("after a final failure: capacity %d, expansion %+v, %d calls", stored.CapacityBytes, stored.Expansion, e.plugin.Calls("ControllerExpandVolume"))
				}
				return
			}
			if err != nil || v.CapacityBytes != 2*gib || e.plugin.Calls("ControllerExpandVolume") != 2 {
				t.Fatalf("Expand after one %s = %d, %v (%d calls); want retried and done", tt.code, v.CapacityBytes, err, e.plugin.Calls("ControllerExpandVolume"))
			}
		})
	}
}

// expandCrashPoints are the persisted points of an expansion.
var expandCrashPoints = []string{
	"persist:expand", "persisted:expand",
	"persist:expand-controller", "persisted:expand-controller",
	"persist:expand-node", "persisted:expand-node",
}

func TestManager_Crash_ExpansionResumes(t *testing.T) {
	for _, point := range expandCrashPoints {
		t.Run(point, func(t *testing.T) {
			c := &crash{point: point}
			e := newEnv(t, expandPlugin, withHook(c.hook))
			ctx := ctxT(t)
			if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
				Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
				t.Fatal(err)
			}
			cl, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
			if err != nil {
				t.Fatal(err)
			}
			// The crash loses the answer; Expand sends the request again
			// to the restarted actor, which resumed (or never recorded)
			// the expansion.
			v, err := e.m.Expand(ctx, "vol1", 2*gib)
			if err != nil || v.CapacityBytes != 2*gib {
				t.Fatalf("Expand = %d, %v", v.CapacityBytes, err)
			}
			if c.fired.Load() == 0 {
				t.Fatalf("crash point %s never reached", point)
			}
			waitFor(t, "expansion done", func() bool {
				s, err := e.store.Volume(ctx, "vol1")
				return err == nil && s.Expansion == nil && s.CapacityBytes == 2*gib
			})
			if e.plugin.NodeExpanded()[cl.TargetPath] != 2*gib {
				t.Errorf("node expansions %v", e.plugin.NodeExpanded())
			}
			// And the volume still works: release tears down cleanly.
			if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
				t.Fatal(err)
			}
			e.waitFreed("vol1")
			e.checkClean()
		})
	}
}

func TestManager_Restart_ResumesExpansion(t *testing.T) {
	e := newEnv(t, expandPlugin)
	ctx := ctxT(t)
	if _, err := e.m.Create(ctx, Spec{ID: "vol1", Plugin: testPlugin, CapacityBytes: gib,
		Capabilities: []csi.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter)}}); err != nil {
		t.Fatal(err)
	}
	// The plugin hangs: the expansion is recorded, its RPC never answers
	// before the manager shuts down.
	e.plugin.SetFault("ControllerExpandVolume", fakeplugin.Fault{Hang: true, Times: 1})
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := e.m.Expand(short, "vol1", 2*gib); done <- err }()
	waitFor(t, "expansion recorded", func() bool {
		s, err := e.store.Volume(ctx, "vol1")
		return err == nil && s.Expansion != nil && e.plugin.Calls("ControllerExpandVolume") == 1
	})
	cancel()
	<-done
	e.restart()
	// The actor writes the store, then shows the record to Get: wait for
	// both.
	waitFor(t, "expansion resumed after restart", func() bool {
		s, err := e.store.Volume(ctx, "vol1")
		got, gerr := e.m.Get(ctx, "vol1")
		return err == nil && s.Expansion == nil && s.CapacityBytes == 2*gib &&
			gerr == nil && got.Expansion == nil && got.CapacityBytes == 2*gib
	})
}
