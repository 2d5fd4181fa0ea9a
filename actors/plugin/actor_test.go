package plugin

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/plugin/proc"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/actorkit"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/internal/leakcheck"
)

func attached(id string, typ Type, endpoint string) Spec {
	s, err := Spec{ID: id, Plugin: "fake", Type: typ, Socket: endpoint}.WithSocket("/unused")
	if err != nil {
		panic(err)
	}
	return s
}

func TestActor_Fingerprint_ByType(t *testing.T) {
	tests := []struct {
		name           string
		typ            Type
		cfg            fakeplugin.Config
		wantController bool
		wantNode       bool
		wantRequired   bool
	}{
		{"monolith with publish", Monolith, fakeplugin.Config{Name: "m.csi", VendorVersion: "2.1", NodeID: "n1", ControllerPublish: true}, true, true, true},
		{"controller without publish", Controller, fakeplugin.Config{Name: "m.csi", VendorVersion: "2.1", NodeID: "n1", CreateDelete: true}, true, false, false},
		{"node only", Node, fakeplugin.Config{Name: "m.csi", VendorVersion: "2.1", NodeID: "n1", MaxVolumesPerNode: 7}, false, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			fake, ep := startFake(t, tt.cfg)
			defer fake.Stop()
			h := newHarness(t, attached("a1", tt.typ, ep), StaleProcess{}, nil)
			defer h.close()

			s := h.waitHealthy()
			fp := s.Fingerprint
			if s.Description != "healthy" || s.Client == nil {
				t.Errorf("status = %q client %v, want healthy with a client", s.Description, s.Client)
			}
			if fp.Provider != "m.csi" || fp.Version != "2.1" {
				t.Errorf("provider/version = %q/%q, want m.csi/2.1", fp.Provider, fp.Version)
			}
			if (fp.Controller != nil) != tt.wantController || (fp.Node != nil) != tt.wantNode || (fp.NodeInfo != nil) != tt.wantNode {
				t.Errorf("controller %v node %v nodeinfo %v; want controller %v node %v", fp.Controller, fp.Node, fp.NodeInfo, tt.wantController, tt.wantNode)
			}
			if fp.ControllerRequired != tt.wantRequired {
				t.Errorf("ControllerRequired = %v, want %v", fp.ControllerRequired, tt.wantRequired)
			}
			if tt.wantNode && (fp.NodeInfo.NodeID != "n1" || fp.NodeInfo.MaxVolumesPerNode != tt.cfg.MaxVolumesPerNode) {
				t.Errorf("node info = %+v", fp.NodeInfo)
			}
			if fp.At.IsZero() {
				t.Error("fingerprint time not set")
			}
			r, err := actorkit.Request(context.Background(), h.sys, h.child, &GetStatus{}, 10*time.Second)
			if st, ok := r.(Status); err != nil || !ok || !st.Healthy || st.Fingerprint.Provider != "m.csi" {
				t.Errorf("GetStatus = %+v, %v; want the healthy status", r, err)
			}
			// The client handed to the registry works.
			if ready, err := s.Client.Probe(context.Background()); err != nil || !ready {
				t.Errorf("Probe through the reported client = %v, %v", ready, err)
			}
		})
	}
}

func TestActor_Health_NotReadyThenReady(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{NotReady: true})
	defer fake.Stop()
	h := newHarness(t, attached("a1", Node, ep), StaleProcess{}, nil)
	defer h.close()
	h.waitUnhealthy("starting: plugin reports it is not ready")
	fake.SetReady(true)
	h.waitHealthy() // the unhealthy retry notices without waiting a heartbeat
}

func TestActor_Health_GarbageAnswer(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{})
	defer fake.Stop()
	fake.SetFault("GetPluginInfo", fakeplugin.Fault{Garbage: true})
	h := newHarness(t, attached("a1", Node, ep), StaleProcess{}, nil)
	defer h.close()
	s := h.waitUnhealthy("fingerprint failed")
	if !strings.Contains(s.Description, "invalid response") {
		t.Errorf("description = %q, want it to say the response is invalid", s.Description)
	}
	fake.ClearFaults()
	h.waitHealthy()
}

