package mountprobe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/mountprobe/mountprobetest"
)

func TestCause(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{&fs.PathError{Op: "stat", Path: "/x", Err: syscall.ENOTCONN}, CauseENOTCONN},
		{fmt.Errorf("wrapped: %w", syscall.EIO), CauseEIO},
		{syscall.ESTALE, CauseESTALE},
		{&fs.PathError{Op: "stat", Path: "/x", Err: syscall.ENOENT}, ""},
		{syscall.EACCES, ""},
	} {
		if got := Cause(tt.err); got != tt.want {
			t.Errorf("Cause(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}

// hungStat is a fake stat under which each of n paths hangs; it returns
// them.
func hungStat(n int) (*mountprobetest.Stat, []string) {
	st := mountprobetest.New()
	var paths []string
	for i := range n {
		p := fmt.Sprintf("/hung%d", i)
		st.Hang(p)
		paths = append(paths, p)
	}
	return st, paths
}

// waitOutstanding waits until p has n stats outstanding.
func waitOutstanding(t *testing.T, p *Prober, n int) {
	t.Helper()
	for end := time.Now().Add(time.Minute); p.Outstanding() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("Outstanding = %d after a minute, want %d", p.Outstanding(), n)
		}
	}
}

// TestProber_Probe_Causes: each stat error gives its cause; a path given
// twice is stat'ed once. The timeout is far off: every stat answers.
func TestProber_Probe_Causes(t *testing.T) {
	h := mountprobetest.New()
	for path, err := range map[string]error{
		"/ok": nil, "/gone": os.ErrNotExist, "/fuse": syscall.ENOTCONN, "/nfs": syscall.ESTALE, "/io": syscall.EIO,
		"/denied": &fs.PathError{Op: "stat", Path: "/denied", Err: syscall.EACCES},
	} {
		h.Set(path, err)
	}
	p := New(Config{Timeout: time.Hour, Budget: 2, Stat: h.Stat})
	got := p.Probe(context.Background(), []string{"/ok", "/gone", "/fuse", "/nfs", "/io", "/denied", "/ok"})
	want := map[string]Result{
		"/ok": {}, "/gone": {}, "/fuse": {Cause: CauseENOTCONN}, "/nfs": {Cause: CauseESTALE}, "/io": {Cause: CauseEIO}, "/denied": {},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Probe = %v, want %v", got, want)
	}
	if h.Calls("/ok") != 1 {
		t.Errorf("a path given twice was stat'ed %d times, want once", h.Calls("/ok"))
	}
	if n := p.Outstanding(); n != 0 {
		t.Errorf("Outstanding = %d after every stat answered, want 0", n)
	}
}

// TestProber_Probe_Hung: a stat that does not answer within the timeout
// is a dead mount (timeout). While it hangs, the path is not stat'ed
// again and stays dead; once it returns, the path is probed anew.
func TestProber_Probe_Hung(t *testing.T) {
	h := mountprobetest.New()
	h.Hang("/hung")
	p := New(Config{Timeout: 20 * time.Millisecond, Budget: 4, Stat: h.Stat})
	if got := p.Probe(context.Background(), []string{"/hung"}); got["/hung"] != (Result{Cause: CauseTimeout}) {
		t.Errorf("Probe of a hung path = %v, want timeout", got)
	}
	for range 3 {
		if r := p.One(context.Background(), "/hung"); r.Cause != CauseTimeout {
			t.Errorf("probe of a path whose stat hangs = %+v, want timeout", r)
		}
	}
	if n := h.Calls("/hung"); n != 1 {
		t.Errorf("hung path stat'ed %d times, want 1 while the first hangs", n)
	}
	if n := p.Outstanding(); n != 1 {
		t.Errorf("Outstanding = %d, want 1", n)
	}
	h.Release() // the stat returns ENOTCONN, as a FUSE mount whose server is killed
	waitOutstanding(t, p, 0)
	h.Set("/hung", syscall.ENOTCONN)
	p.timeout = time.Hour // read by the next probe only, on this goroutine
	if r := p.One(context.Background(), "/hung"); r.Cause != CauseENOTCONN {
		t.Errorf("probe after the hang ended = %+v, want ENOTCONN", r)
	}
	if n := h.Calls("/hung"); n != 2 {
		t.Errorf("path stat'ed %d times, want 2", n)
	}
}

// TestProber_Budget: hung stats never take more than the budget; a path
// that cannot get a place is unknown, not broken.
func TestProber_Budget(t *testing.T) {
	h, paths := hungStat(5)
	p := New(Config{Timeout: 20 * time.Millisecond, Budget: 2, Stat: h.Stat})
	got := p.Probe(context.Background(), paths)
	timeouts, unknown := 0, 0
	for _, r := range got {
		switch {
		case r.Cause == CauseTimeout:
			timeouts++
		case r.Unknown:
			unknown++
		}
	}
	if timeouts != 2 || unknown != 3 {
		t.Errorf("with a budget of 2: %d timeouts and %d unknown, want 2 and 3 (%v)", timeouts, unknown, got)
	}
	if n := p.Outstanding(); n != 2 {
		t.Errorf("Outstanding = %d, want the budget, 2", n)
	}
	// A path without a place is not stat'ed: only the budget's were.
	stated := 0
	for _, path := range paths {
		stated += h.Calls(path)
	}
	if stated != 2 {
		t.Errorf("%d stats started, want the budget, 2", stated)
	}
	h.Release()
	waitOutstanding(t, p, 0)
}

// TestProber_Probe_ReturnsWithinTwoTimeouts: however many paths hang, with
// a budget of one, Probe waits one timeout for places and one for the
// stats, not one per path. The bound checked is far above the two
// timeouts (2 s) and far below what a wait per path would take (10 s).
func TestProber_Probe_ReturnsWithinTwoTimeouts(t *testing.T) {
	h, paths := hungStat(10)
	p := New(Config{Timeout: time.Second, Budget: 1, Stat: h.Stat})
	start := time.Now()
	got := p.Probe(context.Background(), paths)
	took := time.Since(start)
	t.Logf("Probe of %d hung paths with a budget of 1 and a timeout of 1s took %s", len(paths), took)
	if took > 6*time.Second {
		t.Errorf("Probe took %s, want about two timeouts (2s)", took)
	}
	if len(got) != len(paths) {
		t.Errorf("Probe answered %d paths, want %d", len(got), len(paths))
	}
	h.Release()
	waitOutstanding(t, p, 0)
}

func TestProber_ContextEnds(t *testing.T) {
	h := mountprobetest.New()
	h.Hang("/hung")
	defer h.Release()
	p := New(Config{Timeout: time.Hour, Stat: h.Stat})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := p.One(ctx, "/hung"); !r.Unknown || r.Broken() {
		t.Errorf("probe with an ended ctx = %+v, want unknown", r)
	}
}

func TestUnmount_NotAMount(t *testing.T) {
	dir := t.TempDir()
	if err := Unmount(dir); err != nil && !errors.Is(err, syscall.EPERM) {
		t.Errorf("Unmount of a plain directory: %v, want nil", err)
	}
	if err := Unmount(dir + "/missing"); err != nil && !errors.Is(err, syscall.EPERM) {
		t.Errorf("Unmount of a missing path: %v, want nil", err)
	}
}
