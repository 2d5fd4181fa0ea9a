package volume

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

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/examples/csiplugin"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

func TestManager_Register_SamePluginVolumeConflicts(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	ro := spec("ro", fsCap(csi.AccessModeSingleNodeReaderOnly))
	ro.ExternalID = ""
	v, err := e.m.Create(ctx, ro)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Claim(ctx, claimReq("ro", "reader", claim.ModeRead, csi.AccessModeSingleNodeReaderOnly)); err != nil {
		t.Fatal(err)
	}
	alias := spec("alias", fsCap(csi.AccessModeSingleNodeWriter))
	alias.ExternalID = v.ExternalID
	check := func(when string) {
		t.Helper()
		_, err := e.m.Register(ctx, alias)
		if !errors.Is(err, ErrConflict) || errors.Is(err, ErrClaimLimit) || errors.Is(err, ErrInUse) {
			t.Fatalf("%s: register alias: %v, want ErrConflict", when, err)
		}
		want := fmt.Sprintf(`external_id %q of plugin %q is already registered as volume "ro"`, v.ExternalID, testPlugin)
		if err.Error() != want {
			t.Errorf("%s: error %q, want %q", when, err, want)
		}
		if _, err := e.m.Get(ctx, "alias"); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s: refused alias is registered: %v", when, err)
		}
	}
	check("first")
	// The same plugin volume is the same whatever else the spec says.
	alias.Capabilities = ro.Capabilities
	check("same capabilities")
	// The index is rebuilt from the store.
	e.restart()
	check("after a restart")
	if calls := e.plugin.Calls("ValidateVolumeCapabilities"); calls != 0 {
		t.Errorf("a conflicting register called the plugin %d times", calls)
	}
	// Another plugin's volume of the same external ID is another volume
	// (the unknown plugin cannot validate; see the validation tests).
	other := alias
	other.ID, other.Plugin = "elsewhere", "other"
	if _, err := e.m.Register(ctx, other); err != nil {
		t.Errorf("same external ID of another plugin: %s", err)
	}
	// Once ro is gone, the plugin volume can be registered again.
	if _, err := e.m.Release(ctx, "ro", "reader"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("ro")
	if err := e.m.Deregister(ctx, "ro"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Register(ctx, alias); err != nil {
		t.Errorf("register after the other ID was deregistered: %s", err)
	}
	if _, ok := e.plugin.Volumes()[v.ExternalID]; !ok {
		t.Errorf("the plugin's volume is gone")
	}
}

func TestManager_Create_SamePluginVolumeConflicts(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	// The fake plugin names the volume created for "vol2" "vol-vol2".
	first := spec("first")
	first.ExternalID = "vol-vol2"
	if _, err := e.m.Register(ctx, first); err != nil {
		t.Fatal(err)
	}
	s := spec("vol2")
	s.ExternalID = ""
	_, err := e.m.Create(ctx, s)
	if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), `registered as volume "first"`) {
		t.Fatalf("create of a plugin volume registered as another ID: %v, want ErrConflict naming first", err)
	}
	if _, err := e.m.Get(ctx, "vol2"); !errors.Is(err, ErrNotFound) {
		t.Errorf("refused create is registered: %v", err)
	}
	if _, ok := e.plugin.Volumes()["vol-vol2"]; !ok {
		t.Errorf("the plugin volume of the other ID was deleted")
	}
	if n := e.plugin.Calls("DeleteVolume"); n != 0 {
		t.Errorf("DeleteVolume called %d times", n)
	}
	if _, err := e.m.Claim(ctx, claimReq("first", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Errorf("the other ID still works: %s", err)
	}
}

func TestManager_Register_SamePluginVolumeRace(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	const n = 8
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			s := spec(fmt.Sprintf("v%d", i))
			s.ExternalID = "shared"
			_, errs[i] = e.m.Register(ctx, s)
		})
	}
	wg.Wait()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, ErrConflict):
			t.Errorf("register v%d: %v, want success or ErrConflict", i, err)
		}
	}
	vs, err := e.m.List(ctx, Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if won != 1 || len(vs) != 1 {
		t.Errorf("%d registers won and %d volumes are registered; want one", won, len(vs))
	}
}

