package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/runtime"
)

// startHung starts a runtime whose node RPCs time out after 200 ms, with
// an exec-managed fake plugin (allocation h1) whose calls in hang
// (FAKE_HANG: "Method" or "Method@volume") hang, and returns it healthy
// with its PID.
func startHung(t *testing.T, hang string, mod func(*runtime.Config)) (*testEnv, int) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{t: t, dataDir: shortDir(t, "csiactor-rt-")}
	e.cfg = testConfig(e.dataDir)
	e.cfg.Plugins.RPCTimeout = 200 * time.Millisecond
	if mod != nil {
		mod(&e.cfg)
	}
	e.start()
	if _, err := e.rt.RegisterAllocation(context.Background(), "h1", runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeMonolith, Command: []string{self, "-test.run=^$"},
		Env: map[string]string{fakePluginEnv: "1", "FAKE_HANG": hang},
	}); err != nil {
		t.Fatal(err)
	}
	e.waitAllocHealthy("h1")
	return e, e.alloc("h1").PID
}

// TestRuntime_HungNodePublish_RestartsPlugin: an exec-managed plugin that
// answers Probe but hangs NodePublishVolume is restarted once a claim's
// publishes have timed out plugins.hung_rpc_restart times in a row; the
// event plugin-hung and csiactor_plugin_hung_restarts_total say so, and
// the claim, released, is torn down by the new process.
func TestRuntime_HungNodePublish_RestartsPlugin(t *testing.T) {
	defer leakcheck.Check(t)()
	e, first := startHung(t, "NodePublishVolume", nil)
	ctx := context.Background()
	if _, err := e.rt.RegisterVolume(ctx, "vol-1", volSpec("single-node-writer")); err != nil {
		t.Fatal(err)
	}

	// The claim retries its publish, each attempt timing out, until the
	// test has seen the restart and gives up on it.
	claimCtx, cancel := context.WithCancel(ctx)
	claimed := make(chan error, 1)
	go func() {
		_, err := e.rt.Claim(claimCtx, "vol-1", claimReq("a1", runtime.ModeWrite, "single-node-writer"))
		claimed <- err
	}()
	eventually(t, "plugin-hung and a restarted plugin", func() (bool, error) {
		pid := e.alloc("h1").PID
		return len(e.eventsOf(runtime.EventPluginHung)) > 0 && pid != 0 && pid != first, nil
	})
	cancel()
	if err := <-claimed; err == nil {
		t.Fatal("a claim whose every publish hangs succeeded")
	}
	// The check starts at the third timeout in a row (the default
	// hung_rpc_restart); the claim goes on retrying its publish meanwhile,
	// so on a loaded machine a fourth may time out before the check's
	// fingerprint answers, and the event counts what the restart saw.
	ev := e.eventsOf(runtime.EventPluginHung)[0]
	var n int
	_, err := fmt.Sscanf(ev.Message, "node RPCs hang: %d in a row ended in DeadlineExceeded while the plugin answers Probe; restarting the plugin", &n)
	if ev.Plugin != testPlugin || ev.Alloc != "h1" || err != nil || n < 3 ||
		ev.Message != fmt.Sprintf("node RPCs hang: %d in a row ended in DeadlineExceeded while the plugin answers Probe; restarting the plugin", n) {
		t.Errorf("event %+v: want at least 3 timeouts in a row, and the restart", ev)
	}
	if n, _ := metrictest.Value(t, e.reg, "csiactor_plugin_hung_restarts_total", map[string]string{"plugin": testPlugin}); n < 1 {
		t.Errorf("csiactor_plugin_hung_restarts_total = %v, want at least 1", n)
	}

	if _, err := e.rt.Release(ctx, "vol-1", "a1"); err != nil && !errors.Is(err, runtime.ErrNotFound) {
		t.Fatal(err)
	}
	e.waitFreed("vol-1", "a1")
	if err := e.rt.DeregisterAllocation(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	e.stop()
}

// TestRuntime_HungOneVolume_NoRestart: a plugin that hangs
// NodePublishVolume on one volume but answers every other node RPC is not
// restarted, though more of that volume's publishes time out in all than
// plugins.hung_rpc_restart: the answers between them start the count over.
// The slow volume's claims fail (volumes.max_claim_attempts); the other
// volume's claim is published by the same process.
func TestRuntime_HungOneVolume_NoRestart(t *testing.T) {
	defer leakcheck.Check(t)()
	e, first := startHung(t, "NodePublishVolume@ext-slow", func(c *runtime.Config) {
		c.Volumes.MaxClaimAttempts = 2 // two timeouts in a row per claim; the count is 3
		// Room for the answered calls on a loaded machine: one of them
		// timing out too would make three in a row.
		c.Plugins.RPCTimeout = time.Second
	})
	ctx := context.Background()
	for _, v := range []string{"slow", "fast"} {
		if _, err := e.rt.RegisterVolume(ctx, v, volSpecFor(v, "single-node-writer")); err != nil {
			t.Fatal(err)
		}
	}

	slowClaim := func(alloc string) {
		t.Helper()
		_, err := e.rt.Claim(ctx, "slow", claimReq(alloc, runtime.ModeWrite, "single-node-writer"))
		t.Logf("claim %s of the slow volume: %v", alloc, err)
		if err == nil {
			t.Fatalf("claim %s of the slow volume succeeded", alloc)
		}
		e.waitFreed("slow", alloc)
	}
	slowClaim("a1")
	if _, err := e.rt.Claim(ctx, "fast", claimReq("b1", runtime.ModeWrite, "single-node-writer")); err != nil {
		t.Fatalf("claim of the other volume: %v", err)
	}
	slowClaim("a2") // four timeouts in all, never three in a row

	if a := e.alloc("h1"); a.PID != first || !a.Healthy {
		t.Errorf("allocation PID %d (was %d) healthy %v: want the same healthy process", a.PID, first, a.Healthy)
	}
	if evs := e.eventsOf(runtime.EventPluginHung); len(evs) != 0 {
		t.Errorf("plugin-hung events %+v for one slow volume", evs)
	}
	if n, _ := metrictest.Value(t, e.reg, "csiactor_plugin_hung_restarts_total", map[string]string{"plugin": testPlugin}); n != 0 {
		t.Errorf("csiactor_plugin_hung_restarts_total = %v, want 0", n)
	}

	if _, err := e.rt.Release(ctx, "fast", "b1"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("fast", "b1")
	if err := e.rt.DeregisterAllocation(ctx, "h1"); err != nil {
		t.Fatal(err)
	}
	e.stop()
}
