package testbin

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTicks returns the CPU time (user + system, in clock ticks) process
// pid has used, and whether it is alive (not gone, not a zombie).
func cpuTicks(pid int) (ticks int, alive bool) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the ")" that ends the command name: state is the
	// first, utime and stime the 12th and 13th.
	i := bytes.LastIndexByte(stat, ')')
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	utime, _ := strconv.Atoi(f[11])
	stime, _ := strconv.Atoi(f[12])
	return utime + stime, true
}

func TestCPUHog_SpinsUntilTheTestEnds(t *testing.T) {
	var pids []int
	t.Run("loaded", func(t *testing.T) {
		pids = CPUHog(t, 2)
		if len(pids) != 2 {
			t.Fatalf("CPUHog returned %d pids, want 2", len(pids))
		}
		running := ProcessesWith(CPUHogMarker)
		for _, pid := range pids {
			if !slices.Contains(running, pid) {
				t.Errorf("hog %d not among the processes marked %s: %v", pid, CPUHogMarker, running)
			}
			start, _ := cpuTicks(pid)
			Eventually(t, "the hog to use CPU", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
				now, alive := cpuTicks(pid)
				return alive && now > start+5, "hog " + strconv.Itoa(pid) + " used " + strconv.Itoa(now-start) + " ticks, alive " + strconv.FormatBool(alive)
			})
		}
	})
	// The subtest's cleanups killed and waited for the hogs: reaped, they
	// are gone from /proc.
	for _, pid := range pids {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !os.IsNotExist(err) {
			t.Errorf("hog %d still in /proc after its test ended (stat: %v)", pid, err)
		}
	}
}

// A hog whose parent dies without killing it (the test binary killed, or
// a -timeout panic: no cleanups run) exits by itself.
func TestCPUHog_ExitsWhenItsParentDies(t *testing.T) {
	parent := exec.Command("/bin/sh", "-c", `/bin/sh -c "$1" csiactor-cpuhog-orphan $$ & echo $!; wait`, "sh", hogScript)
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	done, err := Start(t, parent, nil)
	if err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read the hog's pid: %s", err)
	}
	hog, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatalf("hog pid %q: %s", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(hog, syscall.SIGKILL) })
	// Spinning (past its first check of its parent) before the parent dies.
	Eventually(t, "the hog to use CPU", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		used, alive := cpuTicks(hog)
		return alive && used > 5, "hog " + strconv.Itoa(hog) + " used " + strconv.Itoa(used) + " ticks, alive " + strconv.FormatBool(alive)
	})
	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-done
	Eventually(t, "the orphaned hog to exit", 30*time.Second, 10*time.Millisecond, func() (bool, string) {
		_, alive := cpuTicks(hog)
		return !alive, "hog " + strconv.Itoa(hog) + " still running"
	})
}
