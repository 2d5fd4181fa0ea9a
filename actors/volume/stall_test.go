package volume

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/metrictest"
	"github.com/csiactor/csiactor/persistence"
)

// stalledGauge is the exposition of csiactor_volume_claims_stalled for the
// test plugin at n.
func stalledGauge(n string) string {
	return `# HELP csiactor_volume_claims_stalled Claims and past claims that have not changed state for volumes.stall_after (their condition is stalled), by plugin.
# TYPE csiactor_volume_claims_stalled gauge
csiactor_volume_claims_stalled{plugin="fake"} ` + n + "\n"
}

func (e *env) waitStalledGauge(n string) {
	e.t.Helper()
	var err error
	waitFor(e.t, "csiactor_volume_claims_stalled at "+n, func() bool {
		err = testutil.GatherAndCompare(e.reg, strings.NewReader(stalledGauge(n)), "csiactor_volume_claims_stalled")
		return err == nil
	})
}

func (e *env) stepFailures(step, code string) float64 {
	e.t.Helper()
	n, _ := metrictest.Value(e.t, e.reg, "csiactor_claim_step_failures_total", map[string]string{"plugin": testPlugin, "step": step, "code": code})
	return n
}

// stalledEvents returns the claim-stalled events of alloc whose message
// names state.
func (l *eventLog) stalledEvents(alloc, state string) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Event
	for _, e := range l.evs {
		if e.Type == EventClaimStalled && e.Alloc == alloc && strings.Contains(e.Message, "state "+state+" ") {
			out = append(out, e)
		}
	}
	return out
}

// stallEnv is an env whose claims stall after a second, with every step
// the fake plugin has. The second is a generous bound on a step's first
// attempt (it takes milliseconds), so that a stall is seen after the step
// failed: with 20 ms, a loaded machine sometimes stalled the claim before
// its first attempt, and the stall had no error to report.
func stallEnv(t *testing.T) (*env, *eventLog) {
	t.Helper()
	events := &eventLog{}
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) {
		c.StallAfter = time.Second
		c.OnEvent = events.add
	}))
	return e, events
}

// checkStallEvent checks that alloc's stall in state was reported once,
// with its last error (which holds want) and without secrets or mount
// flags. It waits until the failing step has been retried a few more
// times after the stall was seen, so that a second report would have come.
func (e *env) checkStallEvent(events *eventLog, alloc, state, step, code, want string) {
	e.t.Helper()
	var evs []Event
	waitFor(e.t, "a claim-stalled event", func() bool {
		evs = events.stalledEvents(alloc, state)
		return len(evs) > 0
	})
	after := e.stepFailures(step, code)
	waitFor(e.t, "more failed attempts after the stall", func() bool { return e.stepFailures(step, code) >= after+3 })
	evs = events.stalledEvents(alloc, state)
	if len(evs) != 1 {
		e.t.Fatalf("claim-stalled events of %s in state %s: %+v, want one per stall", alloc, state, evs)
	}
	ev := evs[0]
	if ev.Volume != "v" || ev.Plugin != testPlugin || !strings.Contains(ev.Message, want) {
		e.t.Errorf("claim-stalled event %+v: want volume v, plugin %s and the last error (%s) in the message", ev, testPlugin, want)
	}
	for _, secret := range []string{"s3cr3t", "hunter2", "noatime"} {
		if strings.Contains(ev.Message, secret) {
			e.t.Errorf("claim-stalled event shows %q: %s", secret, ev.Message)
		}
	}
}

