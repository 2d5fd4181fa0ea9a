package leakcheck

import (
	"testing"
	"time"
)

type fakeTB struct {
	testing.TB
	failed bool
	msg    string
}

func (f *fakeTB) Helper()      {}
func (f *fakeTB) Failed() bool { return f.failed }
func (f *fakeTB) Errorf(format string, args ...any) {
	f.failed = true
	f.msg = format
}

func TestCheck_DetectsLeak(t *testing.T) {
	old := Grace
	Grace = 100 * time.Millisecond
	defer func() { Grace = old }()

	stop := make(chan struct{})
	ft := &fakeTB{}
	done := Check(ft)
	go func() { <-stop }()
	done()
	close(stop)
	if !ft.failed {
		t.Fatal("Check did not report a goroutine that was still running")
	}
}

func TestCheck_WaitsForExit(t *testing.T) {
	ft := &fakeTB{}
	done := Check(ft)
	go func() { time.Sleep(50 * time.Millisecond) }()
	done()
	if ft.failed {
		t.Fatal("Check reported a goroutine that exited within the grace period")
	}
}