func TestActor_Health_RPCErrorDescribed(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{})
	defer fake.Stop()
	fake.SetFault("NodeGetInfo", fakeplugin.Fault{Code: codes.Internal, Message: "disk on fire"})
	h := newHarness(t, attached("a1", Node, ep), StaleProcess{}, nil)
	defer h.close()
	s := h.waitUnhealthy("disk on fire")
	if !strings.Contains(s.Description, "NodeGetInfo") {
		t.Errorf("description = %q, want the failing method named", s.Description)
	}
}

func TestActor_Health_SocketAppearsLater(t *testing.T) {
	defer leakcheck.Check(t)()
	path := filepath.Join(shortDir(t), "csi.sock")
	h := newHarness(t, attached("a1", Node, path), StaleProcess{}, nil)
	defer h.close()
	h.waitUnhealthy("connecting:")
	fake := fakeplugin.New(fakeplugin.Config{})
	if err := fake.Serve(path); err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	h.waitHealthy()
}

func TestActor_Health_SocketDisappearsAndReturns(t *testing.T) {
	tests := []struct {
		name string
		stop func(*fakeplugin.Plugin)
	}{
		{"graceful stop removes the socket", (*fakeplugin.Plugin).Stop},
		{"kill leaves a dead socket", (*fakeplugin.Plugin).Kill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			fake, ep := startFake(t, fakeplugin.Config{})
			defer fake.Stop()
			path := fake.SocketPath()
			h := newHarness(t, attached("a1", Node, ep), StaleProcess{}, func(c *Config) {
				c.HeartbeatInterval = time.Hour // only the connection state can tell
			})
			defer h.close()
			h.waitHealthy()
			tt.stop(fake)
			h.waitUnhealthy("")
			again := fakeplugin.New(fakeplugin.Config{})
			if err := again.Serve(path); err != nil {
				t.Fatal(err)
			}
			defer again.Stop()
			h.waitHealthy()
		})
	}
}

func TestActor_Shutdown_LastFingerprintWithClosedClient(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{Name: "last.csi"})
	defer fake.Stop()
	h := newHarness(t, attached("a1", Node, ep), StaleProcess{}, nil)
	defer h.close()
	s := h.waitHealthy()
	client := s.Client

	st := h.shutdown("")
	if st.ID != "a1" || st.Reason != ReasonShutdown {
		t.Errorf("Stopped = %+v, want a1 with reason %q", st, ReasonShutdown)
	}
	if st.Status.Healthy || st.Status.Description != ReasonShutdown {
		t.Errorf("final status = %v %q, want unhealthy %q", st.Status.Healthy, st.Status.Description, ReasonShutdown)
	}
	if st.Status.Fingerprint.Provider != "last.csi" {
		t.Errorf("final status lost the plugin info: %+v", st.Status.Fingerprint)
	}
	if st.Status.Client != nil {
		t.Error("final status still has a client")
	}
	if _, err := client.Probe(context.Background()); !errors.Is(err, csi.ErrClosed) {
		t.Errorf("Probe after shutdown: %v, want csi.ErrClosed", err)
	}
}

