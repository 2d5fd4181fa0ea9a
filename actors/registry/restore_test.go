package registry

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/actors/plugin"
	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/persistence"
)

// reopen opens e's store file again; the caller closes it.
func reopen(t *testing.T, e *env) *persistence.Store {
	t.Helper()
	st, err := persistence.Open(filepath.Join(e.data, "state.db"), persistence.Config{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A plugin process left by a killed agent (its PID and start time are in
// the store) is killed before the restored allocation starts its own, so
// two copies never run.
func TestHandle_Restore_KillsLeftoverProcess(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, nil)
	spec := execSpec(t, "e1", "p", plugin.Node)
	e.register(spec)
	e.waitHealthy("e1")
	e.close()

	// What a killed agent leaves: the plugin still running, its PID in the
	// store.
	socket := plugin.SocketPath(e.data, "e1")
	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Env = []string{fakePluginEnv + "=1", "CSI_ENDPOINT=unix://" + socket}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	st, err := proc.ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	store, err := persistence.Open(filepath.Join(e.data, "state.db"), persistence.Config{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	rec, err := store.Allocation(ctx(t), "e1")
	if err != nil {
		t.Fatal(err)
	}
	rec.PID, rec.PIDStart = cmd.Process.Pid, st.StartTicks
	if _, err := store.PutAllocation(ctx(t), rec); err != nil {
		t.Fatal(err)
	}
	e.store = store
	e.start()
	defer e.close()

	m := e.waitHealthy("e1")
	select {
	case <-waited:
	case <-time.After(30 * time.Second):
		t.Fatal("the leftover process was not killed")
	}
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("leftover ended with %s, want SIGKILL", cmd.ProcessState)
	}
	if m["e1"].PID == cmd.Process.Pid {
		t.Error("restored allocation reports the leftover's PID")
	}
	if _, err := os.Stat(socket); err != nil {
		t.Errorf("socket of the new process: %v", err)
	}
}

// StartSubscribed's subscription exists before the registry actor starts:
// the first event it delivers is the restore of the stored allocation,
// which a Subscribe after Start can miss (the actor restores as it
// starts).
func TestStartSubscribed_SeesRestore(t *testing.T) {
	defer leakcheck.Check(t)()
	e := newEnv(t, nil)
	spec := execSpec(t, "e1", "p", plugin.Node)
	e.register(spec)
	e.waitHealthy("e1")
	e.stop()

	cfg := e.config()
	e.sys = actorkit.NewSystem(cfg.Log)
	h, sub, err := StartSubscribed(context.Background(), e.sys, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	e.h = h
	defer e.close()
	select {
	case ev := <-sub.C:
		if ev.Type != EventRegistered || ev.Alloc != "e1" {
			t.Fatalf("first event %+v, want registered (restored) for e1", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no event from the restore")
	}
	sub.Cancel()
}
