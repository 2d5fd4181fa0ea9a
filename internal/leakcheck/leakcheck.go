// Package leakcheck fails a test that leaves goroutines behind. It is a
// thin layer over go.uber.org/goleak, which finds and parses the
// goroutines; this package adds what goleak v1.3.0 lacks for this
// project's tests, and keeps the project's list of known long-lived
// goroutines in one place.
//
// # Basics
//
// Call [Check] at the start of a test and defer the function it returns, or
// call [VerifyTestMain] from TestMain to check the whole package:
//
//	func TestThing(t *testing.T) {
//		defer leakcheck.Check(t)()
//		...
//	}
//
//	func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }
//
// [Run] is VerifyTestMain for a TestMain with more to do after the tests.
//
// # What it adds to goleak
//
//   - A grace period ([Grace], 5 s) for goroutines that end just after
//     Shutdown returns (gRPC transports, a closing listener's server).
//     goleak retries for about half a second in all, a fixed schedule it
//     does not let callers change; on a loaded 2-core CI machine that turns
//     goroutines that are ending into false leaks.
//   - Check ignores the goroutines running when it was called
//     (goleak.IgnoreCurrent), so a test is charged only with its own, and
//     reports nothing for a test that already failed (its servers are
//     often still up; the failure is the news).
//   - [Options] is the one list of goroutines a dependency starts once per
//     process and never stops.
//
// # Caveats
//
// Like goleak.VerifyNone, Check cannot tell goroutines of parallel tests
// apart; use VerifyTestMain in packages with parallel tests.
package leakcheck

import (
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// Grace is how long Check and VerifyTestMain wait for goroutines to exit.
var Grace = 5 * time.Second

// Options are the goroutines every check ignores: those a dependency
// starts once per process, by design, and never stops. goleak itself
// already ignores the testing package's, os/signal's and runtime/trace's.
func Options() []goleak.Option {
	return []goleak.Option{
		// Ginkgo (run by csi-test's sanity suite) starts a signal watcher
		// in RunSpecs and never stops it.
		goleak.IgnoreAnyFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func2"),
		goleak.IgnoreAnyFunction("github.com/onsi/ginkgo/v2/internal/interrupt_handler.(*InterruptHandler).registerForInterrupts.func1"),
	}
}

// find waits up to Grace for the goroutines that opts do not ignore to
// exit, and returns goleak's report of those left, or nil.
func find(opts ...goleak.Option) error {
	opts = append(Options(), opts...)
	deadline := time.Now().Add(Grace)
	for {
		err := goleak.Find(opts...) // itself retries for a short while
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Check records the running goroutines and returns a function that fails t
// if goroutines started since are still running after the grace period.
func Check(t testing.TB) func() {
	t.Helper()
	current := goleak.IgnoreCurrent()
	return func() {
		t.Helper()
		if t.Failed() {
			return // a failed test often leaves its servers up; don't pile on
		}
		if err := find(current); err != nil {
			t.Errorf("leakcheck: %v", err)
		}
	}
}

// VerifyTestMain runs the package's tests and then fails the run if any
// goroutine is left over. Use it as the body of TestMain.
func VerifyTestMain(m *testing.M) { os.Exit(Run(m)) }

// Run is VerifyTestMain without the exit: it returns the exit code, for a
// TestMain with more to do after the tests (remove what it built).
func Run(m *testing.M) int {
	current := goleak.IgnoreCurrent()
	code := m.Run()
	if code == 0 {
		if err := find(current); err != nil {
			fmt.Fprintf(os.Stderr, "leakcheck: goroutines left after all tests: %v\n", err)
			code = 1
		}
	}
	return code
}
