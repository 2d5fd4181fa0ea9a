package runtime_test

import (
	"context"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// serveAPI serves the runtime's HTTP API on a real unix socket and returns
// a client of it; both end with the test.
func serveAPI(t *testing.T, rt *runtime.Runtime) *api.Client {
	t.Helper()
	sock := filepath.Join(shortDir(t, "csiactor-api-"), "api.sock")
	l, err := api.ListenUnix(sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: api.NewHandler(rt, api.Options{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(l)
	}()
	c, err := api.NewClient("unix://" + sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		srv.Close()
		<-done
	})
	return c
}

func TestRuntime_Plugin_Capabilities(t *testing.T) {
	e := newEnv(t)
	e.attach("mono", "caps", runtime.TypeMonolith, fakeplugin.Config{
		ControllerPublish: true, CreateDelete: true, StageUnstage: true,
		Topology: map[string]string{"zone": "z1"}, MaxVolumesPerNode: 3,
	})
	e.attach("ctrl", "caps", runtime.TypeController, fakeplugin.Config{CreateDelete: true})
	c := serveAPI(t, e.rt)
	p, err := c.Plugin(context.Background(), "caps")
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]runtime.Allocation{}
	for _, a := range p.Allocations {
		byID[a.ID] = a
	}
	mono := byID["mono"].Capabilities
	if mono == nil {
		t.Fatalf("mono has no capabilities: %+v", byID["mono"])
	}
	if !slices.Equal(mono.Plugin, []string{"CONTROLLER_SERVICE", "VOLUME_ACCESSIBILITY_CONSTRAINTS"}) ||
		!slices.Contains(mono.Controller, "CREATE_DELETE_VOLUME") || !slices.Contains(mono.Controller, "PUBLISH_UNPUBLISH_VOLUME") ||
		!slices.Equal(mono.Node, []string{"STAGE_UNSTAGE_VOLUME"}) ||
		mono.Topology["zone"] != "z1" || mono.MaxVolumesPerNode != 3 {
		t.Errorf("mono capabilities = %+v", mono)
	}
	ctrl := byID["ctrl"].Capabilities
	if ctrl == nil || !slices.Contains(ctrl.Controller, "CREATE_DELETE_VOLUME") || ctrl.Node != nil || ctrl.Topology != nil {
		t.Errorf("ctrl capabilities = %+v", ctrl)
	}
}
