package registration_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csiactor/csiactor/internal/leakcheck"
	"github.com/csiactor/csiactor/registration"
	"github.com/csiactor/csiactor/registration/registrartest"
)

func TestMain(m *testing.M) { leakcheck.VerifyTestMain(m) }

// waitLimit bounds every wait for something the watcher does in the
// background; a safety net against a hung test, not a speed assertion.
const waitLimit = 20 * time.Second

// call is one call to the fake registrar.
type call struct {
	op     string // register, deregister
	driver registration.Driver
	name   string
}

// fakeRegistrar records the watcher's calls. registerErrs are returned by
// the first Register calls, in order.
type fakeRegistrar struct {
	calls chan call

	mu           sync.Mutex
	registered   map[string]registration.Driver // guarded by mu
	registerErrs []error                        // guarded by mu
}

func newFakeRegistrar(registered ...string) *fakeRegistrar {
	f := &fakeRegistrar{calls: make(chan call, 64), registered: map[string]registration.Driver{}}
	for _, n := range registered {
		f.registered[n] = registration.Driver{Name: n}
	}
	return f
}

func (f *fakeRegistrar) Register(_ context.Context, d registration.Driver) error {
	f.mu.Lock()
	var err error
	if len(f.registerErrs) > 0 {
		err, f.registerErrs = f.registerErrs[0], f.registerErrs[1:]
	}
	if err == nil {
		f.registered[d.Name] = d
	}
	f.mu.Unlock()
	f.calls <- call{op: "register", driver: d, name: d.Name}
	return err
}

func (f *fakeRegistrar) Deregister(_ context.Context, name string) error {
	f.mu.Lock()
	delete(f.registered, name)
	f.mu.Unlock()
	f.calls <- call{op: "deregister", name: name}
	return nil
}

func (f *fakeRegistrar) Registered(context.Context) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for n := range f.registered {
		names = append(names, n)
	}
	slices.Sort(names)
	return names, nil
}

// next returns the next call, failing the test after waitLimit.
func (f *fakeRegistrar) next(t *testing.T) call {
	t.Helper()
	select {
	case c := <-f.calls:
		return c
	case <-time.After(waitLimit):
		t.Fatal("no call to the registrar")
		return call{}
	}
}

// none fails the test if a call comes within wait.
func (f *fakeRegistrar) none(t *testing.T, wait time.Duration) {
	t.Helper()
	select {
	case c := <-f.calls:
		t.Fatalf("unexpected call %+v", c)
	case <-time.After(wait):
	}
}

// regDir returns a new registration directory, short enough for sockets.
func regDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "csiactor-reg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func start(t *testing.T, dir string, r registration.Registrar, onRefused func(name, socket, reason string)) *registration.Watcher {
	t.Helper()
	w, err := registration.Start(registration.Config{
		Dir: dir, Registrar: r, OnRefused: onRefused,
		CallTimeout: 2 * time.Second, RetryInitial: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Shutdown)
	return w
}

func csiInfo(name, endpoint string) registration.PluginInfo {
	return registration.PluginInfo{Type: registration.TypeCSIPlugin, Name: name, Endpoint: endpoint, SupportedVersions: []string{"1.0.0"}}
}

func TestWatcher_NewSocket_RegistersAndNotifies(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	start(t, dir, f, nil)

	reg := registrartest.Serve(t, filepath.Join(dir, "drv.example-reg.sock"), csiInfo("drv.example", "unix:///run/drv/csi.sock"))
	c := f.next(t)
	want := registration.Driver{Name: "drv.example", Endpoint: "/run/drv/csi.sock", Versions: []string{"1.0.0"}, Socket: reg.Path}
	if c.op != "register" || !equalDriver(c.driver, want) {
		t.Fatalf("call = %+v, want register %+v", c, want)
	}
	if st := reg.Status(t, waitLimit); !st.PluginRegistered || st.Error != "" {
		t.Fatalf("status = %+v, want registered", st)
	}

	// The registrar exits: its socket goes, and so does the driver.
	reg.Stop()
	if c := f.next(t); c.op != "deregister" || c.name != "drv.example" {
		t.Fatalf("call = %+v, want deregister drv.example", c)
	}
}

