package cli_test

import (
	"context"
	"encoding/json"
	"maps"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestVolumeModify_Cases(t *testing.T) {
	b, env := populated(t)
	runCLI(t, env, "volume", "modify", "-param", "iops=3000", "vol2").want(t, 0, "Modified volume vol2: mutable parameters iops=3000\n")
	r := runCLI(t, env, "volume", "modify", "-param", "throughput=125", "-json", "vol2")
	r.want(t, 0, "")
	var got runtime.Volume
	want := map[string]string{"iops": "3000", "throughput": "125"}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || !maps.Equal(got.MutableParameters, want) {
		t.Errorf("modify -json = %+v, %v", got.MutableParameters, err)
	}
	if v, err := b.Volume(context.Background(), "vol2"); err != nil || !maps.Equal(v.MutableParameters, want) {
		t.Fatalf("volume after modify = %v, %v", v.MutableParameters, err)
	}
	r = runCLI(t, env, "volume", "status", "vol2")
	r.contains(t, "stdout", "Mutable parameters  iops=3000, throughput=125")

	r = runCLI(t, env, "volume", "modify", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", "-param is required")
	r = runCLI(t, env, "volume", "modify", "-param", "iops", "vol2")
	r.want(t, 2, "")
	r.contains(t, "stderr", "want KEY=VALUE")
	r = runCLI(t, env, "volume", "modify", "-param", "iops=1", "nope")
	r.want(t, 1, "")
	r.contains(t, "stderr", `volume "nope" not found`)
}
