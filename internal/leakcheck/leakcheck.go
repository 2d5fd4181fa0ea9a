// Package leakcheck fails a test that leaves goroutines behind.
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
// The check waits up to a grace period (5 s) for goroutines to finish, since
// many exit just after Shutdown returns (gRPC transports, timers).
//
// # Caveats
//
// Goroutines that a dependency starts once per process and never stops are
// ignored by name (see ignoredFrames); anything else counts as a leak.
package leakcheck

import (
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// Grace is how long Check waits for goroutines to exit.
var Grace = 5 * time.Second

// ignoredFrames are functions whose goroutines live for the whole process,
// by design of the runtime, the testing package or a dependency.
var ignoredFrames = []string{
	"testing.(*T).Run",
	"testing.(*M).",
	"testing.tRunner",
	"testing.runTests",
	"testing.(*F).Fuzz",
	"runtime.goexit",
	"os/signal.signal_recv",
	"os/signal.loop",
	"runtime.ensureSigM",
	"created by runtime.gc",
	"runtime.MHeap_Scavenger",
	"runtime/trace",
	"internal/poll.runtime_pollWait", // only when paired with a listed owner below
	// gRPC's process-wide resolver and balancer goroutines.
	"google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run",
	"google.golang.org/grpc/internal/transport.(*controlBuffer)",
	"go.opencensus.io/stats/view.(*worker).start",
	// bbolt: none; protoactor: the process-wide eventstream has no goroutine.
	"github.com/asynkron/protoactor-go/scheduler",
	// Ginkgo (run by csi-test's sanity suite) starts a signal watcher in
	// RunSpecs and never stops it.
	"github.com/onsi/ginkgo/v2/internal/interrupt_handler",
}

type goroutine struct {
	id    string
	stack string
}

func snapshot() map[string]goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]goroutine{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		first, _, _ := strings.Cut(g, "\n")
		// "goroutine 12 [running]:"
		f := strings.Fields(first)
		if len(f) < 2 || f[0] != "goroutine" {
			continue
		}
		out[f[1]] = goroutine{id: f[1], stack: g}
	}
	return out
}

func interesting(g goroutine, self string) bool {
	if g.id == self {
		return false
	}
	// The first frame after the header is the function the goroutine is in;
	// the "created by" line is its origin. Ignore known long-lived ones.
	for _, f := range ignoredFrames {
		if f == "internal/poll.runtime_pollWait" {
			continue
		}
		if strings.Contains(g.stack, f) && (strings.Contains(g.stack, "created by "+f) || firstFrame(g.stack, f)) {
			return false
		}
	}
	if strings.Contains(g.stack, "created by testing.") && strings.Contains(g.stack, "testing.tRunner") {
		return false
	}
	return true
}

func firstFrame(stack, f string) bool {
	lines := strings.Split(stack, "\n")
	return len(lines) > 1 && strings.HasPrefix(lines[1], f)
}

func currentID() string {
	buf := make([]byte, 64)
	n := runtime.Stack(buf, false)
	f := strings.Fields(string(buf[:n]))
	if len(f) > 1 {
		return f[1]
	}
	return ""
}

// leaked returns the goroutines not in before, waiting up to Grace for them
// to go away.
func leaked(before map[string]goroutine) []goroutine {
	self := currentID()
	deadline := time.Now().Add(Grace)
	for {
		var extra []goroutine
		for id, g := range snapshot() {
			if _, ok := before[id]; ok {
				continue
			}
			if interesting(g, self) {
				extra = append(extra, g)
			}
		}
		if len(extra) == 0 || time.Now().After(deadline) {
			sort.Slice(extra, func(i, j int) bool { return extra[i].id < extra[j].id })
			return extra
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Check records the running goroutines and returns a function that fails t
// if goroutines started since are still running after the grace period.
func Check(t testing.TB) func() {
	t.Helper()
	before := snapshot()
	return func() {
		t.Helper()
		if t.Failed() {
			return // a failed test often leaves its servers up; don't pile on
		}
		if extra := leaked(before); len(extra) > 0 {
			t.Errorf("leakcheck: %d goroutine(s) leaked:\n%s", len(extra), format(extra))
		}
	}
}

// VerifyTestMain runs the package's tests and then fails the run if any
// goroutine is left over. Use it as the body of TestMain.
func VerifyTestMain(m *testing.M) { os.Exit(Run(m)) }

// Run is VerifyTestMain without the exit: it returns the exit code, for a
// TestMain with more to do after the tests (remove what it built).
func Run(m *testing.M) int {
	before := snapshot()
	code := m.Run()
	if code == 0 {
		if extra := leaked(before); len(extra) > 0 {
			fmt.Fprintf(os.Stderr, "leakcheck: %d goroutine(s) leaked after all tests:\n%s", len(extra), format(extra))
			code = 1
		}
	}
	return code
}

func format(gs []goroutine) string {
	var b strings.Builder
	for _, g := range gs {
		b.WriteString(g.stack)
		b.WriteString("\n\n")
	}
	return b.String()
}