func TestManager_Register_ValidatesWithPlugin(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{ControllerPublish: true, CreateDelete: true, StageUnstage: true, StrictVolumes: true})
	ctx := ctxT(t)
	e.plugin.AddVolume(fakeplugin.Volume{ID: "ext-there"})

	s := spec("vol1")
	s.Parameters = map[string]string{"tier": "fast"}
	_, err := e.m.Register(ctx, s)
	if !errors.Is(err, ErrNotFound) || csi.Code(err) != codes.NotFound ||
		!strings.Contains(err.Error(), `plugin "fake" says volume "ext-vol1" (external_id) does not exist`) {
		t.Fatalf("register of a volume the plugin does not have: %v, want ErrNotFound", err)
	}
	if strings.Contains(err.Error(), "s3cr3t") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error shows a secret or mount flag: %s", err)
	}
	req, _ := e.plugin.LastRequest("ValidateVolumeCapabilities").(*csipb.ValidateVolumeCapabilitiesRequest)
	if req.GetVolumeId() != "ext-vol1" || req.GetSecrets()["token"] != "s3cr3t" || req.GetVolumeContext()["ctx"] != "1" ||
		req.GetParameters()["tier"] != "fast" || len(req.GetVolumeCapabilities()) != 1 ||
		req.GetVolumeCapabilities()[0].GetMount().GetFsType() != "ext4" {
		t.Errorf("ValidateVolumeCapabilities request = %s", csi.Sanitize(req))
	}
	if _, err := e.m.Get(ctx, "vol1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("refused volume is registered: %v", err)
	}

	s.ExternalID = "ext-there"
	if _, err := e.m.Register(ctx, s); err != nil {
		t.Fatalf("register of a volume the plugin has: %s", err)
	}
	// Registering again does not ask again.
	calls := e.plugin.Calls("ValidateVolumeCapabilities")
	if _, err := e.m.Register(ctx, s); err != nil || e.plugin.Calls("ValidateVolumeCapabilities") != calls {
		t.Errorf("register again: %v, %d calls (was %d)", err, e.plugin.Calls("ValidateVolumeCapabilities"), calls)
	}
}

func TestManager_Register_PluginAnswers(t *testing.T) {
	tests := []struct {
		name  string
		fault fakeplugin.Fault
		want  error // nil: registered
		code  codes.Code
	}{
		{"unimplemented", fakeplugin.Fault{Code: codes.Unimplemented}, nil, codes.OK},
		{"unavailable", fakeplugin.Fault{Code: codes.Unavailable}, nil, codes.OK},
		{"timeout", fakeplugin.Fault{Code: codes.DeadlineExceeded}, nil, codes.OK},
		{"invalid argument", fakeplugin.Fault{Code: codes.InvalidArgument, Message: "bad volume id s3cr3t"}, ErrInvalid, codes.InvalidArgument},
		{"permission denied", fakeplugin.Fault{Code: codes.PermissionDenied, Message: "wrong token"}, ErrPluginCall, codes.PermissionDenied},
		{"internal", fakeplugin.Fault{Code: codes.Internal}, ErrPluginCall, codes.Internal},
	}
	e := newEnv(t, fullPlugin)
	var logs lockedBuffer
	l := logrus.New()
	l.Out = &logs
	e.restartWith(func(c *Config) { c.Logger = logrus.NewEntry(l) })
	ctx := ctxT(t)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e.plugin.SetFault("ValidateVolumeCapabilities", tt.fault)
			defer e.plugin.ClearFaults()
			id := fmt.Sprintf("vol%d", i)
			_, err := e.m.Register(ctx, spec(id))
			if tt.want == nil {
				if err != nil {
					t.Fatalf("register: %s, want it registered", err)
				}
				return
			}
			if !errors.Is(err, tt.want) || csi.Code(err) != tt.code {
				t.Fatalf("register: %v, want %v with code %s", err, tt.want, tt.code)
			}
			if strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error shows a secret: %s", err)
			}
			if _, err := e.m.Get(ctx, id); !errors.Is(err, ErrNotFound) {
				t.Errorf("refused volume is registered: %v", err)
			}
		})
	}
	if got := strings.Count(logs.String(), "without validating"); got != 3 {
		t.Errorf("%d log lines say a volume was registered without validation, want 3:\n%s", got, logs.String())
	}
}

