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
	r.contains(t, "stderr", "invalid argument: capacity_bytes 1073741824 is less than volume vol2's 22548578304 bytes: volumes cannot shrink")
	r = runCLI(t, env, "volume", "expand", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-capacity is required")
	r = runCLI(t, env, "volume", "expand", "-capacity", "lots", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", `-capacity "lots": want a size like 1GiB`)
	r = runCLI(t, env, "volume", "expand", "-capacity", "1GiB", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", "not found: volume nope")
}
