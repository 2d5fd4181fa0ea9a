package dockerplugin_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/csiactor/csiactor/dockerplugin"
	"github.com/csiactor/csiactor/runtime"
)

func TestServer_ActivateAndCapabilities(t *testing.T) {
	r := newRig(t, nil)
	out := r.ok("Plugin.Activate", []byte(""))
	if got := out["Implements"]; !reflect.DeepEqual(got, []any{"VolumeDriver"}) {
		t.Errorf("Activate = %v", out)
	}
	out = r.ok("VolumeDriver.Capabilities", struct{}{})
	if got := out["Capabilities"].(map[string]any)["Scope"]; got != "local" {
		t.Errorf("Capabilities = %v, want scope local on one host", out)
	}
	fi, err := os.Stat(r.socket(testDriver))
	if err != nil || fi.Mode().Type() != os.ModeSocket {
		t.Fatalf("driver socket: %v %v", fi, err)
	}
}

func TestServer_Create_Options(t *testing.T) {
	r := newRig(t, func(c *runtime.DockerConfig) {
		c.Drivers[0].Defaults = runtime.DockerDefaults{
			Capacity: "1GiB", FSType: "xfs", MountFlags: []string{"noatime"},
			Parameters: map[string]string{"tier": "gold", "zone": "x"},
			Secrets:    map[string]string{"token": "s3cret"},
		}
	})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1", "Opts": map[string]string{
		"size": "2GiB", "sharing": "readonly", "scope": "multi", "fs-type": "ext4", "zone": "a",
	}})
	v := r.volume("v1")
	if !v.Created || v.Plugin != testPlugin || v.CapacityBytes != 2<<30 {
		t.Errorf("volume = %+v", v)
	}
	if want := []runtime.Capability{{AccessMode: "multi-node-reader-only", AttachmentMode: "file-system"}}; !reflect.DeepEqual(v.Capabilities, want) {
		t.Errorf("capabilities = %v, want %v", v.Capabilities, want)
	}
	if want := map[string]string{"tier": "gold", "zone": "a"}; !reflect.DeepEqual(v.Parameters, want) {
		t.Errorf("parameters = %v, want %v", v.Parameters, want)
	}
	if v.MountOptions == nil || v.MountOptions.FSType != "ext4" || v.MountOptions.MountFlagCount != 1 {
		t.Errorf("mount options = %+v", v.MountOptions)
	}
	req := r.plugin.LastRequest("CreateVolume").(*csipb.CreateVolumeRequest)
	if req.GetName() != "v1" || req.GetCapacityRange().GetRequiredBytes() != 2<<30 || req.GetSecrets()["token"] != "s3cret" {
		t.Errorf("CreateVolume request: name %q capacity %d secrets %d", req.GetName(), req.GetCapacityRange().GetRequiredBytes(), len(req.GetSecrets()))
	}

	// Without options: the driver's defaults, file-system and
	// single-node-writer.
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v2"})
	v = r.volume("v2")
	if v.CapacityBytes != 1<<30 || v.Capabilities[0] != (runtime.Capability{AccessMode: "single-node-writer", AttachmentMode: "file-system"}) || v.MountOptions.FSType != "xfs" {
		t.Errorf("defaults: %+v", v)
	}
	// Create of an existing volume changes nothing.
	calls := r.plugin.Calls("CreateVolume")
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v2", "Opts": map[string]string{"size": "5GiB"}})
	if r.plugin.Calls("CreateVolume") != calls || r.volume("v2").CapacityBytes != 1<<30 {
		t.Error("Create of an existing volume changed it")
	}
}

