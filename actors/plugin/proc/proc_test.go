package proc

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// The test binary doubles as a tiny "agent" for the survival test: it
// starts a plugin through a Launcher (output in $PROC_TEST_AGENT), writes
// its State there, prints "ok", and waits to be killed.
func TestMain(m *testing.M) {
	if dir := os.Getenv("PROC_TEST_AGENT"); dir != "" {
		l := NewLauncher()
		p, err := l.Start(context.Background(), Spec{
			Command:   []string{"sh", "-c", "while :; do echo tick; sleep 0.05; done"},
			OutputDir: dir,
		})
		if err != nil || WriteState(dir, p.State()) != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("ok\n")
		select {}
	}
	leakcheck.VerifyTestMain(m)
}

func TestParseStat(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Stat
		wantErr bool
	}{
		{
			name: "plain",
			in:   "42 (sleep) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 123456 8 1 18446744073709551615",
			want: Stat{PID: 42, State: "S", PGID: 42, StartTicks: 123456},
		},
		{
			name: "command with spaces and parentheses",
			in:   "7 (a b) (c)) Z 1 9 9 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 99 8 1 1",
			want: Stat{PID: 7, State: "Z", PGID: 9, StartTicks: 99},
		},
		{name: "no command", in: "7 S 1", wantErr: true},
		{name: "short", in: "7 (x) S 1 2 3", wantErr: true},
		{name: "bad start", in: "7 (x) S 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 zz 8", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseStat(tt.want.PID, []byte(tt.in))
			if tt.wantErr {
				if err == nil {
					t.Fatalf("parseStat = %+v, want an error", got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseStat = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func wait(t *testing.T, p *Process) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Wait(ctx); err != nil {
		t.Fatal(err)
	}
}

// gone reports whether pid no longer runs (absent, or a zombie nobody
// reaps: in a container the init process may not reap orphans).
func gone(pid int) bool {
	st, err := ReadStat(pid)
	return errors.Is(err, ErrNoProcess) || (err == nil && st.State == "Z")
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !gone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestLauncher_Start_OutputAndExitStatus(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	logger, hook := test.NewNullLogger()
	p, err := l.Start(context.Background(), Spec{
		Command:   []string{"sh", "-c", `echo "hello $GREETING"; echo oops >&2; pwd; exit 3`},
		Env:       []string{"GREETING=world"},
		Dir:       "/",
		OutputDir: t.TempDir(),
		Log:       logrus.NewEntry(logger).WithField("alloc", "a1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.PID() <= 0 || p.StartTicks() == 0 {
		t.Errorf("PID %d StartTicks %d, want both set", p.PID(), p.StartTicks())
	}
	wait(t, p)
	if got := p.Status(); got != "exit status 3" || p.Success() {
		t.Errorf("Status() = %q Success %v, want exit status 3", got, p.Success())
	}
	lines := map[string]string{}
	for _, e := range hook.AllEntries() {
		if e.Data["alloc"] != "a1" {
			t.Errorf("line %q lost the alloc field", e.Message)
		}
		lines[e.Message] = e.Data["stream"].(string)
	}
	want := map[string]string{"hello world": "stdout", "oops": "stderr", "/": "stdout"}
	for msg, stream := range want {
		if lines[msg] != stream {
			t.Errorf("line %q on %q, want on %q (all: %v)", msg, lines[msg], stream, lines)
		}
	}
}

func TestProcess_Stop(t *testing.T) {
	tests := []struct {
		name   string
		script string
		grace  time.Duration
		want   string
	}{
		{"terminates on SIGTERM", "exec sleep 60", 10 * time.Second, "signal: terminated"},
		{"killed after grace", `trap "" TERM; echo ready; while :; do sleep 1; done`, 50 * time.Millisecond, "signal: killed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer leakcheck.Check(t)()
			l := NewLauncher()
			defer l.Close()
			logger, hook := test.NewNullLogger()
			p, err := l.Start(context.Background(), Spec{Command: []string{"sh", "-c", tt.script}, OutputDir: t.TempDir(), Log: logrus.NewEntry(logger)})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(tt.script, "ready") {
				for len(hook.AllEntries()) == 0 { // the trap is set once "ready" is out
					time.Sleep(time.Millisecond)
				}
			}
			if err := p.Stop(context.Background(), tt.grace); err != nil {
				t.Fatal(err)
			}
			if got := p.Status(); got != tt.want {
				t.Errorf("Status() = %q, want %q", got, tt.want)
			}
			if err := p.Stop(context.Background(), tt.grace); err != nil {
				t.Errorf("second Stop: %v", err)
			}
		})
	}
}

// startGroup starts a shell that leaves a background sleep in its group,
// and returns the process and the sleep's PID.
func startGroup(t *testing.T, l *Launcher, tail string) (*Process, int) {
	t.Helper()
	logger, hook := test.NewNullLogger()
	p, err := l.Start(context.Background(), Spec{
		Command:   []string{"sh", "-c", "sleep 300 & echo $!; " + tail},
		OutputDir: t.TempDir(),
		Log:       logrus.NewEntry(logger),
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(hook.AllEntries()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no PID printed")
		}
		time.Sleep(time.Millisecond)
	}
	pid, err := strconv.Atoi(hook.AllEntries()[0].Message)
	if err != nil {
		t.Fatal(err)
	}
	return p, pid
}

func TestProcess_Stop_StopsTheGroup(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	p, child := startGroup(t, l, "wait")
	if err := p.Stop(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitGone(t, child)
}

func TestProcess_Exited_KillsTheRestOfTheGroup(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	p, child := startGroup(t, l, "exit 0")
	<-p.Exited()
	if !p.Success() {
		t.Errorf("Status() = %q, want success", p.Status())
	}
	waitGone(t, child)
	wait(t, p) // output readers end once the group is gone
}

func TestLauncher_Start_Errors(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	if _, err := l.Start(context.Background(), Spec{}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("empty command: err = %v, want ErrInvalidSpec", err)
	}
	if _, err := l.Start(context.Background(), Spec{Command: []string{"true"}}); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("no output dir: err = %v, want ErrInvalidSpec", err)
	}
	if _, err := l.Start(context.Background(), Spec{Command: []string{"/nonexistent/plugin"}, OutputDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "/nonexistent/plugin") {
		t.Errorf("missing binary: err = %v, want an error naming it", err)
	}
	l.Close()
	l.Close()
	if _, err := l.Start(context.Background(), Spec{Command: []string{"true"}, OutputDir: t.TempDir()}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: err = %v, want ErrClosed", err)
	}
}

func TestKillStale(t *testing.T) {
	defer leakcheck.Check(t)()
	// A process "from a previous agent": started without a Launcher.
	cmd := exec.Command("sleep", "300")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	st, err := ReadStat(pid)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if killed, err := KillStale(ctx, pid, st.StartTicks+1); killed || err != nil {
		t.Fatalf("wrong start time: KillStale = %v, %v; want false, nil", killed, err)
	}
	if gone(pid) {
		t.Fatal("a process with another start time was killed")
	}
	if killed, err := KillStale(ctx, pid, st.StartTicks); !killed || err != nil {
		t.Fatalf("KillStale = %v, %v; want true, nil", killed, err)
	}
	_ = cmd.Wait()
	if ws := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("stale process ended with %s, want SIGKILL", cmd.ProcessState)
	}
	if killed, err := KillStale(ctx, pid, st.StartTicks); killed || err != nil {
		t.Errorf("already gone: KillStale = %v, %v; want false, nil", killed, err)
	}
	if killed, err := KillStale(ctx, 0, 0); killed || err != nil {
		t.Errorf("no pid: KillStale = %v, %v; want false, nil", killed, err)
	}
}

// TestLauncher_PluginOutlivesAgent kills an "agent" (this test binary in
// agent mode) with SIGKILL: the plugin it started and its log shim keep
// running, and no line of the plugin's output is lost while no agent
// runs. Then this test adopts them (they are not its children), sees the
// output go on, and stops both.
func TestLauncher_PluginOutlivesAgent(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	agent := exec.Command(self, "-test.run=^$")
	agent.Env = append(os.Environ(), "PROC_TEST_AGENT="+dir)
	out, err := agent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ok\n" {
		_ = agent.Process.Kill()
		_ = agent.Wait()
		t.Fatalf("agent printed %q, %v", line, err)
	}
	st, err := ReadState(dir)
	if err != nil || st.PID == 0 || st.ShimPID == 0 {
		t.Fatalf("state %+v, %v", st, err)
	}
	// Whatever fails below, the plugin and its shim do not outlive the test.
	stopped := false
	t.Cleanup(func() {
		if stopped {
			return
		}
		_ = syscall.Kill(st.PID, syscall.SIGKILL)
		_ = syscall.Kill(st.ShimPID, syscall.SIGKILL)
	})
	_ = agent.Process.Signal(syscall.SIGKILL)
	_ = agent.Wait()

	// The plugin ticks every few milliseconds; on a loaded machine a new
	// line may take longer, so wait for one (or for either process to die).
	before, after := countTicks(t, dir), 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if gone(st.PID) || gone(st.ShimPID) {
			t.Fatalf("plugin (gone %v) or shim (gone %v) died with the agent", gone(st.PID), gone(st.ShimPID))
		}
		if after = countTicks(t, dir); after > before {
			break
		}
	}
	if after <= before {
		t.Fatalf("no output written while no agent runs: %d lines, then %d after 10s", before, after)
	}

	// A wrong start time is another process: not adopted.
	if _, err := Adopt(Adopted{State: State{PID: st.PID, PIDStart: st.PIDStart + 1, ShimPID: st.ShimPID, ShimPIDStart: st.ShimPIDStart}, OutputDir: dir}); !errors.Is(err, ErrNotAdopted) {
		t.Fatalf("adopt with a wrong start time: %v, want ErrNotAdopted", err)
	}
	logger, hook := test.NewNullLogger()
	p, err := Adopt(Adopted{State: st, OutputDir: dir, Log: logrus.NewEntry(logger)})
	if err != nil {
		t.Fatal(err)
	}
	if !p.Adopted() || p.PID() != st.PID || p.State() != st {
		t.Errorf("adopted %+v, want %+v", p.State(), st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(hook.AllEntries()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the adopted plugin's output does not reach the log")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if e := hook.AllEntries()[0]; e.Message != "tick" || e.Data["stream"] != Stdout {
		t.Errorf("forwarded %q on %v, want tick on stdout", e.Message, e.Data["stream"])
	}
	if err := p.Stop(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	stopped = true
	if p.Status() != "unknown status (adopted process)" {
		t.Errorf("Status() = %q", p.Status())
	}
	waitGone(t, st.PID)
	waitGone(t, st.ShimPID)
}

func countTicks(t *testing.T, dir string) int {
	t.Helper()
	lines, err := ReadOutput(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	return len(lines)
}

// Detach leaves the plugin and its shim running; Adopt takes them over.
func TestProcess_Detach_ThenAdopt(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	dir := t.TempDir()
	p, err := l.Start(context.Background(), Spec{Command: []string{"sleep", "300"}, OutputDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	st := p.State()
	p.Detach()
	p.Detach()
	if gone(st.PID) || gone(st.ShimPID) {
		t.Fatal("Detach stopped the plugin or its shim")
	}
	if err := p.Stop(context.Background(), time.Second); err != nil || gone(st.PID) {
		t.Fatalf("Stop after Detach: %v, plugin gone %v; want a no-op", err, gone(st.PID))
	}
	q, err := Adopt(Adopted{State: st, OutputDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	// The adopted plugin's death is seen although it is not our child
	// (here it still is: its zombie is seen through the pidfd too).
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-q.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("the adopted process's exit was not seen")
	}
	wait(t, q)
	// Ours to reap after all: the test binary started it.
	_ = p.plugin.cmd.Wait()
	_ = p.shim.cmd.Wait()
	waitGone(t, st.ShimPID)
}

func TestKillLeftover(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	dir := t.TempDir()
	p, err := l.Start(context.Background(), Spec{Command: []string{"sleep", "300"}, OutputDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteState(dir, p.State()); err != nil {
		t.Fatal(err)
	}
	killed, err := KillLeftover(context.Background(), dir, 0, 0)
	if !killed || err != nil {
		t.Fatalf("KillLeftover = %v, %v", killed, err)
	}
	wait(t, p)
	if st, err := ReadState(dir); err != nil || st != (State{}) {
		t.Errorf("state after KillLeftover: %+v, %v; want removed", st, err)
	}
	if killed, err := KillLeftover(context.Background(), dir, 0, 0); killed || err != nil {
		t.Errorf("again: %v, %v; want nothing to kill", killed, err)
	}
}

// A broken State file does not keep the store's process alive.
func TestKillLeftover_BrokenStateFile(t *testing.T) {
	defer leakcheck.Check(t)()
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/"+StateFile, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	st, err := ReadStat(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	killed, err := KillLeftover(context.Background(), dir, cmd.Process.Pid, st.StartTicks)
	if !killed || err == nil || !strings.Contains(err.Error(), StateFile) {
		t.Errorf("KillLeftover = %v, %v; want the process killed and an error naming the file", killed, err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(dir + "/" + StateFile); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("broken state file: %v, want removed", err)
	}
}

// TestProcess_Stop_OneSIGTERM: a stop sends SIGTERM to the plugin once,
// and not to the rest of its group: the group leader is the plugin, so a
// SIGTERM to the group reached the plugin twice, and drivers that take a
// second SIGTERM as "exit now" skipped their graceful stop. The plugin
// here waits, on SIGTERM, for a child of its group that exits only on a
// SIGTERM of its own: the child must never get one, so the plugin is
// killed after the grace, having seen one SIGTERM.
func TestProcess_Stop_OneSIGTERM(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	childSaw := filepath.Join(t.TempDir(), "child-signals")
	logger, hook := test.NewNullLogger()
	script := `sh -c 'trap "echo TERM >>` + childSaw + `; exit 0" TERM; while :; do sleep 0.05; done' &
child=$!
trap 'echo plugin-TERM; wait $child; exit 0' TERM
echo ready
while :; do sleep 0.05; done`
	p, err := l.Start(context.Background(), Spec{Command: []string{"sh", "-c", script}, OutputDir: t.TempDir(), Log: logrus.NewEntry(logger)})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for !hasLine(hook, "ready") {
		if time.Now().After(deadline) {
			t.Fatal("the plugin never printed ready")
		}
		time.Sleep(time.Millisecond)
	}
	if err := p.Stop(context.Background(), 500*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if got := p.Status(); got != "signal: killed" {
		t.Errorf("Status() = %q, want signal: killed (the plugin waits for a child that never got SIGTERM)", got)
	}
	if b, err := os.ReadFile(childSaw); err == nil {
		t.Errorf("the plugin's child got a SIGTERM from the stop: %q", b)
	}
	n := 0
	for _, e := range hook.AllEntries() {
		if e.Message == "plugin-TERM" {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the plugin saw %d SIGTERMs, want 1", n)
	}
}

func hasLine(hook *test.Hook, line string) bool {
	for _, e := range hook.AllEntries() {
		if e.Message == line {
			return true
		}
	}
	return false
}
