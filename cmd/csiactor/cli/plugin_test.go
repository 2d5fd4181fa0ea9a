package cli_test

import (
	"encoding/json"
	"testing"

	"github.com/csiactor/csiactor/runtime"
)

func TestPluginList_Table(t *testing.T) {
	_, env := populated(t)
	runCLI(t, env, "plugin", "list").want(t, 0,
		"NAME      PROVIDER               VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n"+
			"hostpath  fake.csi.csiactor.dev  1.0.0    1/1          1/1    no\n"+
			"nfs       fake.csi.csiactor.dev  1.0.0    0/0          0/1    no\n")
}

func TestPluginList_JSON(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "plugin", "list", "-json")
	r.want(t, 0, "")
	var ps []runtime.Plugin
	if err := json.Unmarshal([]byte(r.stdout), &ps); err != nil || len(ps) != 2 || ps[1].Name != "nfs" || ps[1].NodesExpected != 1 {
		t.Errorf("plugin list -json = %+v, %v", ps, err)
	}
}

func TestPluginStatus_Table(t *testing.T) {
	_, env := populated(t)
	runCLI(t, env, "plugin", "status", "hostpath").want(t, 0,
		"Name                 hostpath\n"+
			"Provider             fake.csi.csiactor.dev\n"+
			"Version              1.0.0\n"+
			"Controller required  no\n"+
			"Controllers          1/1 healthy\n"+
			"Nodes                1/1 healthy\n"+
			"\n"+
			"Allocations\n"+
			"ID   TYPE      HEALTHY  SINGLETON  NODE    SOCKET        DESCRIPTION\n"+
			"hp1  monolith  yes      yes        node-1  /run/hp.sock  healthy\n")
}

func TestPluginStatus_Cases(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "plugin", "status", "-json", "nfs")
	r.want(t, 0, "")
	var p runtime.Plugin
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.Name != "nfs" || len(p.Allocations) != 1 || p.Allocations[0].Healthy {
		t.Errorf("plugin status -json = %+v, %v", p, err)
	}
	r = runCLI(t, env, "plugin", "status", "ceph")
	r.want(t, 1, "")
	r.contains(t, "stderr", "csiactor: not found: plugin ceph")
	r = runCLI(t, env, "plugin", "status")
	r.want(t, 2, "")
	r.contains(t, "stderr", "missing NAME")
}