func TestServer_Create_BadOptions(t *testing.T) {
	r := newRig(t, nil)
	for _, tc := range []struct {
		opts map[string]string
		want string
	}{
		{map[string]string{"type": "disk"}, `type="disk": want mount or block`},
		{map[string]string{"sharing": "some"}, `sharing="some"`},
		{map[string]string{"scope": "wide"}, `scope="wide": want single or multi`},
		{map[string]string{"scope": "multi"}, "sharing=none with scope=multi"},
		{map[string]string{"size": "big"}, "option size"},
		{map[string]string{"fs_type": "ext4"}, `unknown option "fs_type"; did you mean "fs-type"?`},
		{map[string]string{"capacity": "1G"}, `did you mean "size"?`},
		{map[string]string{"secret": "x"}, "secrets are never options"},
		{map[string]string{"Secret-Key": "x"}, "secrets are never options"},
		{map[string]string{"type": "block", "fs-type": "ext4"}, "fs-type applies to type=mount only"},
		{map[string]string{"external-id": "e1", "size": "1G"}, "size does not apply with external-id"},
		{map[string]string{"context.server": "a"}, "apply with external-id only"},
		{map[string]string{"topology-required": "zone"}, "option topology-required"},
	} {
		status, out := r.call(testDriver, "VolumeDriver.Create", map[string]any{"Name": "bad", "Opts": tc.opts})
		msg, _ := out["Err"].(string)
		if status != http.StatusBadRequest || !strings.Contains(msg, tc.want) {
			t.Errorf("Create with %v = %d %q, want 400 containing %q", tc.opts, status, msg, tc.want)
		}
		if strings.Contains(msg, "s3cret") {
			t.Errorf("error shows an option value: %q", msg)
		}
	}
	if _, err := r.rt.Volume(context.Background(), "bad"); err == nil {
		t.Error("a bad Create made the volume")
	}
	if n := r.plugin.Calls("CreateVolume"); n != 0 {
		t.Errorf("CreateVolume called %d times for bad options", n)
	}
	for _, body := range []string{"{", `{"Name": 5}`} {
		status, raw := r.callRaw(testDriver, "VolumeDriver.Create", []byte(body))
		if status != http.StatusBadRequest || !strings.Contains(string(raw), `"Err"`) {
			t.Errorf("Create with body %s = %d %s", body, status, raw)
		}
	}
	status, out := r.call(testDriver, "VolumeDriver.Create", map[string]any{"Name": "../x"})
	if status != http.StatusBadRequest || !strings.Contains(out["Err"].(string), "Name") {
		t.Errorf("Create with a bad name = %d %v", status, out)
	}
}

func TestServer_Remove_DeletesCreatedDeregistersRegistered(t *testing.T) {
	r := newRig(t, nil)
	r.ok("VolumeDriver.Create", map[string]any{"Name": "made"})
	ext := r.volume("made").ExternalID
	r.ok("VolumeDriver.Create", map[string]any{"Name": "reg", "Opts": map[string]string{"external-id": ext + "-other", "context.k": "v"}})
	v := r.volume("reg")
	if v.Created || v.ExternalID != ext+"-other" || v.Context["k"] != "v" {
		t.Fatalf("registered volume = %+v", v)
	}
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "reg"})
	if n := r.plugin.Calls("DeleteVolume"); n != 0 {
		t.Errorf("Remove of a registered volume called DeleteVolume %d times", n)
	}
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "made"})
	if n := r.plugin.Calls("DeleteVolume"); n != 1 {
		t.Errorf("Remove of a created volume called DeleteVolume %d times, want 1", n)
	}
	for _, id := range []string{"made", "reg"} {
		if _, err := r.rt.Volume(context.Background(), id); err == nil {
			t.Errorf("volume %s is still registered", id)
		}
	}
	// Removing what is gone succeeds, as Docker expects.
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "made"})
}

