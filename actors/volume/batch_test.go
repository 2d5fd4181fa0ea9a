package volume

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/csiactor/csiactor/actors/claim"
	"github.com/csiactor/csiactor/csi"
	"github.com/csiactor/csiactor/internal/fakeplugin"
	"github.com/csiactor/csiactor/persistence"
)

// RegisterBatch with new volumes, refused ones and registered ones: each
// outcome in its place, the new ones written together with one event and
// loaded after a restart, nothing written for the refused ones.
func TestManager_RegisterBatch_Mixed(t *testing.T) {
	var evs dayEvents
	pc := fullPlugin
	pc.StrictVolumes = true
	e := newEnv(t, pc, withDayEvents(&evs))
	ctx := ctxT(t)
	known := func(ids ...string) {
		for _, id := range ids {
			e.plugin.AddVolume(fakeplugin.Volume{ID: "ext-" + id})
		}
	}
	known("old", "upd", "n0", "n1", "n2", "n3", "n4")
	e.register("old")
	e.register("upd")
	before := len(evs.of(EventVolumeRegistered))

	var specs []Spec
	for i := range 5 {
		specs = append(specs, spec(fmt.Sprintf("n%d", i)))
	}
	unknown := spec("unknown")
	invalid := spec("invalid")
	invalid.Capabilities = nil
	twice := spec("n0")
	extTwice := spec("other")
	extTwice.ExternalID = "ext-n1"
	taken := spec("taken")
	taken.ExternalID = "ext-old"
	upd := spec("upd")
	upd.Parameters = map[string]string{"tier": "gold"}
	specs = append(specs, unknown, invalid, twice, extTwice, taken, spec("old"), upd)
	errs := e.m.RegisterBatch(ctx, specs)
	for i := range 5 {
		if errs[i] != nil {
			t.Errorf("n%d: %v", i, errs[i])
		}
	}
	wants := []struct {
		kind error
		text string
	}{
		{ErrNotFound, `says volume "ext-unknown" (external_id) does not exist`},
		{ErrInvalid, "capabilities is empty"},
		{ErrInvalid, `volume "n0" is given twice in the batch (entries 0 and 7)`},
		{ErrConflict, `external_id "ext-n1" of plugin "fake" is already registered as volume "n1"`},
		{ErrConflict, `is already registered as volume "old"`},
		{nil, ""},
		{nil, ""},
	}
	for k, w := range wants {
		err := errs[5+k]
		if w.kind == nil {
			if err != nil {
				t.Errorf("%s: %v", specs[5+k].ID, err)
			}
			continue
		}
		if !errors.Is(err, w.kind) || !strings.Contains(err.Error(), w.text) {
			t.Errorf("%s: %v, want %v naming %q", specs[5+k].ID, err, w.kind, w.text)
		}
		if strings.Contains(fmt.Sprint(err), "hunter2") || strings.Contains(fmt.Sprint(err), "s3cr3t") {
			t.Errorf("%s: error shows a secret or mount flag: %v", specs[5+k].ID, err)
		}
	}
	if got := len(evs.of(EventVolumeRegistered)); got != before {
		t.Errorf("%d volume-registered events for the batch, want none", got-before)
	}
	if got := evs.of(EventVolumesRegistered); len(got) != 1 || got[0].Message != "5 volumes registered: n0, n1, n2, n3, n4" || got[0].Plugin != testPlugin {
		t.Errorf("volumes-registered events = %+v, want one for n0..n4", got)
	}
	if v, err := e.m.Get(ctx, "upd"); err != nil || v.Parameters["tier"] != "gold" {
		t.Errorf("upd after the batch: %+v, %v; want updated", v, err)
	}

	e.restart()
	var ids []string
	if err := e.store.ForEachVolume(ctx, func(v persistence.Volume) error {
		ids = append(ids, v.ID)
		if strings.HasPrefix(v.ID, "n") && (v.Revision != 1 || v.UpdatedAt.IsZero() || v.ExternalID != "ext-"+v.ID) {
			t.Errorf("record of %s: %+v", v.ID, v)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(ids, ","), "n0,n1,n2,n3,n4,old,upd"; got != want {
		t.Errorf("stored volumes %s, want %s", got, want)
	}
	if _, err := e.m.Claim(ctx, claimReq("n3", "a1", claim.ModeWrite, csi.AccessModeSingleNodeWriter)); err != nil {
		t.Errorf("claim on a batch-registered volume after a restart: %v", err)
	}
	// The plugin volume of an entry refused after it was reserved is free
	// again.
	known("unknown")
	if _, err := e.m.Register(ctx, spec("unknown")); err != nil {
		t.Errorf("register after the batch: %v", err)
	}
}

// While a batch writes a new volume, a request that would start its actor
// is refused; once the batch is done the volume is there.
func TestManager_RegisterBatch_ReservedIDs(t *testing.T) {
	e := newEnv(t, fullPlugin)
	ctx := ctxT(t)
	e.m.mu.Lock()
	e.m.batching = map[string]struct{}{"b1": {}}
	e.m.mu.Unlock()
	if _, err := e.m.Register(ctx, spec("b1")); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "being registered by a batch") {
		t.Errorf("register during a batch: %v, want ErrConflict", err)
	}
	if errs := e.m.RegisterBatch(ctx, []Spec{spec("b1")}); !errors.Is(errs[0], ErrConflict) {
		t.Errorf("a second batch with the same volume: %v, want ErrConflict", errs[0])
	}
	e.m.mu.Lock()
	e.m.batching = nil
	e.m.mu.Unlock()
	if errs := e.m.RegisterBatch(ctx, []Spec{spec("b1")}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if v, err := e.m.Get(ctx, "b1"); err != nil || v.ExternalID != "ext-b1" {
		t.Errorf("b1 after the batch: %+v, %v", v, err)
	}
}

// With no controller to ask, a batch registers its volumes without
// validating them, as Register does, and says so in one log line for the
// batch.
func TestManager_RegisterBatch_PluginDown(t *testing.T) {
	logger, hook := logtest.NewNullLogger()
	e := newEnv(t, fullPlugin, withConfig(func(c *Config) { c.Logger = logrus.NewEntry(logger) }))
	e.plugins.setDown(true)
	ctx := ctxT(t)
	var specs []Spec
	for i := range 20 {
		specs = append(specs, spec(fmt.Sprintf("d%02d", i)))
	}
	for i, err := range e.m.RegisterBatch(ctx, specs) {
		if err != nil {
			t.Errorf("%s: %v", specs[i].ID, err)
		}
	}
	var lines []string
	for _, en := range hook.AllEntries() {
		if strings.Contains(en.Message, "without validating") {
			lines = append(lines, fmt.Sprintf("%s volumes=%v", en.Message, en.Data["volumes"]))
		}
	}
	if want := "no controller of the plugin can be asked now; registering volumes of a batch without validating it volumes=20"; len(lines) != 1 || lines[0] != want {
		t.Errorf("log lines %q, want one: %q", lines, want)
	}
}
