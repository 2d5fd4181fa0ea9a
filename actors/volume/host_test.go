package volume

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

// fakeHost is a hand-written Host: the test says what is not mounted;
// every other path is (what a plugin stages or publishes is a mount).
type fakeHost struct {
	mu      sync.Mutex
	mounted map[string]bool // guarded by mu; a path not in it is mounted
	looks   int             // guarded by mu
}

func newFakeHost() *fakeHost { return &fakeHost{mounted: map[string]bool{}} }

func (h *fakeHost) Look(context.Context) (claim.HostView, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.looks++
	return hostSnapshot(maps.Clone(h.mounted)), nil
}

func (h *fakeHost) set(mounted bool, paths ...string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, p := range paths {
		h.mounted[p] = mounted
	}
}

type hostSnapshot map[string]bool

func (s hostSnapshot) Mounted(p string) bool { m, set := s[p]; return m || !set }
func (hostSnapshot) Linked(string) bool      { return false }

// hostEnv is an env whose manager looks at a fakeHost, with one write
// claim of alloc a on vol1 published and its paths "mounted".
func hostEnv(t *testing.T, opts ...envOpt) (*env, *fakeHost, *eventLog, Claim) {
	t.Helper()
	host := newFakeHost()
	events := &eventLog{}
	opts = append(opts, withConfig(func(c *Config) { c.Host, c.OnEvent = host, events.add }))
	e := newEnv(t, fullPlugin, opts...)
	e.register("vol1")
	c, err := e.m.Claim(ctxT(t), claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil {
		t.Fatal(err)
	}
	host.set(true, c.TargetPath, c.StagingPath)
	return e, host, events, c
}

// calls returns the plugin's call counts of the publish RPCs.
func calls(p *fakeplugin.Plugin) [3]int {
	return [3]int{p.Calls("ControllerPublishVolume"), p.Calls("NodeStageVolume"), p.Calls("NodePublishVolume")}
}

func (e *env) waitPublished(id, alloc string) Claim {
	e.t.Helper()
	var c Claim
	waitFor(e.t, alloc+"'s claim on "+id+" published again", func() bool {
		v, err := e.m.Get(context.Background(), id)
		if err != nil || len(v.Claims) != 1 {
			return false
		}
		c = v.Claims[0]
		return c.State == claim.StatePublished
	})
	return c
}

// awaitRepaired waits for alloc's claim-repaired event and returns every
// one. The volume's snapshot shows the claim published just before the
// event is recorded, so a test that saw it published waits for the event.
func (l *eventLog) awaitRepaired(t *testing.T, alloc string) []Event {
	t.Helper()
	waitFor(t, alloc+"'s claim-repaired event", func() bool { return len(l.find(EventClaimRepaired, alloc)) > 0 })
	return l.find(EventClaimRepaired, alloc)
}

func (l *eventLog) find(typ, alloc string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.evs {
		if e.Type == typ && e.Alloc == alloc {
			out = append(out, e)
		}
	}
	return out
}

func repairsMetric(t *testing.T, e *env, result string) float64 {
	t.Helper()
	return testutil.ToFloat64(e.m.repairs.WithLabelValues(testPlugin, result))
}

func TestManager_Start_TargetMissing_PublishesAgain(t *testing.T) {
	e, host, events, c := hostEnv(t)
	before := calls(e.plugin)
	host.set(false, c.TargetPath)
	e.restart()
	got := e.waitPublished("vol1", "a")
	if got.Repair != "" || got.Condition != "" || got.TargetPath != c.TargetPath {
		t.Errorf("claim after the repair = %+v", got)
	}
	after := calls(e.plugin)
	if want := [3]int{before[0], before[1], before[2] + 1}; after != want {
		t.Errorf("ControllerPublish, NodeStage, NodePublish calls = %v, want %v (NodePublishVolume once more)", after, want)
	}
	evs := events.awaitRepaired(t, "a")
	if len(evs) != 1 || !strings.Contains(evs[0].Message, "target path was not mounted") {
		t.Errorf("claim-repaired events = %+v, want one naming the target path", evs)
	}
	if n := repairsMetric(t, e, repairSucceeded); n != 1 {
		t.Errorf("csiactor_claim_repairs_total{result=success} = %g, want 1", n)
	}
	if ids := e.m.Repairing(); len(ids) != 0 {
		t.Errorf("Repairing() = %v after the repair", ids)
	}
	// Nothing is missing now: another start changes nothing.
	host.set(true, c.TargetPath)
	e.restart()
	if res, err := e.m.Reconcile(ctxT(t), ReconcileOptions{}); err != nil || res.Claims != 0 {
		t.Errorf("Reconcile with everything mounted = %+v, %v", res, err)
	}
	if got := calls(e.plugin); got != after {
		t.Errorf("calls after a start with everything mounted = %v, want %v", got, after)
	}
}

func TestManager_Reconcile_StagingMissing_StagesAndPublishesAgain(t *testing.T) {
	e, host, events, c := hostEnv(t)
	before := calls(e.plugin)
	host.set(false, c.StagingPath)
	res, err := e.m.Reconcile(ctxT(t), ReconcileOptions{Plugin: testPlugin})
	if err != nil || res.Volumes != 1 || res.Claims != 1 {
		t.Fatalf("Reconcile = %+v, %v; want one claim of one volume", res, err)
	}
	e.waitPublished("vol1", "a")
	if after, want := calls(e.plugin), [3]int{before[0], before[1] + 1, before[2] + 1}; after != want {
		t.Errorf("calls = %v, want %v (NodeStage and NodePublish once more)", after, want)
	}
	if evs := events.awaitRepaired(t, "a"); len(evs) != 1 || !strings.Contains(evs[0].Message, "staging path") {
		t.Errorf("claim-repaired events = %+v", evs)
	}
	// Another plugin's check leaves this one alone.
	host.set(false, c.StagingPath)
	if res, err := e.m.Reconcile(ctxT(t), ReconcileOptions{Plugin: "other"}); err != nil || res.Claims != 0 {
		t.Errorf("Reconcile of another plugin = %+v, %v", res, err)
	}
	e.checkAgree()
}

func TestManager_Start_HostRebooted_RedoesEveryStep(t *testing.T) {
	e, _, events, _ := hostEnv(t)
	before := calls(e.plugin)
	e.restartWith(func(c *Config) { c.HostRebooted = true })
	e.waitPublished("vol1", "a")
	if after, want := calls(e.plugin), [3]int{before[0] + 1, before[1] + 1, before[2] + 1}; after != want {
		t.Errorf("calls = %v, want %v (every publish step once more)", after, want)
	}
	if evs := events.awaitRepaired(t, "a"); len(evs) != 1 || !strings.Contains(evs[0].Message, "rebooted") {
		t.Errorf("claim-repaired events = %+v", evs)
	}
	if evs := events.find(EventClaimPublished, "a"); len(evs) != 1 {
		t.Errorf("claim-published events = %d, want only the first publish's", len(evs))
	}
	e.checkAgree()
}

func TestManager_Claim_RepeatedChecksTheHostFirst(t *testing.T) {
	e, host, events, c := hostEnv(t)
	ctx := ctxT(t)
	req := claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)
	// Mounted: answered from the record, no RPC.
	before := calls(e.plugin)
	if again, err := e.m.Claim(ctx, req); err != nil || again.TargetPath != c.TargetPath {
		t.Fatalf("repeated claim = %+v, %v", again, err)
	}
	if got := calls(e.plugin); got != before {
		t.Errorf("a repeated claim of a mounted claim made RPCs: %v → %v", before, got)
	}
	// Not mounted: published again before the answer.
	host.set(false, c.TargetPath)
	again, err := e.m.Claim(ctx, req)
	if err != nil || again.State != claim.StatePublished || again.TargetPath != c.TargetPath {
		t.Fatalf("repeated claim with the target gone = %+v, %v", again, err)
	}
	if got := calls(e.plugin); got[2] != before[2]+1 {
		t.Errorf("NodePublishVolume calls = %d, want %d", got[2], before[2]+1)
	}
	if evs := events.awaitRepaired(t, "a"); len(evs) != 1 {
		t.Errorf("claim-repaired events = %+v", evs)
	}
}