func TestActor_Exec_StartsWithEndpointAndOutput(t *testing.T) {
	defer leakcheck.Check(t)()
	data := shortDir(t)
	spec, err := Spec{ID: "e1", Plugin: "fake", Type: Monolith, Command: fakeCommand(t), Env: fakeEnv("exec.csi")}.WithSocket(data)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, nil)
	defer h.close()
	s := h.waitHealthy()
	if s.PID <= 0 || s.PIDStart == 0 || !alive(s.PID) {
		t.Fatalf("PID %d start %d, want a running process", s.PID, s.PIDStart)
	}
	if s.Fingerprint.Provider != "exec.csi" || s.Fingerprint.NodeInfo.NodeID != "node-exec.csi" {
		t.Errorf("fingerprint = %+v", s.Fingerprint)
	}
	fi, err := os.Stat(filepath.Dir(spec.Socket))
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("socket dir: %v mode %v, want 0700", err, fi.Mode().Perm())
	}
	if want := filepath.Join(data, "plugins", "e1", "csi.sock"); spec.Socket != want {
		t.Errorf("socket = %q, want %q", spec.Socket, want)
	}

	st := h.shutdown(ReasonDeregistered)
	if alive(s.PID) {
		t.Errorf("process %d survived the shutdown", s.PID)
	}
	if st.Status.Description != ReasonDeregistered {
		t.Errorf("final description %q, want %q", st.Status.Description, ReasonDeregistered)
	}
	if _, err := os.Stat(filepath.Dir(spec.Socket)); !os.IsNotExist(err) {
		t.Errorf("socket dir after deregistration: %v, want removed", err)
	}
	var served, stopped bool
	for _, e := range h.hook.AllEntries() {
		if e.Data["alloc"] == "e1" && e.Data["plugin"] == "fake" && e.Data["stream"] == "stdout" {
			served = served || strings.HasPrefix(e.Message, "fake plugin serving on ")
			stopped = stopped || e.Message == "fake plugin stopped" // SIGTERM first, not SIGKILL
		}
	}
	if !served || !stopped {
		t.Errorf("plugin output in the log: serving %v stopped %v, want both with alloc and plugin fields", served, stopped)
	}
}

func TestActor_Exec_KilledProcessIsUnhealthyThenRestarted(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "e1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: fakeEnv("k")}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, func(c *Config) { c.HeartbeatInterval = time.Hour })
	defer h.close()
	first := h.waitHealthy()

	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The very next update is already unhealthy (the exit or the lost
	// connection, whichever is seen first), not a heartbeat's discovery;
	// the exit is reported before the restarted process is healthy.
	var updates []Status
	for {
		u, ok := h.next().(*StatusChanged)
		if !ok {
			t.Fatal("actor stopped")
		}
		updates = append(updates, u.Status)
		if u.Status.Healthy {
			break
		}
	}
	if len(updates) < 2 || updates[0].Healthy {
		t.Fatalf("updates after SIGKILL = %+v, want unhealthy first", updates)
	}
	var exited bool
	for _, u := range updates {
		if strings.HasPrefix(u.Description, "plugin process exited with signal: killed; restarting in ") {
			exited = true
			if u.PID != 0 || u.Exits != 1 {
				t.Errorf("after exit: PID %d exits %d, want 0 and 1", u.PID, u.Exits)
			}
		}
	}
	if !exited {
		t.Errorf("no update said the process exited: %+v", updates)
	}
	again := updates[len(updates)-1]
	if again.PID == first.PID || again.PID == 0 {
		t.Errorf("restarted PID %d, first %d", again.PID, first.PID)
	}
	if again.Client != first.Client {
		t.Error("the client changed; gRPC should have reconnected the same one")
	}
}

func TestActor_Exec_CrashLooping(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "c1", Plugin: "fake", Type: Node, Command: []string{"sh", "-c", "echo dying; exit 7"}}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, nil)
	defer h.close()
	s := h.waitUnhealthy("crash-looping: exited 3 times")
	if !strings.Contains(s.Description, "last with exit status 7; restarting in ") {
		t.Errorf("description = %q, want the last exit status", s.Description)
	}
	if s.Exits < 3 {
		t.Errorf("Exits = %d, want at least 3", s.Exits)
	}
}

// A binary that cannot be started is described as such, with the system's
// error, and its attempts are counted as failed starts, not as exits.
func TestActor_Exec_StartFailure(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := shortDir(t)
	missing := filepath.Join(dir, "no-such-plugin")
	spec, err := Spec{ID: "f1", Plugin: "fake", Type: Node, Command: []string{missing}}.WithSocket(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, nil)
	defer h.close()
	first := h.waitUnhealthy("failed to start")
	want := "failed to start: fork/exec " + missing + ": no such file or directory; retrying in "
	if !strings.HasPrefix(first.Description, want) {
		t.Errorf("first description = %q, want prefix %q", first.Description, want)
	}
	third := h.waitUnhealthy("cannot start plugin (3 attempts): ")
	want = "cannot start plugin (3 attempts): fork/exec " + missing + ": no such file or directory; retrying in "
	if !strings.HasPrefix(third.Description, want) {
		t.Errorf("third description = %q, want prefix %q", third.Description, want)
	}
	if third.Exits != 0 || third.PID != 0 {
		t.Errorf("Exits = %d, PID = %d; a process that never started neither exits nor has a PID", third.Exits, third.PID)
	}
	if strings.Contains(third.Description, "crash-looping") || strings.Contains(third.Description, "exited") {
		t.Errorf("description = %q, a failed start is not an exit", third.Description)
	}
}

