package volume

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
)

// TestManager_LifecycleWaitsForThreeWrites checks which writes of a claim's
// whole lifecycle (claim → ControllerPublish → NodeStage → NodePublish →
// release → NodeUnpublish → NodeUnstage → ControllerUnpublish → freed)
// wait for the disk: the claim's intent (reserved) before its first RPC,
// its outcome (published) before the caller is answered, and the
// release's taken before Release answers. Every step in between is
// deferred (the crash tests show that resuming redoes what a crash lost).
func TestManager_LifecycleWaitsForThreeWrites(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEnv(t, fullPlugin, withDurableStore(""), func(e *env) { e.storeReg = reg })
	e.register("vol")
	writes := func() (durable, deferred float64) {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "csiactor_store_writes_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				switch m.GetLabel()[0].GetValue() {
				case "ok":
					durable = m.GetCounter().GetValue()
				case "deferred":
					deferred = m.GetCounter().GetValue()
				}
			}
		}
		return durable, deferred
	}
	durable0, deferred0 := writes()
	if _, err := e.m.Claim(ctxT(t), claimReq("vol", "a1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	durable1, deferred1 := writes()
	if durable1-durable0 != 2 || deferred1-deferred0 != 2 {
		t.Errorf("claim: %v durable and %v deferred writes, want 2 (reserved, published) and 2 (controller-published, staged)",
			durable1-durable0, deferred1-deferred0)
	}
	if _, err := e.m.Release(ctxT(t), "vol", "a1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol")
	durable2, deferred2 := writes()
	if durable2-durable1 != 1 {
		t.Errorf("release: %v durable writes, want 1 (taken)", durable2-durable1)
	}
	if deferred2-deferred1 < 3 {
		t.Errorf("release: %v deferred writes, want at least 3 (node-unpublished, unstaged, freed)", deferred2-deferred1)
	}
	e.checkAgree()
}
