package runtime_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_Snapshots_RestoreAndClone takes a snapshot of a volume of
// the example plugin through the HTTP API: data written before it is in
// the volume restored from it, data written after is not; a clone has
// both. The snapshot is listed once, then deleted.
func TestRuntime_Snapshots_RestoreAndClone(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sock := serveExample(t, shortDir(t, "csiactor-sn-"), csiplugin.Config{})
	if _, err := e.rt.RegisterAllocation(ctx, "ex", runtime.AllocationSpec{Plugin: "example", Type: runtime.TypeMonolith, Socket: sock}); err != nil {
		t.Fatal(err)
	}
	e.waitHealthy("example", runtime.TypeMonolith)
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "example", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "src", VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	cl, err := c.Claim(ctx, "src", claimReq("w", "write", "single-node-writer"))
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, data string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(cl.TargetPath, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("before.txt", "before the snapshot")

	sspec := runtime.SnapshotSpec{ID: "snap1", Plugin: "example", SourceVolume: "src", Secrets: map[string]string{"token": "hunter2"}}
	sn, err := c.CreateSnapshot(ctx, sspec)
	if err != nil {
		t.Fatalf("create snapshot: %v", err)
	}
	if sn.ID != "snap1" || sn.State != "ready" || !sn.ReadyToUse || sn.ExternalID == "" || !sn.Registered || sn.SourceVolume != "src" {
		t.Fatalf("snapshot = %+v", sn)
	}
	if again, err := c.CreateSnapshot(ctx, sspec); err != nil || again.ExternalID != sn.ExternalID {
		t.Fatalf("create the same snapshot again = %+v, %v; want the same one", again, err)
	}
	write("after.txt", "after the snapshot")

	restored, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "restored", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Snapshot: "snap1"}})
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	clone, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "clone", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Volume: "src"}})
	if err != nil {
		t.Fatalf("clone: %v", err)
	}
	if restored.ExternalID == "" || clone.ExternalID == "" {
		t.Fatalf("restored %+v, clone %+v", restored, clone)
	}
	check := func(vol, alloc string, want map[string]string) {
		t.Helper()
		cc, err := c.Claim(ctx, vol, claimReq(alloc, "write", "single-node-writer"))
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range want {
			b, err := os.ReadFile(filepath.Join(cc.TargetPath, name))
			switch {
			case data == "" && !os.IsNotExist(err):
				t.Errorf("%s: %s = %q, %v; want no such file", vol, name, b, err)
			case data != "" && (err != nil || string(b) != data):
				t.Errorf("%s: %s = %q, %v; want %q", vol, name, b, err, data)
			}
		}
	}
	check("restored", "r", map[string]string{"before.txt": "before the snapshot", "after.txt": ""})
	check("clone", "k", map[string]string{"before.txt": "before the snapshot", "after.txt": "after the snapshot"})

	for _, f := range []runtime.SnapshotFilter{{}, {Plugin: "example"}, {Volume: "src"}} {
		list, err := c.Snapshots(ctx, f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		if len(list) != 1 || list[0].ID != "snap1" || !list[0].Registered {
			t.Errorf("list %+v = %s, want snap1 once, registered", f, toJSON(t, list))
		}
	}
	if list, err := c.Snapshots(ctx, runtime.SnapshotFilter{Volume: "clone"}); err != nil || len(list) != 0 {
		t.Errorf("list of the clone's snapshots = %s, %v; want none", toJSON(t, list), err)
	}
	if got, err := c.Snapshot(ctx, "snap1"); err != nil || got.ExternalID != sn.ExternalID {
		t.Errorf("get = %+v, %v", got, err)
	}
	if err := c.DeleteSnapshot(ctx, "snap1"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	_, err = c.Snapshot(ctx, "snap1")
	wantAPIError(t, "get after delete", err, http.StatusNotFound, `snapshot "snap1"`)
	if list, err := c.Snapshots(ctx, runtime.SnapshotFilter{Plugin: "example"}); err != nil || len(list) != 0 {
		t.Errorf("list after delete = %s, %v; want none (the plugin's listing too)", toJSON(t, list), err)
	}

	evs, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, ev := range evs {
		if strings.Contains(toJSON(t, ev), "hunter2") {
			t.Errorf("event shows a secret: %+v", ev)
		}
		if ev.Snapshot == "snap1" {
			seen[ev.Type] = true
		}
	}
	for _, typ := range []string{runtime.EventSnapshotCreating, runtime.EventSnapshotCreated, runtime.EventSnapshotDeleted} {
		if !seen[typ] {
			t.Errorf("no %s event for snap1 in %s", typ, toJSON(t, evs))
		}
	}
	for vol, alloc := range map[string]string{"src": "w", "restored": "r", "clone": "k"} {
		if _, err := c.Release(ctx, vol, alloc); err != nil {
			t.Fatal(err)
		}
		e.waitFreed(vol, alloc)
	}
}

// TestRuntime_Snapshots_BadInput: every refusal is a 4xx naming what is
// wrong or missing, and nothing is recorded or sent to the plugin.
func TestRuntime_Snapshots_BadInput(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	snap := e.attach("s", "snappy", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true, Snapshots: true})
	e.attach("p", "plain", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true})
	c := serveAPI(t, e.rt)
	for _, v := range []struct{ id, plugin string }{{"v1", "snappy"}, {"v2", "plain"}} {
		spec := volSpec("single-node-writer")
		spec.Plugin, spec.ExternalID = v.plugin, ""
		if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: v.id, VolumeSpec: spec}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "good", Plugin: "snappy", SourceVolume: "v1"}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []struct {
		name   string
		spec   runtime.SnapshotSpec
		status int
		msg    string
	}{
		{"unknown volume", runtime.SnapshotSpec{ID: "x", Plugin: "snappy", SourceVolume: "nope"}, http.StatusNotFound, `source_volume: volume "nope"`},
		{"volume of another plugin", runtime.SnapshotSpec{ID: "x", Plugin: "snappy", SourceVolume: "v2"}, http.StatusBadRequest, `source_volume: volume "v2" is of plugin "plain", not "snappy"`},
		{"plugin without the capability", runtime.SnapshotSpec{ID: "x", Plugin: "plain", SourceVolume: "v2"}, http.StatusBadRequest, "no CREATE_DELETE_SNAPSHOT capability"},
		{"no id", runtime.SnapshotSpec{Plugin: "snappy", SourceVolume: "v1"}, http.StatusBadRequest, "id"},
		{"bad source", runtime.SnapshotSpec{ID: "x", Plugin: "snappy", SourceVolume: "../v1"}, http.StatusBadRequest, "source_volume"},
		{"same id, other definition", runtime.SnapshotSpec{ID: "good", Plugin: "snappy", SourceVolume: "v1", Parameters: map[string]string{"a": "b"}}, http.StatusConflict, `snapshot "good" is already recorded with a different definition`},
	} {
		_, err := c.CreateSnapshot(ctx, b.spec)
		wantAPIError(t, "snapshot with "+b.name, err, b.status, b.msg)
	}
	if n := snap.Calls("CreateSnapshot"); n != 1 {
		t.Errorf("CreateSnapshot called %d times, want 1 (refusals send nothing)", n)
	}
	if _, err := c.Snapshot(ctx, "x"); err == nil {
		t.Error("a refused snapshot was recorded")
	}
	for _, b := range []struct {
		name, id, plugin string
		status           int
		msg              string
	}{
		{"unknown snapshot", "nope", "snappy", http.StatusNotFound, `content_source.snapshot: snapshot "nope"`},
		{"snapshot of another plugin", "good", "plain", http.StatusBadRequest, "no CREATE_DELETE_SNAPSHOT capability"},
	} {
		spec := volSpec("single-node-writer")
		spec.Plugin, spec.ExternalID = b.plugin, ""
		_, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "bad", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Snapshot: b.id}})
		wantAPIError(t, "restore of "+b.name, err, b.status, b.msg)
	}
	// A plugin that can restore, but the snapshot is another plugin's.
	e.attach("s2", "snappy2", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true, Snapshots: true})
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "snappy2", ""
	_, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "bad", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Snapshot: "good"}})
	wantAPIError(t, "restore into another plugin", err, http.StatusBadRequest, `content_source.snapshot: snapshot "good" is of plugin "snappy", not "snappy2"`)
	if _, err := c.Volume(ctx, "bad"); err == nil {
		t.Error("a refused restore was registered")
	}
	err = c.DeleteSnapshot(ctx, "nope")
	wantAPIError(t, "delete of an unknown snapshot", err, http.StatusNotFound, `snapshot "nope"`)
	_, err = c.Snapshots(ctx, runtime.SnapshotFilter{Volume: "nope"})
	wantAPIError(t, "list of an unknown volume's snapshots", err, http.StatusNotFound, `volume "nope"`)
}

