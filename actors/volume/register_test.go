package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc/codes"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
)

func TestManager_Register_Invalid(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	good := spec("vol1")
	tests := []struct {
		name   string
		mutate func(*Spec)
		field  string
	}{
		{"empty id", func(s *Spec) { s.ID = "" }, "id"},
		{"id with slash", func(s *Spec) { s.ID = "a/b" }, "id"},
		{"id dot-dot", func(s *Spec) { s.ID = ".." }, "id"},
		{"id too long", func(s *Spec) { s.ID = strings.Repeat("x", 200) }, "id"},
		{"empty plugin", func(s *Spec) { s.Plugin = "" }, "plugin"},
		{"no external id", func(s *Spec) { s.ExternalID = "" }, "external_id"},
		{"no capabilities", func(s *Spec) { s.Capabilities = nil }, "capabilities"},
		{"unknown access mode", func(s *Spec) { s.Capabilities[0].AccessMode = 0 }, "capabilities[0]"},
		{"mount options on block only", func(s *Spec) {
			s.Capabilities = []csi.VolumeCapability{{AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeBlockDevice}}
		}, "mount_options"},
		{"negative capacity", func(s *Spec) { s.CapacityBytes = -1 }, "capacity_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			s.Capabilities = append([]csi.VolumeCapability(nil), good.Capabilities...)
			tt.mutate(&s)
			_, err := e.m.Register(ctx, s)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tt.field) {
				t.Errorf("register: %v, want ErrInvalid naming %q", err, tt.field)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t") {
				t.Errorf("error shows a secret or mount flag: %s", err)
			}
		})
	}
	if vs, err := e.m.List(ctx, Filter{}); err != nil || len(vs) != 0 {
		t.Errorf("bad input changed something: %v, %v", vs, err)
	}
	if _, err := e.m.Claim(ctx, ClaimRequest{VolumeID: "vol1", Alloc: "", Mode: claim.ModeWrite,
		AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "alloc") {
		t.Errorf("claim without alloc: %v, want ErrInvalid naming alloc", err)
	}
	if _, err := e.m.Claim(ctx, ClaimRequest{VolumeID: "vol1", Alloc: "a", Mode: "rw",
		AccessMode: csi.AccessModeSingleNodeWriter, AttachmentMode: csi.AttachmentModeFileSystem}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "mode") {
		t.Errorf("claim with mode rw: %v, want ErrInvalid naming mode", err)
	}
}

func TestManager_Register_IdempotentAndConflict(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	v1, err := e.m.Register(ctx, spec("vol1"))
	if err != nil {
		t.Fatal(err)
	}
	v2, err := e.m.Register(ctx, spec("vol1"))
	if err != nil || v2.Revision != v1.Revision {
		t.Errorf("same spec again = %+v, %v; want the same volume", v2, err)
	}
	other := spec("vol1")
	other.ExternalID = "elsewhere"
	if _, err := e.m.Register(ctx, other); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "external_id") {
		t.Errorf("another external ID under the same id: %v, want ErrInvalid naming external_id", err)
	}
	other = spec("vol1")
	other.Plugin = "another"
	if _, err := e.m.Register(ctx, other); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "plugin: ") {
		t.Errorf("another plugin under the same id: %v, want ErrInvalid naming plugin", err)
	}
	if v, err := e.m.Get(ctx, "vol1"); err != nil || v.Revision != v1.Revision {
		t.Errorf("refused updates changed the volume: %+v, %v", v, err)
	}
	if _, err := e.m.Claim(ctx, claimReq("nope", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrNotFound) {
		t.Errorf("claim on an unknown volume: %v, want ErrNotFound", err)
	}
	if err := e.m.Deregister(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("deregister unknown: %v, want ErrNotFound", err)
	}
}

func TestManager_Deregister_InUse(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Deregister(ctx, "vol1"); !errors.Is(err, ErrInUse) || !errors.Is(err, ErrConflict) {
		t.Errorf("deregister while claimed: %v, want ErrInUse", err)
	}
	e.plugin.SetFault("NodeUnpublishVolume", fakeplugin.Fault{Code: codes.Unavailable})
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.m.Delete(ctx, "vol1"); !errors.Is(err, ErrInUse) {
		t.Errorf("delete while a past claim is unfinished: %v, want ErrInUse", err)
	}
	e.plugin.ClearFaults()
	e.waitFreed("vol1")
	if err := e.m.Deregister(ctx, "vol1"); err != nil {
		t.Errorf("deregister once freed: %s", err)
	}
	if _, ok := e.plugin.Volumes()["ext-vol1"]; ok {
		t.Errorf("deregister must not delete the plugin's volume")
	}
}

