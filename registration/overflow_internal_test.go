package registration

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
)

// recorder is a Registrar that records the drivers registered.
type recorder struct{ calls chan string }

func (r recorder) Register(_ context.Context, d Driver) error {
	r.calls <- "register " + d.Name
	return nil
}

func (r recorder) Deregister(_ context.Context, name string) error {
	r.calls <- "deregister " + name
	return nil
}

func (recorder) Registered(context.Context) ([]string, error) { return nil, nil }

// staticRegistrar serves GetInfo with info on path until the test ends.
type staticRegistrar PluginInfo

func (s staticRegistrar) GetInfo(context.Context) (PluginInfo, error) { return PluginInfo(s), nil }
func (staticRegistrar) NotifyRegistrationStatus(context.Context, RegistrationStatus) error {
	return nil
}

// TestWatcher_Overflow_Rescans loses the events of a socket's removal and
// of another's creation (the directory is unwatched meanwhile, as events
// are lost when the inotify queue overflows), then reports the overflow as
// fsnotify does: the scan that follows registers and deregisters what the
// lost events would have.
func TestWatcher_Overflow_Rescans(t *testing.T) {
	dir, err := os.MkdirTemp("", "csiactor-ovf-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	rec := recorder{calls: make(chan string, 16)}
	next := func() string {
		t.Helper()
		select {
		case c := <-rec.calls:
			return c
		case <-time.After(20 * time.Second):
			t.Fatal("no call to the registrar")
			return ""
		}
	}
	w, err := Start(Config{Dir: dir, Registrar: rec, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Shutdown()

	serve := func(name string) func() {
		l, err := net.Listen("unix", filepath.Join(dir, name+".sock"))
		if err != nil {
			t.Fatal(err)
		}
		srv := newTestServer(staticRegistrar{Type: TypeCSIPlugin, Name: name, SupportedVersions: []string{"1.0.0"}})
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Serve(l) }()
		return func() { srv.Stop(); <-done }
	}
	stopOld := serve("old.drv")
	if c := next(); c != "register old.drv" {
		t.Fatalf("call %q", c)
	}

	if err := w.fsw.Remove(dir); err != nil {
		t.Fatal(err)
	}
	stopOld()
	stopNew := serve("new.drv")
	defer stopNew()
	select {
	case c := <-rec.calls:
		t.Fatalf("call %q while unwatched", c)
	case <-time.After(100 * time.Millisecond):
	}

	w.handleErr(fsnotify.ErrEventOverflow)
	got := map[string]bool{next(): true, next(): true}
	if !got["register new.drv"] || !got["deregister old.drv"] {
		t.Fatalf("calls after the rescan = %v", got)
	}
}

func newTestServer(s Server) *grpc.Server {
	srv := grpc.NewServer()
	RegisterServer(srv, s)
	return srv
}