func TestManager_Register_NoControllerNow(t *testing.T) {
	tests := []struct {
		name   string
		plugin fakeplugin.Config
		down   bool
		plugID string
	}{
		{"plugin down", fullPlugin, true, testPlugin},
		{"plugin unknown", fullPlugin, false, "later"},
		{"node-only plugin", fakeplugin.Config{StageUnstage: true}, false, testPlugin},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, tt.plugin)
			var logs lockedBuffer
			l := logrus.New()
			l.Out = &logs
			e.restartWith(func(c *Config) { c.Logger = logrus.NewEntry(l) })
			e.plugins.setDown(tt.down)
			s := spec("vol1", csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeBlockDevice})
			s.MountOptions = nil
			s.Plugin = tt.plugID
			v, err := e.m.Register(ctxT(t), s)
			if err != nil || v.ID != "vol1" {
				t.Fatalf("register with no controller to ask: %+v, %v; want it registered", v, err)
			}
			if !strings.Contains(logs.String(), "without validating") || strings.Contains(logs.String(), "s3cr3t") {
				t.Errorf("logs: %s", logs.String())
			}
		})
	}
}

func TestManager_Register_CallerGivesUp(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.plugin.SetFault("ValidateVolumeCapabilities", fakeplugin.Fault{Hang: true})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Register(ctx, spec("vol1"))
		done <- err
	}()
	waitFor(t, "the validation to hang", func() bool { return e.plugin.Calls("ValidateVolumeCapabilities") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("register: %v, want context.Canceled", err)
	}
	e.plugin.ClearFaults()
	// Nothing was registered or kept: another ID may have the plugin
	// volume, and vol1's request is served.
	s := spec("vol2")
	s.ExternalID = "ext-vol1"
	if _, err := e.m.Register(ctxT(t), s); err != nil {
		t.Fatalf("register the plugin volume as another ID: %s", err)
	}
	if _, err := e.m.Get(ctxT(t), "vol1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("abandoned register was recorded: %v", err)
	}
}

// serveExample serves the example CSI plugin in this process (symlinks
// instead of mounts) and returns its socket; the plugin stops at cleanup.
func serveExample(t *testing.T) (*csiplugin.Plugin, string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "csivol-ex-") // short: a socket path has a length limit
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	p, err := csiplugin.New(csiplugin.Config{
		StateDir: filepath.Join(dir, "state"), NodeID: "node-1",
		MountMode: csiplugin.MountModeSymlink, Logger: quietLogger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "csi.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Serve(l)
	}()
	t.Cleanup(func() { p.Stop(); <-done })
	return p, sock
}

func TestManager_Register_UnsupportedCapability(t *testing.T) {
	_, sock := serveExample(t)
	dir, err := os.MkdirTemp("", "csivol-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	e := newEnvWith(t, dir, nil, sock, withFacts(claim.Facts{NodeID: "node-1", ControllerRequired: true, StageUnstage: true}))
	ctx := ctxT(t)
	cv, err := e.client.CreateVolume(ctx, &csipb.CreateVolumeRequest{
		Name:               "data",
		VolumeCapabilities: []*csipb.VolumeCapability{fsCap(csi.AccessModeSingleNodeWriter).ToCSI()},
	})
	if err != nil {
		t.Fatal(err)
	}
	ext := cv.GetVolume().GetVolumeId()
	fs := fsCap(csi.AccessModeSingleNodeWriter)
	block := csi.VolumeCapability{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeBlockDevice}
	blockRO := csi.VolumeCapability{AccessMode: csi.AccessModeMultiNodeReaderOnly, AttachmentMode: csi.AttachmentModeBlockDevice}
	tests := []struct {
		name string
		caps []csi.VolumeCapability
		want string // "" registers
	}{
		{"block", []csi.VolumeCapability{block},
			`plugin "fake" does not support capability single-node-writer/block-device for volume "` + ext + `": `},
		{"file system and block", []csi.VolumeCapability{fs, block},
			`plugin "fake" does not support capability single-node-writer/block-device for volume "` + ext + `": `},
		{"two blocks", []csi.VolumeCapability{block, blockRO, fs},
			`plugin "fake" does not support capabilities single-node-writer/block-device, multi-node-reader-only/block-device for volume "` + ext + `": `},
		{"file system", []csi.VolumeCapability{fs}, ""},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Spec{ID: fmt.Sprintf("vol%d", i), Plugin: testPlugin, ExternalID: ext, Capabilities: tt.caps,
				Secrets: map[string]string{"token": "s3cr3t"}}
			_, err := e.m.Register(ctx, s)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("register: %s", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalid) || !strings.HasPrefix(err.Error(), tt.want) || !strings.Contains(err.Error(), "block access is not supported") {
				t.Fatalf("register: %v\nwant ErrInvalid starting %q with the plugin's message", err, tt.want)
			}
		})
	}
	// A volume the plugin does not have.
	s := Spec{ID: "ghost", Plugin: testPlugin, ExternalID: "vol-00000000000000000000000000000000", Capabilities: []csi.VolumeCapability{fs}}
	if _, err := e.m.Register(ctx, s); !errors.Is(err, ErrNotFound) {
		t.Errorf("register of a volume the example plugin does not have: %v, want ErrNotFound", err)
	}
}

