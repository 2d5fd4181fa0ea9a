package runtime_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

func wantAPIError(t *testing.T, what string, err error, status int, msg string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != status || !strings.Contains(ae.Message, msg) {
		t.Errorf("%s = %v, want %d naming %q", what, err, status, msg)
	}
}

func TestRuntime_PluginCapacity_FakePlugin(t *testing.T) {
	e := newEnv(t)
	const gib = int64(1) << 30
	p := e.attach("ctl", "cap", runtime.TypeController, fakeplugin.Config{CreateDelete: true, GetCapacity: true, Capacity: 10 * gib})
	e.attach("plain", "plain", runtime.TypeController, fakeplugin.Config{CreateDelete: true})
	c := serveAPI(t, e.rt)
	ctx := context.Background()

	got, err := c.PluginCapacity(ctx, "cap", runtime.CapacityQuery{Topology: map[string]string{"zone": "a"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.AvailableCapacityBytes != 10*gib || got.Alloc != "ctl" || got.Topology["zone"] != "a" ||
		got.MaximumVolumeSizeBytes == nil || *got.MaximumVolumeSizeBytes != 10*gib || got.MinimumVolumeSizeBytes != nil {
		t.Errorf("capacity = %+v", got)
	}
	if req, ok := p.LastRequest("GetCapacity").(*csipb.GetCapacityRequest); !ok || req.GetAccessibleTopology().GetSegments()["zone"] != "a" {
		t.Errorf("GetCapacity request = %v, want the topology zone=a", p.LastRequest("GetCapacity"))
	}
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "cap", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v1", VolumeSpec: spec, CapacityBytes: 4 * gib}); err != nil {
		t.Fatal(err)
	}
	if got, err := c.PluginCapacity(ctx, "cap", runtime.CapacityQuery{}); err != nil || got.AvailableCapacityBytes != 6*gib {
		t.Errorf("capacity after a 4 GiB volume = %+v, %v", got, err)
	}

	_, err = c.PluginCapacity(ctx, "plain", runtime.CapacityQuery{})
	wantAPIError(t, "capacity of a plugin without GET_CAPACITY", err, http.StatusBadRequest, "plugin plain: its controller (allocation plain) has no GET_CAPACITY capability")
	_, err = c.PluginCapacity(ctx, "nope", runtime.CapacityQuery{})
	wantAPIError(t, "capacity of an unknown plugin", err, http.StatusNotFound, "nope")
	p.SetFault("GetCapacity", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	_, err = c.PluginCapacity(ctx, "cap", runtime.CapacityQuery{})
	wantAPIError(t, "capacity while the plugin is unavailable", err, http.StatusServiceUnavailable, "GetCapacity")
	p.SetFault("GetCapacity", fakeplugin.Fault{Code: codes.InvalidArgument, Message: "bad topology", Times: 1})
	_, err = c.PluginCapacity(ctx, "cap", runtime.CapacityQuery{})
	wantAPIError(t, "capacity refused by the plugin", err, http.StatusBadRequest, "bad topology")
}

func TestRuntime_ListExternalVolumes_ExamplePlugin(t *testing.T) {
	e := newEnv(t)
	sock, stop := servePlugin(shortDir(t, "csiactor-ex-"))
	t.Cleanup(stop)
	ctx := context.Background()
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	ids := map[string]string{} // external ID → volume ID
	for _, id := range []string{"a", "b", "c"} {
		v, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: id, VolumeSpec: spec, CapacityBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		ids[v.ExternalID] = id
	}
	// "c" is deregistered: the plugin still has it, this agent no longer.
	if err := c.DeleteVolume(ctx, "c", false); err != nil {
		t.Fatal(err)
	}
	var all []runtime.ExternalVolume
	q := runtime.ExternalVolumesQuery{MaxEntries: 2}
	pages := 0
	for {
		page, err := c.ListExternalVolumes(ctx, "example", q)
		if err != nil {
			t.Fatal(err)
		}
		pages++
		all = append(all, page.Volumes...)
		if page.NextToken == "" {
			break
		}
		q.StartingToken = page.NextToken
	}
	if pages != 2 || len(all) != 3 {
		t.Fatalf("%d pages, volumes %+v; want 2 pages of 3 volumes", pages, all)
	}
	for _, v := range all {
		want := ids[v.ExternalID]
		if want == "c" {
			want = ""
		}
		if v.RegisteredAs != want || v.CapacityBytes != 1<<20 {
			t.Errorf("volume %s: registered as %q, capacity %d; want %q, %d", v.ExternalID, v.RegisteredAs, v.CapacityBytes, want, 1<<20)
		}
	}
	_, err := c.ListExternalVolumes(ctx, "example", runtime.ExternalVolumesQuery{StartingToken: "garbage"})
	wantAPIError(t, "a token the plugin does not know", err, http.StatusServiceUnavailable, "starting_token")
	_, err = c.ListExternalVolumes(ctx, "example", runtime.ExternalVolumesQuery{MaxEntries: runtime.MaxListEntries + 1})
	wantAPIError(t, "a page too large", err, http.StatusBadRequest, "max_entries: 1001: want 0 to 1000")

	capy, err := c.PluginCapacity(ctx, "example", runtime.CapacityQuery{})
	if err != nil || capy.AvailableCapacityBytes <= 0 {
		t.Errorf("example plugin capacity = %+v, %v", capy, err)
	}
}
