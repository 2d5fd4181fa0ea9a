package proxy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csiactor/csiactor/api"
	"github.com/csiactor/csiactor/api/apitest"
	"github.com/csiactor/csiactor/cmd/csiactor/cli"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/runtime"
)

// csiactor runs the CLI against address and returns its exit code and
// output.
func csiactor(t *testing.T, address string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := cli.Run(context.Background(), append(args, "-address", address), &out, &errOut)
	return code, out.String(), errOut.String()
}

// callResult runs `plugin call` and decodes what it printed.
func callResult(t *testing.T, address string, wantCode int, args ...string) runtime.PluginCallResult {
	t.Helper()
	code, out, errOut := csiactor(t, address, append([]string{"plugin", "call"}, args...)...)
	if code != wantCode {
		t.Fatalf("plugin call %v: exit %d, want %d\nstdout: %s\nstderr: %s", args, code, wantCode, out, errOut)
	}
	var res runtime.PluginCallResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("plugin call %v printed no result: %v\n%s", args, err, out)
	}
	return res
}

// `plugin call` sends an identity, a controller and a node RPC to the
// plugin's allocations and prints their answers as JSON, with the secrets
// of the request stripped; it refuses an unknown method, bad JSON, a
// request of the wrong shape and a type the method cannot go to as usage
// errors (exit 2), and prints a plugin's error with its code (exit 1).
func TestPluginCall(t *testing.T) {
	for _, tc := range []struct {
		name   string
		plugin string
		spec   func(e *env) runtime.AllocationSpec
	}{
		{"example", "example", func(e *env) runtime.AllocationSpec { return e.exampleSpec(filepath.Join(e.dir, "s"), "") }},
		{"hostpath", "hostpath", func(e *env) runtime.AllocationSpec { return e.hostpathSpec() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.register("a1", tc.spec(e))
			addr := apitest.Serve(t, e.rt, api.Options{})
			p := tc.plugin

			info := callResult(t, addr, cli.ExitOK, p, "GetPluginInfo")
			if info.Alloc != "a1" || info.Type != runtime.TypeNode || !strings.Contains(string(info.Response), `"vendorVersion"`) {
				t.Errorf("GetPluginInfo: %+v", info)
			}
			ctrlInfo := callResult(t, addr, cli.ExitOK, p, "Probe", "-type", "controller")
			if ctrlInfo.Type != runtime.TypeController {
				t.Errorf("Probe -type controller went to the %s", ctrlInfo.Type)
			}

			create := callResult(t, addr, cli.ExitOK, p, "CreateVolume", "-json",
				`{"name":"call-1","capacity_range":{"required_bytes":1048576},
				  "volume_capabilities":[{"mount":{"mount_flags":["noatime"]},"access_mode":{"mode":"SINGLE_NODE_WRITER"}}],
				  "secrets":{"token":"hunter2"}}`)
			if strings.Contains(string(create.Request), "hunter2") || strings.Contains(string(create.Request), "noatime") || !strings.Contains(string(create.Request), csi.Stripped) {
				t.Errorf("CreateVolume's request echo has its secrets: %s", create.Request)
			}
			var vol struct {
				Volume struct {
					VolumeID string `json:"volumeId"`
				} `json:"volume"`
			}
			if err := json.Unmarshal(create.Response, &vol); err != nil || vol.Volume.VolumeID == "" {
				t.Fatalf("CreateVolume answered %s (%v)", create.Response, err)
			}

			node := callResult(t, addr, cli.ExitOK, p, "NodeGetInfo")
			if node.Type != runtime.TypeNode || !strings.Contains(string(node.Response), `"nodeId"`) {
				t.Errorf("NodeGetInfo: %+v", node)
			}

			// The plugin's error: its code and message, exit 1.
			code, out, errOut := csiactor(t, addr, "plugin", "call", p, "NodePublishVolume", "-json", `{"volume_id":"`+vol.Volume.VolumeID+`"}`)
			if code != cli.ExitError || !strings.Contains(errOut, "InvalidArgument") || !strings.Contains(out, `"code": "InvalidArgument"`) {
				t.Errorf("NodePublishVolume without a target: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
			}
			if code := callResult(t, addr, cli.ExitOK, p, "DeleteVolume", "-json", `{"volume_id":"`+vol.Volume.VolumeID+`"}`); code.Error != nil {
				t.Errorf("DeleteVolume: %+v", code.Error)
			}

			// Refusals.
			for _, r := range []struct {
				args []string
				code int
				want string
			}{
				{[]string{"NodeMount"}, cli.ExitUsage, "valid methods: GetPluginCapabilities, GetPluginInfo, Probe, "},
				{[]string{"CreateVolume", "-json", `{"name":`}, cli.ExitUsage, "-json"},
				{[]string{"CreateVolume", "-json", `{"nme":"x"}`}, cli.ExitUsage, "-json: not a csi.v1.CreateVolumeRequest"},
				{[]string{"NodeGetInfo", "-type", "controller"}, cli.ExitUsage, "NodeGetInfo is a node method"},
				{[]string{"Probe", "-type", "storage"}, cli.ExitUsage, `-type: "storage"`},
				{[]string{}, cli.ExitUsage, "missing METHOD"},
			} {
				code, out, errOut := csiactor(t, addr, append([]string{"plugin", "call", p}, r.args...)...)
				if code != r.code || !strings.Contains(errOut, r.want) || out != "" {
					t.Errorf("plugin call %s %v: exit %d, want %d with %q\nstdout: %s\nstderr: %s", p, r.args, code, r.code, r.want, out, errOut)
				}
			}
			code, _, errOut = csiactor(t, addr, "plugin", "call", "nfs", "Probe")
			if code != cli.ExitError || !strings.Contains(errOut, "nfs") {
				t.Errorf("plugin call of an unknown plugin: exit %d: %s", code, errOut)
			}
		})
	}
}
