package runtime_test

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// A plugin's own final answer reaches the API caller as the status it
// means: its volume does not exist (404), the request is bad (400), the
// state forbids it (409). Other final codes stay server errors (no
// sentinel). Nothing is left registered by a failed create.
func TestRuntime_Errors_PluginCodes(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t)
	p := e.attach("mono-1", testPlugin, runtime.TypeMonolith, fullPlugin)
	e.waitHealthy(testPlugin, runtime.TypeNode)

	sentinels := []error{runtime.ErrInvalid, runtime.ErrNotFound, runtime.ErrConflict, runtime.ErrPluginUnavailable, runtime.ErrShutdown}
	tests := []struct {
		code codes.Code
		want error // nil: none of the sentinels
	}{
		{codes.InvalidArgument, runtime.ErrInvalid},
		{codes.OutOfRange, runtime.ErrInvalid},
		{codes.AlreadyExists, runtime.ErrConflict},
		{codes.NotFound, runtime.ErrNotFound},
		{codes.PermissionDenied, nil},
		{codes.Internal, nil},
	}
	for _, tt := range tests {
		t.Run("create "+tt.code.String(), func(t *testing.T) {
			p.SetFault("CreateVolume", fakeplugin.Fault{Code: tt.code, Message: "refused by the plugin"})
			defer p.ClearFaults()
			spec := runtime.CreateVolumeSpec{ID: "new-vol", VolumeSpec: volSpec("single-node-writer")}
			spec.ExternalID = ""
			_, err := e.rt.CreateVolume(ctx, spec)
			if err == nil {
				t.Fatal("CreateVolume succeeded despite the fault")
			}
			for _, s := range sentinels {
				if got, want := errors.Is(err, s), s == tt.want; got != want {
					t.Errorf("errors.Is(%q, %v) = %v, want %v", err, s, got, want)
				}
			}
			if _, err := e.rt.Volume(ctx, "new-vol"); !errors.Is(err, runtime.ErrNotFound) {
				t.Errorf("volume after a failed create: %v, want not found", err)
			}
		})
	}

	// A claim whose NodePublishVolume the plugin refuses as NotFound fails
	// as not found (and is torn down).
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}
	p.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.NotFound, Message: "no such volume"})
	_, err := e.rt.Claim(ctx, "vol-1", claimReq("alloc-1", runtime.ModeWrite, "single-node-writer"))
	if !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("claim refused with NotFound by the plugin: %v, want ErrNotFound", err)
	}
	p.ClearFaults()
	e.waitFreed("vol-1", "alloc-1")
}