func equalDriver(a, b registration.Driver) bool {
	return a.Name == b.Name && a.Endpoint == b.Endpoint && a.Socket == b.Socket && slices.Equal(a.Versions, b.Versions)
}

func TestWatcher_PreexistingSocket_EmptyEndpointIsTheSocket(t *testing.T) {
	dir := regDir(t)
	sub := filepath.Join(dir, "drv")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	reg := registrartest.Serve(t, filepath.Join(sub, "reg.sock"), csiInfo("drv.example", ""))
	// A file and a dot-name are not registration sockets.
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	hidden := registrartest.Serve(t, filepath.Join(dir, ".hidden.sock"), csiInfo("hidden", ""))

	f := newFakeRegistrar()
	start(t, dir, f, nil)
	c := f.next(t)
	if c.op != "register" || c.driver.Name != "drv.example" || c.driver.Endpoint != reg.Path {
		t.Fatalf("call = %+v, want register drv.example at the registration socket %s", c, reg.Path)
	}
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("status = %+v", st)
	}
	f.none(t, 200*time.Millisecond)
	if n := hidden.GetInfos(); n != 0 {
		t.Errorf("GetInfo on a dot-name socket: %d calls", n)
	}
}

func TestWatcher_NewSubdirectory(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	start(t, dir, f, nil)
	sub := filepath.Join(dir, "nested", "deeper")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// The watch on the new directories may come after the socket: both
	// ways it is found.
	reg := registrartest.Serve(t, filepath.Join(sub, "reg.sock"), csiInfo("nested.drv", "/run/n/csi.sock"))
	if c := f.next(t); c.op != "register" || c.driver.Name != "nested.drv" {
		t.Fatalf("call = %+v", c)
	}
	reg.Status(t, waitLimit)
	// Removing the whole subdirectory deregisters.
	reg.Stop()
	if err := os.RemoveAll(filepath.Join(dir, "nested")); err != nil {
		t.Fatal(err)
	}
	if c := f.next(t); c.op != "deregister" || c.name != "nested.drv" {
		t.Fatalf("call = %+v", c)
	}
}

func TestWatcher_Refused(t *testing.T) {
	for _, tc := range []struct {
		name string
		info registration.PluginInfo
		want string // in the reason
	}{
		{"device plugin", registration.PluginInfo{Type: registration.TypeDevicePlugin, Name: "gpu", SupportedVersions: []string{"v1beta1"}},
			`plugin type "DevicePlugin" is not supported: csiactor registers CSI drivers (type CSIPlugin) only`},
		{"no name", registration.PluginInfo{Type: registration.TypeCSIPlugin, SupportedVersions: []string{"1.0.0"}},
			"the driver announced no name"},
		{"old CSI", registration.PluginInfo{Type: registration.TypeCSIPlugin, Name: "old.drv", SupportedVersions: []string{"0.3.0", "0.2.0"}},
			`CSI driver "old.drv" supports versions [0.3.0, 0.2.0], none of them 1.x; csiactor speaks CSI 1.x`},
		{"no versions", registration.PluginInfo{Type: registration.TypeCSIPlugin, Name: "nov.drv"},
			`CSI driver "nov.drv" announced no supported versions`},
		{"relative endpoint", registration.PluginInfo{Type: registration.TypeCSIPlugin, Name: "rel.drv", Endpoint: "run/csi.sock", SupportedVersions: []string{"1.2.0"}},
			`CSI driver "rel.drv": endpoint "run/csi.sock" is not a clean absolute path`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := regDir(t)
			f := newFakeRegistrar()
			type refusal struct{ name, socket, reason string }
			refused := make(chan refusal, 1)
			start(t, dir, f, func(name, socket, reason string) { refused <- refusal{name, socket, reason} })
			reg := registrartest.Serve(t, filepath.Join(dir, "reg.sock"), tc.info)
			st := reg.Status(t, waitLimit)
			if st.PluginRegistered || !strings.Contains(st.Error, tc.want) {
				t.Fatalf("status = %+v, want refused with %q", st, tc.want)
			}
			if r := <-refused; r.reason != st.Error || r.socket != reg.Path || r.name != tc.info.Name {
				t.Errorf("OnRefused(%q, %q, %q), want the driver, socket and reason told to the registrar", r.name, r.socket, r.reason)
			}
			// Never handed to the registry, and not asked again.
			f.none(t, 200*time.Millisecond)
			if n := reg.GetInfos(); n != 1 {
				t.Errorf("GetInfo called %d times, want once", n)
			}
		})
	}
}