func TestServer_Mount_CountsReferencesPerID(t *testing.T) {
	r := newRig(t, func(c *runtime.DockerConfig) { c.UnmountGrace = time.Hour })
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	id := strings.Repeat("ab", 32)
	alloc := dockerplugin.AllocFor(id)
	if alloc != "docker-"+id {
		t.Fatalf("AllocFor = %q", alloc)
	}
	mp := r.mount("v1", id)
	if got := r.mount("v1", id); got != mp {
		t.Errorf("second Mount = %q, want %q", got, mp)
	}
	if n := r.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("NodePublishVolume called %d times, want 1", n)
	}
	out := r.ok("VolumeDriver.Path", map[string]string{"Name": "v1"})
	if out["Mountpoint"] != mp {
		t.Errorf("Path = %v, want %s", out, mp)
	}
	// One Unmount of two references keeps the claim.
	r.unmount("v1", id)
	if status, out := r.call(testDriver, "VolumeDriver.Remove", map[string]string{"Name": "v1"}); status != http.StatusConflict || !strings.Contains(out["Err"].(string), "in use") {
		t.Errorf("Remove while mounted = %d %v", status, out)
	}
	// The last Unmount starts the grace period; a Mount within it finds
	// the claim published, with no teardown and no second publish.
	r.unmount("v1", id)
	if !r.claimed("v1", alloc) {
		t.Fatal("the claim went before the grace period ended")
	}
	r.mount("v1", id)
	if n := r.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("a Mount in the grace period published again (%d NodePublishVolume calls)", n)
	}
	if n := r.plugin.Calls("NodeUnpublishVolume"); n != 0 {
		t.Errorf("a Mount in the grace period tore down (%d NodeUnpublishVolume calls)", n)
	}
	// An Unmount of an unknown ID is no error and changes nothing.
	r.unmount("v1", "unknown")
	if !r.claimed("v1", alloc) {
		t.Fatal("an unknown Unmount released the claim")
	}
	// Remove with the last reference gone releases at once and deletes.
	r.unmount("v1", id)
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "v1"})
	if _, err := r.rt.Volume(context.Background(), "v1"); err == nil {
		t.Error("volume still registered after Remove")
	}
	if n := r.plugin.Calls("NodeUnpublishVolume"); n != 1 {
		t.Errorf("NodeUnpublishVolume called %d times, want 1", n)
	}
}

func TestServer_Unmount_ReleasesAfterGrace(t *testing.T) {
	r := newRig(t, nil) // grace 1ns
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1", "Opts": map[string]string{"sharing": "all"}})
	if am := r.volume("v1").Capabilities[0].AccessMode; am != "single-node-multi-writer" {
		t.Fatalf("sharing=all: access mode %s", am)
	}
	r.mount("v1", "m1")
	r.mount("v1", "m2") // another container, another claim
	if n := len(r.volume("v1").Claims); n != 2 {
		t.Fatalf("%d claims, want 2", n)
	}
	r.unmount("v1", "m1")
	r.waitGone("v1", dockerplugin.AllocFor("m1"))
	if !r.claimed("v1", dockerplugin.AllocFor("m2")) {
		t.Error("m2's claim went with m1's")
	}
	r.unmount("v1", "m2")
	r.waitGone("v1", dockerplugin.AllocFor("m2"))
}

func TestServer_Mount_Errors(t *testing.T) {
	r := newRig(t, nil)
	status, out := r.call(testDriver, "VolumeDriver.Mount", map[string]string{"Name": "nope", "ID": "m1"})
	if status != http.StatusNotFound || out["Err"] == nil {
		t.Errorf("Mount of an unknown volume = %d %v", status, out)
	}
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	status, out = r.call(testDriver, "VolumeDriver.Mount", map[string]string{"Name": "v1"})
	if status != http.StatusBadRequest || !strings.Contains(out["Err"].(string), "ID") {
		t.Errorf("Mount without ID = %d %v", status, out)
	}
	// single-node-writer: a second container is refused, naming the
	// holder, and leaves nothing behind.
	r.mount("v1", "m1")
	status, out = r.call(testDriver, "VolumeDriver.Mount", map[string]string{"Name": "v1", "ID": "m2"})
	if status != http.StatusConflict || !strings.Contains(out["Err"].(string), dockerplugin.AllocFor("m1")) {
		t.Errorf("second writer Mount = %d %v, want 409 naming %s", status, out, dockerplugin.AllocFor("m1"))
	}
	if r.claimed("v1", dockerplugin.AllocFor("m2")) {
		t.Error("the refused Mount left a claim")
	}
	data, err := os.ReadFile(filepath.Join(r.cfg.DataDir, "docker", "mounts.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"m2"`) {
		t.Errorf("the refused Mount left a reference: %s", data)
	}
}

func TestServer_GetListPath_PluginDown(t *testing.T) {
	r := newRig(t, func(c *runtime.DockerConfig) { c.UnmountGrace = time.Hour })
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1", "Opts": map[string]string{"size": "1GiB"}})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v2"})
	mp := r.mount("v1", "m1")
	r.plugin.Stop()
	eventually(t, "plugin unhealthy", func() bool {
		p, err := r.rt.Plugin(context.Background(), testPlugin)
		return err == nil && p.NodesHealthy == 0
	})
	out := r.ok("VolumeDriver.Get", map[string]string{"Name": "v1"})
	vol := out["Volume"].(map[string]any)
	if vol["Name"] != "v1" || vol["Mountpoint"] != mp || vol["CreatedAt"] == "" {
		t.Errorf("Get = %v", out)
	}
	st := vol["Status"].(map[string]any)
	if st["plugin"] != testPlugin || st["capacity_bytes"] != float64(1<<30) || st["claims"] != float64(1) {
		t.Errorf("Get status = %v", st)
	}
	out = r.ok("VolumeDriver.List", struct{}{})
	var names []string
	for _, v := range out["Volumes"].([]any) {
		names = append(names, v.(map[string]any)["Name"].(string))
	}
	if !reflect.DeepEqual(names, []string{"v1", "v2"}) {
		t.Errorf("List = %v", out)
	}
	if out := r.ok("VolumeDriver.Path", map[string]string{"Name": "v2"}); out["Mountpoint"] != nil && out["Mountpoint"] != "" {
		t.Errorf("Path of an unmounted volume = %v", out)
	}
	status, out := r.call(testDriver, "VolumeDriver.Get", map[string]string{"Name": "nope"})
	if status != http.StatusNotFound || out["Err"] == nil {
		t.Errorf("Get of an unknown volume = %d %v", status, out)
	}
}

