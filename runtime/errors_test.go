package runtime_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_Errors_Mapped checks that every failure of the actors below
// reaches the caller as the runtime sentinel the HTTP API maps to a status
// code, and that bad input names its field and changes nothing.
func TestRuntime_Errors_Mapped(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	down := e.attach("down-1", "downplugin", runtime.TypeMonolith, fullPlugin)
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")))
	must(e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer")))
	ghost := volSpec("single-node-writer")
	ghost.Plugin = "ghost"
	must(e.rt.RegisterVolume(ctx, "vol-ghost", ghost))
	downSpec := volSpec("single-node-writer")
	downSpec.Plugin = "downplugin"
	must(e.rt.RegisterVolume(ctx, "vol-down", downSpec))
	down.Kill()
	eventually(t, "downplugin unhealthy", func() (bool, error) {
		p, err := e.rt.Plugin(ctx, "downplugin")
		return err == nil && p.NodesHealthy == 0, err
	})
	before, err := e.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name  string
		call  func() error
		want  error
		field string // for ErrInvalid: the field the error names
	}{
		{"claim unknown volume", func() error {
			_, err := e.rt.Claim(ctx, "vol-nope", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrNotFound, ""},
		{"volume unknown", func() error { _, err := e.rt.Volume(ctx, "vol-nope"); return err }, runtime.ErrNotFound, ""},
		{"release unknown alloc", func() error { _, err := e.rt.Release(ctx, "vol-1", "alloc-9"); return err }, runtime.ErrNotFound, ""},
		{"release unknown volume", func() error { _, err := e.rt.Release(ctx, "vol-nope", "alloc-1"); return err }, runtime.ErrNotFound, ""},
		{"plugin unknown", func() error { _, err := e.rt.Plugin(ctx, "nope"); return err }, runtime.ErrNotFound, ""},
		{"deregister unknown allocation", func() error { return e.rt.DeregisterAllocation(ctx, "nope") }, runtime.ErrNotFound, ""},
		{"delete unknown volume", func() error { return e.rt.DeleteVolume(ctx, "vol-nope", false) }, runtime.ErrNotFound, ""},
		{"wait for unknown plugin", func() error { return e.rt.WaitHealthy(ctx, "nope", runtime.TypeNode) }, runtime.ErrNotFound, ""},

		{"claim over the limit", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-2", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrConflict, ""},
		{"deregister claimed volume", func() error { return e.rt.DeleteVolume(ctx, "vol-1", false) }, runtime.ErrConflict, ""},
		{"register volume again, other external id", func() error {
			s := volSpec("single-node-writer")
			s.ExternalID = "ext-2"
			_, err := e.rt.RegisterVolume(ctx, "vol-1", s)
			return err
		}, runtime.ErrInvalid, ""},
		{"update a claimed volume's context", func() error {
			s := volSpec("single-node-writer")
			s.Context = map[string]string{"share": "other"}
			_, err := e.rt.RegisterVolume(ctx, "vol-1", s)
			return err
		}, runtime.ErrConflict, ""},
		{"deregister the allocation claims depend on", func() error { return e.rt.DeregisterAllocation(ctx, "mono-1") }, runtime.ErrConflict, ""},
		{"register allocation again, other spec", func() error {
			_, err := e.rt.RegisterAllocation(ctx, "mono-1", runtime.AllocationSpec{Plugin: testPlugin, Type: runtime.TypeNode, Socket: "/tmp/other.sock"})
			return err
		}, runtime.ErrConflict, ""},

		{"claim, plugin unknown", func() error {
			_, err := e.rt.Claim(ctx, "vol-ghost", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrPluginUnavailable, ""},
		{"claim, plugin down", func() error {
			_, err := e.rt.Claim(ctx, "vol-down", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrPluginUnavailable, ""},
		{"create, plugin unknown", func() error {
			_, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol-new", VolumeSpec: runtime.VolumeSpec{Plugin: "ghost",
				Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}})
			return err
		}, runtime.ErrPluginUnavailable, ""},
		{"create, plugin down", func() error {
			_, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "vol-new", VolumeSpec: runtime.VolumeSpec{Plugin: "downplugin",
				Capabilities: []runtime.Capability{{AccessMode: "single-node-writer", AttachmentMode: "file-system"}}}})
			return err
		}, runtime.ErrPluginUnavailable, ""},

		{"claim, bad mode", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", "rw", "single-node-writer"))
			return err
		}, runtime.ErrInvalid, "mode"},
		{"claim, bad volume id", func() error {
			_, err := e.rt.Claim(ctx, "../x", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrInvalid, "volume"},
		{"claim, bad alloc", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("", runtime.ModeWrite, "single-node-writer"))
			return err
		}, runtime.ErrInvalid, "alloc"},
		{"claim, unknown access mode", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "everyone"))
			return err
		}, runtime.ErrInvalid, "access_mode"},
		{"claim, access mode the volume lacks", func() error {
			_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-3", runtime.ModeRead, "multi-node-reader-only"))
			return err
		}, runtime.ErrInvalid, ""},
		{"register volume, bad capability", func() error {
			s := volSpec("single-node-writer")
			s.Capabilities[0].AttachmentMode = "floppy"
			_, err := e.rt.RegisterVolume(ctx, "vol-2", s)
			return err
		}, runtime.ErrInvalid, "capabilities[0].attachment_mode"},
		{"register volume, no external id", func() error {
			s := volSpec("single-node-writer")
			s.ExternalID = ""
			_, err := e.rt.RegisterVolume(ctx, "vol-2", s)
			return err
		}, runtime.ErrInvalid, "external_id"},
		{"register allocation, relative socket", func() error {
			_, err := e.rt.RegisterAllocation(ctx, "node-2", runtime.AllocationSpec{Plugin: testPlugin, Type: runtime.TypeNode, Socket: "csi.sock"})
			return err
		}, runtime.ErrInvalid, "socket"},
		{"register allocation, bad type", func() error {
			_, err := e.rt.RegisterAllocation(ctx, "node-2", runtime.AllocationSpec{Plugin: testPlugin, Type: "both", Socket: "/tmp/x.sock"})
			return err
		}, runtime.ErrInvalid, "type"},
		{"list volumes, bad plugin", func() error { _, err := e.rt.Volumes(ctx, runtime.VolumeFilter{Plugin: "a/b"}); return err }, runtime.ErrInvalid, "plugin"},
		{"wait healthy, bad type", func() error { return e.rt.WaitHealthy(ctx, testPlugin, "both") }, runtime.ErrInvalid, "type"},
	}
	sentinels := []error{runtime.ErrInvalid, runtime.ErrNotFound, runtime.ErrConflict, runtime.ErrPluginUnavailable, runtime.ErrShutdown}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call()
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
			for _, s := range sentinels {
				if s != tt.want && errors.Is(err, s) {
					t.Errorf("error %q is also %v", err, s)
				}
			}
			if tt.field != "" {
				var fe *runtime.FieldError
				if !errors.As(err, &fe) || fe.Field != tt.field {
					t.Errorf("error %q: want a *FieldError naming %q", err, tt.field)
				}
			}
		})
	}

	after, err := e.rt.Volumes(ctx, runtime.VolumeFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("volumes after the failed calls: %d, before: %d", len(after), len(before))
	}
	for i := range after {
		if a, b := after[i], before[i]; a.ID != b.ID || a.ExternalID != b.ExternalID || len(a.Claims) != len(b.Claims) || len(a.PastClaims) != len(b.PastClaims) {
			t.Errorf("volume changed by failed calls: %+v, was %+v", a, b)
		}
	}
}