func TestManager_Repair_FailureIsDegradedRetriedNeverTornDown(t *testing.T) {
	e, host, events, c := hostEnv(t)
	ctx := ctxT(t)
	// A final error, which would fail a new claim, three times.
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Internal, Message: "disk on fire", Times: 3})
	host.set(false, c.TargetPath)
	if _, err := e.m.Reconcile(ctx, ReconcileOptions{}); err != nil {
		t.Fatal(err)
	}
	var degraded Claim
	waitFor(t, "the claim degraded with its error", func() bool {
		v, _ := e.m.Get(ctx, "vol1")
		if len(v.Claims) != 1 {
			return false
		}
		degraded = v.Claims[0]
		return degraded.Condition == ConditionDegraded
	})
	if degraded.State == claim.StatePublished || degraded.Repair != claim.RepairTarget || !strings.Contains(degraded.LastError, "disk on fire") {
		t.Errorf("degraded claim = %+v; want not published, repair %q, the plugin's error", degraded, claim.RepairTarget)
	}
	if ids := e.m.Repairing(); len(ids) != 1 || ids[0] != "vol1" {
		t.Errorf("Repairing() = %v, want [vol1]", ids)
	}
	e.waitPublished("vol1", "a")
	if n := repairsMetric(t, e, repairFailed); n != 3 {
		t.Errorf("csiactor_claim_repairs_total{result=failure} = %g, want 3", n)
	}
	if n := repairsMetric(t, e, repairSucceeded); n != 1 {
		t.Errorf("csiactor_claim_repairs_total{result=success} = %g, want 1", n)
	}
	if evs := events.find(EventClaimFailed, "a"); len(evs) != 0 {
		t.Errorf("a failing repair failed the claim: %+v", evs)
	}
	v, _ := e.m.Get(ctx, "vol1")
	if len(v.PastClaims) != 0 {
		t.Errorf("past claims after a repair = %+v", v.PastClaims)
	}
}