func TestServer_Restart_KeepsCounts(t *testing.T) {
	r := newRig(t, func(c *runtime.DockerConfig) { c.UnmountGrace = time.Hour })
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	mp := r.mount("v1", "m1")
	r.mount("v1", "m1")
	r.restart()
	data, err := os.ReadFile(filepath.Join(r.cfg.DataDir, "docker", "mounts.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Mounts []struct {
			Volume, ID, Driver string
			Refs               int
		}
	}
	if err := json.Unmarshal(data, &f); err != nil || len(f.Mounts) != 1 || f.Mounts[0].Refs != 2 || f.Mounts[0].Driver != testDriver {
		t.Fatalf("mounts.json = %s (%v)", data, err)
	}
	if got := r.ok("VolumeDriver.Path", map[string]string{"Name": "v1"})["Mountpoint"]; got != mp {
		t.Errorf("Path after restart = %v, want %s", got, mp)
	}
	r.unmount("v1", "m1")
	r.unmount("v1", "m1") // the last: its release waits out the grace period
	r.restart()           // and is scheduled again at the next start
	if !r.claimed("v1", dockerplugin.AllocFor("m1")) {
		t.Fatal("claim gone before its grace period")
	}
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "v1"})
	if _, err := r.rt.Volume(context.Background(), "v1"); err == nil {
		t.Error("volume still registered after Remove")
	}
}

func TestServer_Reconcile_ReleasesUnheldMounts(t *testing.T) {
	var eng *fakeEngine
	r := newRig(t, func(c *runtime.DockerConfig) {
		eng = startFakeEngine(t, testDriver)
		c.Engines = []string{eng.socket}
		c.ReconcileInterval = time.Millisecond
		c.UnmountGrace = time.Hour
	})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v2"})
	eng.set(false, "running:v1", "created:v2") // v2's container is being started
	r.mount("v1", "m1")
	r.mount("v2", "m2")
	sub, err := r.rt.Subscribe(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Held by running containers: many checks release nothing.
	n := eng.requestCount()
	eventually(t, "five checks", func() bool { return eng.requestCount() >= n+5 })
	// An engine that fails changes nothing either.
	eng.set(true)
	n = eng.requestCount()
	eventually(t, "five failed checks", func() bool { return eng.requestCount() >= n+5 })
	if !r.claimed("v1", dockerplugin.AllocFor("m1")) || !r.claimed("v2", dockerplugin.AllocFor("m2")) {
		t.Fatal("a mount was released while held, or while the engine failed")
	}
	// v2's container went without an Unmount: released, with an event.
	eng.set(false, "paused:v1")
	r.waitGone("v2", dockerplugin.AllocFor("m2"))
	if !r.claimed("v1", dockerplugin.AllocFor("m1")) {
		t.Error("v1's mount was released while held")
	}
	for e := range sub {
		if e.Type == dockerplugin.EventMountReleased {
			if e.Volume != "v2" || e.Alloc != dockerplugin.AllocFor("m2") || !strings.Contains(e.Message, "no container") {
				t.Errorf("event = %+v", e)
			}
			break
		}
	}
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "v2"})
}