func TestManager_Create_Delete(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	s := spec("vol1")
	s.ExternalID = ""
	s.CapacityBytes = 1 << 20
	s.Parameters = map[string]string{"tier": "fast"}
	v, err := e.m.Create(ctx, s)
	if err != nil {
		t.Fatalf("create: %s", err)
	}
	pv, ok := e.plugin.Volumes()[v.ExternalID]
	if v.ExternalID == "" || !ok || pv.Name != "vol1" || !v.Created || v.CapacityBytes < 1<<20 {
		t.Fatalf("created volume %+v; plugin has %+v", v, e.plugin.Volumes())
	}
	if again, err := e.m.Create(ctx, s); err != nil || again.ExternalID != v.ExternalID {
		t.Errorf("create again = %+v, %v; want the same volume", again, err)
	}
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatalf("claim a created volume: %s", err)
	}
	if err := e.m.Delete(ctx, "vol1"); !errors.Is(err, ErrInUse) {
		t.Errorf("delete while claimed: %v, want ErrInUse", err)
	}
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1")
	if err := e.m.Delete(ctx, "vol1"); err != nil {
		t.Fatalf("delete: %s", err)
	}
	if len(e.plugin.Volumes()) != 0 {
		t.Errorf("plugin still has %v", e.plugin.Volumes())
	}
	if _, err := e.m.Get(ctx, "vol1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("get after delete: %v", err)
	}
}

func TestManager_Create_PluginErrors(t *testing.T) {
	e := newEnv(t, fakeplugin.Config{}) // no controller
	s := spec("vol1")
	s.ExternalID = ""
	if _, err := e.m.Create(ctxT(t), s); !errors.Is(err, ErrPluginCall) || csi.Code(err) != codes.Unimplemented {
		t.Errorf("create without a controller: %v, want ErrPluginCall (Unimplemented)", err)
	}
	e.plugins.setDown(true)
	if _, err := e.m.Create(ctxT(t), s); !errors.Is(err, ErrPluginUnavailable) {
		t.Errorf("create on a down plugin: %v, want ErrPluginUnavailable at once", err)
	}
	if err := e.m.Delete(ctxT(t), "vol0"); !errors.Is(err, ErrNotFound) {
		t.Errorf("delete unknown: %v, want ErrNotFound", err)
	}
	if _, err := e.m.Claim(ctxT(t), claimReq("vol0", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrNotFound) {
		t.Errorf("claim unknown: %v", err)
	}
	e.register("vol2")
	if _, err := e.m.Claim(ctxT(t), claimReq("vol2", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); !errors.Is(err, ErrPluginUnavailable) {
		t.Errorf("claim on a down plugin: %v, want ErrPluginUnavailable", err)
	}
	if v, _ := e.m.Get(ctxT(t), "vol2"); len(v.Claims) != 0 {
		t.Errorf("a claim that could not start was recorded: %+v", v.Claims)
	}
}

func TestManager_List_Filter(t *testing.T) {
	e := newEnv(t, fullPlugin)
	e.register("vol1")
	e.register("vol2")
	ctx := ctxT(t)
	if _, err := e.m.Claim(ctx, claimReq("vol2", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	ids := func(f Filter) []string {
		vs, err := e.m.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, v := range vs {
			out = append(out, v.ID)
		}
		return out
	}
	for _, tt := range []struct {
		f    Filter
		want string
	}{
		{Filter{}, "vol1,vol2"},
		{Filter{Plugin: testPlugin}, "vol1,vol2"},
		{Filter{Plugin: "other"}, ""},
		{Filter{NodeID: fakeplugin.DefaultNodeID}, "vol2"},
	} {
		if got := strings.Join(ids(tt.f), ","); got != tt.want {
			t.Errorf("List(%+v) = %q, want %q", tt.f, got, tt.want)
		}
	}
}

func TestManager_Passivation(t *testing.T) {
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.IdleTimeout = 5 * time.Millisecond }))
	ctx := ctxT(t)
	e.register("vol1")
	waitFor(t, "the idle volume actor to stop", func() bool { return e.m.Live() == 0 })
	req := claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)
	c, err := e.m.Claim(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claimed volume's actor to stop", func() bool { return e.m.Live() == 0 })
	v, err := e.m.Get(ctx, "vol1")
	if err != nil || len(v.Claims) != 1 || v.Claims[0].State != claim.StatePublished {
		t.Fatalf("status of a passivated volume = %+v, %v", v, err)
	}
	again, err := e.m.Claim(ctx, req)
	if err != nil || again.TargetPath != c.TargetPath {
		t.Fatalf("claim on a passivated volume = %+v, %v", again, err)
	}
	if n := e.plugin.Calls("NodePublishVolume"); n != 1 {
		t.Errorf("NodePublishVolume called %d times", n)
	}
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(claimsExposition(map[string]float64{"published/write": 1})),
		"csiactor_volume_claims"); err != nil {
		t.Errorf("metrics of a passivated volume: %s", err)
	}
	if _, err := e.m.Release(ctx, "vol1", "a"); err != nil {
		t.Fatal(err)
	}
	e.waitFreed("vol1")
	waitFor(t, "the released volume's actor to stop", func() bool { return e.m.Live() == 0 })
	e.checkClean()
}

