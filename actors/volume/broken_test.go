package volume

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/mountprobe"
	"github.com/csiactor/csiactor/internal/mountprobe/mountprobetest"
)

// probedEnv is hostEnv with a mount probe whose stat is a fake one,
// waiting timeout for an answer.
func probedEnv(t *testing.T, timeout time.Duration) (*env, *mountprobetest.Stat, *eventLog, Claim) {
	t.Helper()
	dead := mountprobetest.New()
	t.Cleanup(dead.Release)
	probe := mountprobe.New(mountprobe.Config{Timeout: timeout, Budget: 4, Stat: dead.Stat})
	e, _, events, c := hostEnv(t, withConfig(func(c *Config) { c.MountProbe = probe }))
	return e, dead, events, c
}

// brokenExposition is the exposition of the dead-mount metrics of the test
// plugin: the total by cause (0 for a cause not in causes) and the gauge.
func brokenExposition(causes map[string]string, gauge string) string {
	s := "# HELP csiactor_mounts_broken Claims whose mount was found dead and is not healed yet, by plugin.\n" +
		"# TYPE csiactor_mounts_broken gauge\n" +
		`csiactor_mounts_broken{plugin="fake"} ` + gauge + "\n" +
		"# HELP csiactor_mounts_broken_total Mounts of published claims found dead (in the mount table, but a stat fails with ENOTCONN, EIO or ESTALE, or does not answer: cause timeout), by plugin and cause. Each is healed by publishing the claim again.\n" +
		"# TYPE csiactor_mounts_broken_total counter\n"
	for _, cause := range []string{mountprobe.CauseEIO, mountprobe.CauseENOTCONN, mountprobe.CauseESTALE, mountprobe.CauseTimeout} {
		n, ok := causes[cause]
		if !ok {
			n = "0"
		}
		s += `csiactor_mounts_broken_total{cause="` + cause + `",plugin="fake"} ` + n + "\n"
	}
	return s
}

func (e *env) waitBrokenMetrics(causes map[string]string, gauge string) {
	e.t.Helper()
	var err error
	waitFor(e.t, "the dead-mount metrics at "+brokenExposition(causes, gauge), func() bool {
		err = testutil.GatherAndCompare(e.reg, strings.NewReader(brokenExposition(causes, gauge)), "csiactor_mounts_broken", "csiactor_mounts_broken_total")
		return err == nil
	})
}

// probesExposition is csiactor_mount_probes_total of the test plugin.
func probesExposition(alive, dead, unknown string) string {
	return "# HELP csiactor_mount_probes_total Mount points of published claims probed by the host checks, by plugin and result: alive (the stat answered), dead (found broken), unknown (no place among the probes still outstanding).\n" +
		"# TYPE csiactor_mount_probes_total counter\n" +
		`csiactor_mount_probes_total{plugin="fake",result="alive"} ` + alive + "\n" +
		`csiactor_mount_probes_total{plugin="fake",result="dead"} ` + dead + "\n" +
		`csiactor_mount_probes_total{plugin="fake",result="unknown"} ` + unknown + "\n"
}

func (e *env) checkProbes(alive, dead, unknown string) {
	e.t.Helper()
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(probesExposition(alive, dead, unknown)), "csiactor_mount_probes_total"); err != nil {
		e.t.Error(err)
	}
}

// rpcCalls returns the fake plugin's call counts of the node RPCs a heal
// makes: NodeUnpublish, NodeUnstage, NodeStage, NodePublish.
func rpcCalls(p *fakeplugin.Plugin) [4]int {
	return [4]int{p.Calls("NodeUnpublishVolume"), p.Calls("NodeUnstageVolume"), p.Calls("NodeStageVolume"), p.Calls("NodePublishVolume")}
}