// TestRuntime_DeleteSnapshot_WhileRestoring: a snapshot a volume is being
// restored from cannot be deleted (409) until the restore has ended.
func TestRuntime_DeleteSnapshot_WhileRestoring(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.attach("s", "snappy", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true, Snapshots: true})
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "snappy", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v1", VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: "s1", Plugin: "snappy", SourceVolume: "v1"}); err != nil {
		t.Fatal(err)
	}
	p.SetFault("CreateVolume", fakeplugin.Fault{Hang: true})
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.CreateVolume(rctx, runtime.CreateVolumeSpec{ID: "r1", VolumeSpec: spec, ContentSource: &runtime.ContentSource{Snapshot: "s1"}})
		done <- err
	}()
	eventually(t, "the restore's CreateVolume reaches the plugin", func() (bool, error) { return p.Calls("CreateVolume") >= 2, nil })
	if sn, err := c.Snapshot(ctx, "s1"); err != nil || sn.Restoring != 1 {
		t.Errorf("snapshot while restoring = %+v, %v; want restoring 1", sn, err)
	}
	err := c.DeleteSnapshot(ctx, "s1")
	wantAPIError(t, "delete while restoring", err, http.StatusConflict, `snapshot "s1" is being restored`)
	if n := p.Calls("DeleteSnapshot"); n != 0 {
		t.Errorf("DeleteSnapshot called %d times while restoring", n)
	}
	cancel()
	if err := <-done; err == nil {
		t.Error("the hung restore succeeded")
	}
	p.ClearFaults()
	eventually(t, "the snapshot deleted once the restore ended", func() (bool, error) {
		err := c.DeleteSnapshot(ctx, "s1")
		return err == nil, nil
	})
	if len(p.Snapshots()) != 0 {
		t.Errorf("the plugin still has %v", p.Snapshots())
	}
}