func TestScrub_HidesSecretsAndMountFlags(t *testing.T) {
	s := Spec{
		Secrets:      map[string]string{"a": "pass", "b": "password1", "empty": ""},
		MountOptions: &csi.MountOptions{MountFlags: []string{"uid=1000", "password1,vers=3"}},
	}
	got := scrub("mount with password1,vers=3 and uid=1000 failed; pass is wrong", s)
	want := "mount with " + csi.Stripped + " and " + csi.Stripped + " failed; " + csi.Stripped + " is wrong"
	if got != want {
		t.Errorf("scrub = %q, want %q", got, want)
	}
}

func TestClaimsHeld_Plurals(t *testing.T) {
	for _, tt := range []struct {
		claims, past int
		want         string
	}{
		{1, 0, "1 claim"},
		{2, 0, "2 claims"},
		{0, 1, "1 past claim not yet freed"},
		{0, 3, "3 past claims not yet freed"},
		{1, 1, "1 claim and 1 past claim not yet freed"},
		{2, 2, "2 claims and 2 past claims not yet freed"},
	} {
		if got := claimsHeld(tt.claims, tt.past); got != tt.want {
			t.Errorf("claimsHeld(%d, %d) = %q, want %q", tt.claims, tt.past, got, tt.want)
		}
	}
}

// eventLog collects the events of a manager.
type eventLog struct {
	mu  sync.Mutex
	evs []Event
}

func (l *eventLog) add(e Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.evs = append(l.evs, e)
}

// types returns the types of the events of volume id, in order.
func (l *eventLog) types(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, e := range l.evs {
		if e.Volume == id {
			out = append(out, e.Type)
		}
	}
	return out
}

func TestManager_Delete_EmitsVolumeDeleted(t *testing.T) {
	var events eventLog
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.OnEvent = events.add }))
	ctx := ctxT(t)
	s := spec("made")
	s.ExternalID = ""
	if _, err := e.m.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Delete(ctx, "made"); err != nil {
		t.Fatal(err)
	}
	e.register("kept")
	if err := e.m.Deregister(ctx, "kept"); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(events.types("made"), ","), EventVolumeCreated+","+EventVolumeDeleted; got != want {
		t.Errorf("events of a created and deleted volume: %s, want %s", got, want)
	}
	if got, want := strings.Join(events.types("kept"), ","), EventVolumeRegistered+","+EventVolumeDeregistered; got != want {
		t.Errorf("events of a registered and deregistered volume: %s, want %s", got, want)
	}
}

func TestManager_Errors_ReadWell(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("vol1")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	other := spec("vol1")
	other.Context = map[string]string{"ctx": "2"}
	_, regErr := e.m.Register(ctx, other)
	_, limitErr := e.m.Claim(ctx, claimReq("vol1", "web2", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	inUseErr := e.m.Deregister(ctx, "vol1")
	e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Unavailable})
	if _, err := e.m.Release(ctx, "vol1", "web1"); err != nil {
		t.Fatal(err)
	}
	pastErr := e.m.Delete(ctx, "vol1")
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	for _, tt := range []struct {
		err  error
		is   error
		want string
	}{
		{regErr, ErrInUse, `volume "vol1" is claimed by alloc "web1": context cannot change while it has claims (only secrets can); release them first`},
		{limitErr, ErrClaimLimit, `access mode single-node-writer allows one claim and alloc "web1" holds it`},
		{inUseErr, ErrInUse, `volume "vol1" is in use: it has 1 claim; release them first`},
		{pastErr, ErrInUse, `volume "vol1" is in use: it has 1 past claim not yet freed; wait for them to be freed, or deregister with force to forget them`},
	} {
		if tt.err == nil || tt.err.Error() != tt.want || !errors.Is(tt.err, tt.is) || !errors.Is(tt.err, ErrConflict) {
			t.Errorf("error %v, want %q matching %v and ErrConflict", tt.err, tt.want, tt.is)
		}
	}
	if err := e.m.Deregister(ctx, "nope"); err == nil || err.Error() != `volume "nope" not found` {
		t.Errorf("deregister unknown: %v", err)
	}
}

