package cli_test

import (
	"encoding/json"
	"strings"
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
			"ID   TYPE      SOURCE  HEALTHY  SINGLETON  NODE    SOCKET        DESCRIPTION\n"+
			"hp1  monolith  api     yes      yes        node-1  /run/hp.sock  healthy\n")
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
	r.contains(t, "stderr", `csiactor: plugin "ceph" not found`)
	r = runCLI(t, env, "plugin", "status")
	r.want(t, 2, "")
	r.contains(t, "stderr", "missing NAME")
}

func TestPluginStatus_Capabilities(t *testing.T) {
	b, env := populated(t)
	b.SetCapabilities("hp1", &runtime.Capabilities{
		Plugin:            []string{"CONTROLLER_SERVICE", "EXPANSION_ONLINE"},
		Controller:        []string{"CREATE_DELETE_VOLUME", "EXPAND_VOLUME"},
		Node:              []string{"STAGE_UNSTAGE_VOLUME"},
		Topology:          map[string]string{"zone": "a", "rack": "r1"},
		MaxVolumesPerNode: 16,
	})
	b.SetCapabilities("nfs-node", &runtime.Capabilities{Plugin: []string{}})
	r := runCLI(t, env, "plugin", "status", "hostpath")
	r.want(t, 0, "Name                 hostpath\n"+
		"Provider             fake.csi.csiactor.dev\n"+
		"Version              1.0.0\n"+
		"Controller required  no\n"+
		"Controllers          1/1 healthy\n"+
		"Nodes                1/1 healthy\n"+
		"\n"+
		"Allocations\n"+
		"ID   TYPE      SOURCE  HEALTHY  SINGLETON  NODE    SOCKET        DESCRIPTION\n"+
		"hp1  monolith  api     yes      yes        node-1  /run/hp.sock  healthy\n"+
		"\n"+
		"Capabilities of hp1\n"+
		"Plugin                CONTROLLER_SERVICE, EXPANSION_ONLINE\n"+
		"Controller            CREATE_DELETE_VOLUME, EXPAND_VOLUME\n"+
		"Node                  STAGE_UNSTAGE_VOLUME\n"+
		"Topology              rack=r1, zone=a\n"+
		"Max volumes per node  16\n")
	r = runCLI(t, env, "plugin", "status", "nfs")
	r.contains(t, "stdout", "Capabilities of nfs-node\n"+
		"Plugin                -\n"+
		"Node                  -\n"+
		"Topology              -\n"+
		"Max volumes per node  -\n")
	r = runCLI(t, env, "plugin", "status", "-json", "hostpath")
	var p runtime.Plugin
	if err := json.Unmarshal([]byte(r.stdout), &p); err != nil || p.Allocations[0].Capabilities == nil ||
		p.Allocations[0].Capabilities.MaxVolumesPerNode != 16 || p.Allocations[0].Capabilities.Topology["zone"] != "a" {
		t.Errorf("plugin status -json = %+v, %v", p, err)
	}
	if !strings.Contains(r.stdout, `"max_volumes_per_node":16`) && !strings.Contains(r.stdout, `"max_volumes_per_node": 16`) {
		t.Errorf("plugin status -json has no max_volumes_per_node: %s", r.stdout)
	}
}

func TestPluginCapacity_Cases(t *testing.T) {
	b, env := populated(t)
	b.SetCapacity("hostpath", 10<<30)
	runCLI(t, env, "plugin", "capacity", "-topology", "zone=a", "hostpath").want(t, 0,
		"Plugin               hostpath\n"+
			"Controller           hp1\n"+
			"Topology             zone=a\n"+
			"Available            10 GiB\n"+
			"Maximum volume size  -\n"+
			"Minimum volume size  -\n")
	r := runCLI(t, env, "plugin", "capacity", "-json", "hostpath")
	r.want(t, 0, "")
	var c runtime.Capacity
	if err := json.Unmarshal([]byte(r.stdout), &c); err != nil || c.AvailableCapacityBytes != 10<<30 {
		t.Errorf("plugin capacity -json = %+v, %v", c, err)
	}
	r = runCLI(t, env, "plugin", "capacity", "nfs")
	r.want(t, 1, "")
	r.contains(t, "stderr", "no GET_CAPACITY capability")
	r = runCLI(t, env, "plugin", "capacity", "-topology", "zone", "hostpath")
	r.want(t, 2, "")
	r.contains(t, "stderr", `-topology: "zone": want key=value pairs separated by commas`)
}