// TestRuntime_Errors_NoSecrets checks that neither a secret nor a mount
// flag reaches an error message or a listed volume.
func TestRuntime_Errors_NoSecrets(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	e.attach("mono-1", testPlugin, runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	s := volSpec("single-node-writer")
	s.Secrets = map[string]string{"password": "hunter2-secret"}
	s.MountOptions = &runtime.MountOptions{FSType: "ext4", MountFlags: []string{"key=flag-secret"}}
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", s); err != nil {
		t.Fatal(err)
	}
	s.ExternalID = "ext-other"
	_, err := e.rt.RegisterVolume(ctx, "vol-1", s)
	if !errors.Is(err, runtime.ErrInvalid) {
		t.Fatalf("register with another external ID = %v", err)
	}
	v, verr := e.rt.Volume(ctx, "vol-1")
	if verr != nil {
		t.Fatal(verr)
	}
	for _, text := range []string{err.Error(), strings.Join([]string{v.ID, v.ExternalID}, " "), toJSON(t, v)} {
		if strings.Contains(text, "hunter2") || strings.Contains(text, "flag-secret") {
			t.Errorf("secret shown: %s", text)
		}
	}
	if v.MountOptions == nil || v.MountOptions.MountFlagCount != 1 || v.MountOptions.FSType != "ext4" {
		t.Errorf("mount options shown as %+v, want ext4 with 1 redacted flag", v.MountOptions)
	}
}
