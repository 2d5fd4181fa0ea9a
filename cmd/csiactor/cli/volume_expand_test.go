package cli_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestVolumeExpand_Cases(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "volume", "expand", "-capacity", "20GiB", "vol2").want(t, 0, "Expanded volume vol2 to 20 GiB\n")
	v, err := b.Volume(context.Background(), "vol2")
	if err != nil || v.CapacityBytes != 20<<30 {
		t.Fatalf("volume after expand = %d, %v", v.CapacityBytes, err)
	}
	evs, _ := b.Events(context.Background())
	if last := evs[len(evs)-1]; last.Type != runtime.EventVolumeExpanded || last.Volume != "vol2" {
		t.Errorf("last event %+v, want volume-expanded vol2", last)
	}
	r := runCLI(t, env, "volume", "expand", "-capacity", "21GiB", "-json", "vol2")
	r.want(t, 0, "")
	var got runtime.Volume
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.CapacityBytes != 21<<30 {
		t.Errorf("expand -json = %+v, %v", got, err)
	}

	r = runCLI(t, env, "volume", "expand", "-capacity", "1GiB", "vol2")
	r.want(t, 1, "")
	r.contains(t, "stderr", `capacity_bytes 1073741824 is less than volume "vol2"'s 22548578304 bytes: volumes cannot shrink`)
	r = runCLI(t, env, "volume", "expand", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-capacity is required")
	r = runCLI(t, env, "volume", "expand", "-capacity", "lots", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", `-capacity "lots": want a size like 1GiB`)
	r = runCLI(t, env, "volume", "expand", "-capacity", "1GiB", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "nope" not found`)
}

func TestVolumeListExternal_Cases(t *testing.T) {
	b, env := populated(t)
	for _, id := range []string{"ext-9", "ext-0", "ext-5"} {
		b.AddExternalVolume("hostpath", runtime.ExternalVolume{ExternalID: id, CapacityBytes: 1 << 20, PublishedNodeIDs: []string{"n1"}})
	}
	runCLI(t, env, "volume", "list", "-external", "-plugin", "hostpath").want(t, 0,
		"EXTERNAL ID  CAPACITY  REGISTERED AS  PUBLISHED TO\n"+
			"ext-0        1 MiB     -              n1\n"+
			"ext-1        -         vol1           -\n"+
			"ext-5        1 MiB     -              n1\n"+
			"ext-9        1 MiB     -              n1\n"+
			"ext-vol2     1 GiB     vol2           -\n")
	r := runCLI(t, env, "volume", "list", "-external", "-plugin", "hostpath", "-json")
	r.want(t, 0, "")
	var vs []runtime.ExternalVolume
	if err := json.Unmarshal([]byte(r.stdout), &vs); err != nil || len(vs) != 5 || vs[1].RegisteredAs != "vol1" {
		t.Errorf("volume list -external -json = %+v, %v", vs, err)
	}
	r = runCLI(t, env, "volume", "list", "-external")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-external needs -plugin")
	r = runCLI(t, env, "volume", "list", "-external", "-plugin", "ceph")
	r.want(t, 1, "")
	r.contains(t, "stderr", `plugin "ceph" has no controller allocation`)
}

func TestVolumeCreate_Topology(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer",
		"-topology", "zone=a,rack=r1", "-topology", "zone=b", "vol3").want(t, 0,
		"Created volume vol3 (plugin hostpath, external ID ext-vol3, capacity -)\n")
	if _, ok := b.ReceivedVolumeSpec("vol3"); !ok {
		t.Fatal("no create received")
	}
	r := runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-topology", "zone", "vol4")
	r.want(t, 2, "")
	r.contains(t, "stderr", `"zone": want key=value pairs separated by commas`)
}

func TestVolumeCreate_CloneOf(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-clone-of", "-bad", "vol5")
	r.want(t, 2, "")
	r.contains(t, "stderr", `-clone-of: "-bad"`)
}
