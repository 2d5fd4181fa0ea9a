package testbin

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/mountinfo"
)

// Binary is the csiactor binary a package's tests run: built at most once
// per test process, on first use, or named by an environment variable.
// Declare one per package and run its tests with Main.
type Binary struct {
	// Kind names the tests in the message of the skip under -short.
	Kind string
	// Prefix names the build's temporary directory (see Build).
	Prefix string
	// Race builds with the race detector.
	Race bool
	// Tags are build tags for the build.
	Tags []string
	// Env, when not empty, names an environment variable that, when set,
	// is the path of the binary to test instead of building one.
	Env string

	once sync.Once
	path string
	dir  string // the build's directory, removed by Main
	err  error
}

// Main runs the tests, then removes the build, and exits with the tests'
// code. A package's TestMain calls it.
func (b *Binary) Main(m *testing.M) {
	code := m.Run()
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
	os.Exit(code)
}

// Remove removes the build, if any; for a TestMain that runs the tests
// itself rather than through Main.
func (b *Binary) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// Path returns the binary, building it on first use. It skips t under
// -short, and fails t when the build failed.
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("%s: builds and runs the csiactor binary; skipped with -short", b.Kind)
	}
	b.once.Do(func() {
		if p := os.Getenv(b.Env); b.Env != "" && p != "" {
			b.path, b.err = filepath.Abs(p)
			return
		}
		b.path, b.dir, b.err = Build(b.Prefix, b.Race, b.Tags...)
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

// Start starts cmd and a goroutine that waits for it. Once cmd has exited
// (cmd.ProcessState is set), the goroutine calls exited, when not nil, and
// then closes the channel Start returns. When t ends, cmd is killed unless
// it has exited, and waited for, so no goroutine outlives the test.
func Start(t testing.TB, cmd *exec.Cmd, exited func()) (<-chan struct{}, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		if exited != nil {
			exited()
		}
		close(done)
	}()
	t.Cleanup(func() {
		if !Closed(done) {
			_ = cmd.Process.Kill()
		}
		<-done
	})
	return done, nil
}

// Closed reports whether done is closed, without blocking.
func Closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Eventually polls cond every interval until it holds, and fails t once
// deadline has passed, with the last state cond described. The deadline
// bounds a wait; it asserts no speed.
func Eventually(t testing.TB, what string, deadline, interval time.Duration, cond func() (bool, string)) {
	t.Helper()
	end := time.Now().Add(deadline)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("waited %s for %s; last seen:\n%s", deadline, what, state)
		}
		time.Sleep(interval)
	}
}

// Parallel runs fn(0..n-1) on n goroutines, waits for them all, and fails
// tb with the first error any of them returned.
func Parallel(tb testing.TB, n int, fn func(i int) error) {
	tb.Helper()
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		tb.Fatal(err)
	}
}

// CleanupDir registers a cleanup of dir, a test's base directory, that
// runs whatever happened: it kills every process whose command line
// names dir (plugins outlive their agents by design), unmounts what is
// still mounted under it, deepest first, and removes it; when t failed,
// dir is left for inspection instead, and logged.
func CleanupDir(t testing.TB, dir string) {
	t.Cleanup(func() {
		KillProcessesWith(dir)
		mounts, _ := mountinfo.Under(dir)
		sort.Sort(sort.Reverse(sort.StringSlice(mounts))) // children first
		for _, m := range mounts {
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil {
				t.Errorf("cleanup: unmount %s: %v", m, err)
			}
		}
		if t.Failed() {
			t.Logf("left for inspection: %s", dir)
			return
		}
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
}