func TestManager_Release_WhileRepairing_TearsDown(t *testing.T) {
	e, host, _, c := hostEnv(t)
	ctx := ctxT(t)
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.Unavailable})
	host.set(false, c.TargetPath)
	if _, err := e.m.Reconcile(ctx, ReconcileOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a failed attempt", func() bool { return e.plugin.Calls("NodePublishVolume") >= 2 })
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	e.checkClean()
	if ids := e.m.Repairing(); len(ids) != 0 {
		t.Errorf("Repairing() = %v after the release", ids)
	}
}

type brokenHost struct{}

func (brokenHost) Look(context.Context) (claim.HostView, error) {
	return nil, errors.New("no mount table")
}

// A host that cannot be looked at does not stop the manager: nothing is
// checked, nothing repaired; Reconcile returns the error.
func TestManager_Start_HostUnreadable_ChecksNothing(t *testing.T) {
	e, _, _, _ := hostEnv(t)
	before := calls(e.plugin)
	e.restartWith(func(c *Config) { c.Host = brokenHost{} })
	if _, err := e.m.Reconcile(ctxT(t), ReconcileOptions{}); err == nil || !strings.Contains(err.Error(), "no mount table") {
		t.Errorf("Reconcile with an unreadable host = %v", err)
	}
	v, err := e.m.Get(ctxT(t), "vol1")
	if err != nil || v.Claims[0].State != claim.StatePublished || calls(e.plugin) != before {
		t.Errorf("after a start with an unreadable host: %+v, %v, calls %v → %v", v.Claims, err, before, calls(e.plugin))
	}
	if err := e.m.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Reconcile(ctxT(t), ReconcileOptions{}); !errors.Is(err, ErrShutdown) {
		t.Errorf("Reconcile after Shutdown = %v, want ErrShutdown", err)
	}
}

