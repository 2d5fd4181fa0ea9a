package leakcheck

import (
	"testing"
	"time"

	"go.uber.org/goleak"
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

// A goroutine that ends a second after the test is not a leak: Check waits
// for it, where goleak alone reports it (it gives up after about half a
// second, on a schedule callers cannot change).
func TestCheck_WaitsLongerThanGoleak(t *testing.T) {
	old := Grace
	Grace = 30 * time.Second
	defer func() { Grace = old }()

	start := goleak.IgnoreCurrent()
	ft := &fakeTB{}
	done := Check(ft)
	stop := make(chan struct{})
	go func() { <-stop }()
	if err := goleak.Find(append(Options(), start)...); err == nil {
		t.Fatal("goleak.Find does not report a goroutine that is still running")
	}
	time.AfterFunc(time.Second, func() { close(stop) })
	done()
	if ft.failed {
		t.Fatalf("Check reported a goroutine that ended within the grace period: %s", ft.msg)
	}
}