// stuckClaim claims vol1 with a ctx that ends while a publish step keeps
// failing, and returns the claim's status then.
func stuckClaim(t *testing.T, e *env, method string, f fakeplugin.Fault) Claim {
	t.Helper()
	e.plugin.SetFault(method, f)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
		done <- err
	}()
	// Past the old default of ten attempts: the claim never gives up.
	waitFor(t, method+" to fail a dozen times", func() bool { return e.plugin.Calls(method) >= 12 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("claim with %s failing: %v, want context.Canceled (still retrying)", method, err)
	}
	v, err := e.m.Get(ctxT(t), "vol1")
	if err != nil || len(v.Claims) != 1 {
		t.Fatalf("volume = %+v, %v", v, err)
	}
	return v.Claims[0]
}

func TestManager_Claim_RetriesUntilDoneByDefault(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) {
		c.MaxClaimAttempts = DefaultConfig().MaxClaimAttempts
		c.Backoff = csi.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, Multiplier: 2}
	}))
	e.register("vol1")
	c := stuckClaim(t, e, "NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "backend down"})
	// The twelfth failure may not be recorded yet.
	if c.State != claim.StateControllerPublished || c.Attempts < 11 || !strings.Contains(c.LastError, "backend down") {
		t.Errorf("claim while its stage keeps failing = %+v", c)
	}
	// Once the plugin recovers, the claim is published; calling Claim
	// again returns it.
	e.plugin.ClearFaults()
	got, err := e.m.Claim(ctxT(t), claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err != nil || got.State != claim.StatePublished || got.Attempts != 0 || got.LastError != "" {
		t.Fatalf("claim after recovery = %+v, %v", got, err)
	}
	e.checkAgree()
}

func TestManager_Release_StuckClaimTearsDown(t *testing.T) {
	tests := []struct {
		name   string
		method string
		fault  fakeplugin.Fault
		state  string
	}{
		// The controller publishes, but its answer is lost every time.
		{"uncertain controller publish", "ControllerPublishVolume",
			fakeplugin.Fault{Code: codes.DeadlineExceeded, AfterApply: true}, claim.StateReserved},
		{"stage unavailable", "NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable}, claim.StateControllerPublished},
		{"publish aborted", "NodePublishVolume", fakeplugin.Fault{Code: codes.Aborted}, claim.StateStaged},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t, fullPlugin, withConfig(func(c *Config) {
				c.MaxClaimAttempts = 0
				c.Backoff = csi.Backoff{Initial: time.Millisecond, Max: 2 * time.Millisecond, Multiplier: 2}
			}))
			e.register("vol1")
			if c := stuckClaim(t, e, tt.method, tt.fault); c.State != tt.state {
				t.Fatalf("stuck claim in state %s, want %s", c.State, tt.state)
			}
			past, err := e.m.Release(ctxT(t), "vol1", "a")
			if err != nil || past.Alloc != "a" {
				t.Fatalf("release of a stuck claim = %+v, %v", past, err)
			}
			v := e.waitFreed("vol1")
			if len(v.Claims) != 0 || len(v.Stagings) != 0 || v.ControllerPublished {
				t.Errorf("after release: %+v", v)
			}
			e.checkClean()
			calls := e.plugin.Calls(tt.method)
			// The publish step is not tried again once released.
			if _, err := e.m.Get(ctxT(t), "vol1"); err != nil {
				t.Fatal(err)
			}
			e.restart()
			if n := e.plugin.Calls(tt.method); n != calls {
				t.Errorf("%s called %d more times after the release", tt.method, n-calls)
			}
			if err := e.m.Deregister(ctxT(t), "vol1"); err != nil {
				t.Errorf("deregister after the release: %s", err)
			}
		})
	}
}

func TestConfig_MaxClaimAttempts(t *testing.T) {
	if got := DefaultConfig().MaxClaimAttempts; got != 0 {
		t.Errorf("default MaxClaimAttempts = %d, want 0 (retry until done)", got)
	}
	cfg := DefaultConfig()
	cfg.DataDir = "/var/lib/csiactor"
	cfg.MaxClaimAttempts = -1
	if err := cfg.Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "max_claim_attempts") {
		t.Errorf("Validate with a negative max_claim_attempts: %v", err)
	}
	if got := cfg.withDefaults().MaxClaimAttempts; got != -1 {
		t.Errorf("withDefaults changed MaxClaimAttempts to %d", got)
	}
	cfg.MaxClaimAttempts = 0
	if got := cfg.withDefaults().MaxClaimAttempts; got != 0 {
		t.Errorf("withDefaults made 0 into %d", got)
	}
}

