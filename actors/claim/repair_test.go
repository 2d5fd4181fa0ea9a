package claim

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/csiactor/csiactor/persistence"
)

type view struct{ mounted, linked []string }

func (v view) Mounted(p string) bool { return slices.Contains(v.mounted, p) }
func (v view) Linked(p string) bool  { return slices.Contains(v.linked, p) }

// hostVolume has claims a (published), b (published) and c (staged, its
// NodePublishVolume to come) sharing one staging, d reserved, all last
// changed at t0, controller-published.
func hostVolume(t0 time.Time) *persistence.Volume {
	cl := func(alloc, state string) persistence.Claim {
		return persistence.Claim{Alloc: alloc, State: state, StagingPath: "/s", TargetPath: "/t/" + alloc,
			ControllerRequired: true, UpdatedAt: t0}
	}
	return &persistence.Volume{
		ID: "v", ControllerPublished: true,
		Claims: []persistence.Claim{
			cl("a", StatePublished), cl("b", StatePublished), cl("c", StateStaged), cl("d", StateReserved),
		},
		Stagings: []persistence.Staging{{Path: "/s", Users: []string{"a", "b", "c", "d"}, Staged: true}},
	}
}

func states(v *persistence.Volume) map[string]string {
	out := map[string]string{}
	for _, c := range v.Claims {
		out[c.Alloc] = c.State + "/" + c.Repair
	}
	return out
}

func TestCheckHost(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC)
	asOf, now := t0.Add(time.Second), t0.Add(2*time.Second)
	all := []string{"/s", "/t/a", "/t/b"}
	tests := []struct {
		name         string
		host         view
		boot         bool
		asOf         time.Time
		wantRepaired []string
		want         map[string]string
		wantStaged   bool
		wantCtrl     bool
	}{{
		name: "everything mounted", host: view{mounted: all}, asOf: asOf,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "one target missing", host: view{mounted: []string{"/s", "/t/a"}}, asOf: asOf,
		wantRepaired: []string{"b"},
		want:         map[string]string{"a": "published/", "b": "reserved/" + RepairTarget, "c": "staged/", "d": "reserved/"},
		wantStaged:   true, wantCtrl: true,
	}, {
		name: "staging missing: its published and staged users", host: view{mounted: []string{"/t/a", "/t/b"}}, asOf: asOf,
		wantRepaired: []string{"a", "b", "c"},
		want:         map[string]string{"a": "reserved/" + RepairStaging, "b": "reserved/" + RepairStaging, "c": "reserved/" + RepairStaging, "d": "reserved/"},
		wantCtrl:     true,
	}, {
		name: "staging and one target missing", host: view{mounted: []string{"/t/a"}}, asOf: asOf,
		wantRepaired: []string{"a", "b", "c"},
		want:         map[string]string{"a": "reserved/" + RepairStaging, "b": "reserved/" + RepairStagingAndTarget, "c": "reserved/" + RepairStaging, "d": "reserved/"},
		wantCtrl:     true,
	}, {
		name: "symlink mode: staging is bookkeeping", host: view{linked: []string{"/t/a", "/t/b"}}, asOf: asOf,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "changed after the host was looked at", host: view{}, asOf: t0,
		want:       map[string]string{"a": "published/", "b": "published/", "c": "staged/", "d": "reserved/"},
		wantStaged: true, wantCtrl: true,
	}, {
		name: "boot changed: every claim past reserved, whatever is mounted", host: view{mounted: all}, boot: true, asOf: asOf,
		wantRepaired: []string{"a", "b", "c"},
		want:         map[string]string{"a": "reserved/" + RepairBootID, "b": "reserved/" + RepairBootID, "c": "reserved/" + RepairBootID, "d": "reserved/"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := hostVolume(t0)
			orig := CloneVolume(v)
			repaired, changed := CheckHost(v, tt.host, tt.boot, tt.asOf, now)
			slices.Sort(repaired)
			if !slices.Equal(repaired, tt.wantRepaired) {
				t.Errorf("repaired = %v, want %v", repaired, tt.wantRepaired)
			}
			if got := states(v); !maps.Equal(got, tt.want) {
				t.Errorf("claims = %v, want %v", got, tt.want)
			}
			if v.Stagings[0].Staged != tt.wantStaged || v.ControllerPublished != tt.wantCtrl {
				t.Errorf("staged %t, controller published %t; want %t, %t", v.Stagings[0].Staged, v.ControllerPublished, tt.wantStaged, tt.wantCtrl)
			}
			if changed != (len(tt.wantRepaired) > 0 || tt.boot) {
				t.Errorf("changed = %t", changed)
			}
			if Repairing(v) != (len(tt.wantRepaired) > 0) || Repairing(orig) {
				t.Errorf("Repairing = %t", Repairing(v))
			}
			// The plan takes it from here: a repaired claim's next step.
			for _, alloc := range repaired {
				s, ok := NextPublish(v, alloc)
				want := NodePublish
				switch {
				case tt.boot:
					want = ControllerPublish
				case !v.Stagings[0].Staged:
					want = NodeStage
				}
				if !ok || s.Method != want {
					t.Errorf("next step of %s = %v (%t), want %v", alloc, s.Method, ok, want)
				}
			}
		})
	}
}

func TestCheckHost_RepairClearedWhenPublished(t *testing.T) {
	t0 := time.Now()
	v := hostVolume(t0)
	CheckHost(v, view{mounted: []string{"/s"}}, false, t0.Add(time.Second), t0.Add(time.Second))
	s, _ := NextPublish(v, "a")
	ApplyPublish(v, s, Result{}, t0.Add(2*time.Second))
	if c := v.Claims[FindClaim(v.Claims, "a")]; c.State != StatePublished || c.Repair != "" {
		t.Errorf("after NodePublishVolume: %s, repair %q; want published, no repair", c.State, c.Repair)
	}
}
