package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/runtime"
)

// modifyDriver is d able to modify volumes: the example plugin always is
// (it accepts iops and throughput), the hostpath driver with
// -enable-controller-modify-volume, accepting iops only.
func modifyDriver(d driver) driver {
	if d.alloc != hostpathDriver.alloc {
		return d
	}
	d.allocation = func(h *host) string {
		return h.hostpathAllocation("-enable-controller-modify-volume", "-accepted-mutable-parameter-names=iops")
	}
	return d
}

// post sends body to the agent's HTTP API at path and returns the status
// and the answer.
func (h *host) post(path, body string) (int, string) {
	h.t.Helper()
	sock := strings.TrimPrefix(h.address(), "unix://")
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}, Timeout: commandTimeout}
	defer c.CloseIdleConnections()
	resp, err := c.Post("http://csiactor"+path, "application/json", strings.NewReader(body))
	if err != nil {
		h.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAgent_ModifyVolume modifies a volume's mutable parameters through
// the CLI and the HTTP API with each driver: they merge, the volume shows
// them, and each refusal (a parameter the plugin does not accept, none
// at all, an unknown volume) is an error naming what is wrong that
// changes nothing.
func TestAgent_ModifyVolume(t *testing.T) {
	forEachDriver(t, func(t *testing.T, d driver) {
		defer leakcheck.Check(t)()
		h := newHost(t)
		a := h.startWith(modifyDriver(d))
		const vol = "m1"
		h.createVolume(d, vol, "single-node-writer")
		h.ok("volume", "claim", "-alloc", "w", "-mode", "write", "-access-mode", "single-node-writer", vol)

		if got := h.ok("volume", "modify", "-param", "iops=3000", vol); got != "Modified volume m1: mutable parameters iops=3000\n" {
			t.Errorf("volume modify printed %q", got)
		}
		code, body := h.post("/v1/volumes/m1/modify", `{"mutable_parameters":{"iops":"4000"}}`)
		var v runtime.Volume
		if err := json.Unmarshal([]byte(body), &v); code != http.StatusOK || err != nil || v.MutableParameters["iops"] != "4000" {
			t.Fatalf("POST modify = %d %s (%v)", code, body, err)
		}
		want := map[string]string{"iops": "4000"}
		if d.alloc == exampleDriver.alloc {
			// Merged with what was applied before.
			h.ok("volume", "modify", "-param", "throughput=125", vol)
			want["throughput"] = "125"
			if got := h.pluginMutable(vol); !maps.Equal(got, want) {
				t.Errorf("the example plugin records %v, want %v", got, want)
			}
		}
		if got := h.volume(vol).MutableParameters; !maps.Equal(got, want) {
			t.Errorf("volume's mutable parameters = %v, want %v", got, want)
		}
		status := h.ok("volume", "status", vol)
		if !strings.Contains(status, "Mutable parameters") || !strings.Contains(status, "iops=4000") {
			t.Errorf("volume status does not show the mutable parameters:\n%s", status)
		}

		h.fails(1, "color", "volume", "modify", "-param", "color=blue", vol)
		if code, body := h.post("/v1/volumes/m1/modify", `{"mutable_parameters":{"color":"blue"}}`); code != http.StatusBadRequest || !strings.Contains(body, `color`) {
			t.Errorf("POST modify of a refused parameter = %d %s, want 400 naming it", code, body)
		}
		if code, body := h.post("/v1/volumes/m1/modify", `{"mutable_parameters":{}}`); code != http.StatusBadRequest || !strings.Contains(body, "mutable_parameters") {
			t.Errorf("POST modify with no parameter = %d %s, want 400 naming mutable_parameters", code, body)
		}
		h.fails(2, "-param is required", "volume", "modify", vol)
		if code, body := h.post("/v1/volumes/nope/modify", `{"mutable_parameters":{"iops":"1"}}`); code != http.StatusNotFound || !strings.Contains(body, "nope") {
			t.Errorf("POST modify of an unknown volume = %d %s, want 404", code, body)
		}
		h.fails(1, `volume "nope" not found`, "volume", "modify", "-param", "iops=1", "nope")
		v = h.volume(vol)
		if !maps.Equal(v.MutableParameters, want) || len(v.Modifying) != 0 {
			t.Errorf("after the refusals: mutable %v, modifying %v; want %v", v.MutableParameters, v.Modifying, want)
		}
		if evs := h.events(); !hasEvent(evs, runtime.EventVolumeModified, "", vol) || !hasEvent(evs, runtime.EventVolumeModifyFailed, "", vol) {
			t.Errorf("events lack volume-modified or volume-modify-failed of %s", vol)
		}
		h.ok("volume", "release", "-alloc", "w", vol)
		a.stop()
	})
}

// TestAgent_ModifyWithoutCapability: the hostpath driver started without
// -enable-controller-modify-volume has no MODIFY_VOLUME; a modify is a
// 400 naming it, and the volume is unchanged.
func TestAgent_ModifyWithoutCapability(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	a := h.startWith(hostpathDriver)
	h.createVolume(hostpathDriver, "m1", "single-node-writer")
	code, body := h.post("/v1/volumes/m1/modify", `{"mutable_parameters":{"iops":"1"}}`)
	if code != http.StatusBadRequest || !strings.Contains(body, "MODIFY_VOLUME") {
		t.Errorf("POST modify = %d %s, want 400 naming MODIFY_VOLUME", code, body)
	}
	h.fails(1, "MODIFY_VOLUME", "volume", "modify", "-param", "iops=1", "m1")
	if v := h.volume("m1"); len(v.MutableParameters)+len(v.Modifying) != 0 {
		t.Errorf("volume after the refusals: mutable %v, modifying %v", v.MutableParameters, v.Modifying)
	}
	a.stop()
}

// pluginMutable reads the mutable parameters the example plugin records
// for the volume it created as vol.
func (h *host) pluginMutable(vol string) map[string]string {
	h.t.Helper()
	var st struct {
		Volumes map[string]struct {
			Name              string            `json:"name"`
			MutableParameters map[string]string `json:"mutable_parameters"`
		} `json:"volumes"`
	}
	b, err := os.ReadFile(filepath.Join(h.stateDir, "state.json"))
	if err != nil || json.Unmarshal(b, &st) != nil {
		h.t.Fatalf("read the example plugin's state: %v\n%s", err, b)
	}
	for _, v := range st.Volumes {
		if v.Name == vol {
			return v.MutableParameters
		}
	}
	h.t.Fatalf("the example plugin has no volume named %s:\n%s", vol, b)
	return nil
}

// modifyCrashPoints are the persisted steps of a modification.
var modifyCrashPoints = []string{"persist:modify", "persisted:modify", "persist:modified", "persisted:modified"}

// TestAgent_SIGKILLDuringModify kills the agent at every persisted step
// of a modification of a claimed volume and starts it again: the
// modification ends done (resumed by the agent, or asked again by its
// caller), the agent and the plugin both record the parameters, and the
// volume releases cleanly.
func TestAgent_SIGKILLDuringModify(t *testing.T) {
	defer leakcheck.Check(t)()
	h := newHost(t)
	h.writeConfig(h.exampleAllocation(0))
	const alloc = "w"
	want := map[string]string{"iops": "3000"}
	finish := func(vol string) {
		t.Helper()
		// Resumed at start: done without being asked again.
		h.eventually(vol+": modification resumed", settleDeadline, func() (bool, string) {
			v := h.volume(vol)
			return maps.Equal(v.MutableParameters, want) && len(v.Modifying) == 0, describe(v)
		})
		h.ok("volume", "modify", "-param", "iops=3000", vol) // done already: no RPC
		if got := h.pluginMutable(vol); !maps.Equal(got, want) {
			t.Errorf("%s: the plugin records %v, want %v", vol, got, want)
		}
		h.ok("volume", "release", "-alloc", alloc, vol)
		h.eventually(vol+": every claim freed", settleDeadline, func() (bool, string) {
			v := h.volume(vol)
			return len(v.Claims) == 0 && len(v.PastClaims) == 0, describe(v)
		})
		h.checkNothingLeft(vol)
	}
	prev, prevRecorded := "", false
	for i, point := range modifyCrashPoints {
		vol := fmt.Sprintf("m%d", i)
		h.agentEnv = []string{"CSIACTOR_CRASH_AT=" + point + "@" + vol}
		a := h.startAgent()
		h.waitHealthy()
		if prev != "" {
			if !prevRecorded {
				// Killed before the intent was written: nothing to
				// resume; the caller asks again.
				h.ok("volume", "modify", "-param", "iops=3000", prev)
			}
			finish(prev)
		}
		h.ok("volume", "create", "-plugin", "example", "-capacity", "1GiB", "-capability", "single-node-writer", vol)
		h.ok("volume", "claim", "-alloc", alloc, "-mode", "write", "-access-mode", "single-node-writer", vol)
		if r := h.cli("volume", "modify", "-param", "iops=3000", vol); r.code == 0 {
			t.Errorf("%s: the modification succeeded although the agent was to be killed at %s: %s", vol, point, r)
		}
		if st := a.wait(shutdownDeadline); st.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("%s: agent ended with %s, want killed at %s", vol, st, point)
		}
		a.checkNoRace()
		prev, prevRecorded = vol, point != "persist:modify"
	}
	h.agentEnv = nil
	a := h.startAgent()
	h.waitHealthy()
	finish(prev)
	a.stop()
}