// releaseFailing claims volume v for alloc a and releases it with the
// release step method failing with f.
func (e *env) releaseFailing(method string, f fakeplugin.Fault) {
	e.t.Helper()
	e.register("v")
	if _, err := e.m.Claim(ctxT(e.t), claimReq("v", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		e.t.Fatal(err)
	}
	e.plugin.SetFault(method, f)
	if _, err := e.m.Release(ctxT(e.t), "v", "a"); err != nil {
		e.t.Fatal(err)
	}
}

func TestManager_Stall_PublishStepThatKeepsFailing(t *testing.T) {
	e, events := stallEnv(t)
	e.register("v")
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.FailedPrecondition, Message: "not ready for publishing"})
	claimed := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctxT(t), claimReq("v", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
		claimed <- err
	}()

	var c Claim
	waitFor(t, "the claim stalled", func() bool {
		v, err := e.m.Get(context.Background(), "v")
		if err != nil {
			t.Fatal(err)
		}
		if len(v.Claims) == 0 {
			return false // not reserved yet
		}
		c = v.Claims[0]
		return c.Condition == ConditionStalled
	})
	if c.State != claim.StateStaged || !strings.Contains(c.LastError, "not ready for publishing") {
		t.Errorf("stalled claim: state %s, last error %q; want staged with NodePublishVolume's error", c.State, c.LastError)
	}
	e.waitStalledGauge("1")
	e.checkStallEvent(events, "a", claim.StateStaged, "NodePublishVolume", "FailedPrecondition", "not ready for publishing")
	if vs, err := e.m.List(context.Background(), Filter{}); err != nil || len(vs) != 1 || vs[0].Claims[0].Condition != ConditionStalled {
		t.Errorf("List: %+v, %v; want the claim stalled", vs, err)
	}
	if n, ok := metrictest.Value(t, e.reg, "csiactor_claim_step_failures_total",
		map[string]string{"plugin": testPlugin, "step": "NodeStageVolume", "code": "FailedPrecondition"}); ok {
		t.Errorf("NodeStageVolume counted %v failures; it never failed", n)
	}

	// The step keeps retrying; once it succeeds the claim moves on.
	e.plugin.ClearFaults()
	if err := <-claimed; err != nil {
		t.Fatalf("claim after the fault cleared: %s", err)
	}
	e.waitStalledGauge("0")
	v, err := e.m.Get(context.Background(), "v")
	if err != nil {
		t.Fatal(err)
	}
	if c := v.Claims[0]; c.State != claim.StatePublished || c.Condition != "" || c.LastError != "" {
		t.Errorf("claim after the fault cleared: state %s, condition %q, last error %q", c.State, c.Condition, c.LastError)
	}
}

func TestManager_Stall_ReleaseStepThatKeepsFailing(t *testing.T) {
	e, events := stallEnv(t)
	e.releaseFailing("NodeUnstageVolume", fakeplugin.Fault{Code: codes.Internal, Message: "still busy"})
	var c Claim
	waitFor(t, "the past claim stalled", func() bool {
		v, err := e.m.Get(context.Background(), "v")
		if err != nil {
			t.Fatal(err)
		}
		c = v.PastClaims[0]
		return c.Condition == ConditionStalled
	})
	if c.State != claim.StateTaken || !strings.Contains(c.LastError, "still busy") {
		t.Errorf("stalled past claim: state %s, last error %q; want taken with NodeUnstageVolume's error", c.State, c.LastError)
	}
	e.waitStalledGauge("1")
	e.checkStallEvent(events, "a", claim.StateTaken, "NodeUnstageVolume", "Internal", "still busy")
	// Releasing again answers with the past claim as it is: stalled.
	if again, err := e.m.Release(ctxT(t), "v", "a"); err != nil || again.Condition != ConditionStalled {
		t.Errorf("release again: %+v, %v; want the stalled past claim", again, err)
	}

	// Release steps still retry until done.
	e.plugin.ClearFaults()
	e.waitFreed("v")
	e.waitStalledGauge("0")
	e.checkClean()
}