// Once the binary appears, the next attempt starts it and the count of
// failed starts begins again.
func TestActor_Exec_StartFailureThenStarts(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := shortDir(t)
	bin := filepath.Join(dir, "plugin")
	self := fakeCommand(t)
	spec, err := Spec{ID: "f2", Plugin: "fake", Type: Node, Command: append([]string{bin}, self[1:]...), Env: fakeEnv("f")}.WithSocket(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, nil)
	defer h.close()
	h.waitUnhealthy("cannot start plugin (2 attempts): fork/exec " + bin)
	if err := os.Symlink(self[0], bin); err != nil {
		t.Fatal(err)
	}
	s := h.waitHealthy()
	if s.PID == 0 || s.Exits != 0 {
		t.Errorf("PID = %d, Exits = %d; want a running process and no exit", s.PID, s.Exits)
	}
}

func TestActor_Exec_KillsStaleProcessFirst(t *testing.T) {
	defer leakcheck.Check(t)()
	l := proc.NewLauncher()
	defer l.Close()
	old, err := l.Start(context.Background(), proc.Spec{Command: []string{"sleep", "300"}, OutputDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	spec, err := Spec{ID: "s1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: fakeEnv("s")}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{PID: old.PID(), PIDStart: old.StartTicks()}, nil)
	defer h.close()
	s := h.waitHealthy()
	<-old.Exited()
	if old.Status() != "signal: killed" {
		t.Errorf("stale process ended with %q, want signal: killed", old.Status())
	}
	if s.PID == old.PID() {
		t.Error("new process has the stale PID")
	}
}

// An agent's shutdown leaves the plugin process running (its last status
// keeps the PID, for the store); the next actor adopts it without a
// restart, and sees its death at once although it is not its child.
func TestActor_Exec_ShutdownLeavesProcess_NextActorAdopts(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "ad1", Plugin: "fake", Type: Monolith, Command: fakeCommand(t), Env: fakeEnv("adopt.csi")}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, nil)
	first := h.waitHealthy()
	st := h.shutdown(ReasonShutdown)
	h.close()
	if st.Status.PID != first.PID || st.Status.PIDStart != first.PIDStart || st.Status.Description != ReasonShutdown {
		t.Errorf("final status PID %d start %d %q; want the running process %d kept, %q", st.Status.PID, st.Status.PIDStart, st.Status.Description, first.PID, ReasonShutdown)
	}
	if !alive(first.PID) {
		t.Fatal("the plugin process did not outlive the shutdown")
	}
	rec, err := proc.ReadState(filepath.Dir(spec.Socket))
	if err != nil || rec.PID != first.PID || !alive(rec.ShimPID) {
		t.Fatalf("recorded %+v, %v; want the plugin and a live shim", rec, err)
	}

	h2 := newHarness(t, spec, StaleProcess{PID: st.Status.PID, PIDStart: st.Status.PIDStart}, nil)
	defer h2.close()
	again := h2.waitHealthy()
	if again.PID != first.PID || again.Exits != 0 {
		t.Errorf("after adoption PID %d exits %d; want %d and no exit", again.PID, again.Exits, first.PID)
	}
	var adopted bool
	for _, e := range h2.hook.AllEntries() {
		adopted = adopted || strings.HasPrefix(e.Message, "adopted the plugin process")
	}
	if !adopted {
		t.Error("no log line says the process was adopted")
	}

	if err := syscall.Kill(first.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	h2.waitUnhealthy("plugin process exited with unknown status (adopted process); restarting in ")
	third := h2.waitHealthy()
	if third.PID == first.PID || third.Exits != 1 {
		t.Errorf("after the adopted process died: PID %d exits %d", third.PID, third.Exits)
	}
	h2.shutdown(ReasonDeregistered)
	for _, pid := range []int{third.PID, rec.ShimPID} {
		if alive(pid) {
			t.Errorf("process %d survived the deregistration", pid)
		}
	}
}

func TestActor_Exec_StopOnShutdown(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "so1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: fakeEnv("so")}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, func(c *Config) { c.StopOnShutdown = true })
	defer h.close()
	s := h.waitHealthy()
	rec, _ := proc.ReadState(filepath.Dir(spec.Socket))
	st := h.shutdown(ReasonShutdown)
	if st.Status.PID != 0 {
		t.Errorf("final PID %d, want 0 for a stopped process", st.Status.PID)
	}
	for _, pid := range []int{s.PID, rec.ShimPID} {
		if alive(pid) {
			t.Errorf("process %d survived a shutdown with StopOnShutdown", pid)
		}
	}
	if got, _ := proc.ReadState(filepath.Dir(spec.Socket)); got != (proc.State{}) {
		t.Errorf("recorded state %+v after the stop, want none", got)
	}
}

// A process left running that does not answer on its socket is hung: the
// next actor kills it and starts a new one.
func TestActor_Exec_AdoptedButSilent_Replaced(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := shortDir(t)
	silent, err := Spec{ID: "h1", Plugin: "fake", Type: Node, Command: []string{"sleep", "300"}}.WithSocket(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, silent, StaleProcess{}, nil)
	first := h.waitFor("a process", func(s Status) bool { return s.PID != 0 })
	h.shutdown(ReasonShutdown)
	h.close()
	if !alive(first.PID) {
		t.Fatal("the silent process did not outlive the shutdown")
	}
	// The same allocation now runs a real plugin; the silent process from
	// before does not answer, so it must not be kept.
	spec := silent
	spec.Command, spec.Env = fakeCommand(t), fakeEnv("h")
	h2 := newHarness(t, spec, StaleProcess{}, nil)
	defer h2.close()
	s := h2.waitHealthy()
	if s.PID == first.PID {
		t.Fatal("the silent process was kept")
	}
	deadline := time.Now().Add(10 * time.Second)
	for alive(first.PID) {
		if time.Now().After(deadline) {
			t.Fatal("the silent process still runs beside the new one")
		}
		time.Sleep(10 * time.Millisecond)
	}
	h2.shutdown(ReasonDeregistered)
}

// An exec-managed plugin that never gets healthy is killed after
// HealthTimeout and restarted with the backoff.
func TestActor_Exec_HealthTimeout_Restarts(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "t1", Plugin: "fake", Type: Node, Command: []string{"sleep", "300"}}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, spec, StaleProcess{}, func(c *Config) { c.HealthTimeout = 300 * time.Millisecond })
	defer h.close()
	first := h.waitFor("a process", func(s Status) bool { return s.PID != 0 })
	s := h.waitUnhealthy("plugin process exited with signal: killed after it was not healthy for 300ms; restarting in ")
	if s.Exits != 1 {
		t.Errorf("Exits = %d, want 1", s.Exits)
	}
	second := h.waitFor("a new process", func(s Status) bool { return s.PID != 0 })
	if second.PID == first.PID || alive(first.PID) {
		t.Errorf("new PID %d, old %d alive %v", second.PID, first.PID, alive(first.PID))
	}
	h.shutdown(ReasonDeregistered)
}