// TestRuntime_Snapshots_ErrorClassification: CreateSnapshot is retried
// on the codes a publish-type call retries and fails on the final ones
// (the record is then gone); DeleteSnapshot retries like an
// unpublish-type call, takes NotFound as done, and keeps the snapshot
// ready after a final failure.
func TestRuntime_Snapshots_ErrorClassification(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.attach("s", "snappy", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true, Snapshots: true})
	c := serveAPI(t, e.rt)
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "snappy", ""
	if _, err := c.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v1", VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		code  codes.Code
		retry bool
	}{
		{codes.Unavailable, true}, {codes.DeadlineExceeded, true}, {codes.Aborted, true},
		{codes.ResourceExhausted, true}, {codes.FailedPrecondition, true},
		{codes.InvalidArgument, false}, {codes.NotFound, false}, {codes.AlreadyExists, false},
		{codes.Internal, false}, {codes.PermissionDenied, false},
	} {
		id := "c" + string(rune('a'+i))
		before := p.Calls("CreateSnapshot")
		p.SetFault("CreateSnapshot", fakeplugin.Fault{Code: tc.code, Message: "injected", Times: 2})
		sn, err := c.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: id, Plugin: "snappy", SourceVolume: "v1"})
		calls := p.Calls("CreateSnapshot") - before
		p.ClearFaults()
		if tc.retry {
			if err != nil || sn.State != "ready" || calls != 3 {
				t.Errorf("CreateSnapshot %s twice: %+v, %v after %d calls; want ready after 3", tc.code, sn, err, calls)
			}
			continue
		}
		if err == nil || calls != 1 || !strings.Contains(err.Error(), "injected") {
			t.Errorf("CreateSnapshot %s: %v after %d calls; want the plugin's error after 1", tc.code, err, calls)
		}
		if _, err := c.Snapshot(ctx, id); err == nil {
			t.Errorf("CreateSnapshot %s: the failed snapshot is still recorded", tc.code)
		}
	}

	for i, tc := range []struct {
		code codes.Code
		gone bool // deleted in the end
	}{
		{codes.Unavailable, true}, {codes.Aborted, true}, {codes.NotFound, true},
		{codes.FailedPrecondition, false}, {codes.InvalidArgument, false}, {codes.Internal, false},
	} {
		id := "d" + string(rune('a'+i))
		if _, err := c.CreateSnapshot(ctx, runtime.SnapshotSpec{ID: id, Plugin: "snappy", SourceVolume: "v1"}); err != nil {
			t.Fatal(err)
		}
		before := p.Calls("DeleteSnapshot")
		p.SetFault("DeleteSnapshot", fakeplugin.Fault{Code: tc.code, Message: "injected", Times: 1})
		err := c.DeleteSnapshot(ctx, id)
		calls := p.Calls("DeleteSnapshot") - before
		p.ClearFaults()
		sn, gerr := c.Snapshot(ctx, id)
		switch {
		case tc.gone && (err != nil || gerr == nil):
			t.Errorf("DeleteSnapshot %s: %v, snapshot %+v; want it deleted", tc.code, err, sn)
		case tc.gone && tc.code != codes.NotFound && calls != 2:
			t.Errorf("DeleteSnapshot %s: %d calls, want 2 (retried)", tc.code, calls)
		case !tc.gone && (err == nil || gerr != nil || sn.State != "ready" || !strings.Contains(sn.LastError, "injected") || calls != 1):
			t.Errorf("DeleteSnapshot %s: %v after %d calls, snapshot %+v, %v; want a final error after 1 and the snapshot ready with the error", tc.code, err, calls, sn, gerr)
		}
	}
}

