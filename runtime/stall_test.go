package runtime_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/runtime"
)

// TestRuntime_StalledRelease: a release whose NodeUnstageVolume keeps
// failing is counted per failure, and once it has not moved for
// volumes.stall_after its past claim is stalled, with its last error, in
// the runtime's and the HTTP API's status, a claim-stalled event and
// csiactor_volume_claims_stalled. When the plugin lets it go it is freed
// and the gauge drops.
func TestRuntime_StalledRelease(t *testing.T) {
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	// Long enough for the first NodeUnstageVolume to have failed before
	// the stall is seen, on a loaded machine too (with 50 ms, CI once saw
	// the past claim stall before its first attempt, with no error to
	// report), as in package volume's stall tests.
	e.cfg.Volumes.StallAfter = time.Second
	e.start()
	p := e.attach("mono", testPlugin, runtime.TypeMonolith, fakeplugin.Config{ControllerPublish: true, StageUnstage: true})
	c := serveAPI(t, e.rt)
	ctx := context.Background()
	spec := volSpec("single-node-writer")
	spec.Secrets = map[string]string{"password": "s3cr3t-stall"}
	if _, err := c.RegisterVolume(ctx, "data1", spec); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Claim(ctx, "data1", claimReq("web", "write", "single-node-writer")); err != nil {
		t.Fatal(err)
	}
	p.SetFault("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Internal, Message: "device is busy"})
	if _, err := c.Release(ctx, "data1", "web"); err != nil {
		t.Fatal(err)
	}

	stalled := func(v runtime.Volume) bool {
		return len(v.PastClaims) == 1 && v.PastClaims[0].Condition == runtime.ClaimStalled
	}
	var viaHTTP runtime.Volume
	eventually(t, "the past claim stalled in the HTTP API", func() (bool, error) {
		var err error
		viaHTTP, err = c.Volume(ctx, "data1")
		return stalled(viaHTTP) && viaHTTP.PastClaims[0].LastError != "", err
	})
	pc := viaHTTP.PastClaims[0]
	if pc.State != runtime.ClaimTaken || !strings.Contains(pc.LastError, "device is busy") {
		t.Errorf("stalled past claim %+v: want taken with NodeUnstageVolume's error", pc)
	}
	if v, err := e.rt.Volume(ctx, "data1"); err != nil || !stalled(v) {
		t.Errorf("runtime's status: %+v, %v; want the past claim stalled", v, err)
	}
	if vs, err := c.Volumes(ctx, runtime.VolumeFilter{}); err != nil || len(vs) != 1 || !stalled(vs[0]) {
		t.Errorf("volume list: %+v, %v; want the past claim stalled", vs, err)
	}
	labels := map[string]string{"plugin": testPlugin}
	eventually(t, "csiactor_volume_claims_stalled at 1", func() (bool, error) {
		n, ok := metrictest.Value(t, e.reg, "csiactor_volume_claims_stalled", labels)
		return ok && n == 1, nil
	})
	failures := map[string]string{"plugin": testPlugin, "step": "NodeUnstageVolume", "code": "Internal"}
	if n, ok := metrictest.Value(t, e.reg, "csiactor_claim_step_failures_total", failures); !ok || n < 1 {
		t.Errorf("csiactor_claim_step_failures_total%v = %v (%t), want at least 1", failures, n, ok)
	}
	// The past claim's: on a loaded machine the claim may also have
	// stalled for a while in a publish step, with an event of its own
	// before.
	var ev runtime.Event
	eventually(t, "a claim-stalled event of the past claim", func() (bool, error) {
		evs, err := c.Events(ctx)
		for _, x := range evs {
			if x.Type == runtime.EventClaimStalled && x.Alloc == "web" && x.Volume == "data1" && strings.Contains(x.Message, "state taken") {
				ev = x
				return true, err
			}
		}
		return false, err
	})
	if ev.Plugin != testPlugin || !strings.Contains(ev.Message, "device is busy") || !strings.Contains(ev.Message, "state taken") ||
		strings.Contains(ev.Message, "s3cr3t") {
		t.Errorf("claim-stalled event %+v: want the state and the last error, no secret", ev)
	}

	// Release steps go on retrying: the past claim is freed once the
	// plugin lets it go.
	p.ClearFaults()
	e.waitFreed("data1", "web")
	eventually(t, "csiactor_volume_claims_stalled at 0", func() (bool, error) {
		n, ok := metrictest.Value(t, e.reg, "csiactor_volume_claims_stalled", labels)
		return ok && n == 0, nil
	})
}
