package runtime_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/runtime"
)

// alloc returns the allocation id as the runtime lists it.
func (e *testEnv) alloc(id string) runtime.Allocation {
	e.t.Helper()
	as, err := e.rt.Allocations(context.Background())
	if err != nil {
		e.t.Fatal(err)
	}
	for _, a := range as {
		if a.ID == id {
			return a
		}
	}
	e.t.Fatalf("no allocation %s in %+v", id, as)
	return runtime.Allocation{}
}

// running reports whether pid runs (not absent, not a zombie).
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := strings.LastIndexByte(string(b), ')')
	return i > 0 && i+2 < len(b) && b[i+2] != 'Z'
}

func logLines(t *testing.T, rt *runtime.Runtime, id string, tail int) []runtime.LogLine {
	t.Helper()
	var out []runtime.LogLine
	if err := rt.AllocationLogs(context.Background(), id, runtime.LogsQuery{Tail: tail}, func(l runtime.LogLine) error {
		out = append(out, l)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// An exec-managed plugin outlives Shutdown and is adopted by the next
// Start; its output is kept and served; with StopOnAgentExit, Shutdown
// stops it.
func TestRuntime_ExecPlugin_OutlivesShutdownAndIsAdopted(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t)
	_, err = e.rt.RegisterAllocation(context.Background(), "e1", runtime.AllocationSpec{
		Plugin: testPlugin, Type: runtime.TypeMonolith,
		Command: []string{self, "-test.run=^$"}, Env: map[string]string{fakePluginEnv: "1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.waitAllocHealthy("e1")
	pid := e.alloc("e1").PID
	if pid == 0 {
		t.Fatal("no PID for a running exec-managed allocation")
	}
	eventually(t, "the plugin's first lines are kept", func() (bool, error) {
		lines := logLines(t, e.rt, "e1", -1)
		return len(lines) >= 2, nil
	})
	lines := logLines(t, e.rt, "e1", -1)
	// The shim reads stdout and stderr on their own: lines of the two
	// streams keep their order within each stream only.
	streams := map[string]string{}
	serving := false
	for _, l := range lines {
		streams[l.Line] = l.Stream
		serving = serving || (l.Stream == "stdout" && strings.HasPrefix(l.Line, "fake plugin serving on "))
		if l.Time.IsZero() {
			t.Errorf("line %q without a time", l.Line)
		}
	}
	if streams["a line on stderr"] != "stderr" || !serving {
		t.Errorf("lines %+v, want the serving line on stdout and the stderr line on stderr", lines)
	}
	if last := logLines(t, e.rt, "e1", 1); len(last) != 1 {
		t.Errorf("tail 1 = %+v", last)
	}

	// Not for an attached allocation, nor an unknown one.
	e.attach("a1", "other", runtime.TypeNode, fakeplugin.Config{})
	err = e.rt.AllocationLogs(context.Background(), "a1", runtime.LogsQuery{Tail: -1}, func(runtime.LogLine) error { return nil })
	if !errors.Is(err, runtime.ErrNotFound) || !strings.Contains(err.Error(), "attached") {
		t.Errorf("logs of an attached allocation: %v, want ErrNotFound saying it is attached", err)
	}
	err = e.rt.AllocationLogs(context.Background(), "nope", runtime.LogsQuery{Tail: -1}, func(runtime.LogLine) error { return nil })
	if !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("logs of an unknown allocation: %v, want ErrNotFound", err)
	}
	if err := e.rt.DeregisterAllocation(context.Background(), "a1"); err != nil {
		t.Fatal(err)
	}

	e.stop()
	if !running(pid) {
		t.Fatal("the plugin did not outlive Shutdown")
	}
	e.start()
	e.waitAllocHealthy("e1")
	if got := e.alloc("e1").PID; got != pid {
		t.Errorf("after restart PID %d, want the adopted %d", got, pid)
	}

	// A follow ends with its context.
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan string, 10)
	done := make(chan error, 1)
	go func() {
		done <- e.rt.AllocationLogs(ctx, "e1", runtime.LogsQuery{Tail: 1, Follow: true}, func(l runtime.LogLine) error {
			got <- l.Line
			return nil
		})
	}()
	select {
	case <-got:
	case <-time.After(waitLimit):
		t.Fatal("the follow gave no tail line")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("follow ended with %v", err)
	}

	e.stop()
	e.cfg.Plugins.StopOnAgentExit = true
	e.start()
	e.waitAllocHealthy("e1")
	if got := e.alloc("e1").PID; got != pid {
		t.Errorf("after the second restart PID %d, want %d", got, pid)
	}
	e.stop()
	if running(pid) {
		t.Error("the plugin outlived a Shutdown with StopOnAgentExit")
	}
}