// claimsExposition is the csiactor_volume_claims exposition with the given
// "state/mode" values and zero elsewhere.
func claimsExposition(vals map[string]float64) string {
	var b strings.Builder
	b.WriteString("# HELP csiactor_volume_claims Claims and past claims on volumes, by state and mode.\n")
	b.WriteString("# TYPE csiactor_volume_claims gauge\n")
	for _, md := range allModes {
		for _, s := range allStates {
			b.WriteString("csiactor_volume_claims{mode=\"" + md + "\",state=\"" + s + "\"} ")
			b.WriteString(strconvF(vals[s+"/"+md]) + "\n")
		}
	}
	return b.String()
}

func strconvF(f float64) string {
	out, _ := json.Marshal(f)
	return string(out)
}

func TestManager_Metrics(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.register("vol1")
	e.register("vol2")
	if _, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Fatal(err)
	}
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Hang: true})
	go func() {
		_, _ = e.m.Claim(context.Background(), claimReq("vol2", "b", claim.ModeRead, csi.AccessModeSingleNodeWriter))
	}()
	waitFor(t, "the stage call to hang", func() bool { return e.plugin.Calls("NodeStageVolume") == 2 })
	want := claimsExposition(map[string]float64{"published/write": 1, "controller-published/read": 1}) + `# HELP csiactor_volume_operations_in_flight Volume RPCs (publish, stage, unpublish, create, ...) in flight to plugins.
# TYPE csiactor_volume_operations_in_flight gauge
csiactor_volume_operations_in_flight 1
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want),
		"csiactor_volume_claims", "csiactor_volume_operations_in_flight"); err != nil {
		t.Error(err)
	}
	// The counts survive a restart of the manager.
	e.plugin.ClearFaults()
	e.restart()
	waitFor(t, "vol2's claim to be published", func() bool {
		v, _ := e.m.Get(ctx, "vol2")
		return len(v.Claims) == 1 && v.Claims[0].State == claim.StatePublished
	})
	want = claimsExposition(map[string]float64{"published/write": 1, "published/read": 1})
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "csiactor_volume_claims"); err != nil {
		t.Error(err)
	}
}

// lockedBuffer is a log sink for tests.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestManager_Secrets_NeverShown(t *testing.T) {
	e := newEnv(t, fullPlugin)
	var logs lockedBuffer
	l := logrus.New()
	l.Out = &logs
	l.Level = logrus.TraceLevel
	l.Formatter = &logrus.JSONFormatter{}
	e.restartWith(func(c *Config) { c.Logger = logrus.NewEntry(l) })
	ctx := ctxT(t)
	e.register("vol1")
	e.plugin.SetFault("NodeStageVolume", fakeplugin.Fault{Code: codes.Unavailable, Times: 1})
	e.plugin.SetFault("NodePublishVolume", fakeplugin.Fault{Code: codes.PermissionDenied})
	_, err := e.m.Claim(ctx, claimReq("vol1", "a", claim.ModeWrite, csi.AccessModeSingleNodeWriter))
	if err == nil {
		t.Fatal("claim succeeded")
	}
	e.plugin.ClearFaults()
	v := e.waitFreed("vol1")
	status, _ := json.Marshal(v)
	for _, secret := range []string{"s3cr3t", "hunter2", "noatime"} {
		for what, text := range map[string]string{"error": err.Error(), "logs": logs.String(), "status": string(status)} {
			if strings.Contains(text, secret) {
				t.Errorf("%s shows %q", what, secret)
			}
		}
	}
	if !strings.Contains(logs.String(), "claim failed") {
		t.Errorf("the failure was not logged: %s", logs.String())
	}
}