// An attached plugin that stays unhealthy is only reported; once it
// comes, it is healthy as usual.
func TestActor_Attached_HealthTimeout_Reported(t *testing.T) {
	defer leakcheck.Check(t)()
	sock := filepath.Join(shortDir(t), "late.sock")
	h := newHarness(t, attached("at1", Node, "unix://"+sock), StaleProcess{}, func(c *Config) { c.HealthTimeout = 200 * time.Millisecond })
	defer h.close()
	s := h.waitUnhealthy("not healthy for over 200ms: ")
	if s.PID != 0 || s.Exits != 0 {
		t.Errorf("PID %d exits %d for an attached allocation", s.PID, s.Exits)
	}
	fake := fakeplugin.New(fakeplugin.Config{Name: "late"})
	if err := fake.Serve(sock); err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	if s := h.waitHealthy(); s.Description != "healthy" {
		t.Errorf("description %q", s.Description)
	}
}

// A plugin process that an agent started but was killed before it could
// record it (no State file, nothing in the store) still listens on the
// allocation's socket: it is found by its socket and killed before the
// new process starts, so two copies never run.
func TestActor_Exec_KillsUnrecordedListener(t *testing.T) {
	defer leakcheck.Check(t)()
	spec, err := Spec{ID: "u1", Plugin: "fake", Type: Node, Command: fakeCommand(t), Env: fakeEnv("u")}.WithSocket(shortDir(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(spec.Socket), 0o700); err != nil {
		t.Fatal(err)
	}
	orphan := exec.Command(spec.command()[0], spec.command()[1:]...)
	orphan.Env = spec.environ(nil)
	orphan.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = orphan.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(spec.Socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the orphan plugin does not listen")
		}
		time.Sleep(10 * time.Millisecond)
	}

	h := newHarness(t, spec, StaleProcess{}, nil)
	defer h.close()
	s := h.waitHealthy()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the unrecorded plugin process still runs beside the new one")
	}
	if s.PID == orphan.Process.Pid {
		t.Error("the unrecorded process was taken for the allocation's")
	}
	if ws := orphan.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("the orphan ended with %s, want SIGKILL", orphan.ProcessState)
	}
	h.shutdown(ReasonDeregistered)
}

