package mountprobe

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
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

// hangingStat answers each path's stat with errs[path], but blocks the
// paths in hang until release is closed.
type hangingStat struct {
	errs    map[string]error
	hang    map[string]bool
	release chan struct{}
	mu      sync.Mutex
	calls   map[string]int
}

func (h *hangingStat) stat(p string) error {
	h.mu.Lock()
	h.calls[p]++
	h.mu.Unlock()
	if h.hang[p] {
		<-h.release
		return syscall.ENOTCONN
	}
	return h.errs[p]
}

func (h *hangingStat) count(p string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls[p]
}

func TestProber_Probe(t *testing.T) {
	h := &hangingStat{
		errs: map[string]error{
			"/ok": nil, "/gone": os.ErrNotExist, "/fuse": syscall.ENOTCONN, "/nfs": syscall.ESTALE, "/io": syscall.EIO,
		},
		hang:    map[string]bool{"/hung": true},
		release: make(chan struct{}),
		calls:   map[string]int{},
	}
	p := New(Config{Timeout: 50 * time.Millisecond, Budget: 4, Stat: h.stat})
	got := p.Probe(context.Background(), []string{"/ok", "/gone", "/fuse", "/nfs", "/io", "/hung", "/ok"})
	want := map[string]Result{
		"/ok": {}, "/gone": {}, "/fuse": {Cause: CauseENOTCONN}, "/nfs": {Cause: CauseESTALE}, "/io": {Cause: CauseEIO},
		"/hung": {Cause: CauseTimeout},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Probe = %v, want %v", got, want)
	}
	if h.count("/ok") != 1 {
		t.Errorf("a path given twice was stat'ed %d times, want once", h.count("/ok"))
	}
	// The hung stat is still outstanding: the path is not stat'ed again,
	// and stays broken.
	if r := p.One(context.Background(), "/hung"); r.Cause != CauseTimeout {
		t.Errorf("second probe of a hung path = %+v, want timeout", r)
	}
	if n := h.count("/hung"); n != 1 {
		t.Errorf("hung path stat'ed %d times, want 1 while the first hangs", n)
	}
	if n := p.Outstanding(); n != 1 {
		t.Errorf("Outstanding = %d, want 1", n)
	}
	close(h.release)
	for p.Outstanding() != 0 {
		time.Sleep(time.Millisecond)
	}
	if r := p.One(context.Background(), "/hung"); r.Cause != CauseENOTCONN {
		t.Errorf("probe after the hang ended = %+v, want ENOTCONN", r)
	}
}

// TestProber_Budget: hung stats never take more than the budget; a path
// that cannot get a place is unknown, not broken.
func TestProber_Budget(t *testing.T) {
	h := &hangingStat{hang: map[string]bool{}, release: make(chan struct{}), calls: map[string]int{}}
	var paths []string
	for i := range 5 {
		p := fmt.Sprintf("/hung%d", i)
		h.hang[p] = true
		paths = append(paths, p)
	}
	p := New(Config{Timeout: 20 * time.Millisecond, Budget: 2, Stat: h.stat})
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
	close(h.release)
	for p.Outstanding() != 0 {
		time.Sleep(time.Millisecond)
	}
}

func TestProber_ContextEnds(t *testing.T) {
	h := &hangingStat{hang: map[string]bool{"/hung": true}, release: make(chan struct{}), calls: map[string]int{}}
	defer func() {
		close(h.release)
	}()
	p := New(Config{Timeout: time.Hour, Stat: h.stat})
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
