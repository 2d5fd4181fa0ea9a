package cli_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/csiactor/csiactor/cmd/csiactor/cli"
)

func TestStatus_Table(t *testing.T) {
	_, env := populated(t)
	addr := env[cli.AddressEnv]
	r := runCLI(t, env, "status")
	r.want(t, 0, "Agent    ok at "+addr+"\n"+
		"Ready    yes\n"+
		"Plugins  2 (1 healthy)\n"+
		"Volumes  2 (1 claim, 0 being released)\n"+
		"\n"+
		"NAME      PROVIDER               VERSION  CONTROLLERS  NODES  CONTROLLER REQUIRED\n"+
		"hostpath  fake.csi.csiactor.dev  1.0.0    1/1          1/1    no\n"+
		"nfs       fake.csi.csiactor.dev  1.0.0    0/0          0/1    no\n")
}

func TestStatus_JSON(t *testing.T) {
	_, env := populated(t)
	r := runCLI(t, env, "status", "-json")
	r.want(t, 0, "")
	var got struct {
		Status     string `json:"status"`
		Address    string `json:"address"`
		Plugins    []struct{ Name string }
		Volumes    int `json:"volumes"`
		Claims     int `json:"claims"`
		PastClaims int `json:"past_claims"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, r.stdout)
	}
	if got.Status != "ok" || got.Address != env[cli.AddressEnv] || len(got.Plugins) != 2 || got.Volumes != 2 || got.Claims != 1 || got.PastClaims != 0 {
		t.Errorf("status -json = %+v", got)
	}
}

func TestStatus_Empty_NoPluginTable(t *testing.T) {
	_, env := fakeAgent(t)
	r := runCLI(t, env, "status")
	r.want(t, 0, "Agent    ok at "+env[cli.AddressEnv]+"\nReady    yes\nPlugins  0 (0 healthy)\nVolumes  0 (0 claims, 0 being released)\n")
}

func TestStatus_Starting_ShowsPending(t *testing.T) {
	b, env := fakeAgent(t)
	b.SetPending("allocation example (plugin example): starting", "volume data1: alloc web1 degraded (target path): boom")
	r := runCLI(t, env, "status")
	r.want(t, 0, "Agent    ok at "+env[cli.AddressEnv]+"\n"+
		"Ready    no (pending: allocation example (plugin example): starting; volume data1: alloc web1 degraded (target path): boom)\n"+
		"Plugins  0 (0 healthy)\nVolumes  0 (0 claims, 0 being released)\n")
	r = runCLI(t, env, "status", "-json")
	var got struct {
		Ready struct {
			Status  string   `json:"status"`
			Pending []string `json:"pending"`
		} `json:"ready"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.Ready.Status != "starting" || len(got.Ready.Pending) != 2 {
		t.Errorf("status -json ready = %+v, %v\n%s", got.Ready, err, r.stdout)
	}
}

func TestStatus_BackendError_Exit1(t *testing.T) {
	b, env := fakeAgent(t)
	b.FailWith("Volumes", errors.New("store: closed"))
	r := runCLI(t, env, "status")
	r.want(t, 1, "")
	if r.stderr != "csiactor: store: closed\n" {
		t.Errorf("stderr = %q", r.stderr)
	}
}