// An attached allocation whose socket never appears is a warning, repeated
// after doubling intervals, not a silent or one-time line; once the socket
// answers, that is said too.
func TestActor_SocketNeverAppears_WarnsWithBackoff(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := shortDir(t)
	sock := dir + "/late.sock"
	const after, max = 100 * time.Millisecond, 400 * time.Millisecond
	h := newHarness(t, attached("late", Node, sock), StaleProcess{}, func(c *Config) {
		c.SocketWarnAfter, c.SocketWarnMax = after, max
	})
	defer h.close()
	warnings := func() []*logrus.Entry {
		var out []*logrus.Entry
		for _, e := range h.hook.AllEntries() {
			if e.Level == logrus.WarnLevel && e.Message == "plugin socket does not answer; still trying" {
				out = append(out, e)
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(warnings()) < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d socket warnings after 30s, want 4", len(warnings()))
		}
		time.Sleep(10 * time.Millisecond)
	}
	ws := warnings()
	// Lower bounds only: each warning comes no sooner than its interval
	// (100ms, 200ms, 400ms, then capped at 400ms).
	for i, want := range []time.Duration{2 * after, 4 * after, max} {
		if gap := ws[i+1].Time.Sub(ws[i].Time); gap < want {
			t.Errorf("warning %d came %s after the one before, want at least %s", i+2, gap, want)
		}
	}
	if ws[0].Data["socket"] != sock || ws[0].Data[logrus.ErrorKey] == nil {
		t.Errorf("warning fields = %v, want the socket and the error", ws[0].Data)
	}

	fake := fakeplugin.New(fakeplugin.Config{Name: "late.csi"})
	if err := fake.Serve(sock); err != nil {
		t.Fatal(err)
	}
	defer fake.Stop()
	h.waitHealthy()
	found := false
	for _, e := range h.hook.AllEntries() {
		found = found || (e.Level == logrus.InfoLevel && e.Message == "plugin socket answers now")
	}
	if !found {
		t.Error("no info line saying the socket answers now")
	}
	h.shutdown("")
}

// Stopping an allocation is an expected end: it logs no warning.
func TestActor_Shutdown_NoWarning(t *testing.T) {
	defer leakcheck.Check(t)()
	fake, ep := startFake(t, fakeplugin.Config{Name: "quiet.csi"})
	defer fake.Stop()
	h := newHarness(t, attached("q1", Node, ep), StaleProcess{}, nil)
	defer h.close()
	h.waitHealthy()
	h.shutdown("")
	for _, e := range h.hook.AllEntries() {
		if e.Level <= logrus.WarnLevel {
			t.Errorf("shutdown logged %s %q %v", e.Level, e.Message, e.Data)
		}
	}
}