// TestManager_Reconcile_DeadMount_Healed: a target or staging that is in
// the mount table but whose stat fails with ENOTCONN, EIO or ESTALE, or
// does not answer, sends its claim through the heal: condition broken, the
// repair naming what and why, event mount-broken, the gauge at 1 while the
// plugin keeps failing; then unpublished (and unstaged) and published
// again, event mount-healed with the heal time, the gauge at 0 and the
// total counted by cause.
func TestManager_Reconcile_DeadMount_Healed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		staging bool
		err     error  // the stat's error; nil: it hangs
		cause   string // the cause reported
		repair  string
		rpcs    [4]int // more calls of NodeUnpublish, NodeUnstage, NodeStage, NodePublish
	}{
		{"target ENOTCONN", false, syscall.ENOTCONN, mountprobe.CauseENOTCONN, "target path broken (ENOTCONN)", [4]int{1, 0, 0, 1}},
		{"target hangs", false, nil, mountprobe.CauseTimeout, "target path broken (timeout)", [4]int{1, 0, 0, 1}},
		{"staging EIO", true, syscall.EIO, mountprobe.CauseEIO, "staging path broken (EIO)", [4]int{1, 1, 1, 1}},
		{"staging ESTALE", true, syscall.ESTALE, mountprobe.CauseESTALE, "staging path broken (ESTALE)", [4]int{1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A hung stat is given up after the probe's timeout: short
			// here, and long enough for any other stat to answer.
			timeout := time.Minute
			if tc.err == nil {
				timeout = 50 * time.Millisecond
			}
			e, dead, events, c := probedEnv(t, timeout)
			ctx := ctxT(t)
			path := c.TargetPath
			if tc.staging {
				path = c.StagingPath
			}
			if tc.err != nil {
				dead.Set(path, tc.err)
			} else {
				dead.Hang(path)
			}
			before := rpcCalls(e.plugin)
			// The repair's NodePublishVolume fails until the test
			// clears it: the broken claim can be looked at.
			e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "plugin restarting"})
			res, err := e.m.Reconcile(ctx, ReconcileOptions{Plugin: testPlugin})
			if err != nil || res.Volumes != 1 || res.Claims != 1 {
				t.Fatalf("Reconcile = %+v, %v; want one claim of one volume", res, err)
			}
			waitFor(t, "a failed NodePublishVolume of the heal", func() bool { return e.plugin.Calls("NodePublishVolume") > before[3] })
			v, err := e.m.Get(ctx, "vol1")
			if err != nil {
				t.Fatal(err)
			}
			if got := v.Claims[0]; got.State == claim.StatePublished || got.Condition != ConditionBroken || got.Repair != tc.repair {
				t.Errorf("claim while healing = state %s, condition %q, repair %q; want not published, broken, %q", got.State, got.Condition, got.Repair, tc.repair)
			}
			e.waitBrokenMetrics(map[string]string{tc.cause: "1"}, "1")
			e.checkProbes("1", "1", "0")
			broken := events.find(EventMountBroken, "a")
			if len(broken) != 1 || broken[0].Plugin != testPlugin || broken[0].Volume != "vol1" ||
				!strings.Contains(broken[0].Message, path+" is dead ("+tc.cause+")") {
				t.Errorf("mount-broken events = %+v; want one naming %s and %s", broken, path, tc.cause)
			}

			dead.Set(path, nil) // the heal's new mount answers
			e.plugin.ClearFaults()
			got := e.waitPublished("vol1", "a")
			if got.Repair != "" || got.Condition != "" || got.TargetPath != c.TargetPath {
				t.Errorf("claim after the heal = %+v", got)
			}
			waitFor(t, "a mount-healed event", func() bool { return len(events.find(EventMountHealed, "a")) > 0 })
			healed := events.find(EventMountHealed, "a")
			if len(healed) != 1 || !strings.Contains(healed[0].Message, "dead mount "+path+" ("+tc.cause+") healed in ") ||
				strings.Contains(healed[0].Message, "agent unmounted") {
				t.Errorf("mount-healed events = %+v; want one with the path, the cause and the time", healed)
			}
			after := rpcCalls(e.plugin)
			for i, n := range tc.rpcs {
				if i == 3 {
					continue // NodePublishVolume: its failures count too
				}
				if after[i]-before[i] != n {
					t.Errorf("calls of NodeUnpublish, NodeUnstage, NodeStage, NodePublish: %v → %v; want %v more", before, after, tc.rpcs)
					break
				}
			}
			e.waitBrokenMetrics(map[string]string{tc.cause: "1"}, "0")
			e.checkAgree()
		})
	}
}

// TestManager_Reconcile_ProbeFindsNothingDead: a stat that answers, or
// fails otherwise than a dead mount does (ENOENT, EACCES), sends nothing
// back; a check of another plugin probes nothing.
func TestManager_Reconcile_ProbeFindsNothingDead(t *testing.T) {
	e, dead, events, c := probedEnv(t, time.Minute)
	ctx := ctxT(t)
	dead.Set(c.TargetPath, syscall.ENOENT)
	dead.Set(c.StagingPath, syscall.EACCES)
	before := rpcCalls(e.plugin)
	if res, err := e.m.Reconcile(ctx, ReconcileOptions{Plugin: testPlugin}); err != nil || res.Claims != 0 {
		t.Errorf("Reconcile = %+v, %v; want nothing sent back", res, err)
	}
	if dead.Calls(c.TargetPath) != 1 || dead.Calls(c.StagingPath) != 1 {
		t.Errorf("stats of the target and the staging: %d, %d; want one each", dead.Calls(c.TargetPath), dead.Calls(c.StagingPath))
	}
	e.waitBrokenMetrics(nil, "0")
	e.checkProbes("2", "0", "0")
	dead.Set(c.TargetPath, syscall.ENOTCONN)
	if res, err := e.m.Reconcile(ctx, ReconcileOptions{Plugin: "other"}); err != nil || res.Claims != 0 {
		t.Errorf("Reconcile of another plugin = %+v, %v; want nothing sent back", res, err)
	}
	if dead.Calls(c.TargetPath) != 1 {
		t.Errorf("a check of another plugin stat'ed this plugin's target")
	}
	if got := rpcCalls(e.plugin); got != before {
		t.Errorf("node RPCs %v → %v; want none", before, got)
	}
	if evs := events.find(EventMountBroken, "a"); len(evs) != 0 {
		t.Errorf("mount-broken events = %+v; want none", evs)
	}
}