// recordEvents reports the same events whether a record holds a few claims
// (found by scanning) or many (found through a map).
func TestRecordEvents_FewAndManyClaims(t *testing.T) {
	for _, n := range []int{3, 40} {
		var events eventLog
		m := &Manager{cfg: Config{OnEvent: events.add}}
		old := &persistence.Volume{ID: "v", Plugin: "p"}
		cur := &persistence.Volume{ID: "v", Plugin: "p"}
		for i := range n {
			alloc := fmt.Sprintf("a%02d", i)
			switch i % 4 {
			case 0: // published now
				old.Claims = append(old.Claims, persistence.Claim{Alloc: alloc, State: claim.StateStaged})
				cur.Claims = append(cur.Claims, persistence.Claim{Alloc: alloc, State: claim.StatePublished})
			case 1: // released
				old.Claims = append(old.Claims, persistence.Claim{Alloc: alloc, State: claim.StatePublished})
				cur.PastClaims = append(cur.PastClaims, persistence.Claim{Alloc: alloc, State: claim.StateTaken})
			case 2: // failed before it was published
				old.Claims = append(old.Claims, persistence.Claim{Alloc: alloc, State: claim.StateReserved})
				cur.PastClaims = append(cur.PastClaims, persistence.Claim{Alloc: alloc, State: claim.StateTaken, LastError: "boom"})
			case 3: // freed
				old.PastClaims = append(old.PastClaims, persistence.Claim{Alloc: alloc, State: claim.StateNodeDetached})
			}
		}
		// An unchanged published claim and past claim report nothing.
		same := []persistence.Claim{{Alloc: "same", State: claim.StatePublished}}
		old.Claims, cur.Claims = append(old.Claims, same...), append(cur.Claims, same...)
		past := []persistence.Claim{{Alloc: "past", State: claim.StateTaken}}
		old.PastClaims, cur.PastClaims = append(old.PastClaims, past...), append(cur.PastClaims, past...)
		m.recordEvents(old, cur)

		var got []string
		for _, e := range events.evs {
			got = append(got, e.Alloc+":"+e.Type)
		}
		slices.Sort(got)
		var want []string
		for i := range n {
			typ := []string{EventClaimPublished, EventClaimReleased, EventClaimFailed, EventClaimFreed}[i%4]
			want = append(want, fmt.Sprintf("a%02d:%s", i, typ))
		}
		if !slices.Equal(got, want) {
			t.Errorf("%d claims: events %v, want %v", n, got, want)
		}
	}
}

// A claim reports each step short of published, and each failed attempt
// that is retried with its error, before claim-published.
func TestManager_Claim_StepEvents(t *testing.T) {
	var events eventLog
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.OnEvent = events.add }))
	ctx := ctxT(t)
	e.register("vol1")
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Message: "storage busy", Times: 1})
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "claim-published", func() bool { return slices.Contains(events.types("vol1"), EventClaimPublished) })
	events.mu.Lock()
	var got []string
	for _, ev := range events.evs {
		if ev.Volume == "vol1" && ev.Alloc == "web1" {
			got = append(got, ev.Type+": "+ev.Message)
		}
	}
	events.mu.Unlock()
	want := []string{
		EventClaimStep + ": write claim reserved (single-node-writer/file-system)",
		EventClaimStep + ": controller-published",
		EventClaimRetrying + ": attempt 1 failed, retrying: NodeStageVolume: ",
		EventClaimStep + ": staged",
		EventClaimPublished + ": write claim published at ",
	}
	if len(got) != len(want) {
		t.Fatalf("events of the claim:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("event %d = %q, want it to start with %q", i, got[i], want[i])
		}
	}
	if !strings.Contains(got[2], "storage busy") {
		t.Errorf("the retrying event lacks the plugin's error: %q", got[2])
	}
	// Claiming again changes nothing: no event.
	n := len(events.types("vol1"))
	if _, err := e.m.Claim(ctx, claimReq("vol1", "web1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if m := len(events.types("vol1")); m != n {
		t.Errorf("claiming again made %d events", m-n)
	}
}