func TestStart_SocketInUse(t *testing.T) {
	r := newRig(t, nil)
	_, err := dockerplugin.Start(context.Background(), r.rt, r.srv2Log())
	if err == nil || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("second Start = %v, want the socket in use", err)
	}
	// The first server still serves.
	r.ok("Plugin.Activate", struct{}{})
}

func TestServer_Mount_AnotherIDTakesOverAClaimInGrace(t *testing.T) {
	// Docker copies an image's content into a new volume with a mount ID
	// of its own, then the container mounts it with another; the next
	// container after one that ended comes with another ID too. A claim
	// in its grace period is taken over: no teardown, no second publish.
	r := newRig(t, func(c *runtime.DockerConfig) { c.UnmountGrace = time.Hour })
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	mp := r.mount("v1", "copy")
	r.unmount("v1", "copy")
	if got := r.mount("v1", "container"); got != mp {
		t.Errorf("Mount of the new ID = %q, want the claim's %q", got, mp)
	}
	v := r.volume("v1")
	if len(v.Claims) != 1 || v.Claims[0].Alloc != dockerplugin.AllocFor("copy") || len(v.PastClaims) != 0 {
		t.Fatalf("claims = %+v, past %+v; want the one claim taken over", v.Claims, v.PastClaims)
	}
	if p, u := r.plugin.Calls("NodePublishVolume"), r.plugin.Calls("NodeUnpublishVolume"); p != 1 || u != 0 {
		t.Errorf("NodePublishVolume %d, NodeUnpublishVolume %d times; want 1 and 0", p, u)
	}
	data, err := os.ReadFile(filepath.Join(r.cfg.DataDir, "docker", "mounts.json"))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), `"id": "copy"`) || !strings.Contains(string(data), `"id": "container"`) {
		t.Errorf("mounts.json = %s, want the entry moved to the new ID", data)
	}
	// A held claim is not taken over: a second container gets its own.
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v2", "Opts": map[string]string{"sharing": "all"}})
	r.mount("v2", "a")
	r.mount("v2", "b")
	if n := len(r.volume("v2").Claims); n != 2 {
		t.Errorf("v2 has %d claims, want 2", n)
	}
	// The claim taken over goes with its new ID's last Unmount.
	r.unmount("v1", "container")
	r.ok("VolumeDriver.Remove", map[string]string{"Name": "v1"})
	if n := r.plugin.Calls("NodeUnpublishVolume"); n != 1 {
		t.Errorf("NodeUnpublishVolume %d times, want 1", n)
	}
}

// TestServer_Reconcile_DefaultEngineAppearsLater: with engines left to
// the defaults, an engine whose socket appears after the agent started
// (the agent's unit starts before dockerd) is asked from then on.
func TestServer_Reconcile_DefaultEngineAppearsLater(t *testing.T) {
	later := filepath.Join(shortDir(t, "csiactor-eng-"), "docker.sock")
	saved := runtime.DefaultDockerEngines
	runtime.DefaultDockerEngines = []string{later}
	t.Cleanup(func() { runtime.DefaultDockerEngines = saved })
	r := newRig(t, func(c *runtime.DockerConfig) {
		c.Engines = nil
		c.ReconcileInterval = time.Millisecond
		c.UnmountGrace = time.Hour
	})
	r.ok("VolumeDriver.Create", map[string]any{"Name": "v1"})
	r.mount("v1", "m1")
	eng := startFakeEngineAt(t, testDriver, later) // holds nothing
	r.waitGone("v1", dockerplugin.AllocFor("m1"))
	if eng.requestCount() < 2 {
		t.Errorf("released after %d checks, want 2", eng.requestCount())
	}
}