func TestWatcher_RegistrarRefuses_ReasonToldAndNotRetried(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	f.registerErrs = []error{fmt.Errorf("%w: socket %q is already used by allocation %q", registration.ErrRefused, "/run/x.sock", "manual")}
	start(t, dir, f, nil)
	reg := registrartest.Serve(t, filepath.Join(dir, "reg.sock"), csiInfo("x.drv", "/run/x.sock"))
	if c := f.next(t); c.op != "register" {
		t.Fatalf("call = %+v", c)
	}
	st := reg.Status(t, waitLimit)
	if st.PluginRegistered || st.Error != `socket "/run/x.sock" is already used by allocation "manual"` {
		t.Fatalf("status = %+v", st)
	}
	f.none(t, 200*time.Millisecond)
}

func TestWatcher_RegisterFails_Retried(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	f.registerErrs = []error{errors.New("registry busy"), errors.New("registry busy")}
	start(t, dir, f, nil)
	reg := registrartest.Serve(t, filepath.Join(dir, "reg.sock"), csiInfo("y.drv", "/run/y.sock"))
	for range 3 {
		if c := f.next(t); c.op != "register" || c.name != "y.drv" {
			t.Fatalf("call = %+v", c)
		}
	}
	// Told once, after the registration that worked.
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("status = %+v", st)
	}
	reg.NoStatus(t, 100*time.Millisecond)
}

// deadSocket leaves a unix socket file at path that nothing listens on.
func deadSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestWatcher_Start_PrunesDriversNoSocketAnnounces(t *testing.T) {
	dir := regDir(t)
	registrartest.Serve(t, filepath.Join(dir, "live.sock"), csiInfo("live.drv", "/run/live.sock"))
	// A socket left behind by a registrar that died does not hold the
	// prune up.
	deadSocket(t, filepath.Join(dir, "dead.sock"))
	// An earlier run registered live.drv and gone.drv.
	f := newFakeRegistrar("gone.drv", "live.drv")
	start(t, dir, f, nil)
	got := map[string]string{}
	for range 2 {
		c := f.next(t)
		got[c.op] = c.name
	}
	if got["register"] != "live.drv" || got["deregister"] != "gone.drv" {
		t.Fatalf("calls = %v, want live.drv registered again and gone.drv deregistered", got)
	}
	f.none(t, 200*time.Millisecond)
}

func TestWatcher_DeadSocketComesAlive(t *testing.T) {
	dir := regDir(t)
	path := filepath.Join(dir, "late.sock")
	deadSocket(t, path)
	f := newFakeRegistrar()
	start(t, dir, f, nil)
	f.none(t, 100*time.Millisecond)
	// The registrar starts on the same path (replacing the file, as
	// node-driver-registrar does).
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	reg := registrartest.Serve(t, path, csiInfo("late.drv", "/run/late.sock"))
	if c := f.next(t); c.op != "register" || c.name != "late.drv" {
		t.Fatalf("call = %+v", c)
	}
	reg.Status(t, waitLimit)
}

