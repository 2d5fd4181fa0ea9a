package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestSnapshot_Lifecycle(t *testing.T) {
	b, env := populated(t)
	secrets := filepath.Join(t.TempDir(), "secrets")
	if err := os.WriteFile(secrets, []byte("token=hunter2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runCLI(t, env, "snapshot", "create", "-volume", "vol2", "-parameter", "tier=cold", "-secrets-file", secrets, "snap1").want(t, 0,
		"Created snapshot snap1 of volume vol2 (plugin hostpath, external ID snap-snap1, size 1 GiB)\n")
	r := runCLI(t, env, "snapshot", "create", "-volume", "vol1", "-json", "snap2")
	r.want(t, 0, "")
	var got runtime.Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.ID != "snap2" || got.Plugin != "hostpath" || !got.Registered {
		t.Errorf("snapshot create -json = %+v, %v", got, err)
	}
	r = runCLI(t, env, "snapshot", "list")
	r.want(t, 0, "")
	for _, want := range []string{"ID     PLUGIN    SOURCE VOLUME  EXTERNAL ID  SIZE   STATE  CREATED", "snap1  hostpath  vol2           snap-snap1   1 GiB  ready", "snap2  hostpath  vol1"} {
		r.contains(t, "stdout", want)
	}
	r = runCLI(t, env, "snapshot", "list", "-volume", "vol1", "-json")
	r.want(t, 0, "")
	var list []runtime.Snapshot
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].ID != "snap2" {
		t.Errorf("snapshot list -volume vol1 -json = %+v, %v", list, err)
	}
	r = runCLI(t, env, "snapshot", "status", "snap1")
	r.want(t, 0, "")
	for _, want := range []string{"Source volume  vol2 (external ID ext-vol2)", "State          ready", "Parameters     tier=cold"} {
		r.contains(t, "stdout", want)
	}
	for _, out := range []string{r.stdout, r.stderr} {
		if strings.Contains(out, "hunter2") {
			t.Errorf("a secret is shown: %s", out)
		}
	}
	runCLI(t, env, "volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-from-snapshot", "snap1", "vol9").want(t, 0,
		"Created volume vol9 (plugin hostpath, external ID ext-vol9, capacity -)\n")
	runCLI(t, env, "snapshot", "delete", "snap1").want(t, 0, "Deleted snapshot snap1\n")
	if _, err := b.Snapshot(context.Background(), "snap1"); err == nil {
		t.Error("snap1 still there after delete")
	}
	r = runCLI(t, env, "snapshot", "status", "snap1")
	r.want(t, 1, "")
	r.contains(t, "stderr", `snapshot "snap1"`)
}

func TestSnapshot_BadInput(t *testing.T) {
	_, env := populated(t)
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"snapshot", "create", "snap1"}, 2, "-volume is required"},
		{[]string{"snapshot", "create", "-volume", "vol1"}, 2, "ID"},
		{[]string{"snapshot", "create", "-volume", "../x", "snap1"}, 2, "-volume"},
		{[]string{"snapshot", "create", "-volume", "nope", "snap1"}, 1, `volume "nope" not found`},
		{[]string{"snapshot", "create", "-volume", "vol1", "-plugin", "nfs", "snap1"}, 1, `volume "vol1" is of plugin "hostpath", not "nfs"`},
		{[]string{"snapshot", "create", "-volume", "vol1", "-secret", "novalue", "snap1"}, 2, "secret"},
		{[]string{"snapshot", "list", "-plugin", "-x"}, 2, "-plugin"},
		{[]string{"snapshot", "delete", "nope"}, 1, `snapshot "nope"`},
		{[]string{"volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-from-snapshot", "-bad", "v"}, 2, `-from-snapshot: "-bad"`},
		{[]string{"volume", "create", "-plugin", "hostpath", "-capability", "single-node-writer", "-from-snapshot", "s", "-clone-of", "vol1", "v"}, 2, "-clone-of/-from-snapshot: give snapshot or volume, not both"},
	} {
		r := runCLI(t, env, c.args...)
		r.want(t, c.code, "")
		r.contains(t, "stderr", c.msg)
	}
}