func TestManager_Stall_ForceDeregisterDropsIt(t *testing.T) {
	e, _ := stallEnv(t)
	e.releaseFailing("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Internal, Message: "stuck"})
	e.waitStalledGauge("1")
	if _, err := e.m.ForceDeregister(ctxT(t), "v"); err != nil {
		t.Fatal(err)
	}
	e.waitStalledGauge("0")
	if _, err := e.m.Get(context.Background(), "v"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after force deregister: %v, want ErrNotFound", err)
	}
}

// TestStallBook follows claims through their states with given times:
// what counts as a move, when a claim stalls, once, and when it stops.
func TestStallBook(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 10, 0, 0, 0, time.UTC)
	b := newStallBook(time.Minute)
	rec := func(past bool, state, lastErr string, at time.Time) *persistence.Volume {
		c := persistence.Claim{Alloc: "a", State: state, LastError: lastErr, UpdatedAt: at}
		v := &persistence.Volume{ID: "v", Plugin: "p"}
		if past {
			v.PastClaims = []persistence.Claim{c}
		} else {
			v.Claims = []persistence.Claim{c}
		}
		return v
	}
	stalled := func() int { return b.counts()["p"] }
	condition := func(v *persistence.Volume) string {
		view := viewOf(v)
		b.overlay(&view)
		if len(view.Claims) > 0 {
			return view.Claims[0].Condition
		}
		return view.PastClaims[0].Condition
	}

	if moved := b.observe("v", rec(false, claim.StateReserved, "", t0)); len(moved) != 0 || len(b.check(t0.Add(59*time.Second))) != 0 {
		t.Fatalf("a claim reserved 59 s ago: moved %v; want nothing stalled", moved)
	}
	// A failed attempt is no move: the claim stalls a minute after it
	// was reserved.
	failing := rec(false, claim.StateReserved, "ControllerPublishVolume: Unavailable", t0.Add(30*time.Second))
	b.observe("v", failing)
	notes := b.check(t0.Add(time.Minute))
	if len(notes) != 1 || notes[0].key != (stallKey{alloc: "a"}) || notes[0].state != claim.StateReserved ||
		notes[0].lastError != "ControllerPublishVolume: Unavailable" || stalled() != 1 || condition(failing) != ConditionStalled {
		t.Fatalf("after a minute: notes %+v, %d stalled, condition %q", notes, stalled(), condition(failing))
	}
	if again := b.check(t0.Add(time.Hour)); len(again) != 0 {
		t.Fatalf("a stall is reported once; again: %+v", again)
	}
	b.observe("v", rec(false, claim.StateReserved, "again", t0.Add(2*time.Minute)))
	if stalled() != 1 {
		t.Fatalf("another failure in the same state: %d stalled, want 1", stalled())
	}

	// A new state is a move.
	staged := rec(false, claim.StateStaged, "", t0.Add(3*time.Minute))
	if moved := b.observe("v", staged); len(moved) != 1 || stalled() != 0 || condition(staged) != "" {
		t.Fatalf("moved to staged: moved %+v, %d stalled, condition %q", moved, stalled(), condition(staged))
	}
	if n := b.check(t0.Add(3*time.Minute + 59*time.Second)); len(n) != 0 {
		t.Fatalf("staged 59 s ago: %+v", n)
	}
	// The store's record still says reserved: a stalled mark of another
	// state is not shown on it.
	b.check(t0.Add(4 * time.Minute))
	if stalled() != 1 || condition(failing) != "" || condition(staged) != ConditionStalled {
		t.Fatalf("stalled in staged: %d stalled, reserved record %q, staged record %q", stalled(), condition(failing), condition(staged))
	}

	// Published: no longer followed.
	if moved := b.observe("v", rec(false, claim.StatePublished, "", t0.Add(5*time.Minute))); len(moved) != 1 || stalled() != 0 || len(b.vols) != 0 {
		t.Fatalf("published: moved %+v, %d stalled, %d volumes followed", moved, stalled(), len(b.vols))
	}

	// A past claim stalls too, and stops when its volume goes.
	taken := rec(true, claim.StateTaken, "NodeUnstageVolume: Internal", t0.Add(6*time.Minute))
	b.observe("v", taken)
	b.check(t0.Add(7 * time.Minute))
	if stalled() != 1 || condition(taken) != ConditionStalled {
		t.Fatalf("past claim: %d stalled, condition %q", stalled(), condition(taken))
	}
	if moved := b.observe("v", nil); len(moved) != 1 || stalled() != 0 || len(b.vols) != 0 {
		t.Fatalf("volume gone: moved %+v, %d stalled", moved, stalled())
	}
	if _, ok := b.counts()["p"]; !ok {
		t.Errorf("the plugin's gauge is gone; it stays at 0")
	}
}

func TestConfig_Validate_StallAfter(t *testing.T) {
	cfg := testConfig("/data")
	cfg.StallAfter = -time.Second
	err := cfg.Validate()
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "stall_after -1s is negative") {
		t.Errorf("Validate: %v, want ErrInvalidConfig naming stall_after", err)
	}
	if d := (Config{}).withDefaults().StallAfter; d != DefaultStallAfter {
		t.Errorf("default stall_after %s, want %s", d, DefaultStallAfter)
	}
}