func TestWatcher_SameDriverTwoSockets(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	start(t, dir, f, nil)
	a := registrartest.Serve(t, filepath.Join(dir, "a.sock"), csiInfo("twice.drv", "/run/a.sock"))
	f.next(t)
	a.Status(t, waitLimit)
	b := registrartest.Serve(t, filepath.Join(dir, "b.sock"), csiInfo("twice.drv", "/run/b.sock"))
	if c := f.next(t); c.driver.Endpoint != "/run/b.sock" {
		t.Fatalf("call = %+v", c)
	}
	b.Status(t, waitLimit)
	// The newer one goes: the older one registers the driver again.
	b.Stop()
	if c := f.next(t); c.op != "register" || c.driver.Endpoint != "/run/a.sock" {
		t.Fatalf("call = %+v, want the driver registered again from a.sock", c)
	}
	a.Stop()
	if c := f.next(t); c.op != "deregister" || c.name != "twice.drv" {
		t.Fatalf("call = %+v", c)
	}
}

func TestStart_BadDir(t *testing.T) {
	dir := regDir(t)
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ dir, want string }{
		{filepath.Join(dir, "missing"), "no such file or directory"},
		{file, "not a directory"},
	} {
		_, err := registration.Start(registration.Config{Dir: tc.dir, Registrar: newFakeRegistrar()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Start(%s) = %v, want an error with %q", tc.dir, err, tc.want)
		}
	}
}

func TestWatcher_Shutdown_Idempotent(t *testing.T) {
	w := start(t, regDir(t), newFakeRegistrar(), nil)
	w.Shutdown()
	w.Shutdown()
}

// TestWatcher_SocketReplaced: a registrar restarted on the same path (the
// file system may give the new socket the old one's inode number) is
// asked again and told again.
func TestWatcher_SocketReplaced(t *testing.T) {
	dir := regDir(t)
	f := newFakeRegistrar()
	start(t, dir, f, nil)
	path := filepath.Join(dir, "reg.sock")
	for i := range 3 {
		reg := registrartest.Serve(t, path, csiInfo("again.drv", "/run/again.sock"))
		if st := reg.Status(t, waitLimit); !st.PluginRegistered {
			t.Fatalf("round %d: status = %+v", i, st)
		}
		reg.Stop()
	}
	// Every round registered it, and its removals deregistered it: six
	// calls, and no more.
	var ops []string
	for len(ops) < 6 {
		select {
		case c := <-f.calls:
			ops = append(ops, c.op)
		case <-time.After(waitLimit):
			t.Fatalf("calls after %s: %v, want 6", waitLimit, ops)
		}
	}
	f.none(t, 300*time.Millisecond)
	count := map[string]int{}
	for _, op := range ops {
		count[op]++
	}
	if count["register"] != 3 || count["deregister"] != 3 || ops[len(ops)-1] != "deregister" {
		t.Errorf("calls = %v, want each socket registered, then deregistered when replaced or removed", ops)
	}
}

// TestWatcher_Start_PruneKeepsDriverBeingRetried: a driver of an earlier
// run whose registration fails for now at start is retried, never pruned
// (pruning would stop its allocation while its claims are published).
func TestWatcher_Start_PruneKeepsDriverBeingRetried(t *testing.T) {
	dir := regDir(t)
	reg := registrartest.Serve(t, filepath.Join(dir, "slow.sock"), csiInfo("slow.drv", "/run/slow.sock"))
	f := newFakeRegistrar("slow.drv")
	f.registerErrs = []error{errors.New("registry busy"), errors.New("registry busy")}
	start(t, dir, f, nil)
	for range 3 {
		if c := f.next(t); c.op != "register" || c.name != "slow.drv" {
			t.Fatalf("call = %+v, want slow.drv registered again", c)
		}
	}
	if st := reg.Status(t, waitLimit); !st.PluginRegistered {
		t.Fatalf("status = %+v", st)
	}
	f.none(t, 200*time.Millisecond)
}