// TestRuntime_Snapshots_ResumeAfterRestart: a snapshot whose
// CreateSnapshot had not answered when the runtime stopped is finished by
// the next start.
func TestRuntime_Snapshots_ResumeAfterRestart(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	p := e.attach("s", "snappy", runtime.TypeMonolith, fakeplugin.Config{CreateDelete: true, Snapshots: true})
	spec := volSpec("single-node-writer")
	spec.Plugin, spec.ExternalID = "snappy", ""
	if _, err := e.rt.CreateVolume(ctx, runtime.CreateVolumeSpec{ID: "v1", VolumeSpec: spec}); err != nil {
		t.Fatal(err)
	}
	p.SetFault("CreateSnapshot", fakeplugin.Fault{Hang: true})
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	created := make(chan error, 1)
	go func() {
		_, err := e.rt.CreateSnapshot(cctx, runtime.SnapshotSpec{ID: "s1", Plugin: "snappy", SourceVolume: "v1"})
		created <- err
	}()
	// The snapshot is recorded before the call: give up once it hangs.
	eventually(t, "CreateSnapshot sent to the plugin", func() (bool, error) { return p.Calls("CreateSnapshot") > 0, nil })
	cancel()
	if err := <-created; err == nil {
		t.Fatal("a hung CreateSnapshot returned")
	}
	if sn, err := e.rt.Snapshot(ctx, "s1"); err != nil || sn.State != "creating" {
		t.Fatalf("snapshot while the plugin hangs = %+v, %v; want creating", sn, err)
	}
	e.stop()
	p.ClearFaults()
	e.start()
	eventually(t, "the snapshot is ready after the restart", func() (bool, error) {
		sn, err := e.rt.Snapshot(ctx, "s1")
		return err == nil && sn.State == "ready" && sn.ExternalID != "", err
	})
	if len(p.Snapshots()) != 1 {
		t.Errorf("the plugin has %v, want one snapshot", p.Snapshots())
	}
}