func TestMountTable_Look(t *testing.T) {
	dir := t.TempDir()
	target, link := filepath.Join(dir, "t"), filepath.Join(dir, "link")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	dangling := filepath.Join(dir, "dangling")
	if err := os.Symlink(filepath.Join(dir, "nosuch"), dangling); err != nil {
		t.Fatal(err)
	}
	table := filepath.Join(dir, "mountinfo")
	if err := os.WriteFile(table, []byte("30 22 0:21 / "+target+" rw - ext4 /dev/sda1 rw\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	v, err := MountTable{File: table, Dir: dir}.Look(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !v.Mounted(target) || v.Mounted(link) || v.Mounted(dir) {
		t.Errorf("Mounted: target %t, link %t, dir %t; want true, false, false", v.Mounted(target), v.Mounted(link), v.Mounted(dir))
	}
	if !v.Linked(link) || v.Linked(target) || v.Linked(dangling) {
		t.Errorf("Linked: link %t, target %t, dangling %t; want true, false, false", v.Linked(link), v.Linked(target), v.Linked(dangling))
	}
	if _, err := (MountTable{File: filepath.Join(dir, "nosuch")}).Look(context.Background()); err == nil {
		t.Error("Look with no mount table: no error")
	}
}

// A repeated claim whose target is gone, while another claim's publish
// step is in flight on the volume: the check waits for the slot, then the
// claim is published again and answered.
func TestManager_Claim_RepeatedWhileAStepRuns(t *testing.T) {
	e, host, events, _ := hostEnv(t)
	ctx := ctxT(t)
	mnmw := fsCap(csi.AccessModeMultiNodeMultiWriter)
	e.register("shared", mnmw)
	reqA := claimReq("shared", "a", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter)
	ca, err := e.m.Claim(ctx, reqA)
	if err != nil {
		t.Fatal(err)
	}
	// b's target is "mounted" once published (the fake host is told ahead).
	host.set(true, ca.TargetPath, ca.StagingPath, claim.TargetPath(e.dataDir, testPlugin, "b", "shared", claim.Usage(claim.ModeWrite, mnmw)))
	before := e.plugin.Calls("NodePublishVolume")
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Delay: 300 * time.Millisecond, Times: 1})
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctx, claimReq("shared", "b", claim.ModeWrite, csi.AccessModeMultiNodeMultiWriter))
		done <- err
	}()
	waitFor(t, "b's NodePublishVolume in flight", func() bool { return e.plugin.Calls("NodePublishVolume") == before+1 })
	host.set(false, ca.TargetPath)
	again, err := e.m.Claim(ctx, reqA)
	if err != nil || again.State != claim.StatePublished || again.TargetPath != ca.TargetPath {
		t.Fatalf("repeated claim = %+v, %v", again, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("claim b: %v", err)
	}
	if got := e.plugin.Calls("NodePublishVolume"); got != before+2 {
		t.Errorf("NodePublishVolume calls = %d, want %d (b's, then a's repair)", got, before+2)
	}
	if evs := events.awaitRepaired(t, "a"); len(evs) != 1 || evs[0].Volume != "shared" {
		t.Errorf("claim-repaired events of a = %+v", evs)
	}
}

// touchyView is a host view whose every path is listed as mounted, and
// whose Linked must not be asked (a stat of a hung mount would hang).
type touchyView struct{ t *testing.T }

func (touchyView) Mounted(string) bool { return true }
func (v touchyView) Linked(path string) bool {
	v.t.Errorf("Linked(%q) looked at a dead mount point", path)
	return false
}

// TestProbedView_DeadPathNotLookedAt: a path the probe found dead is
// neither mounted nor linked, and the view never looks at it again.
func TestProbedView_DeadPathNotLookedAt(t *testing.T) {
	v := probedView{HostView: touchyView{t}, broken: map[string]string{"/dead": "timeout"}}
	if v.Mounted("/dead") || v.Linked("/dead") {
		t.Error("a dead mount point reads as mounted or linked")
	}
	if !v.Mounted("/alive") {
		t.Error("a live mount point reads as not mounted")
	}
	if got := v.Broken("/dead"); got != "timeout" {
		t.Errorf("Broken = %q, want timeout", got)
	}
}
