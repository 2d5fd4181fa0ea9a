package testbin

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// Stopped follows a busy process through SIGSTOP and SIGCONT, and is
// false for a process that does not exist.
func TestStopped_StopAndContinue(t *testing.T) {
	pid := CPUHog(t, 1)[0]
	if Stopped(pid) {
		t.Fatalf("hog %d stopped before any SIGSTOP", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	Eventually(t, "the hog stopped", 30*time.Second, 10*time.Millisecond, func() (bool, string) { return Stopped(pid), "running" })
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	Eventually(t, "the hog running again", 30*time.Second, 10*time.Millisecond, func() (bool, string) { return !Stopped(pid), "stopped" })
	if Stopped(os.Getpid() + 1<<22) { // above pid_max's default: no such process
		t.Error("Stopped is true for a process that does not exist")
	}
}