// TestManager_Reconcile_HungProbeDoesNotHoldTheVolume: while the stat of a
// target hangs, Reconcile returns after the probe's timeout, the volume
// answers, and a second check does not stat the path again: it is still
// dead (timeout) and counted once more.
func TestManager_Reconcile_HungProbeDoesNotHoldTheVolume(t *testing.T) {
	e, dead, _, c := probedEnv(t, 50*time.Millisecond)
	ctx := ctxT(t)
	dead.Hang(c.TargetPath)
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Unavailable})
	if res, err := e.m.Reconcile(ctx, ReconcileOptions{}); err != nil || res.Claims != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the claim sent back", res, err)
	}
	if _, err := e.m.Get(ctx, "vol1"); err != nil {
		t.Fatalf("Get while the stat hangs: %v", err)
	}
	if res, err := e.m.Reconcile(ctx, ReconcileOptions{}); err != nil || res.Claims != 0 {
		t.Errorf("second Reconcile = %+v, %v; want nothing more sent back (the claim is healing)", res, err)
	}
	if n := dead.Calls(c.TargetPath); n != 1 {
		t.Errorf("the hung target was stat'ed %d times, want once", n)
	}
	e.plugin.ClearFaults()
	// The heal's new mount is at the same path, whose first stat still
	// hangs: the claim is published, then found dead again (timeout) by
	// the next check, without a second stat.
	e.waitPublished("vol1", "a")
	if res, err := e.m.Reconcile(ctx, ReconcileOptions{}); err != nil || res.Claims != 1 {
		t.Errorf("Reconcile after the heal = %+v, %v; want the claim still dead (its stat hangs)", res, err)
	}
	if n := dead.Calls(c.TargetPath); n != 1 {
		t.Errorf("the hung target was stat'ed %d times, want once", n)
	}
	e.waitBrokenMetrics(map[string]string{mountprobe.CauseTimeout: "2"}, "1")
	// Probed: the target and the staging; then the staging alone (the
	// claim was healing); then both again.
	e.checkProbes("3", "2", "0")
	e.waitPublished("vol1", "a")
	e.waitBrokenMetrics(map[string]string{mountprobe.CauseTimeout: "2"}, "0")
}

// TestManager_Claim_RepeatedClaimProbesTheMount: a claim repeated while
// its target is in the mount table but dead is healed before it is
// answered. While the stat of a hung target waits, the volume still
// answers: the stat waits in a job, not on the volume actor.
func TestManager_Claim_RepeatedClaimProbesTheMount(t *testing.T) {
	e, dead, events, c := probedEnv(t, time.Minute)
	ctx := ctxT(t)
	req := claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)
	before := rpcCalls(e.plugin)
	if again, err := e.m.Claim(ctx, req); err != nil || again.State != claim.StatePublished {
		t.Fatalf("repeated claim of a live mount = %+v, %v", again, err)
	}
	if got := rpcCalls(e.plugin); got != before || dead.Calls(c.TargetPath) != 1 {
		t.Errorf("repeated claim of a live mount: RPCs %v → %v, target stat'ed %d times; want no RPC, one stat", before, got, dead.Calls(c.TargetPath))
	}

	// Dead: healed, then answered.
	dead.Set(c.TargetPath, syscall.ENOTCONN)
	answered := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctx, req)
		answered <- err
	}()
	waitFor(t, "the dead target unpublished", func() bool { return e.plugin.Calls("NodeUnpublishVolume") > before[0] })
	dead.Set(c.TargetPath, nil) // the heal's new mount answers
	if err := <-answered; err != nil {
		t.Fatalf("repeated claim of a dead mount: %v", err)
	}
	if got := rpcCalls(e.plugin); got[0] != before[0]+1 || got[3] != before[3]+1 {
		t.Errorf("RPCs %v → %v; want NodeUnpublishVolume and NodePublishVolume once more", before, got)
	}
	waitFor(t, "a mount-healed event", func() bool { return len(events.find(EventMountHealed, "a")) == 1 })
	if evs := events.find(EventMountBroken, "a"); len(evs) != 1 || !strings.Contains(evs[0].Message, "(ENOTCONN)") {
		t.Errorf("mount-broken events = %+v, want one with ENOTCONN", evs)
	}

	// Hung: the volume answers while the stat waits.
	dead.Hang(c.TargetPath)
	stats := dead.Calls(c.TargetPath)
	go func() {
		_, err := e.m.Claim(ctx, req)
		answered <- err
	}()
	waitFor(t, "the target's stat started", func() bool { return dead.Calls(c.TargetPath) > stats })
	if v, err := e.m.Get(ctx, "vol1"); err != nil || v.Claims[0].State != claim.StatePublished {
		t.Errorf("Get while the repeated claim's stat hangs = %+v, %v; want the published claim", v.Claims, err)
	}
	dead.Release() // the stat returns ENOTCONN: dead
	if err := <-answered; err != nil {
		t.Fatalf("repeated claim of a hung mount: %v", err)
	}
	if evs := events.find(EventMountBroken, "a"); len(evs) != 2 {
		t.Errorf("mount-broken events = %d, want 2", len(evs))
	}
	e.checkAgree()
}
