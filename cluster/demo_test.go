package cluster_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/internal/testbin"
)

// TestClusterDemo_StartStop runs `make run-cluster`'s program
// (examples/cluster) as a process, as a user would: once it says it is
// ready, the commands it prints are run as printed, and show a volume
// created on node1, claimed on node2 and refused to node3 with a 409 that
// names node2; then SIGINT (Ctrl-C) makes it exit 0 — so make prints no
// error — leaving no process, mount or directory behind.
func TestClusterDemo_StartStop(t *testing.T) {
	t.Cleanup(leakcheck.Check(t))
	bin := procBinary.Path(t)
	goBin, err := testbin.GoCommand()
	if err != nil {
		t.Fatal(err)
	}
	buildDir, err := os.MkdirTemp("", "csicl-demo-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(buildDir) })
	demo := filepath.Join(buildDir, "cluster-demo")
	if out, err := exec.Command(goBin, "build", "-o", demo, "github.com/csiactor/csiactor/examples/cluster").CombinedOutput(); err != nil {
		t.Fatalf("build the demo: %v\n%s", err, out)
	}

	outPath := filepath.Join(buildDir, "demo.out")
	outFile, err := os.Create(outPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(demo, "-bin", bin)
	cmd.Stdout, cmd.Stderr = outFile, outFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, err := testbin.Start(t, cmd, nil)
	outFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	var dir string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("demo output:\n%s", readFile(outPath))
		}
		if dir == "" {
			return
		}
		testbin.KillProcessesWith(dir)
		for _, m := range mountsUnder(dir) {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
		_ = os.RemoveAll(dir)
	})
	dirRE := regexp.MustCompile(`\(data in (/\S+)\)`)
	testbin.Eventually(t, "the demo to be ready", procDeadline, 50*time.Millisecond, func() (bool, string) {
		out := readFile(outPath)
		if m := dirRE.FindStringSubmatch(out); m != nil {
			dir = m[1]
		}
		if testbin.Closed(done) {
			t.Fatalf("the demo exited: %s\n%s", cmd.ProcessState, out)
		}
		return strings.Contains(out, "Ctrl-C stops everything."), out
	})
	out := readFile(outPath)
	if dir == "" {
		t.Fatalf("the demo did not say where its data is:\n%s", out)
	}

	// The variables and commands, as printed.
	exports := regexp.MustCompile(`(?m)^\s+export (.+)$`).FindStringSubmatch(out)
	if exports == nil {
		t.Fatalf("no export line in:\n%s", out)
	}
	vars := map[string]string{}
	for _, kv := range strings.Fields(exports[1]) {
		k, v, _ := strings.Cut(kv, "=")
		vars[k] = v
	}
	var commands [][]string
	for _, m := range regexp.MustCompile(`(?m)^    (/\S+) (.+)$`).FindAllStringSubmatch(out, -1) {
		if m[1] != bin {
			continue
		}
		args := strings.Fields(os.Expand(m[2], func(k string) string { return vars[k] }))
		commands = append(commands, args)
	}
	type want struct {
		args    string // the command's first words
		fails   bool
		showing string
	}
	wants := []want{
		{"volume create", false, "Created volume demo"},
		{"volume claim", false, "/node2/"},
		{"volume claim", true, `host "node2"`},
		{"volume status", false, "node2"},
		{"node list", false, "node3"},
		{"volume release", false, "Released"},
	}
	if len(commands) != len(wants) {
		t.Fatalf("the demo printed %d commands, want %d:\n%s", len(commands), len(wants), out)
	}
	for i, w := range wants {
		args := commands[i]
		if got := strings.Join(args[:2], " "); got != w.args {
			t.Fatalf("command %d is %q, want %s", i+1, strings.Join(args, " "), w.args)
		}
		var stdout, stderr bytes.Buffer
		c := exec.Command(bin, args...)
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		if (err != nil) != w.fails || !strings.Contains(stdout.String()+stderr.String(), w.showing) {
			t.Fatalf("csiactor %s: %v\n%s%s\nwant failing %v, showing %q", strings.Join(args, " "), err, stdout.String(), stderr.String(), w.fails, w.showing)
		}
	}

	// Ctrl-C.
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(procDeadline):
		t.Fatal("the demo did not exit on SIGINT")
	}
	if !cmd.ProcessState.Success() {
		t.Fatalf("the demo exited with %s on SIGINT, want 0", cmd.ProcessState)
	}
	if pids := testbin.ProcessesWith(dir); len(pids) > 0 {
		t.Errorf("processes left running from %s: %v", dir, pids)
	}
	if m := mountsUnder(dir); len(m) > 0 {
		t.Errorf("mounts left under %s: %v", dir, m)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s is still there: %v", dir, err)
	}
}
