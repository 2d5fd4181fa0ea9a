package mountprobe

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/csiactor/csiactor/internal/mountinfo"
	"github.com/csiactor/csiactor/internal/testbin"
)

// serveEnv makes the test binary a FUSE server instead of running tests:
// "dir\nmountpoint", the loopback file system of dir served at mountpoint
// until the process is killed. A server in its own process can be stopped
// (SIGSTOP: its mount hangs) and killed (its mount dies: ENOTCONN), as a
// FUSE driver's can.
const serveEnv = "CSIACTOR_MOUNTPROBE_TEST_SERVE"

func TestMain(m *testing.M) {
	if spec := os.Getenv(serveEnv); spec != "" {
		if err := serveLoopback(spec); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		return
	}
	os.Exit(m.Run())
}

func serveLoopback(spec string) error {
	dir, mnt, _ := strings.Cut(spec, "\n")
	root, err := fs.NewLoopbackRoot(dir)
	if err != nil {
		return err
	}
	srv, err := fuse.NewServer(fs.NewNodeFS(root, &fs.Options{}), mnt, &fuse.MountOptions{
		DirectMountStrict: true, FsName: dir, Name: "mountprobe-test",
	})
	if err != nil {
		return err
	}
	srv.Serve()
	return nil
}

// fuseServer is a FUSE mount served by a child process.
type fuseServer struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process was waited for
	mnt  string
}

// startFUSE serves dir at mnt from a child process and waits until it is
// mounted. Cleanup kills the process and takes the mount away.
func startFUSE(t *testing.T, dir, mnt string) *fuseServer {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+dir+"\n"+mnt)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &fuseServer{cmd: cmd, done: make(chan struct{}), mnt: mnt}
	go func() {
		_ = cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
		_ = syscall.Unmount(mnt, syscall.MNT_DETACH)
	})
	waitUntil(t, mnt+" mounted", func() bool { return mountinfo.IsMountPoint(mnt) && !testbin.Closed(s.done) })
	return s
}

func (s *fuseServer) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := s.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

// waitUntil waits for cond, for a minute at most.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Minute); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited a minute for %s", what)
		}
	}
}

// TestProber_RealFUSEMount probes a real FUSE mount through its life: it
// answers while its server runs; it does not answer while the server is
// stopped (timeout), holding one stat, which the next probes do not add
// to; it answers ENOTCONN once the server is killed, and the stuck stat
// returns. Unmount then takes it away, also when a file in it is still
// open (a plain unmount fails with EBUSY; the lazy one does not).
func TestProber_RealFUSEMount(t *testing.T) {
	testbin.RequireFUSE(t)
	dir, mnt := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := startFUSE(t, dir, mnt)
	ctx := context.Background()
	// Far-off timeout: a live mount always answers in time. Short
	// timeout: for the hung one.
	patient := New(Config{Timeout: time.Minute})
	hasty := New(Config{Timeout: 100 * time.Millisecond, Budget: 2})

	if r := patient.One(ctx, mnt); r != (Result{}) {
		t.Errorf("probe of the live mount = %+v, want it answered", r)
	}
	open, err := os.Open(filepath.Join(mnt, "f")) // keeps the mount busy
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()

	srv.signal(t, syscall.SIGSTOP)
	waitUntil(t, "the server stopped", func() bool { return testbin.Stopped(srv.cmd.Process.Pid) })
	for i := range 3 {
		if r := hasty.One(ctx, mnt); r.Cause != CauseTimeout {
			t.Errorf("probe %d of the stopped server's mount = %+v, want timeout", i+1, r)
		}
	}
	if n := hasty.Outstanding(); n != 1 {
		t.Errorf("stats outstanding on the hung mount = %d, want 1 (no second stat while the first hangs)", n)
	}
	// The prober still answers for other paths while one stat hangs.
	if got := hasty.Probe(ctx, []string{dir}); got[dir] != (Result{}) {
		t.Errorf("probe of a plain directory beside the hung stat = %+v", got[dir])
	}

	srv.signal(t, syscall.SIGKILL)
	<-srv.done
	waitUntil(t, "the hung stat to return", func() bool { return hasty.Outstanding() == 0 })
	if r := patient.One(ctx, mnt); r.Cause != CauseENOTCONN {
		t.Errorf("probe of the dead mount = %+v, want ENOTCONN", r)
	}
	if !mountinfo.IsMountPoint(mnt) {
		t.Fatalf("the dead mount left the mount table by itself")
	}
	if err := syscall.Unmount(mnt, 0); err != syscall.EBUSY {
		t.Fatalf("plain unmount of the dead mount with a file open = %v, want EBUSY (the test needs the fallback)", err)
	}
	if err := Unmount(mnt); err != nil {
		t.Errorf("Unmount of the dead, busy mount: %v", err)
	}
	if mountinfo.IsMountPoint(mnt) {
		t.Errorf("%s is still a mount point after Unmount", mnt)
	}
	if err := Unmount(mnt); err != nil {
		t.Errorf("Unmount of a path that is no mount point any more: %v", err)
	}
}
