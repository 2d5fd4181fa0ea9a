package proc

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/internal/leakcheck"
)

// batches is a plugin that writes the lines of each batch, each batch once
// the file named by the batch's first word exists in $GO (the first
// batch at once), then sleeps: the test decides when it writes.
func batches(b ...string) string {
	var sb strings.Builder
	for i, lines := range b {
		if i > 0 {
			sb.WriteString(`while [ ! -e "$GO/` + strings.Fields(lines)[0] + `" ]; do sleep 0.01; done; `)
		}
		for _, l := range strings.Fields(lines) {
			sb.WriteString("echo " + l + "; ")
		}
	}
	sb.WriteString("exec sleep 300")
	return sb.String()
}

// waitLast waits until the last line of dir's kept output is text.
func waitLast(t *testing.T, dir, text string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		lines, err := ReadOutput(dir, 1)
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) == 1 && lines[0].Text == text {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shim wrote %+v last after 20s, want %q", lines, text)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitLogged waits until hook has n entries and returns their messages.
func waitLogged(t *testing.T, hook *test.Hook, n int) []string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(hook.AllEntries()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d lines logged in 20s, want %d: %v", len(hook.AllEntries()), n, messages(hook))
		}
		time.Sleep(5 * time.Millisecond)
	}
	return messages(hook)
}

func messages(hook *test.Hook) []string {
	var out []string
	for _, e := range hook.AllEntries() {
		out = append(out, e.Message)
	}
	return out
}

func newHookLog() (*logrus.Entry, *test.Hook) {
	logger, hook := test.NewNullLogger()
	return logrus.NewEntry(logger), hook
}

// Detach forwards every line the shim has written, however soon after the
// start it comes; the next agent forwards exactly the lines written after,
// across the rotations that happened while no agent ran, and so does the
// one after it.
func TestProcess_Detach_ForwardsAll_AdoptResumes(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	dir, trigger := t.TempDir(), t.TempDir()
	log1, hook1 := newHookLog()
	p, err := l.Start(context.Background(), Spec{
		Command:   []string{"sh", "-c", batches("a1 a2 a3 a4 a5", "b1 b2 b3 b4 b5 b6 b7 b8 b9 b10", "c1 c2")},
		Env:       []string{"GO=" + trigger},
		OutputDir: dir,
		// Three or four records a file (of 31 to 42 bytes): the second
		// batch rotates the output two or three times while no agent runs.
		MaxOutputSize:  150,
		MaxOutputFiles: 3,
		Log:            log1,
	})
	if err != nil {
		t.Fatal(err)
	}
	st := p.State()
	defer func() { // whatever fails: after Detach, Kill does nothing
		_ = syscall.Kill(-st.PID, syscall.SIGKILL)
		_ = p.plugin.cmd.Wait()
		_ = p.shim.cmd.Wait()
	}()
	waitLast(t, dir, "a5")
	p.Detach()
	if got, want := messages(hook1), strings.Fields("a1 a2 a3 a4 a5"); !slices.Equal(got, want) {
		t.Fatalf("forwarded before Detach returned: %v, want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, PositionFile)); err != nil {
		t.Fatalf("Detach recorded no position: %v", err)
	}

	// Written while no agent runs, and rotated.
	if err := os.WriteFile(filepath.Join(trigger, "b1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	waitLast(t, dir, "b10")
	b, err := os.ReadFile(filepath.Join(dir, PositionFile))
	if err != nil {
		t.Fatal(err)
	}
	var pos position
	if err := json.Unmarshal(b, &pos); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	for n := range 2 {
		if fi, err := os.Stat(outputPath(dir, n)); err != nil || fi.Sys().(*syscall.Stat_t).Ino == pos.Inode {
			t.Fatalf("the recorded position %+v is in output file %d (%v): want it rotated at least twice", pos, n, err)
		}
	}
	log2, hook2 := newHookLog()
	q, err := Adopt(Adopted{State: st, OutputDir: dir, Log: log2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, PositionFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Adopt left the position file: %v", err)
	}
	want := strings.Fields("b1 b2 b3 b4 b5 b6 b7 b8 b9 b10")
	waitLogged(t, hook2, len(want))
	q.Detach()
	if got := messages(hook2); !slices.Equal(got, want) {
		t.Fatalf("the adopting agent forwarded %v, want %v", got, want)
	}

	// And once more: a third agent logs only what came after.
	if err := os.WriteFile(filepath.Join(trigger, "c1"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	log3, hook3 := newHookLog()
	r, err := Adopt(Adopted{State: st, OutputDir: dir, Log: log3})
	if err != nil {
		t.Fatal(err)
	}
	waitLogged(t, hook3, 2)
	if err := r.Stop(context.Background(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if got, want := messages(hook3), []string{"c1", "c2"}; !slices.Equal(got, want) {
		t.Errorf("the third agent forwarded %v, want %v", got, want)
	}
}

// A plugin that ends while no agent runs: the next agent, which starts a
// new one, logs the old one's last lines first, and nothing from before.
func TestLauncher_Start_LogsWhatTheDetachedPluginWroteLast(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	dir, trigger := t.TempDir(), t.TempDir()
	log1, hook1 := newHookLog()
	p, err := l.Start(context.Background(), Spec{
		Command:   []string{"sh", "-c", `echo started; while [ ! -e "$GO/end" ]; do sleep 0.01; done; echo last words; exit 1`},
		Env:       []string{"GO=" + trigger},
		OutputDir: dir,
		Log:       log1,
	})
	if err != nil {
		t.Fatal(err)
	}
	st := p.State()
	defer func() { _ = syscall.Kill(-st.PID, syscall.SIGKILL) }() // should it fail before its end
	waitLast(t, dir, "started")
	p.Detach()
	if got := messages(hook1); !slices.Equal(got, []string{"started"}) {
		t.Fatalf("forwarded before Detach returned: %v, want [started]", got)
	}
	if err := os.WriteFile(filepath.Join(trigger, "end"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_ = p.plugin.cmd.Wait()
	_ = p.shim.cmd.Wait() // the shim wrote everything before it exited

	log2, hook2 := newHookLog()
	q, err := l.Start(context.Background(), Spec{Command: []string{"sh", "-c", "echo new"}, OutputDir: dir, Log: log2})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, q)
	if got, want := messages(hook2), []string{"last words", "new"}; !slices.Equal(got, want) {
		t.Errorf("the new process's agent forwarded %v, want %v", got, want)
	}
}

// A broken position file is named in a warning and removed; the output
// is then followed from its end, as with none.
func TestLauncher_Start_BrokenPositionFile(t *testing.T) {
	defer leakcheck.Check(t)()
	l := NewLauncher()
	defer l.Close()
	dir := t.TempDir()
	if err := os.WriteFile(outputPath(dir, 0), Line{Time: time.Now(), Stream: Stdout, Text: "old"}.format(), 0o600); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, PositionFile)
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	log, hook := newHookLog()
	p, err := l.Start(context.Background(), Spec{Command: []string{"sh", "-c", "echo new"}, OutputDir: dir, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, p)
	var lines []string
	warned := false
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel {
			err, _ := e.Data[logrus.ErrorKey].(error)
			warned = err != nil && strings.Contains(err.Error(), path)
			continue
		}
		lines = append(lines, e.Message)
	}
	if !warned {
		t.Errorf("no warning naming %s: %v", path, messages(hook))
	}
	if !slices.Equal(lines, []string{"new"}) {
		t.Errorf("forwarded %v, want [new]", lines)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the broken position file is still there: %v", err)
	}
}
