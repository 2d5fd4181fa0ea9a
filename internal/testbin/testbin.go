// Package testbin holds what the tests that run the built csiactor binary
// share: building it, starting and waiting for the processes they run,
// polling for what happens on its own, and finding the processes left;
// and the few helpers that tests of several packages share (Parallel, and
// CPUHog for benchmarks under load).
package testbin

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// GoCommand finds the go command: in PATH, else in $GOROOT/bin.
func GoCommand() (string, error) {
	if p, err := exec.LookPath("go"); err == nil {
		return p, nil
	}
	if root := os.Getenv("GOROOT"); root != "" {
		p := filepath.Join(root, "bin", "go")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("the go command is neither in PATH nor in $GOROOT/bin; it is needed to build csiactor")
}

// Build builds ./cmd/csiactor into a new directory under os.TempDir named
// with prefix (with the race detector when race is set, and the given
// build tags). It returns the binary and its directory, which the caller
// removes.
func Build(prefix string, race bool, tags ...string) (bin, dir string, err error) {
	goBin, err := GoCommand()
	if err != nil {
		return "", "", err
	}
	if dir, err = os.MkdirTemp("", prefix); err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "csiactor")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	args = append(args, "github.com/csiactor/csiactor/cmd/csiactor")
	if out, err := exec.Command(goBin, args...).CombinedOutput(); err != nil {
		return "", dir, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return bin, dir, nil
}

// KillProcessesWith sends SIGKILL to every live process whose command line
// contains marker (other than this one), and waits until they are gone, at
// most five seconds: tests use it to end the plugin processes that outlive
// the agent by design.
func KillProcessesWith(marker string) {
	for range 100 {
		pids := ProcessesWith(marker)
		if len(pids) == 0 {
			return
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ProcessesWith returns the live (not zombie or dead) processes whose
// command line contains marker, other than this one.
func ProcessesWith(marker string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), []byte(marker)) {
			continue
		}
		if st, ok := procState(filepath.Join("/proc", e.Name(), "stat")); !ok || st == 'Z' || st == 'X' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// Stopped reports whether every thread of process pid is stopped (by
// SIGSTOP, say). kill(2) returns before the stop takes effect: a test that
// stops a process to look at what it wrote waits for Stopped first.
func Stopped(pid int) bool {
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "stat"))
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, t := range tasks {
		if st, ok := procState(t); !ok || (st != 'T' && st != 't') {
			return false
		}
	}
	return true
}

// procState returns the one-letter state in the /proc stat file at path.
func procState(path string) (byte, bool) {
	stat, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	// The state follows the ")" that ends the command name.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return 0, false
	}
	return stat[i+2], true
}

// Tail returns the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
